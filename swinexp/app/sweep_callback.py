"""Hydra multirun -> MLflow: one parent run per sweep, one child run per job named by what the sweep varies.

`SweepCallback` is registered in `conf/config.yaml` under `hydra.callbacks`; Hydra calls it around the sweep and
each job. It hands the parent run id to the jobs through their config: it adds `hydra.job.env_set` overrides to
the sweep's hydra overrides, which every launcher composes into each job's config (and so ships to a job on another
node), and which set the environment of the job's process (the default launcher, `hydra/launcher=isolated`, runs
every job in a process of its own).
"""
from __future__ import annotations

import atexit
import json
import logging
import os
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.utils import JobReturn, JobStatus
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf, open_dict

from swinexp.app import sweep_design
from swinexp.app.sweep_identity import normalised
from swinexp.app.sweep_record import OpenSweep, open_sweep
from swinexp.registry import ConfigError
from swinexp.tracking import FAILED_JOBS_TAG, MlflowTracker, open_tracker
from swinexp.tracking.study import continued_parent_run

log = logging.getLogger("swinexp")

PARENT_RUN_ENV = "SWINEXP_SWEEP_PARENT_RUN_ID"
SWEEP_KEYS_ENV = "SWINEXP_SWEEP_KEYS"
JOB_NUM_ENV = "SWINEXP_SWEEP_JOB_NUM"  # set by the isolated launcher for the job process it starts
RESULT_FILE = "metrics.json"  # a job's final metrics in its run dir; the launcher reads the optimized metric there
FAILED_FILE = "job_failed.json"  # a failed job's number and reason in its dir (see write_failure)


@dataclass(frozen=True)
class SweepInfo:
    """What a job of a sweep knows about its sweep."""

    parent_run_id: str
    keys: tuple[str, ...]               # the override keys the sweep varies, e.g. ("amp",)
    job_num: int

    def run_name(self, overrides: Iterable[str]) -> str:
        """The job's own values of the varying keys, e.g. 'amp=o2'."""
        mine = [o for o in overrides if override_key(o) in self.keys]
        return " ".join(mine) or f"job {self.job_num}"

    def tags(self) -> dict[str, str]:
        return {"mlflow.parentRunId": self.parent_run_id, "sweep.id": self.parent_run_id,
                "sweep.job": str(self.job_num), "sweep.keys": ",".join(self.keys)}


def override_key(override: str) -> str:
    """'+model.qkv=split' -> 'model.qkv' (the key a user would sweep)."""
    parsed = OverridesParser.create().parse_override(override)
    return parsed.key_or_group


def sweep_overrides(config: DictConfig) -> list[str]:
    """The sweeping overrides of a multirun: from the command line and from `hydra.sweeper.params`."""
    parser = OverridesParser.create()
    params = config.hydra.sweeper.get("params")
    # resolved: a named sweep's `seed: range(0,${seeds})` is a sweep of the values `seeds` gives
    given = [f"{key}={value}" for key, value in OmegaConf.to_container(params, resolve=True).items()] if params else []
    given += list(config.hydra.overrides.task)
    last = {parsed.key_or_group: (o, parsed) for o, parsed in zip(given, parser.parse_overrides(given))}
    return [o for o, parsed in last.values() if parsed.is_sweep_override()]  # the command line wins, as in the sweeper


def sweep_of(hydra_cfg: DictConfig) -> SweepInfo | None:
    """The SweepInfo of the current job (from `HydraConfig.get()`), or None outside a tracked sweep.

    The parent run comes from the job's `hydra.job.env_set` (set by SweepCallback), else the environment. The job
    number is Hydra's when the job runs as a job of the multirun (launcher basic, submitit); a job process started
    by the isolated launcher is a single run, and gets its number in the environment.
    """
    given = {**os.environ, **(hydra_cfg.job.get("env_set") or {})}
    parent = given.get(PARENT_RUN_ENV)
    if hydra_cfg.mode == RunMode.MULTIRUN:
        job_num: int | None = int(hydra_cfg.job.get("num", 0))
    else:
        job_num = int(os.environ[JOB_NUM_ENV]) if os.environ.get(JOB_NUM_ENV) else None
    if not parent or job_num is None:
        return None
    return SweepInfo(parent, tuple(k for k in given.get(SWEEP_KEYS_ENV, "").split(",") if k), job_num)


