"""`create_transform`: timm's train/eval image transform factory, same argument names and defaults.

Train order (timm's `transforms_imagenet_train`): RandomResizedCrop + flips -> auto-augment (RandAugment,
AutoAugment or AugMix) or else ColorJitter -> normalize -> RandomErasing. Eval: resize the short side to
floor(img_size / crop_pct), center crop, normalize.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from PIL import Image

from swinexp.data.auto_augment import build_auto_augment
from swinexp.data.erasing import ERASE_MODES, RandomErasing
from swinexp.data.transforms import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    TRAIN_INTERPOLATIONS,
    ColorJitter,
    EvalTransform,
    RandomResizedCropFlip,
    Transform,
    pixels_of,
    to_normalized_chw,
)
from swinexp.registry import ConfigError


class ImageOp(Protocol):
    def __call__(self, img: Image.Image, rng: np.random.Generator) -> Image.Image: ...


@dataclass(frozen=True)
class TrainTransform:
    """PIL image -> normalized float32 (3, H, W): crop/flip, colour ops, normalize, erase."""

    crop: RandomResizedCropFlip
    color: tuple[ImageOp, ...] = ()
    mean: tuple[float, ...] = IMAGENET_MEAN
    std: tuple[float, ...] = IMAGENET_STD
    erasing: RandomErasing | None = None

    def __call__(self, img: Image.Image, rng: np.random.Generator | None = None) -> np.ndarray:
        rng = rng if rng is not None else np.random.default_rng()  # interactive use: fresh, unreproducible draws
        x = to_normalized_chw(self.pil(img, rng), self.mean, self.std)
        return self.erasing(x, rng) if self.erasing is not None else x

    def pil(self, img: Image.Image, rng: np.random.Generator) -> Image.Image:
        """Crop/flip and colour ops: the image before normalization."""
        img = self.crop.pil(img, rng)
        for op in self.color:
            img = op(img, rng)
        return img

    def pixels(self, img: Image.Image, rng: np.random.Generator) -> np.ndarray:
        """uint8 (H, W, 3) before normalization; the erasing draws come next from the same `rng`."""
        return pixels_of(self.pil(img, rng))


def check_train_args(img_size: int, scale: Sequence[float], ratio: Sequence[float], interpolation: str,
                     hflip: float, re_prob: float, re_mode: str, re_count: int) -> None:
    """Raise ConfigError (naming data.augment.<key>) for arguments timm would reject or misuse."""
    if interpolation not in TRAIN_INTERPOLATIONS:
        raise ConfigError(f"data.augment.interpolation='{interpolation}'; choose one of: "
                          f"{', '.join(TRAIN_INTERPOLATIONS)}")
    if len(scale) != 2 or not 0 < scale[0] <= scale[1] <= 1:
        raise ConfigError(f"data.augment.scale={list(scale)} must be [min, max] with 0 < min <= max <= 1")
    if len(ratio) != 2 or not 0 < ratio[0] <= ratio[1]:
        raise ConfigError(f"data.augment.ratio={list(ratio)} must be [min, max] with 0 < min <= max, "
                          "e.g. [0.75, 1.333]")
    for key, p in (("hflip", hflip), ("re_prob", re_prob)):
        if not 0 <= p <= 1:
            raise ConfigError(f"data.augment.{key}={p} is a probability; use a value in [0, 1]")
    if re_mode not in ERASE_MODES:
        raise ConfigError(f"data.augment.re_mode='{re_mode}'; choose one of: {', '.join(ERASE_MODES)}")
    if re_count < 1:
        raise ConfigError(f"data.augment.re_count={re_count} must be >= 1 (the maximum number of erased boxes)")
    if img_size < 1:
        raise ConfigError(f"data.img_size={img_size} must be >= 1")


def create_transform(img_size: int, is_training: bool = False, scale: Sequence[float] = (0.08, 1.0),
                     ratio: Sequence[float] = (3 / 4, 4 / 3), hflip: float = 0.5, vflip: float = 0.0,
                     color_jitter: float | Sequence[float] | None = 0.4, auto_augment: str | None = None,
                     interpolation: str = "bilinear", mean: Sequence[float] = IMAGENET_MEAN,
                     std: Sequence[float] = IMAGENET_STD, re_prob: float = 0.0, re_mode: str = "const",
                     re_count: int = 1, crop_pct: float = 0.875) -> Transform:
    """A callable (PIL image, numpy Generator) -> normalized float32 CHW array, as timm's create_transform.

    Args:
        img_size: output side in pixels.
        is_training: the augmented train transform if True, else the resize + center-crop eval transform.
        scale, ratio: RandomResizedCrop area fraction and aspect-ratio ranges.
        hflip, vflip: flip probabilities.
        color_jitter: brightness/contrast/saturation strength (or a 3/4-list incl. hue); ignored, as in timm,
            when auto_augment is set.
        auto_augment: timm string: 'rand-m9-mstd0.5-inc1', 'original', 'v0r-mstd0.5', 'augmix-m5-w4-d2', or None.
        interpolation: 'bicubic', 'bilinear', 'nearest' or 'random' (train only: bilinear or bicubic per image).
        mean, std: normalization; the auto-augment fill colour is round(255 * mean).
        re_prob, re_mode, re_count: RandomErasing probability, fill mode and maximum box count.
        crop_pct: eval center-crop fraction.

    Returns:
        The transform; train transforms are a TrainTransform whose parts are inspectable.
    """
    if not is_training:
        return EvalTransform(img_size, crop_pct, interpolation if interpolation != "random" else "bilinear",
                             tuple(mean), tuple(std))
    check_train_args(img_size, scale, ratio, interpolation, hflip, re_prob, re_mode, re_count)
    crop = RandomResizedCropFlip(img_size, (float(scale[0]), float(scale[1])), (float(ratio[0]), float(ratio[1])),
                                 interpolation, hflip, vflip)
    color: tuple[ImageOp, ...] = ()
    if auto_augment:
        hparams = {"translate_const": int(img_size * 0.45),
                   "img_mean": tuple(min(255, round(255 * m)) for m in mean)}
        if interpolation != "random":  # else each op picks bilinear or bicubic per call
            hparams["interpolation"] = interpolation
        color = (build_auto_augment(auto_augment, hparams),)
    elif color_jitter:
        strengths = (float(color_jitter),) * 3 if isinstance(color_jitter, (int, float)) else tuple(color_jitter)
        if len(strengths) not in (3, 4):
            raise ConfigError(f"data.augment.color_jitter={list(strengths)}: give one number or 3-4 "
                              "(brightness, contrast, saturation[, hue])")
        color = (ColorJitter(*strengths),)
    erasing = RandomErasing(re_prob, mode=re_mode, max_count=re_count) if re_prob > 0 else None
    return TrainTransform(crop, color, tuple(mean), tuple(std), erasing)
