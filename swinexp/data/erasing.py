"""timm's RandomErasing (Zhong et al., arXiv:1708.04896) on one normalized float32 CHW image."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

ERASE_MODES = ("const", "rand", "pixel")


@dataclass(frozen=True)
class RandomErasing:
    """With probability `probability`, erase `min_count..max_count` boxes of the image.

    Runs after normalization, so 'pixel' (per-pixel N(0, 1)) and 'rand' (one N(0, 1) colour per channel) noise
    matches the normalized data's scale, and 'const' writes 0, the dataset mean.

    Args:
        probability: chance that an image gets any erasing (Swin: re_prob 0.25).
        min_area, max_area: erased fraction of the image, split evenly over the boxes.
        min_aspect, max_aspect: box aspect ratio range, log-uniform; max_aspect None means 1 / min_aspect.
        mode: 'const', 'rand' or 'pixel' (Swin: pixel).
        min_count, max_count: number of boxes, uniform in [min, max]; max_count None means min_count.
    """

    probability: float = 0.5
    min_area: float = 0.02
    max_area: float = 1 / 3
    min_aspect: float = 0.3
    max_aspect: float | None = None
    mode: str = "const"
    min_count: int = 1
    max_count: int | None = None

    def __post_init__(self) -> None:
        if self.mode not in ERASE_MODES:
            raise ValueError(f"RandomErasing mode='{self.mode}'; use one of {', '.join(ERASE_MODES)}")

    def __call__(self, img: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Erase in place and return `img` (C, H, W)."""
        if rng.random() > self.probability:
            return img
        chan, img_h, img_w = img.shape
        area = img_h * img_w
        max_count = self.max_count or self.min_count
        count = self.min_count if self.min_count == max_count else int(rng.integers(self.min_count, max_count + 1))
        log_ratio = (math.log(self.min_aspect), math.log(self.max_aspect or 1 / self.min_aspect))
        for _ in range(count):
            for _attempt in range(10):
                target_area = rng.uniform(self.min_area, self.max_area) * area / count
                aspect = math.exp(rng.uniform(*log_ratio))
                h = round(math.sqrt(target_area * aspect))
                w = round(math.sqrt(target_area / aspect))
                if w < img_w and h < img_h:
                    top, left = int(rng.integers(0, img_h - h + 1)), int(rng.integers(0, img_w - w + 1))
                    img[:, top:top + h, left:left + w] = self._fill(chan, h, w, rng)
                    break
        return img

    def _fill(self, chan: int, h: int, w: int, rng: np.random.Generator) -> np.ndarray:
        if self.mode == "pixel":
            return rng.standard_normal((chan, h, w), dtype=np.float32)
        if self.mode == "rand":
            return rng.standard_normal((chan, 1, 1), dtype=np.float32)
        return np.zeros((chan, 1, 1), np.float32)
