"""The only DictConfig -> objects boundary: `build_experiment(cfg)` returns plain Python objects."""
from __future__ import annotations

import inspect
import re
from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import mindspore as ms
import numpy as np
from mindspore import Tensor, nn
from omegaconf import DictConfig, OmegaConf

from swinexp.amp import AmpPolicy, overflow
from swinexp.config import ACCUMULATE_ON, HardwareCfg, TrainerCfg
from swinexp.data import AUGMENTS, DATASETS, DataSpec, Loader, build_loaders
from swinexp.data.datasets import check_data_args
from swinexp.data.transforms import EvalTransform
from swinexp.models.swin import check_resolution
from swinexp.optim import lr_scale
from swinexp.registry import AMP_POLICIES, MODELS, OPTIMIZERS, SCHEDULERS, TRACKERS, ConfigError, import_modules
from swinexp.runtime import hardware
from swinexp.runtime.launch import is_worker, rank, world_size
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
    steps_per_epoch: int             # optimizer steps; each takes trainer.accumulation_steps batches
    total_batch: int = 0             # images per optimizer step: batch x devices x accumulation_steps
    overflow_check: str = "isfinite"  # how the step sees fp16 overflow on this device (amp/overflow.resolve)


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
    if not 0 <= trainer.label_smoothing < 1:
        raise ConfigError(f"trainer.label_smoothing={trainer.label_smoothing} must be in [0, 1)")
    return trainer


def import_user_components(cfg: DictConfig) -> None:
    """Import the modules of the config's `imports:` list (the user's own registered components)."""
    import_modules(OmegaConf.select(cfg, "imports", default=None) or [], key="imports")


def build_model(cfg: DictConfig) -> nn.Cell:
    """The model of `cfg.model`; an error about a key the model takes from the data names the data key to change."""
    import_user_components(cfg)
    try:
        return MODELS.build(node(cfg, "model"))
    except ConfigError as err:
        raise _naming_the_followed_key(cfg, err) from err


def _naming_the_followed_key(cfg: DictConfig, err: ConfigError) -> ConfigError:
    """`err` about a model key that follows a data key (model.img_size: ${data.img_size}), told to change that one."""
    written = OmegaConf.to_container(cfg.model, resolve=False)
    followed = [k for k in written if f"model.{k}=" in str(err) and OmegaConf.is_interpolation(cfg.model, k)]
    if not followed:
        return err
    key = followed[0]
    source = re.search(r"data\.[\w.]+", str(written[key]))
    return ConfigError(f"{err}. model.{key} follows {source.group(0) if source else written[key]}: change that "
                       "key instead")


def hardware_cfg(cfg: DictConfig) -> HardwareCfg:
    """The validated `cfg.hardware` (mode, device target, process counts)."""
    hw: HardwareCfg = OmegaConf.to_object(cfg.hardware)
    hardware.validate(hw)
    return hw


def build_amp(cfg: DictConfig) -> AmpPolicy:
    """The precision policy of `cfg.amp`; invalid combinations are rejected here."""
    return AMP_POLICIES.build(node(cfg, "amp"))


def saved_config(saved: DictConfig, overrides: Sequence[str] = ()) -> DictConfig:
    """A run's config.yaml (resolved, untyped) typed again like the composed config, with `key=value` overrides.

    Raises:
        ConfigError: an override is not `key=value`, or names a trainer/hardware key the schema lacks.
    """
    if bad := [o for o in overrides if "=" not in o or o.startswith(("+", "~"))]:
        raise ConfigError(f"overrides must be key=value, e.g. data.root=/data/val_set; got {bad}")
    for group, schema in (("trainer", TrainerCfg), ("hardware", HardwareCfg)):  # a config.yaml of an older swinexp
        known = {f.name for f in fields(schema)}
        for key in [k for k in (saved.get(group) or {}) if k not in known]:
            del saved[group][key]
    typed = OmegaConf.create({"trainer": OmegaConf.structured(TrainerCfg),
                              "hardware": OmegaConf.structured(HardwareCfg)})
    try:
        return OmegaConf.merge(typed, saved, OmegaConf.from_dotlist(list(overrides)))
    except Exception as err:  # omegaconf's ConfigKeyError / ValidationError name the key
        raise ConfigError(f"{err}; check the override against the run's config.yaml") from err


