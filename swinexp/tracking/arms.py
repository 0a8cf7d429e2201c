"""A sweep's runs as arms × seeds: each arm's gap to the baseline at the screening epoch, as a table and in MLflow.

An arm is the runs whose names differ only in `seed=` (the sweep's keys other than the seed); runs of two arms that
share a seed are paired (swinexp/tracking/verdict.py). Needs only each run's metric history, so it works for sweeps
logged before the verdicts existed.
"""
from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from mlflow.entities import Run
from mlflow.tracking import MlflowClient

from swinexp.tracking.protocol import STOPPED_TAG
from swinexp.tracking.ui import ARM_TAG
from swinexp.tracking.verdict import MARGIN, METHOD, Gap, Interval, Seed, compare, paired_interval

Curve = Mapping[int, float]  # epoch -> value
AMP_EFFECTIVE_TAG = "amp.effective"  # every training run's: its amp policy as the chip computes it (amp/precision.py)


def without_seed(name: str) -> str:
    return " ".join(part for part in name.split() if not part.startswith("seed=")) or "(seed only)"


def effective_name(name: str, effective: str | None) -> str:
    """`name` with its `amp=<value>` naming what the policy computed where that differs, e.g. 'amp=o0 seed=1' ->
    'amp=o0 (fp32 except Cube inputs: fp16 on ascend910) seed=1'."""
    if not effective:
        return name
    return " ".join(f"amp={effective}" if part.startswith("amp=") else part for part in name.split())


def arm_labels(runs: Sequence[Run]) -> dict[str, str]:
    """arm -> its name as a report shows it: amp named as its runs computed it (their `amp.effective` tag)."""
    labels: dict[str, str] = {}
    for run in runs:
        arm = without_seed(run.info.run_name)
        if labels.get(arm, arm) == arm:  # the first run that names what it computed
            labels[arm] = effective_name(arm, run.data.tags.get(AMP_EFFECTIVE_TAG))
    if len(set(labels.values())) < len(labels):  # two arms must never read as one
        return {arm: arm for arm in labels}
    return labels


def job_label(run: Run) -> str:
    return effective_name(run.info.run_name, run.data.tags.get(AMP_EFFECTIVE_TAG))


def tag_arms(client: MlflowClient, runs: Sequence[Run], labels: Mapping[str, str]) -> None:
    """Tag each run with its arm's label (`sweep.arm`): the group the sweep's MLflow view draws as one line."""
    for run in runs:
        label = labels[without_seed(run.info.run_name)]
        if run.data.tags.get(ARM_TAG) != label:
            client.set_tag(run.info.run_id, ARM_TAG, label)


def run_status(run: Run) -> str:
    """MLflow's status, or 'screen @N' for a run that trainer.stop_after_epoch=N ended (FINISHED, resumable)."""
    stopped = run.data.tags.get(STOPPED_TAG)
    return f"screen @{stopped}" if stopped and run.info.status == "FINISHED" else run.info.status


def seed_of(run: Run) -> Seed:
    """The run's seed: from its name (a swept `seed=`), else its logged `seed` param (the sweep's fixed seed)."""
    for part in run.info.run_name.split():
        if part.startswith("seed="):
            return part[len("seed="):]
    return run.data.params.get("seed", "?")


@dataclass(frozen=True)
class Arms:
    """The valid value of each arm's seeds at one epoch, and the seeds left out with why."""

    values: dict[str, dict[Seed, float]]
    excluded: dict[str, dict[Seed, str]]


def arm_values(runs: Sequence[Run], curves: Sequence[Curve], metric: str, epoch: int) -> Arms:
    """Group `runs` (with their `metric` curves) into arms; a seed counts if its run ended well and has `epoch`."""
    values: dict[str, dict[Seed, float]] = {}
    excluded: dict[str, dict[Seed, str]] = {}
    for run, curve in zip(runs, curves):
        arm, seed, status = without_seed(run.info.run_name), seed_of(run), run.info.status
        values.setdefault(arm, {})
        if status != "FINISHED":  # a failed, killed or still running job: its curve stops short of its schedule
            excluded.setdefault(arm, {})[seed] = status
        elif epoch not in curve:
            last = f"its last is at epoch {max(curve)}" if curve else "it has none"
            excluded.setdefault(arm, {})[seed] = f"has no {metric} at epoch {epoch} ({last})"
        elif seed in values[arm]:
            excluded.setdefault(arm, {})[seed] = f"ran twice ({run.info.run_name}); the first run counts"
        else:
            values[arm][seed] = curve[epoch]
    return Arms(values, excluded)


