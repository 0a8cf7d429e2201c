"""The sweep report as one self-contained HTML page: the verdicts, the table, then inline SVG charts: per metric each
arm's mean with its band over seeds, and each arm's paired difference to the baseline with its interval.

No plotting library and no network: each chart is SVG drawn here, with a tooltip on every point (its arm or job,
epoch and value); the legend's checkboxes show or hide an arm in every chart.
"""
from __future__ import annotations

import html
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from swinexp.tracking.arms import Arm
from swinexp.tracking.verdict import Interval

# matplotlib's tab10, so the page and curves.png give a job the same colour
COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
           "#17becf")
WIDTH, HEIGHT, PAD = 560, 320, 48

Curves = Mapping[str, Mapping[int, float]]  # job name -> {epoch: value}


@dataclass(frozen=True)
class Section:
    """A titled table with notes under it (the verdicts at the head of the page)."""

    title: str
    header: Sequence[str]
    rows: Sequence[Sequence[str]]
    notes: Sequence[str] = ()

@dataclass(frozen=True)
class DifferenceChart:
    """Each arm's paired difference to the baseline over epochs, with its 95% interval."""

    title: str
    series: Mapping[str, Mapping[int, Interval]]  # arm label -> epoch -> interval
    margin: float


SCRIPT = """
for (const box of document.querySelectorAll('input[data-arm]')) {
  box.addEventListener('change', () => {
    for (const group of document.querySelectorAll(`g[data-arm="${box.dataset.arm}"]`))
      group.style.display = box.checked ? '' : 'none';
  });
}
"""


def _scale(lo: float, hi: float, out_lo: float, out_hi: float) -> Callable[[float], float]:
    if hi == lo:  # one epoch, or one value: centre it
        lo, hi = lo - 1, hi + 1
    return lambda v: out_lo + (v - lo) / (hi - lo) * (out_hi - out_lo)


class _Frame:
    """The axes, ticks and scales of one chart holding `epochs` and `values`, `epoch` marked."""

    def __init__(self, label: str, epochs: Sequence[int], values: Sequence[float], epoch: int | None) -> None:
        self.x = _scale(min(epochs), max(epochs), PAD, WIDTH - PAD / 2)
        self.y = _scale(min(values), max(values), HEIGHT - PAD, PAD / 2)
        self.parts = [
            f'<svg width="{WIDTH}" height="{HEIGHT}" role="img" aria-label="{html.escape(label)} against epoch">',
            f'<line x1="{PAD}" y1="{HEIGHT - PAD}" x2="{WIDTH - PAD / 2}" y2="{HEIGHT - PAD}" stroke="#999"/>',
            f'<line x1="{PAD}" y1="{PAD / 2}" x2="{PAD}" y2="{HEIGHT - PAD}" stroke="#999"/>',
            f'<text x="{WIDTH / 2}" y="{HEIGHT - 8}" text-anchor="middle">epoch</text>',
            f'<text x="12" y="{HEIGHT / 2}" transform="rotate(-90 12 {HEIGHT / 2})" text-anchor="middle">'
            f'{html.escape(label)}</text>']
        for value in (min(values), max(values)):
            self.parts.append(f'<text x="{PAD - 4}" y="{self.y(value) + 4:.1f}" text-anchor="end" font-size="11">'
                              f'{value:.4g}</text>')
        for e in sorted(set(epochs)):
            self.parts.append(f'<text x="{self.x(e):.1f}" y="{HEIGHT - PAD + 16}" text-anchor="middle" '
                              f'font-size="11">{e}</text>')
        if epoch is not None and min(epochs) <= epoch <= max(epochs):
            self.parts.append(f'<line x1="{self.x(epoch):.1f}" y1="{PAD / 2}" x2="{self.x(epoch):.1f}" '
                              f'y2="{HEIGHT - PAD}" stroke="#888" stroke-dasharray="3,3"><title>compared epoch'
                              '</title></line>')

    def hline(self, value: float, dash: str, note: str) -> None:
        self.parts.append(f'<line x1="{PAD}" y1="{self.y(value):.1f}" x2="{WIDTH - PAD / 2}" y2="{self.y(value):.1f}" '
                          f'stroke="#666" stroke-dasharray="{dash}"><title>{html.escape(note)}</title></line>')

    def band(self, lows: Sequence[tuple[int, float]], highs: Sequence[tuple[int, float]], colour: str) -> str:
        """A filled polygon between two curves (a spread or an interval)."""
        outline = [*lows, *reversed(highs)]
        points = " ".join(f"{self.x(e):.1f},{self.y(v):.1f}" for e, v in outline)
        return f'<polygon class="band" points="{points}" fill="{colour}" fill-opacity="0.22" stroke="none"/>'

    def line(self, curve: Sequence[tuple[int, float]], colour: str, width: float, tip: Callable[[int, float], str],
             dash: str = "", dots: bool = True) -> str:
        points = " ".join(f"{self.x(e):.1f},{self.y(v):.1f}" for e, v in curve)
        style = f' stroke-dasharray="{dash}"' if dash else ""
        marks = "".join(f'<circle cx="{self.x(e):.1f}" cy="{self.y(v):.1f}" r="3.5" fill="{colour}">'
                        f"<title>{html.escape(tip(e, v))}</title></circle>" for e, v in curve) if dots else ""
        return (f'<polyline points="{points}" fill="none" stroke="{colour}" stroke-width="{width}"{style}>'
                f"<title>{html.escape(tip(curve[-1][0], curve[-1][1]))}</title></polyline>{marks}")

    def svg(self) -> str:
        return "".join(self.parts) + "</svg>"


