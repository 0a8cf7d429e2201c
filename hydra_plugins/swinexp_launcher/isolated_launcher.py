"""`hydra/launcher=isolated`: every job of a multirun runs in a fresh Python process, up to `max_parallel` at once.

MindSpore never frees a compiled graph, and its context is process-global: jobs that share a process inherit each
other's graphs, memory and settings. Here each job is `python run.py <the sweep's config dir, search path and
hydra overrides> <its overrides> hydra.run.dir=<its sweep subdir>`, so it starts clean; the sweep's MLflow parent
run id reaches it through its hydra config (`hydra.job.env_set`, set by `swinexp.app.sweep_callback.SweepCallback`),
its job number through the environment.

With `hydra.launcher.max_parallel=N`, N jobs run at once, each on devices of its own (see
`swinexp.runtime.devices`): a job waits until enough devices are free. A failing job does not stop the others;
SIGTERM or Ctrl-C stops every running job (each checkpoints) and then the sweep.
"""
# Hydra's plugin scan runs this module outside sys.modules, where a dataclass cannot resolve string annotations:
# so no `from __future__ import annotations`, and Optional[...] where a dataclass or signature evaluates the type.
# ruff: noqa: FA100

import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Optional

from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import JobReturn, JobStatus, configure_log, filter_overrides, setup_globals
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf, open_dict

from swinexp.app.sweep_callback import JOB_NUM_ENV, RESULT_FILE
from swinexp.runtime.devices import DevicePool, Slot, devices_per_job, hccs_groups, host_devices

log = logging.getLogger(__name__)

JOB_RECORD_FILE = "launcher.json"  # per job: pid, devices, the affinity the process had, start/end times
JOB_OUTPUT_FILE = "job.out"  # with max_parallel > 1: the job's stdout and stderr (not interleaved with the others)
POLL_S = 0.2
# Hydra overrides of the sweep that must not reach a job: it runs as a single run in its own dir.
NOT_FOR_JOBS = ("hydra.mode=", "hydra.run.dir=")


@dataclass
class IsolatedLauncherConf:
    _target_: str = "hydra_plugins.swinexp_launcher.isolated_launcher.IsolatedLauncher"
    max_parallel: int = 1                   # jobs running at once
    devices_per_job: Optional[int] = None   # null: hardware.num_devices cards; on CPU the host's cores / max_parallel
    devices: Optional[list[int]] = None     # device ids (cards or cores) to share out; null: all the host shows


ConfigStore.instance().store(group="hydra/launcher", name="isolated", node=IsolatedLauncherConf, provider="swinexp")


class JobFailed(RuntimeError):
    """A job's process exited non-zero; its own error is in its stderr and its run dir's log."""


@dataclass
class Job:
    idx: int
    overrides: list[str]
    cfg: DictConfig
    dir: Path
    device_target: str
    num_devices: int = 0        # 0: not confined (max_parallel=1 and no devices_per_job: as one job at a time ever was)
    slot: Optional[Slot] = None
    groups: Optional[tuple[frozenset[int], ...]] = None  # cards a job must stay inside one of (a 910's HCCS)
    proc: Optional[subprocess.Popen] = None
    output: Optional[IO[str]] = None
    started: float = 0.0


