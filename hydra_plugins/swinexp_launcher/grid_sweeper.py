"""`hydra/sweeper=swinexp_grid` (the default): Hydra's grid sweeper, made to continue a sweep whose process died.

Rerunning a sweep's command finds its dir again (`swinexp.app.sweep_identity`, checked by
`swinexp.app.sweep_record` when the sweep starts). There, each job is one of:
  - finished: its run dir has its final metrics (`metrics.json`), written with the stop it has now: kept, not run
    again; its value is read back for the sweeper's return value;
  - interrupted: its run dir has checkpoints: it runs again there and continues from them (trainer.resume=auto), in
    its own MLflow run;
  - missing: it starts.
Jobs run under whichever launcher is chosen (isolated, basic, submitit), numbered as in the first command, a launch per
run of consecutive job numbers.
"""
# Hydra's plugin scan runs this module outside sys.modules, where a dataclass cannot resolve string annotations:
# so no `from __future__ import annotations`, and Optional[...] where a dataclass or signature evaluates the type.
# ruff: noqa: FA100

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import yaml
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper, BasicSweeperConf
from hydra.core.config_store import ConfigStore
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.utils import JobReturn, JobStatus
from omegaconf import DictConfig, OmegaConf, open_dict

from hydra_plugins.swinexp_launcher.isolated_launcher import live_job_pid
from swinexp.app.sweep_callback import RESULT_FILE
from swinexp.app.sweep_identity import without_fresh
from swinexp.registry import ConfigError

log = logging.getLogger(__name__)


@dataclass
class ContinuingBasicSweeperConf(BasicSweeperConf):
    _target_: str = "hydra_plugins.swinexp_launcher.grid_sweeper.ContinuingBasicSweeper"


ConfigStore.instance().store(group="hydra/sweeper", name="swinexp_grid", node=ContinuingBasicSweeperConf,
                             provider="swinexp")


@dataclass
class JobState:
    dir: Path
    kept: Optional[JobReturn] = None     # a finished job's return, read back
    checkpointed: bool = False           # an interrupted job that continues from its checkpoints


class ContinuingBasicSweeper(BasicSweeper):
    def sweep(self, arguments: list[str]) -> Any:
        assert self.config is not None and self.launcher is not None and self.hydra_context is not None
        parser = OverridesParser.create(config_loader=self.hydra_context.config_loader)
        (jobs,) = self.split_arguments(parser.parse_overrides(self._parse_config() + list(arguments)), None)
        jobs = [without_fresh(job) for job in jobs]
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(self.config, sweep_dir / "multirun.yaml")
        states = [self._state(num, job) for num, job in enumerate(jobs)]  # composes each job: as validating does
        log.info(summary(sweep_dir, states))
        returns = {num: s.kept for num, s in enumerate(states) if s.kept is not None}
        for group in batches([n for n in range(len(jobs)) if n not in returns], self.max_batch_size):
            returns.update(zip(group, self.launcher.launch([jobs[n] for n in group], initial_job_idx=group[0])))
        ordered = [returns[n] for n in range(len(jobs))]
        for ret in ordered:
            _ = ret.return_value  # a failed job raises here, after every job ran (as Hydra's sweeper does)
        return [ordered]

    def _state(self, num: int, overrides: Sequence[str]) -> JobState:
        assert self.config is not None and self.hydra_context is not None
        cfg = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
        with open_dict(cfg):
            cfg.hydra.job.num = cfg.hydra.job.id = num
        job_dir = Path(str(cfg.hydra.sweep.dir)) / str(cfg.hydra.sweep.subdir)
        if (pid := live_job_pid(job_dir)) is not None:
            raise ConfigError(f"job #{num} of an earlier command on this sweep still runs (pid {pid}, in {job_dir}); "
                              "wait for it to end or stop it, then rerun the command")
        if (job_dir / RESULT_FILE).is_file() and _same_stop(job_dir, cfg):
            value = json.loads((job_dir / RESULT_FILE).read_text()).get(str(cfg.get("optimized_metric")))
            task_cfg = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"])
            kept = JobReturn(overrides=list(overrides), cfg=task_cfg, hydra_cfg=cfg, working_dir=str(job_dir),
                             task_name=str(cfg.hydra.job.name), status=JobStatus.COMPLETED, _return_value=value)
            return JobState(job_dir, kept=kept)
        return JobState(job_dir, checkpointed=any((job_dir / "checkpoints").glob("*.ckpt")))


def _same_stop(job_dir: Path, cfg: DictConfig) -> bool:
    """Whether the job finished with the trainer.stop_after_epoch it has now (a screen continued later has not)."""
    path = job_dir / "config.yaml"
    if not path.is_file():
        return True
    saved = (yaml.safe_load(path.read_text()) or {}).get("trainer", {}).get("stop_after_epoch")
    return saved == OmegaConf.select(cfg, "trainer.stop_after_epoch")


def batches(numbers: list[int], size: Optional[int]) -> list[list[int]]:
    """Runs of consecutive job numbers (a launch numbers its jobs from its first), at most `size` long."""
    out: list[list[int]] = []
    for n in numbers:
        if out and out[-1][-1] == n - 1 and (size is None or len(out[-1]) < size):
            out[-1].append(n)
        else:
            out.append([n])
    return out


def summary(sweep_dir: Path, states: Sequence[JobState]) -> str:
    """'sweep multirun/optimizer.lr-1a2b3c4d: 4 jobs: 2 kept (finished earlier: #0 #1), 1 to resume from
    checkpoints (#2), 1 to start (#3)'."""
    kept = [n for n, s in enumerate(states) if s.kept is not None]
    resumed = [n for n, s in enumerate(states) if s.kept is None and s.checkpointed]
    started = [n for n, s in enumerate(states) if s.kept is None and not s.checkpointed]

    def listed(nums: list[int], prefix: str = "") -> str:
        return f" ({prefix}{' '.join(f'#{n}' for n in nums)})" if nums else ""

    return (f"sweep {sweep_dir}: {len(states)} jobs: {len(kept)} kept{listed(kept, 'finished earlier: ')}, "
            f"{len(resumed)} to resume from checkpoints{listed(resumed)}, {len(started)} to start{listed(started)}")
