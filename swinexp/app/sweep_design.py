"""A sweep's design before it runs: its arms × paired seeds, how long it should take, and which gaps its seeds can
tell from noise — from earlier runs of the same experiment in the store (swinexp/tracking/noise.py).

Printed when a grid sweep (-m) starts, and on its own by a dry run (`-m ... dry_run=true`), so the seeds are chosen
before the cards are spent.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf

from swinexp.registry import ConfigError
from swinexp.tracking import resolve_uri
from swinexp.tracking.arms import match_arm
from swinexp.tracking.noise import matching_runs, seconds_per_epoch, seed_noise
from swinexp.tracking.report import local_store_path

IDENTITY_GROUPS = ("experiment", "model", "data")  # the group choices that make runs "the same experiment"


@dataclass(frozen=True)
class Design:
    """The jobs of a grid sweep seen as arms × seeds."""

    arms: tuple[str, ...]    # each arm's swept values other than the seed, e.g. 'amp=o2'
    seeds: tuple[str, ...]   # the seeds every arm runs (paired), in order
    jobs: int
    paired: bool             # every arm runs the same seeds

    def line(self) -> str:
        arms = f"{len(self.arms)} arm{'s' if len(self.arms) != 1 else ''} ({', '.join(self.arms)})"
        if not self.seeds:
            return f"{arms}, one run each (the config's seed) = {self.jobs} jobs"
        kind = "paired seeds" if self.paired else "seeds, not the same in every arm (unpaired)"
        return f"{arms} x {len(self.seeds)} {kind} ({', '.join(self.seeds)}) = {self.jobs} jobs"


def design_of(jobs: Sequence[Sequence[str]]) -> Design:
    """The arms and seeds of `jobs`, each job the list of its swept `key=value` overrides."""
    arms: dict[str, list[str]] = {}
    for job in jobs:
        arm = " ".join(o for o in job if not o.startswith("seed=")) or "(seed only)"
        arms.setdefault(arm, []).extend(o[len("seed="):] for o in job if o.startswith("seed="))
    seed_sets = {tuple(seeds) for seeds in arms.values()}
    seeds = tuple(dict.fromkeys(s for seeds in arms.values() for s in seeds))
    return Design(tuple(arms), seeds, len(jobs), len(seed_sets) == 1 and bool(seeds))


def grid_jobs(sweeping: Sequence[str]) -> list[list[str]]:
    """The jobs Hydra's grid sweeper makes of the sweeping overrides, in its order."""
    parsed = OverridesParser.create().parse_overrides(list(sweeping))
    (jobs,) = BasicSweeper.split_arguments(parsed, max_batch_size=None)
    return [list(job) for job in jobs]


def is_grid(config: DictConfig) -> bool:
    return str(OmegaConf.select(config, "hydra.sweeper._target_") or "").endswith("BasicSweeper")


def identity(config: DictConfig, swept: Sequence[str]) -> dict[str, str]:
    """The group choices of the sweep's base config that every job shares (a swept group is not part of it)."""
    choices = OmegaConf.select(config, "hydra.runtime.choices") or {}
    return {g: str(choices[g]) for g in IDENTITY_GROUPS if choices.get(g) not in (None, "null") and g not in swept}


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 90 else f"{seconds:.0f} s"


