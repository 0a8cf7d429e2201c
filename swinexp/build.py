"""Config to objects: `resolve(cfg)` turns the composed config into a validated `Plan` (once per process); the
`build_*` functions turn a Plan into the objects a job runs. Nothing below this module sees the config itself."""
from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import replace
from functools import partial
from typing import Any

import mindspore as ms
import numpy as np
from mindspore import Tensor, nn

from swinexp.amp import AmpPolicy, overflow
from swinexp.amp import precision as amp_precision
from swinexp.amp import report as precision_report
from swinexp.amp.precision import Precision
from swinexp.config import ACCUMULATE_ON, Composed, HardwareCfg, Plan, TrainerCfg, compose, read, saved
from swinexp.data import AUGMENTS, DATASETS, DataSpec, build_loaders
from swinexp.data.datasets import check_data_args
from swinexp.data.native import native_of
from swinexp.data.pipeline import EpochSampler
from swinexp.data.transforms import EvalTransform
from swinexp.engine.experiment import Experiment, start_params
from swinexp.models import factory, fused_cpu
from swinexp.models.swin import check_resolution
from swinexp.optim import lr_scale
from swinexp.registry import AMP_POLICIES, OPTIMIZERS, SCHEDULERS, ConfigError, import_modules
from swinexp.runtime import chips, hardware
from swinexp.runtime.launch import is_worker, rank, world_size
from swinexp.tracking import NullTracker, Tracker

__all__ = ["Experiment", "Plan", "build_amp", "build_data_spec", "build_eval_transform", "build_experiment",
           "build_model", "build_optimization", "build_precision", "build_schedule", "configure_device",
           "optimizer_steps", "plan_for", "resolve", "saved_plan", "shard_sizes", "total_batch_size"]


def resolve(cfg: Composed | Plan, backend: bool = True) -> Plan:
    """The composed config as a validated Plan: every check that needs no file, network, model or data — trainer,
    hardware, amp on that hardware, the data keys, the model's resolution — runs here, before a tracker store is
    opened, a model is built or msrun starts workers. The user's `imports:` are imported first.

    Args:
        backend: also check that this MindSpore build can run hardware.device_target (not for a dry run, which
            works anywhere).
    """
    plan = cfg if isinstance(cfg, Plan) else read(cfg)
    import_modules(plan.imports, key="imports")
    check_trainer(plan.trainer)
    hardware.validate(plan.hardware)
    if backend:
        hardware.check_backend(plan.hardware)
    plan = _with_card(plan, hardware.with_card(plan.hardware))  # hardware.chip=null: the card's, where one is here
    check_amp_on_hardware(build_amp(plan), plan.hardware)
    check_data_args(_data_and_augment(plan)[0])
    check_native_recipe(plan)
    model = plan.section("model")
    check_kernels_on_hardware({"model.kernels": model.get("kernels"),
                               "optimizer.kernel": plan.section("optimizer").get("kernel")}, plan.hardware,
                              compiler=backend)
    if {"img_size", "patch_size", "window_size", "depths"} <= model.keys():  # a Swin: its maps must fit the image
        try:
            check_resolution(model["img_size"], model["patch_size"], model["window_size"], len(model["depths"]))
        except ConfigError as err:
            raise _naming_the_followed_key(plan, err) from err
    return plan


def plan_for(overrides: Sequence[str] = (), backend: bool = True) -> Plan:
    """The validated plan of `python run.py <overrides>`, for tools that are not the Hydra app (self-check, parity,
    benchmarks)."""
    return resolve(compose(overrides), backend)


def saved_plan(config: Any, overrides: Sequence[str] = ()) -> Plan:
    """A saved run's plan: its config.yaml (a path or the mapping a checkpoint carries) with `key=value` overrides,
    typed but not validated (the tools that serve a run need the model, not the trainer's checks)."""
    return saved(config, overrides)


