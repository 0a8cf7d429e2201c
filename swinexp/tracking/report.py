"""`python -m swinexp.tracking.report`: compare the runs of a sweep at epoch N — a verdict per gap between arms, a
table, a CSV/markdown copy, a plot and an HTML page.

Reads any MLflow tracking store; writes into --out and logs the files to the sweep's parent run; prints the link
that opens the sweep's jobs in MLflow's UI on the metric's chart. A sweep (`-m`) calls `sweep_report` itself when
it ends.
"""
from __future__ import annotations

import argparse
import csv
import statistics
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import cycle
from pathlib import Path

from mlflow.entities import Run
from mlflow.tracking import MlflowClient

from swinexp.tracking import FAILED_JOBS_TAG, report_html, resolve_uri, ui
from swinexp.tracking.arms import (
    VERDICT_HEADER,
    Arm,
    arm_labels,
    chart_arms,
    gaps_of,
    left_out,
    log_verdicts,
    paired_differences,
    run_status,
    tag_arms,
    verdict_markdown,
    verdict_rows,
    verdict_title,
    without_seed,
)
from swinexp.tracking.ui import UI_PORT
from swinexp.tracking.verdict import MARGIN, METHOD, Interval

REPORT_FILES = ("report.md", "report.csv", "curves.png", "report.html")


@dataclass(frozen=True)
class Row:
    """One line of the report: a run, or several runs that differ only in seed (then values are mean ± std)."""

    name: str
    runs: int
    at_epoch: list[float]
    best: list[float]
    final: list[float]
    step_time_s: float | None
    images_per_s: float | None
    status: str


def find_parent(client: MlflowClient, experiment_id: str, sweep: str) -> Run:
    """The parent run of `sweep` (a run id), or the newest sweep parent for 'latest'."""
    if sweep != "latest":
        return client.get_run(sweep)
    parents = client.search_runs([experiment_id], "tags.`sweep.role` = 'parent'",
                                 order_by=["attributes.start_time DESC"], max_results=1)
    if not parents:
        raise SystemExit(f"no sweep found in experiment {experiment_id}; run one with `python run.py -m KEY=a,b`")
    return parents[0]


def children(client: MlflowClient, experiment_id: str, parent_id: str) -> list[Run]:
    runs = client.search_runs([experiment_id], f"tags.`sweep.id` = '{parent_id}'")
    return sorted(runs, key=lambda r: int(r.data.tags.get("sweep.job", 0)))


def history(client: MlflowClient, run: Run, metric: str) -> dict[int, float]:
    return {m.step: m.value for m in client.get_metric_history(run.info.run_id, metric)}


def _mean(values: Sequence[float]) -> float | None:
    return statistics.fmean(values) if values else None


def missing_at_epoch(client: MlflowClient, runs: list[Run], metric: str, epoch: int) -> list[str]:
    """One line per run without a `metric` value at `epoch`, saying where its curve ends."""
    lines = []
    for run in runs:
        curve = history(client, run, metric)
        if epoch not in curve:
            last = f"its last is at epoch {max(curve)}" if curve else "it has none"
            lines.append(f"{run.info.run_name} ({run_status(run)}): no {metric} at epoch {epoch}, {last}")
    return lines


def build_rows(client: MlflowClient, runs: list[Run], metric: str, epoch: int) -> list[Row]:
    """Group runs by their name without `seed=...` (an arm, amp named as it computed) and summarise each group."""
    groups: dict[str, list[Run]] = {}
    labels = arm_labels(runs)
    for run in runs:
        groups.setdefault(labels[without_seed(run.info.run_name)], []).append(run)
    rows = []
    for name, members in groups.items():
        curves = [history(client, r, metric) for r in members]
        step_times = [v for r in members for v in history(client, r, "epoch_time_s").values()]
        speeds = [v for r in members for v in history(client, r, "train/images_per_s").values()]
        statuses = sorted({run_status(r) for r in members})
        rows.append(Row(
            name=name if len(members) == 1 else f"{name} (seeds: {len(members)})",
            runs=len(members),
            at_epoch=[c[epoch] for c in curves if epoch in c],
            best=[max(c.values()) for c in curves if c],
            final=[c[max(c)] for c in curves if c],
            step_time_s=_mean(step_times), images_per_s=_mean(speeds), status="/".join(statuses)))
    return rows


def local_store_path(uri: str) -> Path | None:
    """The file (sqlite) or folder (file store) of a local tracking store; None for a server."""
    for scheme in ("sqlite:///", "file://"):
        if uri.startswith(scheme):
            return Path(uri[len(scheme):])
    return None