def svg_chart(metric: str, arms: Sequence[Arm], epoch: int | None) -> str:
    """`metric` against epoch: per arm (in `arms` order, for stable colours) its mean over the finished seeds with
    their min–max band, each seed's own curve thin beside it, and a run that did not finish dashed; `epoch` marked.
    Each arm is one `<g data-arm>`, each run inside it one `<g data-job>`."""
    points = [(e, v) for arm in arms for curves in (arm.finished, arm.unfinished) for c in curves.values()
              for e, v in c.items()]
    if not points:
        return f"<p>No {html.escape(metric)} was logged.</p>"
    frame = _Frame(metric, [e for e, _ in points], [v for _, v in points], epoch)
    for i, arm in enumerate(arms):
        colour, name = COLOURS[i % len(COLOURS)], html.escape(arm.name, quote=True)
        parts = [f'<g data-arm="{name}">']
        band = sorted(arm.band().items())
        if len(arm.finished) > 1 and band:
            parts.append(frame.band([(e, lo) for e, (_, lo, _) in band], [(e, hi) for e, (_, _, hi) in band], colour))
            parts.append(frame.line([(e, m) for e, (m, _, _) in band], colour, 2.5, lambda e, v, arm=arm: (
                f"{arm.name}: epoch {e}, {metric} mean {v:.4g} over {len(arm.finished)} seeds")))
        for job, curve in arm.finished.items():
            one = len(arm.finished) == 1
            parts.append(f'<g data-job="{html.escape(job, quote=True)}">' + frame.line(
                sorted(curve.items()), colour, 2 if one else 1, lambda e, v, job=job: f"{job}: epoch {e}, {metric} "
                f"{v:.4g}", dots=one) + "</g>")
        for job, curve in arm.unfinished.items():
            if curve:
                parts.append(f'<g data-job="{html.escape(job, quote=True)}">' + frame.line(
                    sorted(curve.items()), colour, 1, lambda e, v, job=job: f"{job}: epoch {e}, {metric} {v:.4g}",
                    dash="6,4") + "</g>")
        frame.parts.append("".join(parts) + "</g>")
    return frame.svg()