def for_every_job(config: DictConfig, env: Mapping[str, str]) -> None:
    """Put `env` into the hydra config of every job the sweep composes (launchers compose each job from the
    sweep's hydra overrides plus its own), as `hydra.job.env_set` entries."""
    with open_dict(config):
        for key, value in env.items():
            quoted = "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
            config.hydra.overrides.hydra.append(f"++hydra.job.env_set.{key}={quoted}")


def optimization_result(sweep_dir: Path) -> dict[str, Any] | None:
    """What a search sweeper (hydra/sweeper=swinexp_optuna) found: {'best_params': {...}, 'best_value': x,
    'best_job': trial number}, or None."""
    path = sweep_dir / "optimization_results.yaml"
    if not path.is_file():
        return None
    result = OmegaConf.to_container(OmegaConf.load(path))
    return result if isinstance(result, dict) and "best_params" in result else None


def screening_epoch(config: DictConfig, keys: Iterable[str]) -> int | None:
    """The epoch a sweep's jobs are compared at: `trainer.stop_after_epoch` (a screen), else `trainer.epochs`;
    None when the sweep varies either (the report then takes the last epoch every job reached)."""
    if {"trainer.epochs", "trainer.stop_after_epoch"} & set(keys):
        return None
    try:
        stop = OmegaConf.select(config, "trainer.stop_after_epoch")
        return int(stop if stop is not None else OmegaConf.select(config, "trainer.epochs"))
    except Exception:  # noqa: BLE001 - an unresolvable or missing key: let the report pick the epoch
        return None


def write_failure(config: DictConfig, num: int, line: str) -> None:
    """Leave a failed job's line in its dir, for the sweep's process to read when the job ran elsewhere (submitit
    runs on_job_end in the job's process, with a copy of the callback)."""
    job_dir = Path(str(config.hydra.sweep.dir)) / str(config.hydra.sweep.subdir)  # where read_failures looks
    if job_dir.is_dir():  # a job that never started has none (and its launcher told the sweep's process itself)
        (job_dir / FAILED_FILE).write_text(json.dumps({"job": num, "line": line}))


def read_failures(sweep_dir: Path) -> dict[int, str]:
    """The failed jobs' lines left by `write_failure` in the sweep's job dirs."""
    found = {}
    for path in sweep_dir.rglob(FAILED_FILE):  # hydra.sweep.subdir may be nested
        record = json.loads(path.read_text())
        found[int(record["job"])] = str(record["line"])
    return found