def check_trainer(trainer: TrainerCfg) -> None:
    if trainer.epochs < 1:
        raise ConfigError(f"trainer.epochs={trainer.epochs} must be >= 1")
    stop = trainer.stop_after_epoch
    if stop is not None and not 1 <= stop <= trainer.epochs:
        raise ConfigError(f"trainer.stop_after_epoch={stop} must be between 1 and trainer.epochs={trainer.epochs} "
                          "(the epoch a screen stops after), or null to train all trainer.epochs")
    if trainer.accumulation_steps < 1:
        raise ConfigError(f"trainer.accumulation_steps={trainer.accumulation_steps} must be >= 1 (1 = no accumulation)")
    if trainer.accumulate_on not in ACCUMULATE_ON:
        raise ConfigError(f"trainer.accumulate_on='{trainer.accumulate_on}' is not valid; choose one of: "
                          f"{', '.join(ACCUMULATE_ON)}")
    if trainer.lr_batch_size is not None and trainer.lr_batch_size <= 0:
        raise ConfigError(f"trainer.lr_batch_size={trainer.lr_batch_size} must be > 0, or null to use the LRs as given")
    if trainer.ema.decay is not None and not 0 < trainer.ema.decay < 1:
        raise ConfigError(f"trainer.ema.decay={trainer.ema.decay} must be in (0, 1), e.g. 0.9998, or null to disable")
    if trainer.clip_grad is not None and trainer.clip_grad <= 0:
        raise ConfigError(f"trainer.clip_grad={trainer.clip_grad} must be > 0, or null to disable clipping")
    if trainer.log_every_n_steps < 1:
        raise ConfigError(f"trainer.log_every_n_steps={trainer.log_every_n_steps} must be >= 1 (optimizer steps "
                          "between the host's reads of the step outputs)")
    if trainer.max_nonfinite < 1 or trainer.max_overflow_at_min_scale < 1:
        raise ConfigError(f"trainer.max_nonfinite={trainer.max_nonfinite} and trainer.max_overflow_at_min_scale="
                          f"{trainer.max_overflow_at_min_scale} must be >= 1 (steps in a row that stop a diverged run)")
    if not 0 <= trainer.label_smoothing < 1:
        raise ConfigError(f"trainer.label_smoothing={trainer.label_smoothing} must be in [0, 1)")
    if trainer.straggler_factor <= 1:
        raise ConfigError(f"trainer.straggler_factor={trainer.straggler_factor} must be > 1 (e.g. 1.5: a rank 50% "
                          "slower than the median of the other ranks)")
    if trainer.straggler_patience < 1:
        raise ConfigError(f"trainer.straggler_patience={trainer.straggler_patience} must be >= 1 (read points in a "
                          "row)")


def check_native_recipe(plan: Plan) -> None:
    """With data.pipeline=native, the augment preset must have MindSpore counterparts (no AugMix, no per-image
    random interpolation): refused here rather than after the model is built."""
    data, augment = _data_and_augment(plan)
    if data.get("pipeline") == "native":
        native_of(AUGMENTS.build(augment, img_size=int(data["img_size"])).transform)


def build_model(plan: Plan) -> nn.Cell:
    """The model of `plan.model`; an error about a key the model takes from the data names the data key to change."""
    try:
        return factory.build_model(plan.section("model"))
    except ConfigError as err:
        raise _naming_the_followed_key(plan, err) from err


def _naming_the_followed_key(plan: Plan, err: ConfigError) -> ConfigError:
    """`err` about a model key that follows a data key (model.img_size: ${data.img_size}), told to change that one."""
    followed = [key for key in plan.follows if f"{key}=" in str(err)]
    if not followed:
        return err
    return ConfigError(f"{err}. {followed[0]} follows {plan.follows[followed[0]]}: change that key instead")


def build_amp(plan: Plan) -> AmpPolicy:
    """The precision policy of `plan.amp` as it runs on the plan's chip (`build_precision`); invalid combinations
    are rejected here."""
    return build_precision(plan).policy


def build_precision(plan: Plan) -> Precision:
    """`plan.amp` resolved on the plan's chip: the Ascend precision mode and HF32 switches it needs there, and the
    name of what it computes (`o0 (fp32 except Cube inputs: fp16 on ascend910)`)."""
    hw = plan.hardware
    return amp_precision.resolve(AMP_POLICIES.build(plan.section("amp")), chips.of(hw.device_target, hw.chip))


def configure_device(plan: Plan, one_process: bool = False) -> Plan:
    """Set the MindSpore context, seeds and kernels the plan's run needs — with its amp policy's precision resolved
    on the card, so fp32 stays as fp32 as the chip can — once per process, before building.

    Args:
        one_process: one process on one card (serving a run, a check, a benchmark), whatever the run trained on.

    Returns:
        The plan with `hardware.chip` the card's (Ascend): build from this one.
    """
    hw = replace(plan.hardware, num_devices=1, num_nodes=1) if one_process else plan.hardware
    policy = AMP_POLICIES.build(plan.section("amp"))
    hw = hardware.apply(hw, plan.seed, plan.trainer.deterministic, partial(amp_precision.resolve, policy))
    return _with_card(plan, hw)