class IsolatedLauncher(Launcher):
    def __init__(self, max_parallel: int = 1, devices_per_job: Optional[int] = None,
                 devices: Optional[Sequence[int]] = None) -> None:
        super().__init__()
        if max_parallel < 1:
            raise ValueError(f"hydra.launcher.max_parallel={max_parallel} must be >= 1")
        self.max_parallel, self.devices_per_job = max_parallel, devices_per_job
        self.devices = list(devices) if devices else None
        self.confine = max_parallel > 1 or devices_per_job is not None
        self.pools: dict[str, DevicePool] = {}
        self.config: DictConfig | None = None
        self.hydra_context: HydraContext | None = None
        self.task_function: TaskFunction | None = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config, self.hydra_context, self.task_function = config, hydra_context, task_function

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        assert self.config is not None
        setup_globals()
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        Path(str(self.config.hydra.sweep.dir)).mkdir(parents=True, exist_ok=True)
        log.info(f"Launching {len(job_overrides)} jobs, each in its own process, "
                 f"{self.max_parallel} at a time")
        returns: dict[int, JobReturn] = {}
        pending: list[Job] = []
        for idx, overrides in enumerate(job_overrides, start=initial_job_idx):
            log.info(f"\t#{idx} : {' '.join(filter_overrides(overrides))}")
            job = self._prepare(idx, list(overrides))
            if isinstance(job, JobReturn):
                returns[idx] = job
            else:
                pending.append(job)
        running: list[Job] = []
        stop_requests: list[int] = []
        previous = signal.signal(signal.SIGTERM, lambda signum, _frame: stop_requests.append(signum))
        try:
            while pending or running:
                while pending and len(running) < self.max_parallel and not stop_requests and self._start(pending[0]):
                    running.append(pending.pop(0))
                time.sleep(POLL_S)
                for job in [j for j in running if j.proc is not None and j.proc.poll() is not None]:
                    running.remove(job)
                    returns[job.idx] = self._end(job)
                if stop_requests:
                    raise KeyboardInterrupt(f"signal {stop_requests[0]}: the running jobs were asked to stop; "
                                            "the sweep stops")
        except KeyboardInterrupt:
            for job in running:  # a terminal's Ctrl-C reached them already; a second stop request is harmless
                job.proc.send_signal(signal.SIGTERM)
            for job in running:
                job.proc.wait()
                self._record(job, job.proc.returncode)
            raise
        finally:
            signal.signal(signal.SIGTERM, previous)
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        return [returns[i] for i in sorted(returns)]

    def _prepare(self, idx: int, overrides: list[str]) -> "Job | JobReturn":
        """Compose the job (a job that does not compose, or needs devices the host lacks, fails unstarted)."""
        assert self.config is not None and self.hydra_context is not None
        try:
            job_cfg = self.hydra_context.config_loader.load_sweep_config(self.config, overrides)
            with open_dict(job_cfg):
                job_cfg.hydra.job.id = job_cfg.hydra.job.num = idx
            hw = job_cfg.get("hardware") or {}
            job = Job(idx, overrides, job_cfg, Path(str(job_cfg.hydra.sweep.dir)) / str(job_cfg.hydra.sweep.subdir),
                      str(hw.get("device_target", "CPU")))
            if self.confine:
                host = host_devices(job.device_target, self.devices)
                job.groups = hccs_groups(job.device_target, hw.get("chip"))
                job.num_devices = devices_per_job(job.device_target, int(hw.get("num_devices", 1)),
                                                  self.devices_per_job, host, self.max_parallel, job.groups)
            return job
        except Exception as err:  # noqa: BLE001 - any composition or device error fails this job only
            cfg = OmegaConf.create({"hydra": OmegaConf.to_container(self.config.hydra, resolve=False)})
            with open_dict(cfg):
                cfg.hydra.job.num = cfg.hydra.job.id = idx
            log.error(f"job #{idx} cannot start: {type(err).__name__}: {err}")
            return self._finish(cfg, JobReturn(overrides=overrides, status=JobStatus.FAILED, _return_value=err))

    def _pool(self, device_target: str) -> DevicePool:
        if device_target not in self.pools:
            self.pools[device_target] = DevicePool(device_target, host_devices(device_target, self.devices))
        return self.pools[device_target]

    def _start(self, job: Job) -> bool:
        """Start the job's process if its devices are free; False: it has to wait for a running job to end."""
        assert self.hydra_context is not None
        env = {**os.environ, JOB_NUM_ENV: str(job.idx)}
        if job.num_devices:
            job.slot = self._pool(job.device_target).take(job.num_devices, job.groups)
            if job.slot is None:
                return False
            env.update(job.slot.env())
            log.info(f"job #{job.idx} runs on {job.device_target} {list(job.slot.devices)}")
        HydraConfig.instance().set_config(job.cfg)
        self.hydra_context.callbacks.on_job_start(config=job.cfg, task_function=self.task_function)
        job.dir.mkdir(parents=True, exist_ok=True)
        if self.max_parallel > 1:  # several jobs' output on one terminal would interleave line by line
            job.output = open(job.dir / JOB_OUTPUT_FILE, "w")  # noqa: SIM115 - open while the job runs
        job.started = time.time()
        job.proc = subprocess.Popen(self._command(job.overrides + _own_port(job), job.dir), env=env, stdout=job.output,
                                    stderr=subprocess.STDOUT if job.output else None,
                                    preexec_fn=job.slot.confine if job.slot else None)  # noqa: PLW1509 - one syscall
        self._record(job, None)
        return True

    def _record(self, job: Job, status: Optional[int]) -> None:
        """What the job ran on, as the kernel saw it: read back from the job's process while it runs."""
        path = job.dir / JOB_RECORD_FILE
        record = json.loads(path.read_text()) if path.is_file() else {}
        if status is None:
            assert job.proc is not None
            try:
                affinity = sorted(os.sched_getaffinity(job.proc.pid))
            except OSError:  # the process is already gone
                affinity = None
            record = {"pid": job.proc.pid, "devices": list(job.slot.devices) if job.slot else None,
                      "device_target": job.device_target, "cpu_affinity": affinity, "start": job.started,
                      "env": job.slot.env() if job.slot else {}}
        else:
            record.update(end=time.time(), exit_status=status)
        path.write_text(json.dumps(record, indent=1) + "\n")

    def _end(self, job: Job) -> JobReturn:
        assert job.proc is not None
        status = job.proc.returncode
        self._record(job, status)
        if job.output is not None:
            job.output.close()
        if job.slot is not None:
            self.pools[job.device_target].give(job.slot)
        HydraConfig.instance().set_config(job.cfg)
        task_cfg = OmegaConf.masked_copy(job.cfg, [k for k in job.cfg if k != "hydra"])
        ret = JobReturn(overrides=job.overrides, cfg=task_cfg, hydra_cfg=job.cfg, working_dir=str(job.dir),
                        task_name=str(job.cfg.hydra.job.name))
        if status == 0:
            ret.status, ret._return_value = JobStatus.COMPLETED, _result(job.dir, job.cfg.get("optimized_metric"))
        else:
            ret.status = JobStatus.FAILED
            where = job.dir / (JOB_OUTPUT_FILE if job.output else str(job.cfg.hydra.job.name) + ".log")
            ret._return_value = JobFailed(f"job #{job.idx} ({' '.join(job.overrides)}) exited with status {status}; "
                                          f"its log is {where}{_tail(job.dir / JOB_OUTPUT_FILE) if job.output else ''}")
        return self._finish(job.cfg, ret)

    def _finish(self, job_cfg: DictConfig, ret: JobReturn) -> JobReturn:
        assert self.hydra_context is not None
        self.hydra_context.callbacks.on_job_end(config=job_cfg, job_return=ret)
        return ret

    def _command(self, overrides: list[str], job_dir: Path) -> list[str]:
        """`python -m swinexp` (run as a file) with the sweep's config source, search path and hydra overrides, then
        the job's own."""
        assert self.config is not None
        from swinexp.runtime.launch import entry_script

        hydra_cfg = self.config.hydra
        sources = {s.provider: s for s in hydra_cfg.runtime.config_sources}
        main = sources["main"]
        command = [sys.executable, str(entry_script()),
                   f"--config-path={main.path if main.schema == 'file' else f'{main.schema}://{main.path}'}",
                   f"--config-name={hydra_cfg.job.config_name}"]
        if "command-line" in sources:  # -cd DIR
            command.append(f"--config-dir={sources['command-line'].path}")
        command += [o for o in hydra_cfg.overrides.hydra if not o.startswith(NOT_FOR_JOBS)]
        # hydra.mode=RUN: a named sweep (sweep=...) sets MULTIRUN in its file, which each job composes again
        return [*command, *overrides, f"hydra.run.dir={_quote(str(job_dir))}", "hydra.mode=RUN"]