def _signed(x: float) -> str:
    return f"{x:+.2f}"


def _interval(gap: Gap, paired: bool) -> str:
    found = gap.paired if paired else gap.unpaired
    return f"[{_signed(found.lo)}, {_signed(found.hi)}]" if found else "—"


VERDICT_HEADER = ("arm − baseline", "paired seeds", "mean gap", "95% interval, paired", "95% interval, unpaired",
                  "verdict")


def verdict_rows(gaps: Sequence[Gap], labels: Mapping[str, str] | None = None) -> list[list[str]]:
    """One row of VERDICT_HEADER per gap, each arm named by its `labels` entry where it has one."""
    name = (labels or {}).get
    return [[f"{name(g.arm, g.arm)} − {name(g.baseline, g.baseline)}",
             f"{len(g.seeds)} ({', '.join(g.seeds)})" if g.seeds else "0",
             _signed(g.mean) if g.mean is not None else "—", _interval(g, True), _interval(g, False),
             f"{g.verdict}: {g.reason}" if g.reason else g.verdict] for g in gaps]


def verdict_title(metric: str, epoch: int, gaps: Sequence[Gap], labels: Mapping[str, str] | None = None) -> str:
    baseline = gaps[0].baseline
    return f"Verdicts: {metric} at epoch {epoch}, each arm against {(labels or {}).get(baseline, baseline)}"


def left_out(gaps: Sequence[Gap]) -> list[str]:
    """The seeds each comparison left out, once each."""
    return list(dict.fromkeys(line for g in gaps for line in g.excluded))


def verdict_markdown(gaps: Sequence[Gap], metric: str, epoch: int, labels: Mapping[str, str] | None = None) -> str:
    """The verdict table, the method under it and the seeds left out; '' with no second arm to compare."""
    if not gaps:
        return ""
    lines = [f"## {verdict_title(metric, epoch, gaps, labels)}", "", "| " + " | ".join(VERDICT_HEADER) + " |",
             "|" + "---|" * len(VERDICT_HEADER)]
    lines += ["| " + " | ".join(row) + " |" for row in verdict_rows(gaps, labels)]
    lines += ["", METHOD]
    if excluded := left_out(gaps):
        lines += ["", "Left out (never averaged in): " + "; ".join(excluded)]
    return "\n".join(lines) + "\n\n"


def at_epoch_key(metric: str, epoch: int) -> str:
    """'val/top1_at10': MLflow refuses '@' in a metric name."""
    return f"{metric}_at{epoch}"


def _safe(text: str) -> str:
    return re.sub(r"[^\w.\- /]", "_", text)  # the characters MLflow takes in a metric name


def gap_keys(gaps: Sequence[Gap], epoch: int) -> dict[str, str]:
    """arm -> 'o2-o0_at10' (the values of 'amp=o2' against 'amp=o0'), the stem of its `gap/` and `verdict/` names;
    the whole arm names where values alone would collide."""
    if not gaps:
        return {}
    names = [gaps[0].baseline, *(g.arm for g in gaps)]
    labels = {name: _safe(" ".join(part.split("=", 1)[-1] for part in name.split())) for name in names}
    if len(set(labels.values())) < len(names):
        labels = {name: _safe(name) for name in names}
    return {g.arm: f"{labels[g.arm]}-{labels[g.baseline]}_at{epoch}" for g in gaps}


def log_verdicts(client: MlflowClient, parent_id: str, runs: Sequence[Run], curves: Sequence[Curve], metric: str,
                 epoch: int, gaps: Sequence[Gap]) -> None:
    """Each run's value at `epoch` as `<metric>_at<epoch>`; on the parent, `gap/<arm>-<baseline>_at<epoch>` (with
    `_lo`/`_hi` where there is an interval) and a `verdict/...` tag per gap. A value already logged is not logged
    again, so making the report twice leaves one point per metric."""
    def log(run: Run, key: str, value: float) -> None:
        if run.data.metrics.get(key) != value:
            client.log_metric(run.info.run_id, key, value, step=epoch)

    for run, curve in zip(runs, curves):
        if epoch in curve:
            log(run, at_epoch_key(metric, epoch), curve[epoch])
    parent = client.get_run(parent_id)
    for g, row in zip(gaps, verdict_rows(gaps)):
        stem = gap_keys(gaps, epoch)[g.arm]
        if g.mean is not None:
            log(parent, f"gap/{stem}", g.mean)
        if g.paired is not None:
            log(parent, f"gap/{stem}_lo", g.paired.lo)
            log(parent, f"gap/{stem}_hi", g.paired.hi)
        interval = f" {_interval(g, True)}" if g.paired is not None else ""
        client.set_tag(parent_id, f"verdict/{stem}", f"{row[-1]} (gap {row[2]}{interval}, paired seeds {row[1]})")


