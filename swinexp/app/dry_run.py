"""What a command would do, printed instead of done: `dry_run=true` (the launch, the MindSpore context, the shards
and the recipe in numbers: model, data, total batch, the scaled LR schedule over all trainer.epochs and where
trainer.stop_after_epoch cuts it) and `inspect=amp|drift` (the precision policy per cell, or its drift against
fp32)."""
from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np

from swinexp.amp import AmpPolicy, overflow
from swinexp.amp import precision as amp_precision
from swinexp.amp import report as amp_report
from swinexp.build import (
    Plan,
    build_data_spec,
    build_experiment,
    build_model,
    build_precision,
    build_schedule,
    optimizer_steps,
    shard_sizes,
    total_batch_size,
)
from swinexp.config import HardwareCfg
from swinexp.registry import ConfigError
from swinexp.runtime import allocator, chips, hardware, launch
from swinexp.tracking import npu_monitor

log = logging.getLogger("swinexp")


def dry_run_report(plan: Plan, overrides: list[str], run_dir: Path) -> str:
    """What a launch would do, without the hardware: msrun call per node, MindSpore settings, shard sizes."""
    hw = plan.hardware
    world = launch.world_size(hw)
    spec = build_data_spec(plan)
    accumulation = plan.trainer.accumulation_steps
    lines = [f"dry run: {world} worker(s) = {hw.num_devices} per node x {hw.num_nodes} node(s), "
             f"device_target={hw.device_target}", *launch.launch_plan(hw, overrides, run_dir)]
    precision = build_precision(plan)
    lines.append("mindspore context: " + ", ".join(
        f"{k}={v}" for k, v in context_summary(hw, precision.policy).items()))
    lines += [f"precision note: {note}" for note in precision.notes]
    train, val = shard_sizes(plan, spec)
    lines.append(f"train shard per rank: {train} samples, {train[0] // spec.batch_size} batches of "
                 f"{spec.batch_size} per epoch")
    lines.append(f"val shard per rank: {val} samples")
    lines.append(f"total batch: {spec.batch_size} per device x {world} devices x {accumulation} accumulation "
                 f"= {spec.batch_size * world * accumulation}")
    return "\n".join(lines)


def context_summary(hw: HardwareCfg, policy: AmpPolicy | None = None) -> dict[str, object]:
    """The MindSpore settings `hardware.apply` makes, with `policy` resolved on the chip, for dry runs."""
    chip = chips.of(hw.device_target, hw.chip)
    precision = amp_precision.resolve(policy or AmpPolicy("O0"), chip)
    summary: dict[str, object] = {"device_target": hw.device_target, "mode": f"{hw.mode} ({hardware.MODES[hw.mode]})",
                                  "jit_level": hw.jit_level or "O0 (ms.jit's default)",
                                  "memory_optimize_level": hw.memory_optimize_level or "backend default",
                                  "overflow_check": overflow.describe(hw.overflow_check, hw.device_target, hw.chip)}
    if hw.device_target == "Ascend":
        summary["chip"] = chip.row() if chip else "read from the card at start"
        summary["ascend_precision_mode"] = (
            f"{precision.precision_mode}, HF32 off for MatMul and Conv" if precision.matmul_hf32 is False
            else str(precision.precision_mode)) if chip else "per chip: " + "; ".join(
            f"{name} {amp_precision.resolve(policy or AmpPolicy('O0'), chips.CHIPS[name]).precision_mode}"
            for name in chips.ASCEND_CHIPS)
    summary["amp_effective"] = precision.effective
    if hw.device_target == "CPU":
        summary["cpu_threads"] = hw.cpu_threads or f"{len(os.sched_getaffinity(0))} (one per core of this process)"
    summary["malloc"] = allocator.current()
    if hw.num_devices * hw.num_nodes > 1:
        summary.update({"communication": {"CPU": "MindSpore collective", "GPU": "NCCL", "Ascend": "HCCL"}[
            hw.device_target], "parallel_mode": "DATA_PARALLEL", "gradients_mean": True,
            "device_num": hw.num_devices * hw.num_nodes})
    return summary