def build_eval_transform(cfg: DictConfig) -> EvalTransform:
    """The validation transform of `cfg.data` (resize, center crop, normalize), without reading the data root."""
    data = node(cfg, "data")
    crop_pct = data.get("crop_pct", inspect.signature(DATASETS.get(data["name"])).parameters["crop_pct"].default)
    return EvalTransform(int(data["img_size"]), float(crop_pct))


def build_tracker(cfg: DictConfig) -> Tracker:
    """The experiment tracker of `cfg.tracking` (MLflow or none); with hardware.shared_dir set and no tracking.uri,
    the store is `<shared_dir>/mlflow.db`, which every node and every rerun finds."""
    import_user_components(cfg)
    tracking = node(cfg, "tracking")
    shared = OmegaConf.select(cfg, "hardware.shared_dir")
    if shared and "uri" in tracking and tracking["uri"] is None:
        tracking["uri"] = f"sqlite:///{Path(shared).resolve() / 'mlflow.db'}"
    return TRACKERS.build(tracking)


def data_node(cfg: DictConfig) -> tuple[dict[str, Any], dict[str, Any]]:
    """`cfg.data` split into the dataset's builder kwargs and its `augment` node."""
    data_cfg = node(cfg, "data")
    return data_cfg, data_cfg.pop("augment", None) or {"name": "none"}


def build_data_spec(cfg: DictConfig) -> DataSpec:
    """The dataset of `cfg.data`: file lists and loader settings (reads the folders; synthetic data is drawn)."""
    return DATASETS.build(data_node(cfg)[0])


def check_config(cfg: DictConfig, backend: bool = True) -> None:
    """Every check that needs no file, network, model or data: trainer, hardware backend, amp on that hardware, the
    data keys and that its root exists. Runs before a tracker store is opened, a model is built, or msrun starts
    workers.

    Args:
        backend: also check that this MindSpore build can run hardware.device_target (not for a dry run).
    """
    trainer_cfg(cfg)
    hw = hardware_cfg(cfg)
    if backend:
        hardware.check_backend(hw)
    check_amp_on_hardware(build_amp(cfg), hw)
    check_data_args(data_node(cfg)[0])
    model = node(cfg, "model")
    if {"img_size", "patch_size", "window_size", "depths"} <= model.keys():  # a Swin: its maps must fit the image
        try:
            check_resolution(model["img_size"], model["patch_size"], model["window_size"], len(model["depths"]))
        except ConfigError as err:
            raise _naming_the_followed_key(cfg, err) from err


def check_amp_on_hardware(amp: AmpPolicy, hw: HardwareCfg) -> None:
    """A precision policy the card cannot run, refused before launch (the first-generation 910 has no bfloat16)."""
    if hw.device_target == "CPU" and amp.dtype == ms.bfloat16:
        raise ConfigError("amp.dtype=bfloat16: MindSpore's CPU backend has no bfloat16 MatMul/Conv2D kernels, so the "
                          "network cannot run; use amp.dtype=float16 on CPU, or bfloat16 with a GPU/Ascend hardware "
                          "config")
    if hw.chip == overflow.FIRST_GENERATION and amp.dtype == ms.bfloat16:
        raise ConfigError(f"amp.dtype=bfloat16 but hardware.chip={hw.chip} (the first-generation Ascend 910) has no "
                          "bfloat16 kernels; use amp.dtype=float16 there, or hardware.chip=ascend910b on a 910B")


def total_batch_size(cfg: DictConfig, batch_size: int) -> int:
    """Images per optimizer step: per-device batch x devices x nodes x accumulation steps."""
    hw = cfg.hardware
    return batch_size * int(hw.num_devices) * int(hw.num_nodes) * trainer_cfg(cfg).accumulation_steps


