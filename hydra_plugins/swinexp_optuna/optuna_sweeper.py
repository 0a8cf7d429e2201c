"""`hydra/sweeper=swinexp_optuna`: an Optuna search on current Optuna, ask-and-tell over the Hydra launcher.

Each round asks the study for `n_jobs` trials and hands them to the launcher as one batch of jobs (the isolated
launcher runs them in parallel on the host's cards or cores, submitit as SLURM jobs); job number = trial number, so
trial 7 runs in `<sweep dir>/7` and is the MLflow child tagged `sweep.job=7` and `optuna.trial=7`. Each job reports
`optimized_metric` to its trial after every epoch and stops where the study's pruner says (swinexp.tracking.study);
when the batch returns, the sweeper tells the study each result: COMPLETE with the job's value, PRUNED, or FAIL.

The study is persistent (a journal file `<sweep dir>.optuna.journal`, or `storage: sqlite:///...`), and `n_trials`
counts all its trials: the same command after a kill tells the study what the killed round's finished jobs left in
their run dirs, reruns the unfinished trials in their own run dirs (their checkpoints continue them, in the same
MLflow run), and asks only for the trials still missing. One sweep process per study at a time.

At the end, `<sweep dir>/optimization_results.yaml` holds the best trial (the parent MLflow run gets it as best.*,
see swinexp.app.sweep_callback) and `<sweep dir>/optuna/` the study's trial table and plots (logged to the parent too).
"""
# Hydra's plugin scan runs this module outside sys.modules, where a dataclass cannot resolve string annotations:
# so no `from __future__ import annotations`, and Optional[...] where a dataclass or signature evaluates the type.
# Optuna is imported only when a search starts: every `python run.py` scans the plugins.
# ruff: noqa: FA100

import json
import logging
import math
import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import IntervalSweep, Override, RangeSweep, Transformer
from hydra.core.plugins import Plugins
from hydra.core.utils import JobReturn, JobStatus
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf

from swinexp.app.sweep_callback import PARENT_RUN_ENV, RESULT_FILE, for_every_job
from swinexp.registry import ConfigError
from swinexp.tracking.study import (
    PARENT_RUN_ATTR,
    PRUNED_ATTR,
    RUN_DIR_ATTR,
    STUDY_ENV,
    TRIAL_ENV,
    build_pruner,
    build_sampler,
    open_storage,
    storage_url,
)

log = logging.getLogger(__name__)

RESULTS_FILE = "optimization_results.yaml"  # read by SweepCallback (best.* on the parent run)
STUDY_DIR = "optuna"                        # <sweep dir>/optuna: trials.csv and the plots


@dataclass
class OptunaSweeperConf:
    _target_: str = "hydra_plugins.swinexp_optuna.optuna_sweeper.OptunaSweeper"
    study_name: str = "swinexp"                 # with the same storage, a rerun continues the study
    storage: Optional[str] = None               # null: <sweep dir>.optuna.journal | sqlite:///… | postgresql://…
    direction: str = "maximize"                 # of optimized_metric
    n_trials: int = 20                          # trials in the study, those of earlier (killed) sweeps included
    n_jobs: int = 1                             # trials per batch of the launcher (set hydra.launcher.max_parallel)
    sampler: dict[str, Any] = field(default_factory=lambda: {"name": "tpe"})    # name + the Optuna class's kwargs
    pruner: dict[str, Any] = field(default_factory=lambda: {"name": "none"})    # median | successive_halving | ...
    params: Optional[dict[str, str]] = None     # key: Hydra sweep syntax (interval, tag(log, …), choice, range)


ConfigStore.instance().store(group="hydra/sweeper", name="swinexp_optuna", node=OptunaSweeperConf,
                             provider="swinexp")


