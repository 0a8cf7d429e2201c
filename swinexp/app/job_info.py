"""`JobInfo`: what Hydra knows about a job (run dir, overrides, group choices, sweep, Optuna trial), and the name and
tags its MLflow run gets from it."""
from __future__ import annotations

import getpass
import os
import socket
import sys
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import DictConfig

from swinexp.app.sweep_callback import SweepInfo, override_key, sweep_of
from swinexp.runtime import allocator
from swinexp.tracking.source import git_commit
from swinexp.tracking.study import StudyTrial

INFRASTRUCTURE = ("tracking", "hydra", "hardware.master_")  # overrides that say where a run goes, not what it is
RUN_DIR_TAG = "swinexp.run_dir"
MALLOC_TAG = "swinexp.malloc"  # 'system', or the replacement an accelerator run was allowed to preload


@dataclass(frozen=True)
class JobInfo:
    """What Hydra knows about the job: where it writes, which overrides and group choices made it, its sweep."""

    run_dir: Path
    overrides: list[str] = field(default_factory=list)
    choices: dict[str, str] = field(default_factory=dict)
    sweep: SweepInfo | None = None
    config_dirs: list[str] = field(default_factory=list)  # the user's -cd folders: msrun workers compose with them
    trial: StudyTrial | None = None  # the Optuna trial this job is, in a search (hydra/sweeper=swinexp_optuna)

    @classmethod
    def from_hydra(cls, hydra_cfg: DictConfig) -> JobInfo:
        """From `HydraConfig.get()` inside a Hydra job."""
        config_dirs = [s.path for s in hydra_cfg.runtime.config_sources if s.provider == "command-line"]
        return cls(Path(hydra_cfg.runtime.output_dir), list(hydra_cfg.overrides.task),
                   dict(hydra_cfg.runtime.choices), sweep_of(hydra_cfg), config_dirs,
                   StudyTrial.of(hydra_cfg.job.get("env_set")))

    def relaunch_args(self) -> list[str]:
        """The arguments that compose this job again in another process (an msrun worker)."""
        return [*(f"--config-dir={d}" for d in self.config_dirs), *self.overrides]

    def run_name(self) -> str:
        """The overrides that change the experiment (not where it is logged or how workers meet), or 'defaults'."""
        if self.sweep is not None:
            return self.sweep.run_name(self.overrides)
        return " ".join(o for o in self.overrides if not is_infrastructure(o)) or "defaults"

    def tags(self) -> dict[str, str]:
        """Overrides, host, process and its malloc, sweep membership, chosen group options, the code's git commit,
        the run dir and MLflow's standard source tags (the UI's Source and User columns)."""
        tags = {"overrides": " ".join(self.overrides), "host": socket.gethostname(), "pid": str(os.getpid()),
                MALLOC_TAG: allocator.current(),
                RUN_DIR_TAG: str(self.run_dir.resolve()), "mlflow.source.type": "LOCAL",
                "mlflow.source.name": str(Path(sys.argv[0]).resolve()) if sys.argv[0] else "python",
                "mlflow.user": _user(),
                **(self.sweep.tags() if self.sweep else {}), **(self.trial.tags() if self.trial else {}),
                **{f"choice.{k.split('@')[0]}": str(v) for k, v in self.choices.items()  # no @package: MLflow
                   if v is not None and not k.startswith("hydra")}}                    # rejects '@' in names
        if commit := git_commit():
            tags["git_commit"] = tags["mlflow.source.git.commit"] = commit
        return tags


def is_infrastructure(override: str) -> bool:
    """'tracking.uri=...', 'hydra.run.dir=...', 'hardware.master_addr=...' (and their +/~ forms)."""
    key = override_key(override)
    return any(key == p or key.startswith((f"{p}.", f"{p}/")) or (p.endswith("_") and key.startswith(p))
               for p in INFRASTRUCTURE)


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # a container user without a passwd entry
        return str(os.getuid())