def history_lines(tracking: Mapping[str, object], cwd: Path, choices: Mapping[str, str], design: Design,
                  epoch: int | None, epochs_per_job: int | None, metric: str, parallel: int) -> list[str]:
    """The time estimate and the noise memory from the store, or one line saying why there is none."""
    from mlflow.tracking import MlflowClient

    what = " ".join(f"{g}={v}" for g, v in choices.items()) or "this config"
    uri = resolve_uri(tracking.get("uri"), cwd)  # type: ignore[arg-type]
    local = local_store_path(uri)
    client = MlflowClient(uri) if local is None or local.exists() else None
    found = client.get_experiment_by_name(str(tracking.get("experiment", "swinexp"))) if client else None
    runs = matching_runs(client, found.experiment_id, choices) if client and found else []
    if not runs:
        return [f"no earlier runs of {what} in {uri}: no time estimate, and the seed noise is unknown until this "
                "sweep's report measures it"]
    lines = []
    per_epoch = seconds_per_epoch(runs)
    if per_epoch is not None and epochs_per_job:
        job = per_epoch * epochs_per_job
        waves = -(-design.jobs // max(parallel, 1))
        lines.append(f"estimated wall time: ~{_minutes(job * waves)} ({design.jobs} jobs, {parallel} at a time, "
                     f"~{_minutes(job)} each: {per_epoch:.0f} s per epoch x {epochs_per_job} epochs, the median of "
                     f"{len(runs)} earlier run{'s' if len(runs) != 1 else ''} of {what})")
    if epoch is None:
        return lines
    noise = seed_noise(client, runs, metric, epoch)
    if noise.sd is None:
        lines.append(f"seed noise of {metric} at epoch {epoch}: unknown (no earlier sweep of {what} ran an arm on 2 "
                     "or more seeds; this sweep's report will measure it)")
        return lines
    lines.append(f"seed noise of {metric} at epoch {epoch}, from {noise.sweeps} earlier sweep(s) of {what} "
                 f"({noise.runs} runs): sd {noise.sd:.2f} points over seeds"
                 + (f", {noise.paired_sd:.2f} for the paired difference of two arms" if noise.paired_sd is not None
                    else ""))
    lines.append(f"  with 1 seed per arm, gaps below ~{noise.unpaired_floor():.1f} points cannot be told from noise")
    if noise.paired_sd == 0:
        lines.append("  the paired differences there were the same on every seed: 2 paired seeds decide a gap like "
                     "theirs, and more seeds show whether that holds for these arms")
        return lines
    n = max(len(design.seeds), 2)
    for seeds in dict.fromkeys((n, 2 * n)):
        if found_width := noise.resolvable(seeds):
            width, how = found_width
            mine = " (this sweep)" if seeds == len(design.seeds) else ""
            lines.append(f"  {seeds} {how} seeds{mine} resolve gaps of ~{width:.1f} points (95% interval ±{width:.1f})")
    return lines


def describe(config: DictConfig, sweeping: Sequence[str], keys: Sequence[str], epoch: int | None, metric: str,
             cwd: Path) -> str:
    """The design block a grid sweep prints when it starts (and a dry run prints instead of running it)."""
    if not is_grid(config):
        return ""
    design = design_of(grid_jobs(sweeping))
    if (baseline := OmegaConf.select(config, "sweep.baseline")) is not None:
        try:
            match_arm(str(baseline), design.arms)
        except ValueError as err:
            raise ConfigError(f"sweep.baseline: {err}") from None
    parallel = int(OmegaConf.select(config, "hydra.launcher.max_parallel") or 1)
    at = f"epoch {epoch}" if epoch is not None else "the last epoch every job reached"
    lines = [f"sweep design: {design.line()}; compared at {at} ({metric})"]
    asked = OmegaConf.select(config, "seeds")
    if asked is not None and len(design.seeds) != int(asked):
        lines.append(f"  note: seeds={asked}, but the jobs run {len(design.seeds) or 'the config'}'s seed(s): a seed= "
                     "on the command line replaces the named sweep's seeds")
    if len(design.arms) > 1 and len(design.seeds) < 2:
        lines.append("  one seed per arm: the report can give no verdict on a gap; use a named sweep's seeds=3 or "
                     "add seed=0,1,2")
    if OmegaConf.select(config, "tracking.name") == "mlflow":
        epochs = OmegaConf.select(config, "trainer.stop_after_epoch") or OmegaConf.select(config, "trainer.epochs")
        lines += history_lines(OmegaConf.to_container(config.tracking, resolve=True), cwd,  # type: ignore[arg-type]
                               identity(config, keys), design, epoch, int(epochs) if epochs else None, metric,
                               parallel)
    return "\n".join(lines)