def _with_card(plan: Plan, hw: HardwareCfg) -> Plan:
    return plan if hw.chip == plan.hardware.chip else plan.with_values({"hardware.chip": hw.chip})


def build_eval_transform(plan: Plan) -> EvalTransform:
    """The validation transform of `plan.data` (resize, center crop, normalize), without reading the data root."""
    data = plan.section("data")
    defaults = inspect.signature(DATASETS.get(data["name"])).parameters
    crop_pct = data.get("crop_pct", defaults["crop_pct"].default)
    crop_mode = data.get("crop_mode", defaults["crop_mode"].default)
    return EvalTransform(int(data["img_size"]), float(crop_pct), crop_mode=str(crop_mode))


def _data_and_augment(plan: Plan) -> tuple[dict[str, Any], dict[str, Any]]:
    """`plan.data` split into the dataset's builder kwargs and its `augment` node."""
    data = plan.section("data")
    return data, data.pop("augment", None) or {"name": "none"}


def build_data_spec(plan: Plan) -> DataSpec:
    """The dataset of `plan.data`: file lists and loader settings (reads the folders; synthetic data is drawn)."""
    return DATASETS.build(_data_and_augment(plan)[0])


def check_amp_on_hardware(amp: AmpPolicy, hw: HardwareCfg) -> None:
    """A precision policy the card cannot run, refused before launch (the first-generation 910 has no bfloat16)."""
    if hw.device_target == "CPU" and amp.dtype == ms.bfloat16:
        raise ConfigError("amp.dtype=bfloat16: MindSpore's CPU backend has no bfloat16 MatMul/Conv2D kernels, so the "
                          "network cannot run; use amp.dtype=float16 on CPU, or bfloat16 with a GPU/Ascend hardware "
                          "config")
    chip = chips.of(hw.device_target, hw.chip)
    if hw.device_target == "Ascend" and chip is not None and not chip.bf16 and amp.dtype == ms.bfloat16:
        raise ConfigError(f"amp.dtype=bfloat16 but hardware.chip={hw.chip} ({chip.product}) has no bfloat16 kernels; "
                          "use amp.dtype=float16 there (bfloat16 needs an Atlas A2 card or later)")


def check_kernels_on_hardware(kernels: dict[str, str | None], hw: HardwareCfg, compiler: bool = True) -> None:
    """Config keys (model.kernels, optimizer.kernel) set to fused_cpu run C++ kernels on the host: refused for a card,
    and without a compiler to build them (`compiler`: checked where the run will start, not for a dry run)."""
    fused = tuple(key for key, value in kernels.items() if value == "fused_cpu")
    if not fused:
        return
    if hw.device_target != "CPU":
        chosen, fix = " and ".join(f"{key}=fused_cpu" for key in fused), " ".join(f"{key}=mindspore" for key in fused)
        raise ConfigError(f"{chosen} compute on the CPU, but hardware.device_target={hw.device_target}: use {fix} "
                          "there (the GPU and Ascend presets do)")
    if compiler:
        fused_cpu.check_compiler(fused)


def total_batch_size(plan: Plan, batch_size: int) -> int:
    """Images per optimizer step: per-device batch x devices x nodes x accumulation steps."""
    return batch_size * world_size(plan.hardware) * plan.trainer.accumulation_steps


def optimizer_steps(trainer: TrainerCfg, train_batches: int) -> int:
    """Optimizer steps per epoch from one rank's train batches: capped by trainer.limit_train_batches, then
    trainer.accumulation_steps batches a step; a last incomplete window is dropped."""
    if trainer.limit_train_batches is not None:
        train_batches = min(train_batches, trainer.limit_train_batches)
    return train_batches // trainer.accumulation_steps


def shard_sizes(plan: Plan, spec: DataSpec) -> tuple[list[int], list[int]]:
    """Train and val samples per epoch of each of the plan's ranks (what a dry run states before workers start)."""
    world = world_size(plan.hardware)
    return ([len(EpochSampler(len(spec.train), 0, True, world, r)) for r in range(world)],
            [len(EpochSampler(len(spec.val), 0, False, world, r)) for r in range(world)])