def live_job_pid(job_dir: Path) -> Optional[int]:
    """The process of a job an earlier sweep command started in `job_dir` and that still runs (its sweep's process
    died without it), or None. Linux only (/proc); elsewhere None."""
    path = job_dir / JOB_RECORD_FILE
    record = json.loads(path.read_text()) if path.is_file() else {}
    if record.get("pid") is None or "end" in record:
        return None
    try:  # the pid may be another process's by now: it is the job's if it runs in the job's dir
        command = Path(f"/proc/{record['pid']}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return None
    return int(record["pid"]) if f"hydra.run.dir={_quote(str(job_dir))}" in command.split("\0") else None


def _own_port(job: Job) -> list[str]:
    """Concurrent msrun jobs on one host each need a scheduler port of their own: the preset's port plus the
    job's first device id (device sets are disjoint, so the ports are too)."""
    hw = job.cfg.get("hardware") or {}
    if job.slot is None or int(hw.get("num_devices", 1)) * int(hw.get("num_nodes", 1)) < 2:
        return []
    return [f"hardware.master_port={int(hw.master_port) + job.slot.devices[0]}"]


def _result(job_dir: Path, metric: Optional[str]) -> Any:
    path = job_dir / RESULT_FILE
    if metric is None or not path.is_file():
        return None
    return json.loads(path.read_text()).get(metric)


def _tail(path: Path, lines: int = 15) -> str:
    if not path.is_file():
        return ""
    return "; its last lines:\n" + "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def _quote(value: str) -> str:
    """A path as a Hydra override value: quoted when it holds characters the override grammar would parse."""
    if re.fullmatch(r"[\w./:+-]+", value):
        return value
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
