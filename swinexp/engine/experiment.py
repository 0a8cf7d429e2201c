"""`Experiment`: everything one training job needs, built and validated (by `swinexp.build.build_experiment`), and
`start_params`: what the run's MLflow params say about where it starts (pretrained file, frozen layers, LR groups)."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

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


def start_params(model: nn.Cell, optimizer: nn.Optimizer, schedule: np.ndarray) -> dict[str, Any]:
    """MLflow params of a run's starting point, logged before its first step.

    - `pretrained.layout`, `pretrained.head` (loaded | map22kto1k | dropped | reset | zeros | none) and
      `pretrained.resized` (each resized position tensor, "name (169, 3) -> (529, 3) official"; "none"), when
      model.pretrained loaded a file (models.pretrained.prepare keeps its report on the model);
    - `model.frozen_tensors`: how many parameters model.freeze took out of training;
    - `lr_group.<group>`: each LR group's peak LR (the schedule's peak times the group's layer-decay scale), when
      the groups' LRs differ (optimizer.layer_decay, optimizer.head_lr_scale).
    """
    params: dict[str, Any] = {}
    if (report := getattr(model, "pretrained_report", None)) is not None:
        params.update({"pretrained.layout": report.layout, "pretrained.head": report.head,
                       "pretrained.resized": "; ".join(report.resized) or "none"})
    if frozen := getattr(model, "frozen", ()):
        params["model.frozen_tensors"] = len(frozen)
    scales = getattr(optimizer, "group_scales", {})
    if len(set(scales.values())) > 1:
        peak = float(np.max(schedule)) if np.size(schedule) else 0.0
        params.update({f"lr_group.{name}": peak * scale for name, scale in scales.items()})
    return params