def match_arm(name: str, arms: Sequence[str]) -> str:
    """The arm `name` means: an arm's whole name ('amp=o2') or its values alone ('o2', as `sweep.baseline=o2` is
    typed without quoting the '=').

    Raises:
        ValueError: no arm, or more than one, has that name, listing the arms.
    """
    if name in arms:
        return name
    found = [arm for arm in arms if " ".join(part.split("=", 1)[-1] for part in arm.split()) == name]
    if len(found) != 1:
        raise ValueError(f"baseline '{name}' is {'not an arm' if not found else 'more than one arm'} of this sweep; "
                         f"choose one of: {', '.join(arms)} (e.g. sweep.baseline='{arms[0] if arms else ''}')")
    return found[0]


def gaps_of(runs: Sequence[Run], curves: Sequence[Curve], metric: str, epoch: int, baseline: str | None = None,
            margin: float = MARGIN) -> list[Gap]:
    """Each arm of `runs` against `baseline` (default: the arm of the first run; see `match_arm`) at `epoch`."""
    arms = arm_values(runs, curves, metric, epoch)
    named = list(dict.fromkeys([*arms.values, *arms.excluded]))
    return compare(arms.values, match_arm(baseline, named) if baseline is not None else None, arms.excluded, margin)


@dataclass(frozen=True)
class Arm:
    """One arm's runs for a chart: the finished seeds' curves (its mean and band) and the runs that did not finish
    (drawn on their own, kept out of the mean and band)."""

    name: str                     # the arm as reports show it (its label)
    finished: dict[str, Curve]    # job label -> curve, FINISHED runs
    unfinished: dict[str, Curve]  # job label -> curve, with the run's status in the label

    def band(self) -> dict[int, tuple[float, float, float]]:
        """epoch -> (mean, min, max) over the finished seeds that logged it."""
        epochs = sorted({e for c in self.finished.values() for e in c})
        values = {e: [c[e] for c in self.finished.values() if e in c] for e in epochs}
        return {e: (sum(v) / len(v), min(v), max(v)) for e, v in values.items()}


def chart_arms(runs: Sequence[Run], curves: Sequence[Curve]) -> list[Arm]:
    """`runs` with their curves as arms, in the order of their first job, labelled as `arm_labels` names them."""
    labels = arm_labels(runs)
    arms: dict[str, Arm] = {}
    for run, curve in zip(runs, curves):
        arm = arms.setdefault(without_seed(run.info.run_name),
                              Arm(labels[without_seed(run.info.run_name)], {}, {}))
        if run.info.status == "FINISHED":
            arm.finished[job_label(run)] = dict(curve)
        else:
            arm.unfinished[f"{job_label(run)} ({run.info.status})"] = dict(curve)
    return list(arms.values())


def paired_differences(runs: Sequence[Run], curves: Sequence[Curve], baseline: str) -> dict[str, dict[int, Interval]]:
    """Each other arm's difference to `baseline` at every epoch, over the seeds both ran to that epoch (finished
    runs only): the paired 95% interval from 2 seeds on, the difference itself (a zero-width interval) from one.

    Args:
        runs, curves: The sweep's runs and their curves of one metric.
        baseline: The baseline arm's name (a run name without `seed=`).
    """
    finished: dict[str, dict[Seed, Curve]] = {}
    for run, curve in zip(runs, curves):
        if run.info.status == "FINISHED":
            finished.setdefault(without_seed(run.info.run_name), {}).setdefault(seed_of(run), curve)
    base = finished.get(baseline, {})
    out: dict[str, dict[int, Interval]] = {}
    for arm, seeds in finished.items():
        if arm == baseline:
            continue
        series: dict[int, Interval] = {}
        for e in sorted({e for c in seeds.values() for e in c}):
            diffs = [seeds[s][e] - base[s][e] for s in seeds if s in base and e in seeds[s] and e in base[s]]
            if len(diffs) >= 2:
                series[e] = paired_interval(diffs)
            elif diffs:
                series[e] = Interval(diffs[0], diffs[0], diffs[0])
        out[arm] = series
    return out
