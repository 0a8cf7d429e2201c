"""Image transforms: PIL image (+ a per-sample numpy Generator) -> normalized float32 CHW array.

Randomness comes only from the `rng` argument, which the pipeline derives from (seed, epoch, sample index), so an
augmented sample is the same whatever worker process computes it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol, Sequence

import numpy as np
from PIL import Image

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

INTERPOLATIONS = {
    "bicubic": Image.Resampling.BICUBIC,
    "bilinear": Image.Resampling.BILINEAR,
    "nearest": Image.Resampling.NEAREST,
}


class Transform(Protocol):
    def __call__(self, img: Image.Image, rng: np.random.Generator) -> np.ndarray: ...


def to_normalized_chw(img: Image.Image, mean: Sequence[float] = IMAGENET_MEAN,
                      std: Sequence[float] = IMAGENET_STD) -> np.ndarray:
    """uint8 HWC RGB -> float32 CHW, (x/255 - mean) / std per channel."""
    x = np.asarray(img, dtype=np.float32) / 255.0  # (H, W, 3)
    x = (x - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)
    return np.ascontiguousarray(x.transpose(2, 0, 1))  # (3, H, W)


@dataclass(frozen=True)
class EvalTransform:
    """Resize the short side to int(img_size / crop_pct), center-crop img_size (timm's eval transform)."""

    img_size: int
    crop_pct: float = 0.875
    interpolation: str = "bicubic"

    def __call__(self, img: Image.Image, rng: np.random.Generator | None = None) -> np.ndarray:
        scale_size = math.floor(self.img_size / self.crop_pct)
        w, h = img.size
        if w <= h:
            new_w, new_h = scale_size, int(scale_size * h / w)
        else:
            new_w, new_h = int(scale_size * w / h), scale_size
        if (new_w, new_h) != (w, h):
            img = img.resize((new_w, new_h), INTERPOLATIONS[self.interpolation])
        left = int(round((new_w - self.img_size) / 2.0))
        top = int(round((new_h - self.img_size) / 2.0))
        img = img.crop((left, top, left + self.img_size, top + self.img_size))
        return to_normalized_chw(img)


@dataclass(frozen=True)
class RandomResizedCropFlip:
    """torchvision/timm RandomResizedCrop (10 tries, then a ratio-clamped center crop) and a horizontal flip."""

    img_size: int
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    interpolation: str = "bicubic"
    hflip: float = 0.5

    def crop_box(self, width: int, height: int, rng: np.random.Generator) -> tuple[int, int, int, int]:
        """(top, left, h, w) of the crop, exactly as torchvision's `RandomResizedCrop.get_params`."""
        area = width * height
        log_ratio = (math.log(self.ratio[0]), math.log(self.ratio[1]))
        for _ in range(10):
            target_area = area * rng.uniform(self.scale[0], self.scale[1])
            aspect = math.exp(rng.uniform(*log_ratio))
            w = int(round(math.sqrt(target_area * aspect)))
            h = int(round(math.sqrt(target_area / aspect)))
            if 0 < w <= width and 0 < h <= height:
                return int(rng.integers(0, height - h + 1)), int(rng.integers(0, width - w + 1)), h, w
        in_ratio = width / height
        if in_ratio < min(self.ratio):
            w, h = width, int(round(width / min(self.ratio)))
        elif in_ratio > max(self.ratio):
            h, w = height, int(round(height * max(self.ratio)))
        else:
            w, h = width, height
        return (height - h) // 2, (width - w) // 2, h, w

    def __call__(self, img: Image.Image, rng: np.random.Generator) -> np.ndarray:
        top, left, h, w = self.crop_box(*img.size, rng)
        img = img.resize((self.img_size, self.img_size), INTERPOLATIONS[self.interpolation],
                         box=(left, top, left + w, top + h))
        if rng.random() < self.hflip:
            img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        return to_normalized_chw(img)
