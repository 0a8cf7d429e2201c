"""Image transforms: PIL image (+ a per-sample numpy Generator) -> normalized float32 CHW array.

Randomness comes only from the `rng` argument, which the pipeline derives from (seed, epoch, sample index), so an
augmented sample is the same whatever worker process computes it. Each transform also has `pixels(img, rng)`, its
uint8 HWC image before normalization: what the loader's workers send (`swinexp.data.prologue` normalizes on the
device, with the same float32 ops as `to_normalized_chw`).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from difflib import get_close_matches
from typing import Protocol

import numpy as np
from PIL import Image, ImageEnhance

from swinexp.registry import ConfigError

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

INTERPOLATIONS = {
    "bicubic": Image.Resampling.BICUBIC,
    "bilinear": Image.Resampling.BILINEAR,
    "nearest": Image.Resampling.NEAREST,
}
TRAIN_INTERPOLATIONS = (*INTERPOLATIONS, "random")  # random: bilinear or bicubic per image, as timm
# eval resize before the center crop, timm's crop_mode: center keeps the aspect ratio (short side to
# img_size / crop_pct); squash resizes both sides to it (crop_pct 1: the official Swin's TEST.CROP False)
CROP_MODES = ("center", "squash")


class Transform(Protocol):
    def __call__(self, img: Image.Image, rng: np.random.Generator) -> np.ndarray: ...


class PixelTransform(Transform, Protocol):
    """A Transform the loader can run in its workers: `pixels` is `__call__` before normalization (and erasing)."""

    mean: tuple[float, ...]
    std: tuple[float, ...]

    def pixels(self, img: Image.Image, rng: np.random.Generator) -> np.ndarray: ...


def check_crop_mode(crop_mode: str) -> None:
    if crop_mode not in CROP_MODES:
        hint = get_close_matches(str(crop_mode), CROP_MODES, n=1)
        raise ConfigError(f"data.crop_mode='{crop_mode}' is not an eval crop mode; choose one of: "
                          f"{', '.join(CROP_MODES)} (center: keep the aspect ratio, crop the middle; squash: resize "
                          "both sides to img_size / crop_pct, then crop)"
                          + (f". Did you mean '{hint[0]}'?" if hint else ""))


def pixels_of(img: Image.Image) -> np.ndarray:
    """uint8 (H, W, 3), C-contiguous: what a worker sends for one image (3 bytes a pixel)."""
    return np.ascontiguousarray(np.asarray(img, np.uint8))


def to_normalized_chw(img: Image.Image, mean: Sequence[float] = IMAGENET_MEAN,
                      std: Sequence[float] = IMAGENET_STD) -> np.ndarray:
    """uint8 HWC RGB -> float32 CHW, (x/255 - mean) / std per channel: torchvision's ToTensor + Normalize, bit for bit.

    The same three float32 operations in the same order, written into one CHW buffer: reading the uint8 pixels
    through a transposed view replaces the float HWC copies and the final transpose (4x faster at 224 px).
    """
    chw = np.asarray(img).transpose(2, 0, 1)  # (3, H, W) view of the uint8 pixels
    out = np.empty(chw.shape, np.float32)
    np.divide(chw, np.float32(255.0), out=out)
    out -= np.asarray(mean, np.float32)[:, None, None]
    out /= np.asarray(std, np.float32)[:, None, None]
    return out


@dataclass(frozen=True)
class EvalTransform:
    """Resize to floor(img_size / crop_pct), center-crop img_size (timm's eval transform): the short side
    (crop_mode 'center') or both sides (crop_mode 'squash', aspect ratio not kept)."""

    img_size: int
    crop_pct: float = 0.875
    interpolation: str = "bicubic"
    mean: tuple[float, ...] = IMAGENET_MEAN
    std: tuple[float, ...] = IMAGENET_STD
    crop_mode: str = "center"

    def __post_init__(self) -> None:
        check_crop_mode(self.crop_mode)

    def __call__(self, img: Image.Image, rng: np.random.Generator | None = None) -> np.ndarray:
        return to_normalized_chw(self.pil(img), self.mean, self.std)

    def pixels(self, img: Image.Image, rng: np.random.Generator | None = None) -> np.ndarray:
        return pixels_of(self.pil(img))

    def pil(self, img: Image.Image) -> Image.Image:
        """The resized, center-cropped image."""
        scale_size = math.floor(self.img_size / self.crop_pct)
        w, h = img.size
        if self.crop_mode == "squash":
            new_w, new_h = scale_size, scale_size
        elif w <= h:
            new_w, new_h = scale_size, int(scale_size * h / w)
        else:
            new_w, new_h = int(scale_size * w / h), scale_size
        if (new_w, new_h) != (w, h):
            img = img.resize((new_w, new_h), INTERPOLATIONS[self.interpolation])
        left = round((new_w - self.img_size) / 2.0)
        top = round((new_h - self.img_size) / 2.0)
        return img.crop((left, top, left + self.img_size, top + self.img_size))


@dataclass(frozen=True)
class RandomResizedCropFlip:
    """torchvision/timm RandomResizedCrop (10 tries, then a ratio-clamped center crop) and random flips."""

    img_size: int
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    interpolation: str = "bicubic"
    hflip: float = 0.5
    vflip: float = 0.0

    def crop_box(self, width: int, height: int, rng: np.random.Generator) -> tuple[int, int, int, int]:
        """(top, left, h, w) of the crop, exactly as torchvision's `RandomResizedCrop.get_params`."""
        area = width * height
        log_ratio = (math.log(self.ratio[0]), math.log(self.ratio[1]))
        for _ in range(10):
            target_area = area * rng.uniform(self.scale[0], self.scale[1])
            aspect = math.exp(rng.uniform(*log_ratio))
            w = round(math.sqrt(target_area * aspect))
            h = round(math.sqrt(target_area / aspect))
            if 0 < w <= width and 0 < h <= height:
                return int(rng.integers(0, height - h + 1)), int(rng.integers(0, width - w + 1)), h, w
        in_ratio = width / height
        if in_ratio < min(self.ratio):
            w, h = width, round(width / min(self.ratio))
        elif in_ratio > max(self.ratio):
            h, w = height, round(height * max(self.ratio))
        else:
            w, h = width, height
        return (height - h) // 2, (width - w) // 2, h, w

    def pil(self, img: Image.Image, rng: np.random.Generator) -> Image.Image:
        """The cropped, resized, maybe flipped image, before any colour op or normalization."""
        top, left, h, w = self.crop_box(*img.size, rng)
        name = self.interpolation if self.interpolation != "random" else ("bilinear", "bicubic")[rng.integers(2)]
        # crop, then resize: torchvision's resized_crop. resize(box=...) would differ in the border pixels, whose
        # filter taps it takes from outside the box
        img = img.crop((left, top, left + w, top + h)).resize((self.img_size, self.img_size), INTERPOLATIONS[name])
        if self.hflip > 0 and rng.random() < self.hflip:
            img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        if self.vflip > 0 and rng.random() < self.vflip:
            img = img.transpose(Image.Transpose.FLIP_TOP_BOTTOM)
        return img

    mean: tuple[float, ...] = IMAGENET_MEAN
    std: tuple[float, ...] = IMAGENET_STD

    def __call__(self, img: Image.Image, rng: np.random.Generator) -> np.ndarray:
        return to_normalized_chw(self.pil(img, rng), self.mean, self.std)

    def pixels(self, img: Image.Image, rng: np.random.Generator) -> np.ndarray:
        return pixels_of(self.pil(img, rng))


@dataclass(frozen=True)
class ColorJitter:
    """torchvision's ColorJitter on PIL images: factors drawn from [max(0, 1 - x), 1 + x] (hue: [-h, h]),
    applied in a random order; timm uses it only when no auto-augment is set."""

    brightness: float = 0.4
    contrast: float = 0.4
    saturation: float = 0.4
    hue: float = 0.0

    def __call__(self, img: Image.Image, rng: np.random.Generator) -> Image.Image:
        for op in rng.permutation(4):
            amount = (self.brightness, self.contrast, self.saturation, self.hue)[op]
            if amount <= 0:
                continue
            if op == 3:
                img = _shift_hue(img, rng.uniform(-amount, amount))
            else:
                enhancer = (ImageEnhance.Brightness, ImageEnhance.Contrast, ImageEnhance.Color)[op]
                img = enhancer(img).enhance(rng.uniform(max(0.0, 1 - amount), 1 + amount))
        return img


def _shift_hue(img: Image.Image, shift: float) -> Image.Image:
    h, s, v = img.convert("HSV").split()
    hue = np.asarray(h, np.uint8) + np.uint8(int(shift * 255) % 256)  # uint8 wraps around the hue circle
    return Image.merge("HSV", (Image.fromarray(hue, "L"), s, v)).convert("RGB")