def build_optimization(plan: Plan, model: nn.Cell, steps_per_epoch: int,
                       total_batch: int) -> tuple[nn.Optimizer, np.ndarray]:
    """The optimizer over `model` and its per-optimizer-step LR schedule over trainer.epochs.

    Args:
        model: The network (already cast by its amp policy).
        steps_per_epoch: Optimizer steps per epoch (micro-batches / accumulation steps).
        total_batch: Images per optimizer step (see total_batch_size).

    Returns:
        The optimizer, which indexes the schedule with its own step counter, and the schedule itself.
    """
    schedule = build_schedule(plan, total_batch, steps_per_epoch)
    return OPTIMIZERS.build({**plan.section("optimizer"), "lr": Tensor(schedule)}, model=model), schedule


def build_schedule(plan: Plan, total_batch: int, steps_per_epoch: int) -> np.ndarray:
    """The LR of every optimizer step of all trainer.epochs (also when trainer.stop_after_epoch ends the run early).

    Every LR of the schedule (warmup start, peak, floor) scales by total_batch / trainer.lr_batch_size alike, as in
    the official Swin main.py.
    """
    scale = lr_scale(total_batch, plan.trainer.lr_batch_size)
    return scale * SCHEDULERS.build(plan.section("scheduler"), base_lr=float(plan.section("optimizer")["lr"]),
                                    epochs=plan.trainer.epochs, steps_per_epoch=steps_per_epoch)


def build_experiment(plan: Plan, tracker: Tracker | None = None, amp_report: bool = False) -> Experiment:
    """Build model, data, optimizer and schedule, cheapest first; `tracker` (default: none) is what the loop logs to.

    With `amp_report`, the experiment carries the AMP policy's dtype table and its drift against fp32 on one val
    batch (`Experiment.amp_report`), measured on this one model before and after the policy casts it.

    A `data.num_classes: null` becomes the number of classes the dataset found, in the returned experiment's
    `plan` (and every model key that follows it), so the model head and the saved config agree with it.
    """
    trainer, precision = plan.trainer, build_precision(plan)
    amp = precision.policy
    data_cfg, augment_cfg = _data_and_augment(plan)
    tracker = tracker if tracker is not None else NullTracker()
    counted = "num_classes" in data_cfg and data_cfg["num_classes"] is None  # null: count the class folders
    spec = DATASETS.build(data_cfg) if counted else None  # otherwise the model's checks run before any file is read
    if counted:
        plan = plan.with_values({"data.num_classes": spec.num_classes})
    model = build_model(plan)  # fp32 until the data is there: the drift report records its fp32 outputs first
    spec = spec or DATASETS.build(data_cfg)
    head = getattr(model, "num_classes", spec.num_classes)
    if head != spec.num_classes:
        raise ConfigError(
            f"model.num_classes={head} but data '{data_cfg['name']}' has {spec.num_classes} classes; "
            "leave model.num_classes at ${data.num_classes} or set both to the same value"
        )
    augment = AUGMENTS.build(augment_cfg, img_size=spec.img_size, num_classes=spec.num_classes,
                             label_smoothing=trainer.label_smoothing)
    shards, shard_id = (world_size(plan.hardware), rank()) if is_worker() else (1, 0)  # one shard per msrun worker
    train_loader, val_loader = build_loaders(spec, augment.transform, plan.seed, augment.targets, shards, shard_id)
    if amp_report:
        images, _ = next(iter(val_loader.epoch(0)))
        fp32 = precision_report.fp32_outputs(model, images)
    started = model  # the built cell, which carries its pretrained load report and frozen names
    model = amp.apply(model)
    report = precision_report.artifacts(fp32, model, precision, images) if amp_report else None
    steps = optimizer_steps(trainer, len(train_loader))
    if steps == 0:
        raise ConfigError(f"trainer.accumulation_steps={trainer.accumulation_steps} exceeds the {len(train_loader)} "
                          "train batches of an epoch; lower it or raise trainer.limit_train_batches / the data size")
    total_batch = total_batch_size(plan, spec.batch_size)
    optimizer, schedule = build_optimization(plan, model, steps, total_batch)
    tracker.log_params(start_params(started, optimizer, schedule))
    hw = plan.hardware
    return Experiment(model, spec, train_loader, val_loader, optimizer, schedule, amp, trainer, tracker, steps,
                      total_batch=total_batch, lr_scale=lr_scale(total_batch, trainer.lr_batch_size), plan=plan,
                      amp_report=report, amp_effective=precision.effective,
                      overflow_check=overflow.resolve(hw.overflow_check, hw.device_target, hw.chip))
