"""Hydra multirun -> MLflow: one parent run per sweep, one child run per job named by what the sweep varies.

`SweepCallback` is registered in `conf/config.yaml` under `hydra.callbacks`; Hydra calls it around the sweep and
each job. It hands the parent run id to the jobs through the environment, because the default launcher
(`hydra/launcher=isolated`) runs every job in a process of its own.
"""
from __future__ import annotations

import atexit
import logging
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.utils import JobReturn, JobStatus
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from swinexp import tracking
from swinexp.tracking import MlflowTracker

log = logging.getLogger("swinexp")

PARENT_RUN_ENV = "SWINEXP_SWEEP_PARENT_RUN_ID"
SWEEP_KEYS_ENV = "SWINEXP_SWEEP_KEYS"
JOB_NUM_ENV = "SWINEXP_SWEEP_JOB_NUM"  # set by the isolated launcher for the job process it starts


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
    given = list(config.hydra.overrides.task)
    params = config.hydra.sweeper.get("params")
    if params:
        given += [f"{key}={value}" for key, value in OmegaConf.to_container(params, resolve=False).items()]
    return [o for o, parsed in zip(given, parser.parse_overrides(given)) if parsed.is_sweep_override()]


def sweep_from_env(job_num: int | None = None) -> SweepInfo | None:
    """The SweepInfo of the current job, or None outside a tracked sweep.

    Args:
        job_num: Hydra's job number when the job runs inside the sweep's process; None in a job process started by
            the isolated launcher, which passes the number in the environment.
    """
    parent = os.environ.get(PARENT_RUN_ENV)
    if job_num is None:
        job_num = int(os.environ[JOB_NUM_ENV]) if os.environ.get(JOB_NUM_ENV) else None
    if not parent or job_num is None:
        return None
    return SweepInfo(parent, tuple(k for k in os.environ.get(SWEEP_KEYS_ENV, "").split(",") if k), job_num)


@dataclass
class SweepCallback(Callback):
    """Creates the parent run before the first job, keeps its status current, and lists failed jobs."""

    failed: list[str] = field(default_factory=list)
    tracker: MlflowTracker | None = None
    job_running: int | None = None

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        if config.tracking.get("name") != "mlflow":
            return
        sweeps = sweep_overrides(config)
        keys = tuple(dict.fromkeys(override_key(o) for o in sweeps))
        # Creating the experiment here, once, avoids jobs racing to create it.
        self.tracker = tracking.mlflow(**{k: v for k, v in OmegaConf.to_container(config.tracking, resolve=True).items()
                                          if k != "name"})
        parent = self.tracker.start(f"sweep {' '.join(sweeps)}"[:250], {
            "sweep.role": "parent", "sweep.keys": ",".join(keys), "sweep.dir": str(Path(config.hydra.sweep.dir).resolve()),
            "overrides": " ".join(config.hydra.overrides.task)})
        self.tracker.log_params({"sweep.definition": " ".join(sweeps),
                                 "sweep.fixed_overrides": " ".join(o for o in config.hydra.overrides.task
                                                                   if o not in sweeps)})
        os.environ[PARENT_RUN_ENV] = parent or ""
        os.environ[SWEEP_KEYS_ENV] = ",".join(keys)
        os.environ.pop("MLFLOW_RUN_ID", None)  # it would override the parent link of every child
        atexit.register(self._abandon)  # a sweep stopped by Ctrl-C or an error must not stay RUNNING

    def _abandon(self) -> None:
        """At exit without on_multirun_end: failed jobs (Hydra raises after the last one) or an interrupted sweep."""
        if self.tracker is None:
            return
        if self.job_running is not None:
            self.failed.append(f"#{self.job_running}: stopped while running (the sweep was interrupted)")
            self.tracker.client.set_tag(self.tracker.run_id, "sweep.failed_jobs", "\n".join(self.failed)[:5000])
            self.tracker.close("KILLED")
            self.tracker = None
        else:
            if not self.failed:
                self.failed.append("the sweep stopped between jobs, before its end")
            self._finish()

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        if self.tracker is not None:  # Hydra calls this in single runs too, where hydra.job.num is unset
            self.job_running = int(config.hydra.job.num)
            self.tracker.client.update_run(self.tracker.run_id, status="RUNNING")

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs: Any) -> None:
        self.job_running = None
        if OmegaConf.select(config, "hydra.job.num") is None:  # a single run (also an isolated job): no sweep job
            return
        if job_return.status is JobStatus.FAILED:
            error = job_return._return_value  # the exception; reading .return_value would re-raise it
            self.failed.append(f"#{config.hydra.job.num} {' '.join(job_return.overrides or [])}: "
                               f"{type(error).__name__}: {error}")
            log.error("sweep job #%s failed; the sweep goes on. %s", config.hydra.job.num, self.failed[-1])
        if self.tracker is not None:
            self.tracker.client.update_run(self.tracker.run_id, status="FAILED" if self.failed else "FINISHED")
            if self.failed:
                self.tracker.client.set_tag(self.tracker.run_id, "sweep.failed_jobs", "\n".join(self.failed)[:5000])

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        # Hydra calls this only when every job succeeded; a failed job makes Hydra raise after the last job.
        self._finish()

    def _finish(self) -> None:
        if self.failed:  # the sweep's last words, on stderr whatever Hydra did with the logging setup
            print(f"{len(self.failed)} sweep job(s) failed:\n  " + "\n  ".join(self.failed), file=sys.stderr)
        if self.tracker is not None:
            self.tracker.close("FAILED" if self.failed else "FINISHED")
            self.tracker = None
        os.environ.pop(PARENT_RUN_ENV, None)
        os.environ.pop(SWEEP_KEYS_ENV, None)

