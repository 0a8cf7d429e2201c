"""Train-time augmentation presets (`conf/data/augment/*.yaml`) and the timm-shaped augmentation API.

Each preset builder returns a TrainAugment: the per-image transform the pipeline's workers run and the per-batch
target transform (Mixup/CutMix, or label smoothing alone). `img_size`, `num_classes` and `label_smoothing` are
runtime arguments: build_experiment passes data.img_size, the dataset's class count and trainer.label_smoothing.
"""
from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from PIL import Image

from swinexp.data.auto_augment import (
    AugmentOp,
    AutoAugment,
    RandAugment,
    augment_and_mix_transform,
    auto_augment_transform,
    rand_augment_transform,
)
from swinexp.data.erasing import RandomErasing
from swinexp.data.factory import create_transform
from swinexp.data.mixup import MIX_MODES, Mixup
from swinexp.data.ops import LEVEL_TO_ARG, OPS
from swinexp.data.targets import BatchTransform, SmoothedTargets
from swinexp.data.transforms import EvalTransform, Transform
from swinexp.registry import AUGMENTS, ConfigError

__all__ = [
    "LEVEL_TO_ARG",
    "OPS",
    "AugmentOp",
    "AutoAugment",
    "RandAugment",
    "TrainAugment",
    "augment_and_mix_transform",
    "auto_augment_transform",
    "rand_augment_transform",
]


@dataclass(frozen=True)
class TrainAugment:
    """A preset's two halves; calling it runs the per-image half, so it is also a Transform."""

    transform: Transform
    targets: BatchTransform

    def __call__(self, img: Image.Image, rng: np.random.Generator) -> np.ndarray:
        return self.transform(img, rng)

    def pixels(self, img: Image.Image, rng: np.random.Generator) -> np.ndarray:
        return self.transform.pixels(img, rng)

    @property
    def mean(self) -> tuple[float, ...]:
        return self.transform.mean

    @property
    def std(self) -> tuple[float, ...]:
        return self.transform.std

    @property
    def erasing(self) -> RandomErasing | None:
        return getattr(self.transform, "erasing", None)


def build_targets(num_classes: int, label_smoothing: float, mixup_alpha: float, cutmix_alpha: float,
                  cutmix_minmax: Sequence[float] | None, mixup_prob: float, mixup_switch_prob: float,
                  mixup_mode: str) -> BatchTransform:
    """Mixup/CutMix when any of mixup_alpha, cutmix_alpha, cutmix_minmax is on, else smoothed one-hot targets."""
    if mixup_alpha < 0 or cutmix_alpha < 0:
        raise ConfigError(f"data.augment.mixup_alpha={mixup_alpha} and cutmix_alpha={cutmix_alpha} must be >= 0 "
                          "(0 disables each)")
    if mixup_mode not in MIX_MODES:
        raise ConfigError(f"data.augment.mixup_mode='{mixup_mode}'; choose one of: {', '.join(MIX_MODES)}")
    for key, p in (("mixup_prob", mixup_prob), ("mixup_switch_prob", mixup_switch_prob)):
        if not 0 <= p <= 1:
            raise ConfigError(f"data.augment.{key}={p} is a probability; use a value in [0, 1]")
    if cutmix_minmax is not None and (len(cutmix_minmax) != 2 or not 0 < cutmix_minmax[0] < cutmix_minmax[1] <= 1):
        raise ConfigError(f"data.augment.cutmix_minmax={list(cutmix_minmax)} must be null or [min, max] with "
                          "0 < min < max <= 1 (box side as a fraction of the image side)")
    if mixup_alpha == 0 and cutmix_alpha == 0 and cutmix_minmax is None:
        return SmoothedTargets(num_classes, label_smoothing)
    return Mixup(mixup_alpha, cutmix_alpha, None if cutmix_minmax is None else tuple(cutmix_minmax), mixup_prob,
                 mixup_switch_prob, mixup_mode, True, label_smoothing, num_classes)


@AUGMENTS.register("swin")
def swin(img_size: int, num_classes: int = 1000, label_smoothing: float = 0.1,
         scale: Sequence[float] = (0.08, 1.0), ratio: Sequence[float] = (3 / 4, 4 / 3),
         interpolation: str = "bicubic", hflip: float = 0.5, color_jitter: float | None = 0.4,
         auto_augment: str | None = "rand-m9-mstd0.5-inc1", re_prob: float = 0.25, re_mode: str = "pixel",
         re_count: int = 1, mixup_alpha: float = 0.8, cutmix_alpha: float = 1.0,
         cutmix_minmax: Sequence[float] | None = None, mixup_prob: float = 1.0, mixup_switch_prob: float = 0.5,
         mixup_mode: str = "batch") -> TrainAugment:
    """The official Swin ImageNet-1k recipe (Swin's config.py AUG.* defaults, built through timm's factory).

    Args:
        img_size: runtime: data.img_size.
        num_classes: runtime: the dataset's class count (the target width).
        label_smoothing: runtime: trainer.label_smoothing, folded into the (mixed) targets.
        scale, ratio, interpolation, hflip: RandomResizedCrop and flip.
        color_jitter: timm ignores it when auto_augment is set (Swin sets both: 0.4 is inert).
        auto_augment: timm string ('rand-m9-mstd0.5-inc1', 'original', ...) or null.
        re_prob, re_mode, re_count: RandomErasing after normalization.
        mixup_alpha, cutmix_alpha, cutmix_minmax, mixup_prob, mixup_switch_prob, mixup_mode: timm's Mixup
            (mixup_prob is Mixup's prob); both alphas 0 and no minmax disable mixing.
    """
    transform = create_transform(img_size, is_training=True, scale=scale, ratio=ratio, hflip=hflip,
                                 color_jitter=color_jitter, auto_augment=auto_augment or None,
                                 interpolation=interpolation, re_prob=re_prob, re_mode=re_mode, re_count=re_count)
    targets = build_targets(num_classes, label_smoothing, mixup_alpha, cutmix_alpha, cutmix_minmax, mixup_prob,
                            mixup_switch_prob, mixup_mode)
    return TrainAugment(transform, targets)


# AutoAugment's ImageNet policy (timm 'original') after crop/flip, no erasing or mixing: `swin` with four changes
# (auto_augment 'originalr', 'v0' or 'v0r' are timm's variants)
autoaugment = AUGMENTS.register("autoaugment")(
    functools.partial(swin, auto_augment="original", re_prob=0.0, mixup_alpha=0.0, cutmix_alpha=0.0))


@AUGMENTS.register("light")
def light(img_size: int, num_classes: int = 1000, label_smoothing: float = 0.1,
          scale: Sequence[float] = (0.08, 1.0), ratio: Sequence[float] = (3 / 4, 4 / 3),
          interpolation: str = "bicubic", hflip: float = 0.5) -> TrainAugment:
    """RandomResizedCrop + horizontal flip, timm's train transform without colour or auto-augment."""
    return swin(img_size, num_classes, label_smoothing, scale, ratio, interpolation, hflip, color_jitter=None,
                auto_augment=None, re_prob=0.0, mixup_alpha=0.0, cutmix_alpha=0.0)


@AUGMENTS.register("none")
def none(img_size: int, num_classes: int = 1000, label_smoothing: float = 0.1) -> TrainAugment:
    """No augmentation: resize and center-crop the whole image, as at evaluation; smoothed one-hot targets."""
    return TrainAugment(EvalTransform(img_size, crop_pct=1.0), SmoothedTargets(num_classes, label_smoothing))
