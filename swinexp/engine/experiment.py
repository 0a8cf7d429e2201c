"""`Experiment`: everything one training job needs, built and validated (by `swinexp.build.build_experiment`)."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from mindspore import nn

from swinexp.amp import AmpPolicy
from swinexp.config import Plan, TrainerCfg
from swinexp.data import DataSpec, Loader
from swinexp.tracking import Tracker


@dataclass(frozen=True)
class Experiment:
    model: nn.Cell
    data: DataSpec
    train_loader: Loader
    val_loader: Loader
    optimizer: nn.Optimizer
    lr_schedule: np.ndarray          # per optimizer step
    amp: AmpPolicy
    trainer: TrainerCfg
    tracker: Tracker
    steps_per_epoch: int             # optimizer steps; each takes trainer.accumulation_steps batches
    total_batch: int = 0             # images per optimizer step: batch x devices x accumulation_steps
    lr_scale: float = 1.0            # every LR of the schedule times this: total_batch / trainer.lr_batch_size
    overflow_check: str = "isfinite"  # how the step sees fp16 overflow on this device (amp/overflow.resolve)
    plan: Plan | None = None         # what it was built from, with the class count a folder dataset found
    amp_report: Mapping[str, str] | None = None  # {file name: text}: the policy's dtype table and drift vs fp32
    amp_effective: str = ""          # what the policy computes on this chip (amp/precision.py), e.g. an MLflow tag

    @property
    def jit_level(self) -> str | None:
        """hardware.jit_level, for ms.jit of the train and eval steps (None: ms.jit's default)."""
        return self.plan.hardware.jit_level if self.plan is not None else None