def svg_differences(chart: DifferenceChart, colours: Mapping[str, str], epoch: int | None) -> str:
    """Each arm's mean paired difference with its 95% interval as a band, 0 and ±margin as lines."""
    points = [(e, v) for series in chart.series.values() for e, i in series.items() for v in (i.lo, i.hi)]
    if not points:
        return "<p>No paired seeds to compare.</p>"
    values = [v for _, v in points] + [-chart.margin, chart.margin]
    frame = _Frame("paired difference", [e for e, _ in points], values, epoch)
    frame.hline(0, "1,0", "no difference")
    for edge in (-chart.margin, chart.margin):
        frame.hline(edge, "4,4", f"margin ±{chart.margin:g}")
    for arm, series in chart.series.items():
        colour, curve = colours.get(arm, "#666"), sorted(series.items())
        if not curve:
            continue
        parts = [f'<g data-arm="{html.escape(arm, quote=True)}">',
                 frame.band([(e, i.lo) for e, i in curve], [(e, i.hi) for e, i in curve], colour),
                 frame.line([(e, i.mean) for e, i in curve], colour, 2, lambda e, v, arm=arm, series=series: (
                     f"{arm}: epoch {e}, paired difference {v:+.3g}, 95% interval [{series[e].lo:+.3g}, "
                     f"{series[e].hi:+.3g}]")), "</g>"]
        frame.parts.append("".join(parts))
    return frame.svg()


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    esc = html.escape
    return ("<table><tr>" + "".join(f"<th>{esc(h)}</th>" for h in header) + "</tr>"
            + "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in row) + "</tr>" for row in rows) + "</table>")


def page(title: str, header: Sequence[str], rows: Sequence[Sequence[str]], charts: Mapping[str, Sequence[Arm]],
         epoch: int | None, failed: Sequence[str], head: Section | None = None,
         differences: DifferenceChart | None = None) -> str:
    """The whole page: `head` first, `rows` under `header`, failed jobs, the legend (a box per arm), one chart per
    `charts` (metric -> its arms) and the paired differences to the baseline."""
    esc = html.escape
    table = _table(header, rows)
    if head is not None:
        table = (f'<h2>{esc(head.title)}</h2><div class="verdicts">{_table(head.header, head.rows)}</div>'
                 + "".join(f"<p>{esc(note)}</p>" for note in head.notes) + f"<h2>Runs</h2>{table}")
    arms = list(dict.fromkeys(arm.name for chart in charts.values() for arm in chart))
    colours = {arm: COLOURS[i % len(COLOURS)] for i, arm in enumerate(arms)}
    legend = "".join(f'<label style="color:{colours[arm]}"><input type="checkbox" checked '
                     f'data-arm="{esc(arm, quote=True)}"> {esc(arm)}</label> ' for arm in arms)
    failures = ("<h2>Failed jobs</h2><ul>" + "".join(f"<li>{esc(f)}</li>" for f in failed) + "</ul>") if failed else ""
    figures = "".join(f"<h2>{esc(metric)}</h2><p>Each arm: the mean over its finished seeds, their min–max band and "
                      f"each seed thin; dashed: a run that did not finish.</p>{svg_chart(metric, chart, epoch)}"
                      for metric, chart in charts.items())
    if differences is not None:
        figures += (f"<h2>{esc(differences.title)}</h2><p>Each arm minus the baseline on the seeds both ran: the "
                    f"mean with its 95% paired interval; dashed: ±{differences.margin:g}.</p>"
                    + svg_differences(differences, colours, epoch))
    return (f"<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>{esc(title)}</title><style>"
            "body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
            "td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}td:first-child{text-align:left}"
            f"label{{margin-right:1em}}</style></head><body><h1>{esc(title)}</h1>{table}{failures}"
            f"<h2>Arms</h2><p>{legend}</p>{figures}<script>{SCRIPT}</script></body></html>\n")
