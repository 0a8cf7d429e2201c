"""What earlier runs in the store say before a sweep starts: how long its jobs take, and how large a gap its seeds
can resolve (the seed-to-seed noise of earlier sweeps of the same experiment).

"The same experiment" is runs tagged with the same group choices (`choice.experiment`, `choice.model`, ... as each
run's tags record them), FINISHED. The noise is pooled over earlier sweeps' arms at the screening epoch: the
spread over seeds within an arm (sd), and the spread of the per-seed differences between an arm and its sweep's
first arm (paired sd), which is what a paired verdict's interval is made of (swinexp/tracking/verdict.py).
"""
from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from mlflow.entities import Run
from mlflow.tracking import MlflowClient

from swinexp.tracking.arms import at_epoch_key, seed_of, without_seed
from swinexp.tracking.protocol import STOPPED_TAG
from swinexp.tracking.verdict import CONFIDENCE, t_quantile

MAX_RUNS = 500          # the newest runs of the experiment read for an estimate
MAX_HISTORY_READS = 60  # runs logged before `<metric>_at<epoch>` existed: their curve is read, up to this many


def matching_runs(client: MlflowClient, experiment_id: str, choices: Mapping[str, str]) -> list[Run]:
    """FINISHED runs whose `choice.<group>` tags equal `choices` (a group absent from `choices` may be anything),
    newest first; a sweep's parent runs are not runs of the experiment."""
    clauses = ["attributes.status = 'FINISHED'", *(f"tags.`choice.{group}` = '{value}'"
                                                   for group, value in choices.items())]
    runs = client.search_runs([experiment_id], " and ".join(clauses), max_results=MAX_RUNS,
                              order_by=["attributes.start_time DESC"])
    return [r for r in runs if r.data.tags.get("sweep.role") != "parent" and r.info.end_time]


def epochs_ran(run: Run) -> int | None:
    """The epochs a run trained: where a screen stopped, else all of `trainer.epochs`."""
    stopped = run.data.tags.get(STOPPED_TAG) or run.data.params.get("trainer.epochs")
    try:
        return int(stopped) if stopped else None
    except ValueError:
        return None


def seconds_per_epoch(runs: Sequence[Run]) -> float | None:
    """The median wall time per epoch over `runs` (start to end of the run: compile, data and eval included)."""
    rates = [(r.info.end_time - r.info.start_time) / 1000 / n for r in runs if (n := epochs_ran(r))]
    return statistics.median(rates) if rates else None


@dataclass(frozen=True)
class Noise:
    """Seed-to-seed noise at one epoch, pooled over earlier sweeps."""

    sd: float | None         # the spread of one arm's value over its seeds (pooled sample sd)
    paired_sd: float | None  # the spread of the per-seed difference between two arms of one sweep (pooled)
    sweeps: int              # earlier sweeps it came from
    runs: int                # their runs with a value at the epoch

    def unpaired_floor(self) -> float | None:
        """With one seed per arm: a gap below this (1.96·√2·sd) is within the noise of two single runs."""
        return 1.96 * math.sqrt(2) * self.sd if self.sd is not None else None

    def resolvable(self, seeds: int) -> tuple[float, str] | None:
        """The 95% interval's half-width `seeds` seeds per arm would give, and how it was estimated: paired (the
        t interval of the differences) where earlier sweeps paired arms, else unpaired (two arms' means)."""
        if seeds < 2:
            return None
        t = t_quantile((1 + CONFIDENCE) / 2, seeds - 1)
        if self.paired_sd is not None:
            return t * self.paired_sd / math.sqrt(seeds), "paired"
        if self.sd is not None:
            return t_quantile((1 + CONFIDENCE) / 2, 2 * seeds - 2) * self.sd * math.sqrt(2 / seeds), "unpaired"
        return None


def _pooled_sd(groups: Sequence[Sequence[float]]) -> float | None:
    """sqrt(Σ(nᵢ−1)·sᵢ² / Σ(nᵢ−1)) over the groups with 2 or more values."""
    usable = [g for g in groups if len(g) >= 2]
    dof = sum(len(g) - 1 for g in usable)
    if not dof:
        return None
    return math.sqrt(sum((len(g) - 1) * statistics.variance(g) for g in usable) / dof)


def _value_at(client: MlflowClient, run: Run, metric: str, epoch: int, reads: list[int]) -> float | None:
    logged = run.data.metrics.get(at_epoch_key(metric, epoch))
    if logged is not None:
        return logged
    if reads[0] >= MAX_HISTORY_READS:
        return None
    reads[0] += 1
    return next((m.value for m in client.get_metric_history(run.info.run_id, metric) if m.step == epoch), None)


def seed_noise(client: MlflowClient, runs: Sequence[Run], metric: str, epoch: int) -> Noise:
    """The noise of `metric` at `epoch` among the sweep jobs of `runs` (grouped by their `sweep.id`)."""
    sweeps: dict[str, list[Run]] = {}
    for run in runs:
        if sweep := run.data.tags.get("sweep.id"):
            sweeps.setdefault(sweep, []).append(run)
    within: list[list[float]] = []
    differences: list[list[float]] = []
    used_sweeps = used_runs = 0
    reads = [0]
    for jobs in sweeps.values():
        jobs.sort(key=lambda r: int(r.data.tags.get("sweep.job", 0)))
        arms: dict[str, dict[str, float]] = {}
        for run in jobs:
            value = _value_at(client, run, metric, epoch, reads)
            if value is not None:
                arms.setdefault(without_seed(run.info.run_name), {})[seed_of(run)] = value
        if not any(len(seeds) >= 2 for seeds in arms.values()):
            continue  # one seed per arm: it says nothing about the seed's effect
        used_sweeps += 1
        used_runs += sum(len(seeds) for seeds in arms.values())
        within += [list(seeds.values()) for seeds in arms.values()]
        baseline, *others = arms.values()
        for arm in others:
            common = sorted(set(arm) & set(baseline))
            differences.append([arm[s] - baseline[s] for s in common])
    return Noise(_pooled_sd(within), _pooled_sd(differences), used_sweeps, used_runs)
