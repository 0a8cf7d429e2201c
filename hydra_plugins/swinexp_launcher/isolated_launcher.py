"""`hydra/launcher=isolated`: every job of a multirun runs in a fresh Python process, one after another.

MindSpore never frees a compiled graph, and its context is process-global: jobs that share a process inherit each
other's graphs, memory and settings. Here each job is `python run.py <its overrides> hydra.run.dir=<its sweep
subdir>`, so it starts clean; the sweep's MLflow parent run id reaches it through the environment (set by
`swinexp.tracking.sweep.SweepCallback`), together with its job number.
"""

import json
import logging
import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import JobReturn, JobStatus, configure_log, filter_overrides, setup_globals
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf, open_dict

log = logging.getLogger(__name__)

JOB_NUM_ENV = "SWINEXP_SWEEP_JOB_NUM"
RESULT_FILE = "metrics.json"  # written by each job into its run dir; holds the value a sweeper optimizes


@dataclass
class IsolatedLauncherConf:
    _target_: str = "hydra_plugins.swinexp_launcher.isolated_launcher.IsolatedLauncher"


ConfigStore.instance().store(group="hydra/launcher", name="isolated", node=IsolatedLauncherConf, provider="swinexp")


class JobFailed(RuntimeError):
    """A job's process exited non-zero; its own error is in its stderr and its run dir's log."""


class IsolatedLauncher(Launcher):
    def __init__(self) -> None:
        super().__init__()
        self.config: DictConfig | None = None
        self.hydra_context: HydraContext | None = None
        self.task_function: TaskFunction | None = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config, self.hydra_context, self.task_function = config, hydra_context, task_function

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        assert self.config is not None and self.hydra_context is not None
        setup_globals()
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        Path(str(self.config.hydra.sweep.dir)).mkdir(parents=True, exist_ok=True)
        log.info(f"Launching {len(job_overrides)} jobs, each in its own process")
        runs: list[JobReturn] = []
        for idx, overrides in enumerate(job_overrides, start=initial_job_idx):
            log.info(f"\t#{idx} : {' '.join(filter_overrides(overrides))}")
            runs.append(self._run_one(idx, list(overrides)))
            configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        return runs

    def _run_one(self, idx: int, overrides: list[str]) -> JobReturn:
        assert self.config is not None and self.hydra_context is not None
        try:  # compose here too: a job that does not compose fails without starting a process
            job_cfg = self.hydra_context.config_loader.load_sweep_config(self.config, overrides)
        except Exception as err:  # noqa: BLE001 - any composition error fails this job only
            cfg = OmegaConf.create({"hydra": OmegaConf.to_container(self.config.hydra, resolve=False)})
            with open_dict(cfg):
                cfg.hydra.job.num = cfg.hydra.job.id = idx
            return self._finish(cfg, JobReturn(overrides=overrides, status=JobStatus.FAILED, _return_value=err))
        with open_dict(job_cfg):
            job_cfg.hydra.job.id = job_cfg.hydra.job.num = idx
        HydraConfig.instance().set_config(job_cfg)
        job_dir = Path(str(job_cfg.hydra.sweep.dir)) / str(job_cfg.hydra.sweep.subdir)
        self.hydra_context.callbacks.on_job_start(config=job_cfg, task_function=self.task_function)
        status = run_in_process(self._command(overrides, job_dir), {**os.environ, JOB_NUM_ENV: str(idx)})
        task_cfg = OmegaConf.masked_copy(job_cfg, [k for k in job_cfg if k != "hydra"])
        ret = JobReturn(overrides=overrides, cfg=task_cfg, hydra_cfg=job_cfg, working_dir=str(job_dir),
                        task_name=str(job_cfg.hydra.job.name))
        if status == 0:
            ret.status, ret._return_value = JobStatus.COMPLETED, _result(job_dir, job_cfg.get("optimized_metric"))
        else:
            ret.status = JobStatus.FAILED
            ret._return_value = JobFailed(f"job #{idx} ({' '.join(overrides)}) exited with status {status}; its log "
                                          f"is {job_dir / (str(job_cfg.hydra.job.name) + '.log')}")
        return self._finish(job_cfg, ret)

    def _finish(self, job_cfg: DictConfig, ret: JobReturn) -> JobReturn:
        assert self.hydra_context is not None
        self.hydra_context.callbacks.on_job_end(config=job_cfg, job_return=ret)
        return ret

    def _command(self, overrides: list[str], job_dir: Path) -> list[str]:
        assert self.config is not None
        script = Path(sys.argv[0]).resolve()
        if not script.is_file():
            raise RuntimeError(f"hydra/launcher=isolated re-runs the script that started the sweep, but sys.argv[0]="
                               f"'{sys.argv[0]}' is not a file; start sweeps as `python run.py -m ...`")
        config_name = str(self.config.hydra.job.config_name)
        user_dirs = [f"--config-dir={source.path}" for source in self.config.hydra.runtime.config_sources
                     if source.provider == "command-line"]  # the sweep's -cd: the job composes the same options
        return [sys.executable, str(script), *user_dirs, f"--config-name={config_name}", *overrides,
                f"hydra.run.dir={_quote(str(job_dir))}"]


def run_in_process(command: list[str], env: dict[str, str]) -> int:
    """Run one job and wait; a SIGTERM to the sweep is passed on to the job (which checkpoints and exits) and then
    stops the sweep; Ctrl-C reaches the job directly through the terminal's process group."""
    proc = subprocess.Popen(command, env=env)

    def forward(signum: int, _frame: Any) -> None:
        proc.send_signal(signum)
        raise KeyboardInterrupt(f"signal {signum}: the running job was asked to stop; the sweep stops")

    previous = signal.signal(signal.SIGTERM, forward)
    try:
        return proc.wait()
    except KeyboardInterrupt:
        proc.wait()
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)


def _result(job_dir: Path, metric: str | None) -> Any:
    path = job_dir / RESULT_FILE
    if metric is None or not path.is_file():
        return None
    return json.loads(path.read_text()).get(metric)


def _quote(value: str) -> str:
    """A path as a Hydra override value: quoted when it holds characters the override grammar would parse."""
    if re.fullmatch(r"[\w./:+-]+", value):
        return value
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