def fmt(values: Sequence[float]) -> str:
    """'81.20' for one value, '81.20 ± 0.31' (sample std) for several, '—' for none."""
    if not values:
        return "—"
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{statistics.fmean(values):.2f} ± {statistics.stdev(values):.2f}"


def table_header(metric: str, epoch: int) -> list[str]:
    return ["run", f"{metric} @ epoch {epoch}", "best", "final", "epoch time (s)", "images/s", "status"]


def row_cells(r: Row) -> list[str]:
    speed = f"{r.images_per_s:.1f}" if r.images_per_s is not None else "—"
    step = f"{r.step_time_s:.1f}" if r.step_time_s is not None else "—"
    return [r.name, fmt(r.at_epoch), fmt(r.best), fmt(r.final), step, speed, r.status]


def markdown(rows: list[Row], metric: str, epoch: int) -> str:
    lines = ["| " + " | ".join(table_header(metric, epoch)) + " |", "|" + "---|" * 7]
    lines += ["| " + " | ".join(row_cells(r)) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def write_csv(rows: list[Row], path: Path) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["run", "runs", "at_epoch_mean", "best_mean", "final_mean", "epoch_time_s", "images_per_s",
                         "status"])
        for r in rows:
            writer.writerow([r.name, r.runs, _mean(r.at_epoch), _mean(r.best), _mean(r.final), r.step_time_s,
                             r.images_per_s, r.status])


def plot(arms: Sequence[Arm], differences: Mapping[str, Mapping[int, Interval]], labels: Mapping[str, str],
         baseline: str | None, metric: str, epoch: int, margin: float, title: str, path: Path) -> None:
    """Top: one line per arm, the mean over its finished seeds with their min–max band; a run that did not finish
    is drawn on its own, dashed, and kept out of its arm's mean and band. Below, where there is a baseline: each
    other arm's paired difference to it over epochs with its 95% interval as a band, the ±margin lines and 0."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    panels = 2 if differences else 1
    fig, axes = plt.subplots(panels, 1, figsize=(7, 4.5 * panels), dpi=110, squeeze=False, sharex=True)
    top = axes[0][0]
    colours = dict(zip((a.name for a in arms), cycle(plt.rcParams["axes.prop_cycle"].by_key()["color"])))
    for arm in arms:
        colour, band = colours[arm.name], arm.band()
        if band:
            seeds = len(arm.finished)
            epochs = list(band)
            top.plot(epochs, [band[e][0] for e in epochs], marker="o", ms=3, color=colour,
                     label=arm.name if seeds == 1 else f"{arm.name} (mean of {seeds} seeds, min–max band)")
            if seeds > 1:
                top.fill_between(epochs, [band[e][1] for e in epochs], [band[e][2] for e in epochs], color=colour,
                                 alpha=0.25, lw=0)
        for label, curve in arm.unfinished.items():
            if curve:
                top.plot(sorted(curve), [curve[e] for e in sorted(curve)], ls="--", lw=1, color=colour, label=label)
    top.set(ylabel=metric, title=title)
    if differences:
        below = axes[1][0]
        for arm, series in differences.items():
            name, epochs = labels.get(arm, arm), sorted(series)
            if not epochs:
                continue
            colour = colours.get(name, "grey")
            below.plot(epochs, [series[e].mean for e in epochs], marker="o", ms=3, color=colour,
                       label=f"{name} − {labels.get(baseline or '', baseline)}")
            below.fill_between(epochs, [series[e].lo for e in epochs], [series[e].hi for e in epochs], color=colour,
                               alpha=0.25, lw=0)
        below.axhline(0, color="black", lw=0.8)
        for edge in (-margin, margin):
            below.axhline(edge, color="grey", ls="--", lw=0.8)
        below.set(ylabel=f"paired difference ({metric})",
                  title=f"− {labels.get(baseline or '', baseline)}, paired by seed: mean, 95% interval; "
                        f"dashed ±{margin:g}")
    for (ax,) in axes:
        ax.axvline(epoch, color="grey", ls=":", lw=1)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[-1][0].set(xlabel="epoch")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


@dataclass(frozen=True)
class Report:
    table: str     # the markdown table
    text: str      # what the console shows: the verdicts, the table, the screens, failed jobs, where the report and
                   # the UI are
    url: str       # the sweep's jobs in MLflow's UI, chart view on the metric
    verdicts: str  # the markdown verdict table with its method line; '' for a sweep of one arm


def failed_jobs(parent: Run) -> list[str]:
    """The failed jobs the sweep recorded on its parent run (a job that failed before it logged a run has no row)."""
    return [line for line in parent.data.tags.get(FAILED_JOBS_TAG, "").splitlines() if line]


def best_trial(tags: dict[str, str], metric: str) -> str:
    """'best trial: job #3 optimizer.lr=0.001: val/top1 41.5' from a search's `best.*` parent tags, or ''."""
    if "best.objective" not in tags:
        return ""
    values = [f"{k[len('best.'):]}={v}" for k, v in sorted(tags.items())
              if k.startswith("best.") and k not in ("best.objective", "best.metric", "best.job")]
    return (f"best trial: job #{tags.get('best.job', '?')} {' '.join(values)}: {tags.get('best.metric') or metric} "
            f"{tags['best.objective']}\n")