def dry_run(plan: Plan, overrides: list[str], run_dir: Path) -> str:
    """The whole `dry_run=true` text: the launch and the recipe."""
    warn_embedded_data(plan)
    return "\n".join((dry_run_report(plan, overrides, run_dir), card_metrics(plan), describe(plan)))


def card_metrics(plan: Plan) -> str:
    """Whether rank 0 will sample the job's Ascend cards into MLflow's system metrics, and which."""
    tracking = plan.section("tracking")
    on = tracking.get("name") == "mlflow" and tracking.get("system_metrics", True)
    return npu_monitor.describe(tracking.get("system_metrics_interval_s", 10.0) if on else None,
                                plan.hardware.num_devices)


def warn_embedded_data(plan: Plan) -> None:
    """One line when an accelerator preset would train on the embedded synthetic shapes (the default data)."""
    if plan.hardware.device_target != "CPU" and plan.get("data.name") == "synthetic":
        log.warning("hardware=%s trains on the embedded synthetic dataset (%d px shapes, the laptop default); for "
                    "ImageNet use experiment=swin_tiny_in1k data.root=/path/to/imagenet (or data=imagenet)",
                    plan.hardware.device_target, int(plan.get("data.img_size")))


def inspect_precision(plan: Plan, what: str | None) -> str:
    """The text `inspect=amp|drift` prints: per-cell compute dtypes, or the policy's drift against fp32."""
    if what not in amp_report.INSPECTIONS:
        raise ConfigError(f"inspect={what} is not valid; choose one of: {', '.join(amp_report.INSPECTIONS)}, "
                          f"e.g. python run.py amp=o2 inspect=drift")
    precision = build_precision(plan)
    header = ("hardware: " + ", ".join(f"{k}={v}" for k, v in context_summary(
        plan.hardware, precision.policy).items() if k in ("device_target", "chip", "overflow_check",
                                                          "ascend_precision_mode", "amp_effective")))
    if what == "amp":  # no data needed: build only the model and the policy
        return header + "\n" + amp_report.dtype_table(precision.policy.apply(build_model(plan)), precision)
    exp = build_experiment(plan, amp_report=True)  # an inspection is not a tracked run
    return header + "\n" + exp.amp_report["amp_drift.txt"]


def epoch_end_lr(schedule: np.ndarray, steps_per_epoch: int, epoch: int) -> float:
    """The LR of the last optimizer step of `epoch` (1-based): the `lr` a run logs at step `epoch`."""
    return float(schedule[epoch * steps_per_epoch - 1])


def describe(plan: Plan) -> str:
    """A few lines that state the recipe `plan` trains with; `--cfg job` shows every key."""
    trainer = plan.trainer
    model, optimizer, scheduler = plan.section("model"), plan.section("optimizer"), plan.section("scheduler")
    data = plan.section("data")
    augment = data.pop("augment", None) or {"name": "none"}
    spec = build_data_spec(plan)
    total_batch = total_batch_size(plan, spec.batch_size)
    steps = optimizer_steps(trainer, shard_sizes(plan, spec)[0][0] // spec.batch_size)
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
        f"{trainer.label_smoothing}, ema.decay {trainer.ema.decay}, amp {build_precision(plan).effective}",
        f"  stop: after epoch {last} of {trainer.epochs}"
        + (" (a screen: rerun in its run dir with trainer.stop_after_epoch=null to continue)" if last < trainer.epochs
           else ""),
    ]
    schedule_args = ", ".join(f"{k}={v}" for k, v in scheduler.items() if k != "name")
    if steps == 0:
        lines.append(f"  schedule: {scheduler['name']} ({schedule_args}); the train split has fewer images per rank "
                     f"than one total batch, so no optimizer step per epoch")
        return "\n".join(lines)
    schedule = build_schedule(plan, total_batch, steps)
    lines.append(f"  schedule: {scheduler['name']} ({schedule_args}) over {trainer.epochs} epochs x {steps} optimizer "
                 f"steps; peak LR {schedule.max():.3e}; LR at the end of epoch 1: "
                 f"{epoch_end_lr(schedule, steps, 1):.3e}, epoch {last}: {epoch_end_lr(schedule, steps, last):.3e}")
    return "\n".join(lines)
