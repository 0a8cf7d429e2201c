"""The only DictConfig -> objects boundary: `build_experiment(cfg)` returns plain Python objects."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from mindspore import Tensor, nn
from omegaconf import DictConfig, OmegaConf

from swinexp.amp import AmpPolicy
from swinexp.config import TrainerCfg
from swinexp.data import AUGMENTS, DATASETS, DataSpec, Loader, build_loaders
from swinexp.data.targets import SmoothedTargets
from swinexp.registry import AMP_POLICIES, MODELS, OPTIMIZERS, SCHEDULERS, TRACKERS, ConfigError
from swinexp.tracking import Tracker


@dataclass(frozen=True)
class Experiment:
    """Everything one training job needs, built and validated."""

    model: nn.Cell
    data: DataSpec
    train_loader: Loader
    val_loader: Loader
    optimizer: nn.Optimizer
    lr_schedule: np.ndarray          # per optimizer step
    amp: AmpPolicy
    trainer: TrainerCfg
    tracker: Tracker
    steps_per_epoch: int


def node(cfg: DictConfig, key: str) -> dict[str, Any]:
    """A config group as a plain resolved dict, with a clear error for a missing mandatory value."""
    try:
        value = OmegaConf.to_container(OmegaConf.select(cfg, key), resolve=True, throw_on_missing=True)
    except Exception as err:  # omegaconf's MissingMandatoryValue / InterpolationResolutionError
        raise ConfigError(f"{err}. Set it on the command line, e.g. {key}.<key>=...") from err
    if not isinstance(value, dict):
        raise ConfigError(f"config group '{key}' is missing; add it to the defaults list or pass {key}=<option>")
    return value


def trainer_cfg(cfg: DictConfig) -> TrainerCfg:
    trainer: TrainerCfg = OmegaConf.to_object(cfg.trainer)  # typed by the base_trainer schema
    if trainer.epochs < 1:
        raise ConfigError(f"trainer.epochs={trainer.epochs} must be >= 1")
    if trainer.accumulation_steps != 1:
        raise ConfigError(
            f"trainer.accumulation_steps={trainer.accumulation_steps}: gradient accumulation is not available yet; "
            "use trainer.accumulation_steps=1 and a larger data.batch_size"
        )
    if trainer.clip_grad is not None and trainer.clip_grad <= 0:
        raise ConfigError(f"trainer.clip_grad={trainer.clip_grad} must be > 0, or null to disable clipping")
    if not 0 <= trainer.label_smoothing < 1:
        raise ConfigError(f"trainer.label_smoothing={trainer.label_smoothing} must be in [0, 1)")
    return trainer


def build_experiment(cfg: DictConfig) -> Experiment:
    """Build tracker, model, data, optimizer and schedule from the composed config, cheapest checks first."""
    trainer = trainer_cfg(cfg)
    amp = AMP_POLICIES.build(node(cfg, "amp"))
    data_cfg = node(cfg, "data")
    augment_cfg = data_cfg.pop("augment", None) or {"name": "none"}
    tracker = TRACKERS.build(node(cfg, "tracking"))
    model = amp.apply(MODELS.build(node(cfg, "model")))
    spec = DATASETS.build(data_cfg)
    head = getattr(model, "num_classes", spec.num_classes)
    if head != spec.num_classes:
        raise ConfigError(
            f"model.num_classes={head} but data '{data_cfg['name']}' has {spec.num_classes} classes; "
            "leave model.num_classes at ${data.num_classes} or set both to the same value"
        )
    train_loader, val_loader = build_loaders(spec, AUGMENTS.build(augment_cfg, img_size=spec.img_size), int(cfg.seed),
                                             SmoothedTargets(spec.num_classes, trainer.label_smoothing))
    steps = len(train_loader) if trainer.limit_train_batches is None else min(len(train_loader),
                                                                              trainer.limit_train_batches)
    optimizer_cfg = node(cfg, "optimizer")
    schedule = SCHEDULERS.build(node(cfg, "scheduler"), base_lr=float(optimizer_cfg["lr"]), epochs=trainer.epochs,
                                steps_per_epoch=steps)
    optimizer = OPTIMIZERS.build({**optimizer_cfg, "lr": Tensor(schedule)}, model=model)
    return Experiment(model, spec, train_loader, val_loader, optimizer, schedule, amp, trainer, tracker, steps)