def last_common_epoch(client: MlflowClient, runs: list[Run], metric: str) -> int:
    """The last epoch every run that logged `metric` reached: where a sweep of screens compares its jobs."""
    ends = [max(curve) for curve in (history(client, r, metric) for r in runs) if curve]
    return min(ends, default=1)


def sweep_report(tracking_uri: str, experiment: str, parent_run_id: str, metric: str = "val/top1",
                 epoch: int | None = None, out: Path | None = None, ui_port: int = UI_PORT,
                 baseline: str | None = None, margin: float = MARGIN) -> Report:
    """Compare the jobs of sweep `parent_run_id` at `epoch` and log the report to the parent run.

    Writes report.md, report.csv, curves.png (`metric` against epoch, each arm's mean over its seeds with their
    min–max band, `epoch` marked) and
    report.html (the table and the `metric` and train/loss curves, self-contained) into `out` and the parent's
    `report/` artifacts, and stores the sweep's view in the experiment (see `swinexp.tracking.ui`): its jobs grouped
    by arm, one line per arm with its min-max band. Runs that differ only in `seed=` share a row, as mean ± std,
    and form an arm, tagged `sweep.arm` on each run: the report and its page open with each arm's paired gap to
    `baseline` and its verdict (`swinexp.tracking.arms`), which are also logged to MLflow (`<metric>_at<epoch>` on
    each job; `gap/...` metrics and `verdict/...` tags on the parent). An arm whose runs computed another amp than
    its `amp=` value (their `amp.effective` tag, e.g. o0 on a 910) is named by what they computed. Warnings about
    runs without `epoch` go to stderr.

    Args:
        tracking_uri: An absolute tracking URI (`swinexp.tracking.resolve_uri`).
        experiment: The experiment's name.
        parent_run_id: The sweep's parent run.
        metric: The compared metric, logged with step = epoch.
        epoch: The compared epoch; None: the last epoch every job reached.
        out: Where the files go; None: report/<parent run id> in the working directory.
        ui_port: The port the printed `mlflow ui` command serves a local store on.
        baseline: The arm every other arm is compared with (a run name without `seed=`); None: the first job's.
        margin: Points within which a gap's paired interval makes two arms "equal".

    Raises:
        LookupError: The experiment does not exist, or the sweep has no child runs.
        ValueError: `baseline` is not an arm of the sweep.
    """
    client = MlflowClient(tracking_uri)
    found = client.get_experiment_by_name(experiment)
    if found is None:
        raise LookupError(f"experiment '{experiment}' not found at {tracking_uri}")
    parent = client.get_run(parent_run_id)
    runs = children(client, found.experiment_id, parent_run_id)
    failed = failed_jobs(parent)
    if not runs:
        raise LookupError(f"sweep {parent_run_id} ({parent.info.run_name}) has no child runs"
                          + "".join(f"\n  failed: {f}" for f in failed))
    if epoch is None:
        epoch = last_common_epoch(client, runs, metric)
    for line in missing_at_epoch(client, runs, metric, epoch):
        print(f"warning: {line}; its row shows — at epoch {epoch}", file=sys.stderr)
    rows = build_rows(client, runs, metric, epoch)
    table = markdown(rows, metric, epoch)
    curves = [history(client, r, metric) for r in runs]
    gaps = gaps_of(runs, curves, metric, epoch, baseline, margin)
    labels = arm_labels(runs)  # amp as each arm computed it, where that differs from its amp= value
    verdicts = verdict_markdown(gaps, metric, epoch, labels)
    failures = "".join(f"\n- {f}" for f in failed)
    failures = f"\nFailed jobs:{failures}\n" if failed else ""
    out = out or Path("report") / parent_run_id
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.md").write_text(f"# {parent.info.run_name}\n\n{verdicts}{table}{failures}")
    write_csv(rows, out / "report.csv")
    base = gaps[0].baseline if gaps else None
    differences = paired_differences(runs, curves, base) if base is not None else {}
    arms = chart_arms(runs, curves)
    plot(arms, differences, labels, base, metric, epoch, margin, parent.info.run_name, out / "curves.png")
    charts = {metric: arms, **({"train/loss": chart_arms(runs, [history(client, r, "train/loss") for r in runs])}
                               if metric != "train/loss" else {})}
    head = report_html.Section(verdict_title(metric, epoch, gaps, labels), VERDICT_HEADER, verdict_rows(gaps, labels),
                               [METHOD, *(["Left out (never averaged in): " + "; ".join(left_out(gaps))]
                                          if left_out(gaps) else [])]) if gaps else None
    gap_chart = report_html.DifferenceChart(
        f"{metric}: paired difference to {labels.get(base, base)}",
        {labels.get(arm, arm): series for arm, series in differences.items()}, margin) if differences else None
    (out / "report.html").write_text(report_html.page(
        parent.info.run_name, table_header(metric, epoch), [row_cells(r) for r in rows], charts, epoch, failed,
        head, gap_chart))
    for name in REPORT_FILES:
        client.log_artifact(parent_run_id, str(out / name), artifact_path="report")
    log_verdicts(client, parent_run_id, runs, curves, metric, epoch, gaps)
    tag_arms(client, runs, labels)

    base, command = ui.ui_base(tracking_uri, ui_port)
    url = ui.runs_view_url(base, found.experiment_id, ui.share_sweep_view(client, found.experiment_id,
                                                                           parent_run_id, metric))
    screens = [r.info.run_name for r in runs if run_status(r).startswith("screen")]
    finished = [r.info.run_name for r in runs if run_status(r) == "FINISHED"]
    text = (f"{parent.info.run_name}  ({len(runs)} runs, parent {parent_run_id})\n\n{verdicts}{table}{failures}\n"
            f"{best_trial(parent.data.tags, metric)}"
            f"screens (stopped early; continue with trainer.stop_after_epoch=null): {', '.join(screens) or 'none'}\n"
            f"finished (all trainer.epochs): {', '.join(finished) or 'none'}\n"
            f"written to {out}/ (open report.html) and to the parent run's artifacts, report/: "
            f"{ui.run_url(base, found.experiment_id, parent_run_id)}\n"
            f"compare in MLflow: {url}\n"
            + (f"  first serve the store: {command}\n" if command else ""))
    return Report(table, text, url, verdicts)


