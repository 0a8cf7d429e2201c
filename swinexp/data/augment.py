"""Train-time augmentation presets (`conf/data/augment/*.yaml`), each a builder returning a Transform."""
from __future__ import annotations

from typing import Sequence

from swinexp.data.transforms import INTERPOLATIONS, EvalTransform, RandomResizedCropFlip, Transform
from swinexp.registry import AUGMENTS, ConfigError


@AUGMENTS.register("none")
def none(img_size: int) -> Transform:
    """No augmentation: resize and center-crop the whole image, as at evaluation."""
    return EvalTransform(img_size, crop_pct=1.0)


@AUGMENTS.register("light")
def light(img_size: int, scale: Sequence[float] = (0.08, 1.0), ratio: Sequence[float] = (3 / 4, 4 / 3),
          interpolation: str = "bicubic", hflip: float = 0.5) -> Transform:
    """RandomResizedCrop + horizontal flip, timm's train transform without colour or auto-augment."""
    if interpolation not in INTERPOLATIONS:
        raise ConfigError(f"data.augment.interpolation='{interpolation}'; choose one of: {', '.join(INTERPOLATIONS)}")
    if not (0 < scale[0] <= scale[1] <= 1):
        raise ConfigError(f"data.augment.scale={list(scale)} must satisfy 0 < min <= max <= 1")
    return RandomResizedCropFlip(img_size, tuple(scale), tuple(ratio), interpolation, hflip)
