"""The sweep report as one self-contained HTML page: the table, then one inline SVG chart per metric.

No plotting library and no network: each chart is SVG drawn here, a line per job with a tooltip on every point
(its job, epoch and value); the legend's checkboxes show or hide a job's line in every chart.
"""
from __future__ import annotations

import html
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

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

SCRIPT = """
for (const box of document.querySelectorAll('input[data-job]')) {
  box.addEventListener('change', () => {
    for (const line of document.querySelectorAll(`g[data-job="${box.dataset.job}"]`))
      line.style.display = box.checked ? '' : 'none';
  });
}
"""


def _scale(lo: float, hi: float, out_lo: float, out_hi: float) -> Callable[[float], float]:
    if hi == lo:  # one epoch, or one value: centre it
        lo, hi = lo - 1, hi + 1
    return lambda v: out_lo + (v - lo) / (hi - lo) * (out_hi - out_lo)


def svg_chart(metric: str, curves: Curves, jobs: Sequence[str], epoch: int | None) -> str:
    """`metric` against epoch, one line per job (in `jobs` order, for stable colours); `epoch` marked."""
    points = [(e, v) for curve in curves.values() for e, v in curve.items()]
    if not points:
        return f"<p>No {html.escape(metric)} was logged.</p>"
    epochs, values = [e for e, _ in points], [v for _, v in points]
    x = _scale(min(epochs), max(epochs), PAD, WIDTH - PAD / 2)
    y = _scale(min(values), max(values), HEIGHT - PAD, PAD / 2)
    parts = [f'<svg width="{WIDTH}" height="{HEIGHT}" role="img" aria-label="{html.escape(metric)} against epoch">',
             f'<line x1="{PAD}" y1="{HEIGHT - PAD}" x2="{WIDTH - PAD / 2}" y2="{HEIGHT - PAD}" stroke="#999"/>',
             f'<line x1="{PAD}" y1="{PAD / 2}" x2="{PAD}" y2="{HEIGHT - PAD}" stroke="#999"/>',
             f'<text x="{WIDTH / 2}" y="{HEIGHT - 8}" text-anchor="middle">epoch</text>',
             f'<text x="12" y="{HEIGHT / 2}" transform="rotate(-90 12 {HEIGHT / 2})" text-anchor="middle">'
             f'{html.escape(metric)}</text>']
    for value in (min(values), max(values)):
        parts.append(f'<text x="{PAD - 4}" y="{y(value) + 4:.1f}" text-anchor="end" font-size="11">{value:.4g}</text>')
    for e in sorted(set(epochs)):
        parts.append(f'<text x="{x(e):.1f}" y="{HEIGHT - PAD + 16}" text-anchor="middle" font-size="11">{e}</text>')
    if epoch is not None and min(epochs) <= epoch <= max(epochs):
        parts.append(f'<line x1="{x(epoch):.1f}" y1="{PAD / 2}" x2="{x(epoch):.1f}" y2="{HEIGHT - PAD}" '
                     'stroke="#888" stroke-dasharray="3,3"><title>compared epoch</title></line>')
    for i, job in enumerate(jobs):
        curve = sorted(curves.get(job, {}).items())
        if not curve:
            continue
        colour, name = COLOURS[i % len(COLOURS)], html.escape(job, quote=True)
        line = " ".join(f"{x(e):.1f},{y(v):.1f}" for e, v in curve)
        dots = "".join(f'<circle cx="{x(e):.1f}" cy="{y(v):.1f}" r="3.5" fill="{colour}">'
                       f"<title>{name}: epoch {e}, {html.escape(metric)} {v:.4g}</title></circle>" for e, v in curve)
        parts.append(f'<g data-job="{name}"><polyline points="{line}" fill="none" stroke="{colour}" '
                     f'stroke-width="2"/>{dots}</g>')
    return "".join(parts) + "</svg>"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    esc = html.escape
    return ("<table><tr>" + "".join(f"<th>{esc(h)}</th>" for h in header) + "</tr>"
            + "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in row) + "</tr>" for row in rows) + "</table>")


def page(title: str, header: Sequence[str], rows: Sequence[Sequence[str]], charts: Mapping[str, Curves],
         jobs: Sequence[str], epoch: int | None, failed: Sequence[str], head: Section | None = None) -> str:
    """The whole page: `head` first, `rows` under `header`, failed jobs, the legend and one chart per `charts`."""
    esc = html.escape
    table = _table(header, rows)
    if head is not None:
        table = (f'<h2>{esc(head.title)}</h2><div class="verdicts">{_table(head.header, head.rows)}</div>'
                 + "".join(f"<p>{esc(note)}</p>" for note in head.notes) + f"<h2>Runs</h2>{table}")
    legend = "".join(f'<label style="color:{COLOURS[i % len(COLOURS)]}"><input type="checkbox" checked '
                     f'data-job="{esc(job, quote=True)}"> {esc(job)}</label> ' for i, job in enumerate(jobs))
    failures = ("<h2>Failed jobs</h2><ul>" + "".join(f"<li>{esc(f)}</li>" for f in failed) + "</ul>") if failed else ""
    figures = "".join(f"<h2>{esc(metric)}</h2>{svg_chart(metric, curves, jobs, epoch)}"
                      for metric, curves in charts.items())
    return (f"<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>{esc(title)}</title><style>"
            "body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
            "td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}td:first-child{text-align:left}"
            f"label{{margin-right:1em}}</style></head><body><h1>{esc(title)}</h1>{table}{failures}"
            f"<h2>Jobs</h2><p>{legend}</p>{figures}<script>{SCRIPT}</script></body></html>\n")
