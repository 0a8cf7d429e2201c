"""The training recipe a config amounts to, in numbers (printed by `dry_run=true`): model, data, total batch, the
scaled LR schedule over all trainer.epochs and where trainer.stop_after_epoch cuts it. Builds no model."""
from __future__ import annotations

import numpy as np
from omegaconf import DictConfig

from swinexp.build import build_schedule, node, trainer_cfg
from swinexp.config import HardwareCfg
from swinexp.data.pipeline import EpochSampler
from swinexp.registry import DATASETS


def epoch_end_lr(schedule: np.ndarray, steps_per_epoch: int, epoch: int) -> float:
    """The LR of the last optimizer step of `epoch` (1-based): the `lr` a run logs at step `epoch`."""
    return float(schedule[epoch * steps_per_epoch - 1])


def describe(cfg: DictConfig, hw: HardwareCfg) -> str:
    """A few lines that state the recipe `cfg` trains with; `--cfg job` shows every key."""
    trainer = trainer_cfg(cfg)
    model, optimizer, scheduler = node(cfg, "model"), node(cfg, "optimizer"), node(cfg, "scheduler")
    data = node(cfg, "data")
    augment = data.pop("augment", None) or {"name": "none"}
    spec = DATASETS.build(data)
    world = hw.num_devices * hw.num_nodes
    total_batch = spec.batch_size * world * trainer.accumulation_steps
    batches = len(EpochSampler(len(spec.train), 0, True, world, 0)) // spec.batch_size
    if trainer.limit_train_batches is not None:
        batches = min(batches, trainer.limit_train_batches)
    steps = batches // trainer.accumulation_steps
    last = trainer.stop_after_epoch or trainer.epochs
    lines = [
        "recipe (every key: the same command with --cfg job):",
        f"  model: {model['name']}, {model.get('img_size')} px, {model.get('num_classes')} classes, "
        f"drop_path_rate {model.get('drop_path_rate')}",
        f"  data: {data['name']} at {spec.root}: {len(spec.train)} train / {len(spec.val)} val images, "
        f"augment {augment['name']}, total batch {total_batch}",
        f"  optimizer: {optimizer['name']}, lr {optimizer['lr']:g} quoted at total batch "
        f"{trainer.lr_batch_size or total_batch}, weight_decay {optimizer.get('weight_decay')}",
        f"  trainer: {trainer.epochs} epochs, clip_grad {trainer.clip_grad}, label_smoothing "
        f"{trainer.label_smoothing}, ema.decay {trainer.ema.decay}, amp {node(cfg, 'amp')['name']}",
        f"  stop: after epoch {last} of {trainer.epochs}"
        + (" (a screen: rerun in its run dir with trainer.stop_after_epoch=null to continue)" if last < trainer.epochs
           else ""),
    ]
    schedule_args = ", ".join(f"{k}={v}" for k, v in scheduler.items() if k != "name")
    if steps == 0:
        lines.append(f"  schedule: {scheduler['name']} ({schedule_args}); the train split has fewer images per rank "
                     f"than one total batch, so no optimizer step per epoch")
        return "\n".join(lines)
    schedule = build_schedule(cfg, trainer, total_batch, steps)
    lines.append(f"  schedule: {scheduler['name']} ({schedule_args}) over {trainer.epochs} epochs x {steps} optimizer "
                 f"steps; peak LR {schedule.max():.3e}; LR at the end of epoch 1: "
                 f"{epoch_end_lr(schedule, steps, 1):.3e}, epoch {last}: {epoch_end_lr(schedule, steps, last):.3e}")
    return "\n".join(lines)