def build_optimization(cfg: DictConfig, model: nn.Cell, steps_per_epoch: int,
                       total_batch: int) -> tuple[nn.Optimizer, np.ndarray]:
    """The optimizer over `model` and its per-optimizer-step LR schedule over trainer.epochs.

    Every LR of the schedule (warmup start, peak, floor) is scaled alike by total_batch / trainer.lr_batch_size,
    as in the official Swin main.py.

    Args:
        model: The network (already cast by its amp policy).
        steps_per_epoch: Optimizer steps per epoch (micro-batches / accumulation steps).
        total_batch: Images per optimizer step (see total_batch_size).

    Returns:
        The optimizer, which indexes the schedule with its own step counter, and the schedule itself.
    """
    schedule = build_schedule(cfg, trainer_cfg(cfg), total_batch, steps_per_epoch)
    return OPTIMIZERS.build({**node(cfg, "optimizer"), "lr": Tensor(schedule)}, model=model), schedule


def build_schedule(cfg: DictConfig, trainer: TrainerCfg, total_batch: int, steps_per_epoch: int) -> np.ndarray:
    """The LR of every optimizer step of all trainer.epochs (also when trainer.stop_after_epoch ends the run early).

    Every LR of the schedule (warmup start, peak, floor) scales by total_batch / trainer.lr_batch_size alike, as in
    the official Swin main.py.
    """
    scale = lr_scale(total_batch, trainer.lr_batch_size)
    return scale * SCHEDULERS.build(node(cfg, "scheduler"), base_lr=float(node(cfg, "optimizer")["lr"]),
                                    epochs=trainer.epochs, steps_per_epoch=steps_per_epoch)


def build_experiment(cfg: DictConfig, tracker: Tracker | None = None) -> Experiment:
    """Build model, data, optimizer and schedule (and the tracker unless given), cheapest checks first.

    Every check of `check_config` runs before the tracker opens its store and before the model is built. A
    `data.num_classes: null` is set to the number of classes the dataset found, in `cfg` itself, so the model head
    and the saved config agree with it.
    """
    import_user_components(cfg)
    check_config(cfg)  # reads no file: a wrong root fails before the model costs seconds to build
    trainer, amp = trainer_cfg(cfg), build_amp(cfg)
    data_cfg, augment_cfg = data_node(cfg)
    tracker = tracker if tracker is not None else build_tracker(cfg)
    counted = "num_classes" in cfg.data and cfg.data.num_classes is None  # null: count the class folders
    spec = DATASETS.build(data_cfg) if counted else None  # otherwise the model's checks run before any file is read
    if counted:
        cfg.data.num_classes = spec.num_classes  # for the model's ${data.num_classes} and the saved config.yaml
    model = amp.apply(build_model(cfg))
    spec = spec or DATASETS.build(data_cfg)
    head = getattr(model, "num_classes", spec.num_classes)
    if head != spec.num_classes:
        raise ConfigError(
            f"model.num_classes={head} but data '{data_cfg['name']}' has {spec.num_classes} classes; "
            "leave model.num_classes at ${data.num_classes} or set both to the same value"
        )
    augment = AUGMENTS.build(augment_cfg, img_size=spec.img_size, num_classes=spec.num_classes,
                             label_smoothing=trainer.label_smoothing)
    shards, shard_id = (world_size(cfg.hardware), rank()) if is_worker() else (1, 0)  # one shard per msrun worker
    train_loader, val_loader = build_loaders(spec, augment.transform, int(cfg.seed), augment.targets, shards, shard_id)
    batches = len(train_loader) if trainer.limit_train_batches is None else min(len(train_loader),
                                                                                trainer.limit_train_batches)
    steps = batches // trainer.accumulation_steps  # optimizer steps; a last incomplete window is dropped
    if steps == 0:
        raise ConfigError(f"trainer.accumulation_steps={trainer.accumulation_steps} exceeds the {batches} train "
                          "batches of an epoch; lower it or raise trainer.limit_train_batches / the data size")
    total_batch = total_batch_size(cfg, spec.batch_size)
    optimizer, schedule = build_optimization(cfg, model, steps, total_batch)
    hw = hardware_cfg(cfg)
    return Experiment(model, spec, train_loader, val_loader, optimizer, schedule, amp, trainer, tracker, steps,
                      total_batch=total_batch, overflow_check=overflow.resolve(hw.overflow_check, hw.device_target,
                                                                               hw.chip))
