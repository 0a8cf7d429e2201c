"""Optuna studies of a search (`hparams_search=swin_lr_wd`): where a study lives, and a trial's side of pruning.

The sweeper (`hydra/sweeper=swinexp_optuna`, in hydra_plugins/swinexp_optuna) asks the study for trials and tells it
their results; each trial runs as a job of the Hydra launcher, in a process of its own or on another node. The job
finds its study and trial through its environment (`hydra.job.env_set`, like the sweep's MLflow parent run, see
`swinexp.app.sweep_callback`): it reports `optimized_metric` after every epoch and asks the study's pruner whether to
go on.

A study is persistent: a journal file beside the sweep directory (`<sweep dir>.optuna.journal`; safe on a shared
filesystem, Optuna locks it with a symlink) unless `hydra.sweeper.storage` names an SQL URL. The same study name and
storage continue a search that was killed.
"""
from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from difflib import get_close_matches
from pathlib import Path
from typing import TYPE_CHECKING, Any

from swinexp.registry import ConfigError

if TYPE_CHECKING:
    import optuna

log = logging.getLogger("swinexp")

STUDY_ENV = "SWINEXP_OPTUNA_STUDY"  # JSON {"storage", "study_name", "pruner"}: the same for every trial of a sweep
TRIAL_ENV = "SWINEXP_OPTUNA_TRIAL"  # the job's trial number
SWEEPER_TARGET = "hydra_plugins.swinexp_optuna.optuna_sweeper.OptunaSweeper"
JOURNAL_SUFFIX = ".optuna.journal"
# trial and study user attributes
PRUNED_ATTR = "pruned_at_epoch"    # set by the trial's process when the pruner stops it
RUN_DIR_ATTR = "run_dir"           # set by the trial's process: where it runs (its checkpoints continue it)
PARENT_RUN_ATTR = "mlflow_parent_run_id"  # the study's MLflow parent run: a continued search logs into it again
STATE_TAG = "optuna.state"         # on a trial's MLflow run: PRUNED or COMPLETE


def _median(**kwargs: Any) -> optuna.pruners.BasePruner:
    import optuna

    return optuna.pruners.MedianPruner(**kwargs)


def _percentile(**kwargs: Any) -> optuna.pruners.BasePruner:
    import optuna

    return optuna.pruners.PercentilePruner(**kwargs)


def _successive_halving(**kwargs: Any) -> optuna.pruners.BasePruner:
    import optuna

    return optuna.pruners.SuccessiveHalvingPruner(**kwargs)


def _hyperband(**kwargs: Any) -> optuna.pruners.BasePruner:
    import optuna

    return optuna.pruners.HyperbandPruner(**kwargs)


def _no_pruning() -> optuna.pruners.BasePruner:
    import optuna

    return optuna.pruners.NopPruner()


def _tpe(**kwargs: Any) -> optuna.samplers.BaseSampler:
    import optuna

    return optuna.samplers.TPESampler(**kwargs)


def _random(**kwargs: Any) -> optuna.samplers.BaseSampler:
    import optuna

    return optuna.samplers.RandomSampler(**kwargs)


# `hydra.sweeper.pruner` / `.sampler`: `name:` plus the Optuna class's keyword arguments (steps are epochs, from 1)
PRUNERS = {"median": _median, "percentile": _percentile, "successive_halving": _successive_halving,
           "hyperband": _hyperband, "none": _no_pruning}
SAMPLERS = {"tpe": _tpe, "random": _random}


def _build(table: Mapping[str, Any], what: str, spec: Mapping[str, Any]) -> Any:
    kwargs = {k: v for k, v in spec.items() if k != "name"}
    name = str(spec.get("name", "none" if what == "pruner" else "tpe"))
    if name not in table:
        hint = get_close_matches(name, table, n=1)
        raise ConfigError(f"hydra.sweeper.{what}.name='{name}' is not an Optuna {what} swinexp builds. Choose one "
                          f"of: {', '.join(table)}" + (f". Did you mean '{hint[0]}'?" if hint else ""))
    try:
        return table[name](**kwargs)
    except (TypeError, ValueError) as err:
        raise ConfigError(f"hydra.sweeper.{what} ({name}): {err}") from err


def build_pruner(spec: Mapping[str, Any]) -> optuna.pruners.BasePruner:
    """`{'name': 'median', 'n_warmup_steps': 10}` -> MedianPruner(n_warmup_steps=10)."""
    return _build(PRUNERS, "pruner", spec)