def main(argv: Sequence[str] | None = None) -> str:
    parser = argparse.ArgumentParser(prog="python -m swinexp.tracking.report", description=__doc__)
    parser.add_argument("--tracking-uri", default=None, help="default: sqlite:///mlflow.db in this directory")
    parser.add_argument("--experiment", default="swinexp")
    parser.add_argument("--sweep", default="latest", help="the sweep's parent run id, or 'latest'")
    parser.add_argument("--metric", default="val/top1")
    parser.add_argument("--epoch", type=int, default=10)
    parser.add_argument("--out", type=Path, default=None, help="default: report/<parent run id>")
    parser.add_argument("--ui-port", type=int, default=UI_PORT, help="the port of the printed `mlflow ui` command")
    parser.add_argument("--baseline", default=None, help="the arm the others are compared with, e.g. 'amp=o0' "
                                                         "(default: the first job's)")
    parser.add_argument("--margin", type=float, default=MARGIN,
                        help="points within which two arms count as equal (default: %(default)s)")
    args = parser.parse_args(argv)

    uri = resolve_uri(args.tracking_uri, Path.cwd())
    local = local_store_path(uri)
    if local is not None and not local.exists():  # MLflow would create an empty store there
        raise SystemExit(f"no MLflow store at {uri}: run the report from the directory the runs were started in, or "
                         "name the store with --tracking-uri (e.g. sqlite:///path/to/mlflow.db or http://host:5000)")
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name(args.experiment)
    if experiment is None:
        raise SystemExit(f"experiment '{args.experiment}' not found at {client.tracking_uri}; pass --experiment, or "
                         "--tracking-uri for another store")
    parent = find_parent(client, experiment.experiment_id, args.sweep)
    try:
        report = sweep_report(uri, args.experiment, parent.info.run_id, args.metric, args.epoch, args.out,
                              args.ui_port, args.baseline, args.margin)
    except (LookupError, ValueError) as err:
        raise SystemExit(str(err)) from err
    print(report.text, end="")
    return report.table


if __name__ == "__main__":
    main()