def distribution(override: Override) -> Any:
    """A sweep override as an Optuna distribution: `interval(a, b)` (floats; `tag(log, …)`: log scale), `choice(…)`,
    `range(start, stop, step)` (ints if all three are; a shuffled range: a choice)."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    value = override.value()
    if override.is_choice_sweep() or (override.is_range_sweep() and value.shuffle):
        return CategoricalDistribution(list(override.sweep_iterator(transformer=Transformer.encode)))
    if override.is_range_sweep():
        assert isinstance(value, RangeSweep)
        values = list(override.sweep_iterator())  # Hydra's expansion (stop excluded); Optuna's high is included
        if any(isinstance(x, float) for x in (value.start, value.stop, value.step)):
            return FloatDistribution(values[0], values[-1], step=value.step)
        return IntDistribution(values[0], values[-1], step=value.step)
    if override.is_interval_sweep():
        assert isinstance(value, IntervalSweep)
        log_scale = "log" in value.tags
        if isinstance(value.start, int) and isinstance(value.end, int):
            return IntDistribution(value.start, value.end, log=log_scale)
        return FloatDistribution(value.start, value.end, log=log_scale)
    raise ConfigError(f"hydra.sweeper.params: '{override.input_line}' is not a search space Optuna can sample; use "
                      "interval(a, b), tag(log, interval(a, b)), choice(x, y, ...) or range(start, stop, step)")


def search_space(params: Optional[dict[str, str]], arguments: Sequence[str]) -> tuple[dict[str, Any], list[str]]:
    """(the searched keys and their distributions, the fixed overrides every trial gets) from `hydra.sweeper.params`
    and the command line (which wins for the same key)."""
    given = [f"{k}={v}" for k, v in (params or {}).items()] + list(arguments)
    parsed = {o.get_key_element(): o for o in OverridesParser.create().parse_overrides(given)}
    space = {key: distribution(o) for key, o in parsed.items() if o.is_sweep_override()}
    fixed = [o.input_line for o in parsed.values() if not o.is_sweep_override()]
    return space, fixed


def _consecutive(numbers: list[int]) -> list[list[int]]:
    groups: list[list[int]] = []
    for n in sorted(numbers):
        if groups and groups[-1][-1] == n - 1:
            groups[-1].append(n)
        else:
            groups.append([n])
    return groups


class OptunaSweeper(Sweeper):
    def __init__(self, study_name: str, storage: Optional[str], direction: str, n_trials: int, n_jobs: int,
                 sampler: dict[str, Any], pruner: dict[str, Any], params: Optional[dict[str, str]]) -> None:
        if n_jobs < 1 or n_trials < 1:
            raise ConfigError(f"hydra.sweeper.n_jobs={n_jobs} and n_trials={n_trials} must be >= 1")
        if direction not in ("maximize", "minimize"):
            raise ConfigError(f"hydra.sweeper.direction='{direction}': choose maximize or minimize")
        self.study_name, self.storage, self.direction = study_name, storage, direction
        self.n_trials, self.n_jobs = n_trials, n_jobs
        self.sampler, self.pruner = _plain(sampler), _plain(pruner)
        self.params = dict(params) if params else None
        self.config: Optional[DictConfig] = None
        self.hydra_context: Optional[HydraContext] = None
        self.launcher: Any = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config, self.hydra_context = config, hydra_context
        self.launcher = Plugins.instance().instantiate_launcher(config=config, hydra_context=hydra_context,
                                                                task_function=task_function)

    def sweep(self, arguments: list[str]) -> None:
        import optuna

        assert self.config is not None
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        space, fixed = search_space(self.params, arguments)
        if not space:
            raise ConfigError("hydra/sweeper=swinexp_optuna has nothing to search: give hydra.sweeper.params or "
                              "sweep overrides such as 'optimizer.lr=tag(log, interval(1e-5, 1e-2))'")
        url = storage_url(self.storage, sweep_dir)
        study = optuna.create_study(study_name=self.study_name, storage=open_storage(url), direction=self.direction,
                                    sampler=build_sampler(self.sampler), pruner=build_pruner(self.pruner),
                                    load_if_exists=True)
        if study.trials and self.sampler.get("seed") is not None:  # a continued study: a sampler seeded as before
            # would draw the first command's points again
            study.sampler = build_sampler({**self.sampler, "seed": int(self.sampler["seed"]) + len(study.trials)})
        for_every_job(self.config, {STUDY_ENV: json.dumps({"storage": url, "study_name": self.study_name,
                                                           "pruner": self.pruner})})
        if os.environ.get(PARENT_RUN_ENV) and PARENT_RUN_ATTR not in study.user_attrs:
            study.set_user_attr(PARENT_RUN_ATTR, os.environ[PARENT_RUN_ENV])
        leftover = self._leftover(study, sweep_dir)
        done = len(study.get_trials(deepcopy=False, states=_finished()))
        log.info(f"Optuna study '{self.study_name}' in {url}: {done} of {self.n_trials} trials done"
                 + (f", {len(leftover)} to continue ({', '.join(map(str, leftover))})" if leftover else ""))
        while leftover or done < self.n_trials:
            batch = leftover[:self.n_jobs]
            leftover = leftover[len(batch):]
            batch += [study.ask(space).number for _ in range(min(self.n_jobs - len(batch),
                                                                 self.n_trials - done - len(batch)))]
            self._run(study, batch, fixed)
            done += len(batch)
        self._report(study, sweep_dir)

    def _leftover(self, study: Any, sweep_dir: Path) -> list[int]:
        """Trials an earlier, killed sweep left RUNNING: tell the study those whose job ended (pruned, or its
        metrics in its run dir); return the numbers of the others, to run again in their run dirs."""
        from optuna.trial import TrialState

        again = []
        for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            result = Path(trial.user_attrs.get(RUN_DIR_ATTR, sweep_dir / str(trial.number))) / RESULT_FILE
            if PRUNED_ATTR in trial.user_attrs:
                study.tell(trial.number, state=TrialState.PRUNED)
            elif result.is_file() and _finite(value := json.loads(result.read_text()).get(self._metric())):
                study.tell(trial.number, value)
            else:
                again.append(trial.number)
        return again

    def _metric(self) -> Optional[str]:
        assert self.config is not None
        return self.config.get("optimized_metric")

    def _run(self, study: Any, numbers: list[int], fixed: list[str]) -> None:
        """Launch the trials (a launcher batch per run of consecutive numbers: job number = trial number) and tell
        the study how each ended."""
        trials = {t.number: t for t in study.get_trials(deepcopy=False)}
        for group in _consecutive(numbers):
            batch = [[*fixed, *(f"{k}={v}" for k, v in trials[n].params.items()),
                      f"++hydra.job.env_set.{TRIAL_ENV}='{n}'"] for n in group]
            self.validate_batch_is_legal(batch)
            returns = self.launcher.launch(batch, initial_job_idx=group[0])
            ended = {t.number: t for t in study.get_trials(deepcopy=False)}  # with what the jobs reported
            for number, ret in zip(group, returns):
                self._tell(study, ended[number], ret)

    def _tell(self, study: Any, trial: Any, ret: JobReturn) -> None:
        from optuna.trial import TrialState

        if ret.status is JobStatus.COMPLETED and PRUNED_ATTR in trial.user_attrs:
            study.tell(trial.number, state=TrialState.PRUNED, skip_if_finished=True)
        elif ret.status is JobStatus.COMPLETED and _finite(ret.return_value):
            study.tell(trial.number, float(ret.return_value), skip_if_finished=True)
        else:
            why = (f"{type(ret._return_value).__name__}: {ret._return_value}" if ret.status is JobStatus.FAILED
                   else f"it returned {self._metric()}={ret.return_value!r}")
            log.warning(f"Optuna trial {trial.number} failed ({why})")
            study.tell(trial.number, state=TrialState.FAIL, skip_if_finished=True)

    def _report(self, study: Any, sweep_dir: Path) -> None:
        """The best trial as `optimization_results.yaml`, the trial table and Optuna's plots in `<sweep dir>/optuna`."""
        sweep_dir.mkdir(parents=True, exist_ok=True)
        counts = {s.name: len(study.get_trials(deepcopy=False, states=(s,))) for s in _finished()}
        log.info("Optuna study '%s': %s", self.study_name, ", ".join(f"{n} {s.lower()}" for s, n in counts.items()))
        out = sweep_dir / STUDY_DIR
        out.mkdir(exist_ok=True)
        study.trials_dataframe().to_csv(out / "trials.csv", index=False)
        if not counts["COMPLETE"]:
            log.warning("Optuna study '%s' has no complete trial: no best trial", self.study_name)
            return
        best = study.best_trial
        OmegaConf.save(OmegaConf.create({
            "name": "optuna", "study_name": self.study_name, "best_params": best.params, "best_value": best.value,
            "best_job": best.number, "trials": counts}), sweep_dir / RESULTS_FILE)
        log.info(f"Best trial {best.number}: {best.params} -> {best.value}")
        _plots(study, out)


def _finished() -> tuple[Any, ...]:
    """The trial states that count towards n_trials."""
    from optuna.trial import TrialState

    return TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL


def _plain(node: Any) -> dict[str, Any]:
    return OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else dict(node)


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def _plots(study: Any, out: Path) -> None:
    """Optimization history, intermediate values (the pruned trials' curves) and parameter importances as PNGs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from optuna.exceptions import ExperimentalWarning
    from optuna.visualization import matplotlib as optuna_plt

    plots = {"optimization_history": optuna_plt.plot_optimization_history,
             "intermediate_values": optuna_plt.plot_intermediate_values,
             "param_importances": optuna_plt.plot_param_importances}
    for name, plot in plots.items():
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ExperimentalWarning)  # the matplotlib backend is "experimental"
                axes = plot(study)
        except (ValueError, RuntimeError) as err:  # e.g. importances need two complete trials
            log.warning(f"no {name} plot: {err}")
            continue
        figure = (axes.flat[0] if hasattr(axes, "flat") else axes).figure
        figure.savefig(out / f"{name}.png", dpi=100, bbox_inches="tight")
        plt.close(figure)