def build_sampler(spec: Mapping[str, Any]) -> optuna.samplers.BaseSampler:
    return _build(SAMPLERS, "sampler", spec)


def storage_url(storage: str | None, sweep_dir: Path) -> str:
    """`hydra.sweeper.storage`, or (null) the journal file beside the sweep directory, as an absolute path."""
    return storage if storage else str(sweep_dir.resolve()) + JOURNAL_SUFFIX


def open_storage(url: str) -> optuna.storages.BaseStorage:
    """An SQL URL (`sqlite:///…`, `postgresql://…`) as Optuna's RDB storage; any other string is a journal file."""
    import optuna

    if "://" in url:
        return optuna.storages.RDBStorage(url)
    Path(url).parent.mkdir(parents=True, exist_ok=True)
    return optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(url))


def continued_parent_run(sweeper: Mapping[str, Any], sweep_dir: Path) -> str | None:
    """The MLflow parent run of the study a search sweep continues (same study name and storage), or None.

    Args:
        sweeper: the sweep's `hydra.sweeper` settings.
        sweep_dir: the sweep's `hydra.sweep.dir`.
    """
    if sweeper.get("_target_") != SWEEPER_TARGET:
        return None
    url = storage_url(sweeper.get("storage"), sweep_dir)
    if "://" not in url and not Path(url).is_file():
        return None
    import optuna

    try:
        study = optuna.load_study(study_name=str(sweeper["study_name"]), storage=open_storage(url))
    except KeyError:  # no study of that name in the storage yet
        return None
    return study.user_attrs.get(PARENT_RUN_ATTR)


@dataclass
class TrialPruning:
    """What `fit` calls after every epoch (`should_stop`): report the metric to the trial, ask the pruner.

    The epoch number counts from 1, as the MLflow steps do; a pruned trial stops there like a run with
    `trainer.stop_after_epoch` at that epoch (checkpointed, continuable), and the trial records the epoch. The last
    epoch is only reported: a trial that ran its whole schedule is complete, whatever the pruner thinks of it.
    """

    trial: optuna.trial.Trial
    metric: str
    last_epoch: int
    pruned_at: int | None = field(default=None, init=False)

    def __call__(self, epoch: int, metrics: Mapping[str, float]) -> bool:
        self.trial.report(float(metrics[self.metric]), step=epoch)
        if epoch >= self.last_epoch or not self.trial.should_prune():
            return False
        self.pruned_at = epoch
        self.trial.set_user_attr(PRUNED_ATTR, epoch)
        log.info("optuna: trial %d is pruned after epoch %d (%s %.4g)", self.trial.number, epoch, self.metric,
                 metrics[self.metric])
        return True

    def tags(self) -> dict[str, str | None]:
        return {STATE_TAG: "PRUNED" if self.pruned_at is not None else "COMPLETE",
                "optuna.pruned_at_epoch": str(self.pruned_at) if self.pruned_at is not None else None}


@dataclass(frozen=True)
class StudyTrial:
    """The study and trial a job of a search runs (from its environment); None outside a search."""

    storage: str
    study_name: str
    pruner: dict[str, Any]
    number: int

    @classmethod
    def of(cls, env_set: Mapping[str, str] | None) -> StudyTrial | None:
        """From the job's `hydra.job.env_set` (set by the sweeper), else the process environment."""
        given = {**os.environ, **(env_set or {})}
        if not given.get(STUDY_ENV) or given.get(TRIAL_ENV) in (None, ""):
            return None
        study = json.loads(given[STUDY_ENV])
        return cls(study["storage"], study["study_name"], study.get("pruner") or {}, int(given[TRIAL_ENV]))

    def tags(self) -> dict[str, str]:
        return {"optuna.study": self.study_name, "optuna.trial": str(self.number)}

    def pruning(self, metric: str, run_dir: Path, last_epoch: int) -> TrialPruning:
        """Open the trial in the study, with the study's pruner, and record where it runs; `last_epoch`: the one its
        run ends with anyway (trainer.stop_after_epoch or trainer.epochs)."""
        import optuna

        storage = open_storage(self.storage)
        trial_id = storage.get_trial_id_from_study_id_trial_number(storage.get_study_id_from_name(self.study_name),
                                                                   self.number)
        study = optuna.load_study(study_name=self.study_name, storage=storage, pruner=build_pruner(self.pruner))
        trial = optuna.trial.Trial(study, trial_id)
        trial.set_user_attr(RUN_DIR_ATTR, str(run_dir.resolve()))
        return TrialPruning(trial, metric, last_epoch)