@dataclass
class SweepCallback(Callback):
    """Creates the parent run before the first job, keeps its status current, lists failed jobs, and ends the
    sweep with its report (`swinexp.tracking.report.sweep_report`): table, curves and the link to compare the jobs in
    MLflow's UI, printed and logged to the parent run.

    After a search (hydra/sweeper=swinexp_optuna) the parent run gets the best trial: `best.<key>` params and tags, the
    objective as `best.objective` (and the metric's name as `best.metric`), and the job as `best.job`.
    """

    failed: dict[int, str] = field(default_factory=dict)  # job number -> "#num overrides: reason"
    stopped: str | None = None                            # why the sweep ended before its end, if it did
    tracker: MlflowTracker | None = None
    running: set[int] = field(default_factory=set)        # job numbers started and not ended
    returned: dict[int, Any] = field(default_factory=dict)  # job number -> the value it returned to the sweeper
    continued: bool = False  # the parent run of an earlier command, continued (a search's study)
    sweep_dir: Path | None = None
    keys: tuple[str, ...] = ()                            # the override keys the sweep varies
    metric: str = "val/top1"
    epoch: int | None = None
    baseline: str | None = None                           # sweep.baseline: the arm the verdicts compare with
    margin: float | None = None                           # sweep.margin
    opened: OpenSweep | None = None  # the sweep's dir, record and lock (sweep_record.open_sweep)

    def __getstate__(self) -> dict[str, Any]:
        """A copy shipped into a job's process (hydra/launcher=submitit_local, slurm_*) leaves the parent run to the
        sweep's process, which alone opens, updates and closes it."""
        return {**self.__dict__, "tracker": None, "opened": None}

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        try:
            self.opened = open_sweep(config)  # a rerun of the command continues its sweep, in the same dir
        except ConfigError as err:  # Hydra would turn an exception here into a warning and run the sweep anyway
            print(f"ConfigError: {err}", file=sys.stderr)
            raise SystemExit(2) from None
        sweeps = sweep_overrides(config)
        keys = tuple(dict.fromkeys(override_key(o) for o in sweeps))
        self.sweep_dir, self.keys = Path(str(config.hydra.sweep.dir)).resolve(), keys
        self.metric = str(config.get("optimized_metric") or "val/top1")
        self.epoch = screening_epoch(config, keys)
        self.baseline = OmegaConf.select(config, "sweep.baseline")
        self.margin = OmegaConf.select(config, "sweep.margin")
        try:
            design = sweep_design.describe(config, sweeps, keys, self.epoch, self.metric, Path.cwd())
        except ConfigError as err:  # Hydra would turn an exception here into a warning and run the sweep anyway
            print(f"ConfigError: {err}", file=sys.stderr)
            raise SystemExit(2) from None
        if design:
            print(design, flush=True)
        if config.get("dry_run") or config.tracking.get("name") != "mlflow":  # a dry run logs nothing
            return
        # The sweep's process only waits for its jobs: its own CPU and memory samples would add nine system
        # charts, with a legend entry for the parent, to the jobs' charts.
        tracking = {**OmegaConf.to_container(config.tracking, resolve=True), "system_metrics": False}
        # Creating the experiment here, once, avoids jobs racing to create it.
        self.tracker = open_tracker(tracking, OmegaConf.select(config, "hardware.shared_dir"))
        # a search continuing its study logs into the study's parent
        record = self.opened.record
        continued = (record.parent_run_id if record else None) or continued_parent_run(config.hydra.sweeper,
                                                                                       self.sweep_dir)
        shown = [normalised(o) for o in OverridesParser.create().parse_overrides(sweeps)]  # seed=0,1,2, not range()
        parent = self.tracker.start(f"sweep {' '.join(shown)}"[:250], {
            "sweep.role": "parent", "sweep.keys": ",".join(keys), "sweep.dir": str(self.sweep_dir),
            "overrides": " ".join(config.hydra.overrides.task)}, run_id=continued)
        self.continued = continued is not None
        if record is not None and record.parent_run_id is None:
            record.parent_run_id = parent
            record.save(self.opened.dir)
        if not self.continued:
            self.tracker.log_params({"sweep.definition": " ".join(sweeps),
                                     "sweep.fixed_overrides": " ".join(o for o in config.hydra.overrides.task
                                                                       if o not in sweeps)})
        for_every_job(config, {PARENT_RUN_ENV: parent or "", SWEEP_KEYS_ENV: ",".join(keys)})
        os.environ[PARENT_RUN_ENV] = parent or ""
        os.environ[SWEEP_KEYS_ENV] = ",".join(keys)
        os.environ.pop("MLFLOW_RUN_ID", None)  # it would override the parent link of every child
        atexit.register(self._abandon)  # a sweep stopped by Ctrl-C or an error must not stay RUNNING

    def _abandon(self) -> None:
        """At exit without on_multirun_end: failed jobs (Hydra raises after the last one) or an interrupted sweep."""
        if self.tracker is None:
            return
        if self.running:
            for num in sorted(self.running):
                self.failed[num] = f"#{num}: stopped while running (the sweep was interrupted)"
            self.tracker.set_tags({FAILED_JOBS_TAG: self._failed_lines()})
            self.tracker.close("KILLED")
            self.tracker = None
        else:
            self._collect_failures()
            if not self.failed:
                self.stopped = "the sweep stopped between jobs, before its end"
            self._finish()

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        if OmegaConf.select(config, "hydra.job.num") is not None:  # a job run again: its earlier failure is over
            (Path(str(config.hydra.sweep.dir)) / str(config.hydra.sweep.subdir) / FAILED_FILE).unlink(missing_ok=True)
        if self.tracker is not None:  # Hydra calls this in single runs too, where hydra.job.num is unset
            self.running.add(int(config.hydra.job.num))
            self.tracker.set_status("RUNNING")

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs: Any) -> None:
        if OmegaConf.select(config, "hydra.job.num") is None:  # a single run (also an isolated job): no sweep job
            return
        num = int(config.hydra.job.num)
        self.running.discard(num)
        if job_return.status is JobStatus.FAILED:
            error = job_return._return_value  # the exception; reading .return_value would re-raise it
            given = list(job_return.overrides or [])
            varied = [o for o in given if override_key(o) in self.keys] or given  # the job's name, not every override
            self.failed[num] = f"#{num} {' '.join(varied)}: {type(error).__name__}: {error}"
            log.error("sweep job #%s failed; the sweep goes on. %s", num, self.failed[num])
            write_failure(config, num, self.failed[num])
        else:
            self.returned[num] = job_return._return_value
        if self.tracker is not None:
            self.tracker.set_status("FAILED" if self.failed else "RUNNING" if self.running else "FINISHED")
            if self.failed:
                self.tracker.set_tags({FAILED_JOBS_TAG: self._failed_lines()})

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        # Hydra calls this when every job succeeded; a failed job makes Hydra raise after the last job, and then
        # _abandon ends the sweep at exit.
        result = optimization_result(Path(str(config.hydra.sweep.dir)))
        if result is not None and self.tracker is not None:
            self._log_best(result, config.get("optimized_metric"))
        study_files = Path(str(config.hydra.sweep.dir)) / "optuna"  # the study's trial table and plots
        if study_files.is_dir() and self.tracker is not None:
            for path in sorted(study_files.iterdir()):
                self.tracker.log_artifact(path, "optuna")
        self._collect_failures()
        self._finish()

    def _collect_failures(self) -> None:
        """Add the failed jobs this process did not see end (submitit ran them, and their on_job_end, elsewhere)."""
        if self.sweep_dir is not None:
            self.failed = {**read_failures(self.sweep_dir), **self.failed}

    def _failed_lines(self) -> str:
        lines = [self.failed[num] for num in sorted(self.failed)] + ([self.stopped] if self.stopped else [])
        return "\n".join(lines)[:5000]

    def _log_best(self, result: dict[str, Any], metric: str | None) -> None:
        assert self.tracker is not None
        best = {f"best.{k}": v for k, v in result["best_params"].items()}
        jobs = ([result["best_job"]] if "best_job" in result  # a search that ran over several commands
                else [num for num, value in sorted(self.returned.items()) if value == result["best_value"]])
        tags = {**best, "best.objective": result["best_value"], "best.metric": metric or "",
                **({"best.job": jobs[0]} if jobs else {})}
        if not self.continued:  # MLflow params cannot change: a continued study's new best is in the tags
            self.tracker.log_params({**best, "best.objective": result["best_value"]})
        self.tracker.set_tags({k: str(v) for k, v in tags.items()})
        log.info("best trial: %s", " ".join(f"{k}={v}" for k, v in tags.items()))

    def _finish(self) -> None:
        failed = self.failed or self.stopped
        if failed:  # the sweep's last words, on stderr whatever Hydra did with the logging setup
            lines = self._failed_lines().splitlines()
            print(f"{len(lines)} sweep job(s) failed:\n  " + "\n  ".join(lines), file=sys.stderr)
        if self.tracker is not None:
            if failed or self.continued:  # a continued sweep's earlier command may have listed jobs finished since
                self.tracker.set_tags({FAILED_JOBS_TAG: self._failed_lines() if failed else None})
            self._report(self.tracker)
            self.tracker.close("FAILED" if failed else "FINISHED")
            self.tracker = None
        os.environ.pop(PARENT_RUN_ENV, None)
        os.environ.pop(SWEEP_KEYS_ENV, None)

    def _report(self, tracker: MlflowTracker) -> None:
        """Print the sweep's report and log it to the parent; a report that cannot be made never fails the sweep."""
        from swinexp.tracking.report import sweep_report

        assert tracker.run_id is not None
        try:
            report = sweep_report(tracker.uri, tracker.experiment, tracker.run_id, self.metric, self.epoch,
                                  out=self.sweep_dir / "report" if self.sweep_dir else None, baseline=self.baseline,
                                  **({"margin": float(self.margin)} if self.margin is not None else {}))
        except Exception as err:  # noqa: BLE001 - the jobs' runs are in the store whatever happens here
            epoch = f" --epoch {self.epoch}" if self.epoch is not None else ""
            print(f"the sweep's report was not made ({type(err).__name__}: {err}); make it with: python -m "
                  f"swinexp.tracking.report --tracking-uri {tracker.uri} --experiment {tracker.experiment} --sweep "
                  f"{tracker.run_id} --metric {self.metric}{epoch}", file=sys.stderr)
            return
        print(f"\n{report.text}", end="", flush=True)
