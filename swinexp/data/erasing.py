"""timm's RandomErasing (Zhong et al., arXiv:1708.04896), split into host draws and their application.

`RandomErasing.draw` makes every random decision of one image on the host (the boxes, a colour per box for 'rand',
a noise key per box for 'pixel') from the image's numpy Generator, in timm's order; the draws are small arrays that
travel with the uint8 pixels. `erase` applies them to a normalized float32 CHW image here, and
`swinexp.data.prologue` applies the same draws to a batch on the device. Per-pixel noise is a pure function of
(key, element index), `pixel_noise`: it reads a fixed table of N(0, 1) values at positions the key permutes, so
host and device give the same pixels bit for bit, and the device needs one int32 index and a gather per element
(a hash per element held int64 intermediates of the whole batch: 300 MB each at batch 256, 224 px).
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

ERASE_MODES = ("const", "rand", "pixel")
NOISE_BITS = 22  # the noise table: 2^22 float32 N(0, 1) values (16 MB), enough for one image up to 1182 px


@functools.cache
def noise_table() -> np.ndarray:
    """float32 (2^NOISE_BITS,) N(0, 1), fixed: the values 'pixel' erasing reads (the device gets the same array)."""
    return np.random.default_rng(0x5EED).standard_normal(1 << NOISE_BITS, dtype=np.float32)


@dataclass(frozen=True)
class EraseDraws:
    """The draws of one image (or, stacked, of a batch: a leading B axis on every array).

    Attributes:
        boxes: int32 (R, 4) top, left, height, width of each box in the order timm writes them; height 0: no box.
        colours: float32 (R, C): the fill of each box in 'rand' mode (zeros otherwise).
        keys: int64 (R, 2): per box, the (xor mask, offset) of its pixel noise in 'pixel' mode (zeros otherwise).
    """

    boxes: np.ndarray
    colours: np.ndarray
    keys: np.ndarray


def noise_positions(key: np.ndarray, index: np.ndarray) -> np.ndarray:
    """Where in `noise_table()` element `index` of a (C*H*W) image reads its noise: ((index ^ mask) + offset) mod
    2^NOISE_BITS, a bijection of the image's elements onto distinct table entries for each key."""
    wrap = (1 << NOISE_BITS) - 1
    return ((index.astype(np.int64) ^ (int(key[0]) & wrap)) + (int(key[1]) & wrap)) & wrap


def pixel_noise(key: np.ndarray, index: np.ndarray) -> np.ndarray:
    """float32 N(0, 1) for each element index of the C*H*W image, a pure function of (key, index): entries of a
    fixed table, so the device (`swinexp.data.prologue`) reads exactly the same values."""
    return noise_table()[noise_positions(key, index)]


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

    @property
    def slots(self) -> int:
        """R, the most boxes one image can get: the length of every draw array."""
        return max(self.max_count or self.min_count, self.min_count)

    def draw(self, shape: tuple[int, int, int], rng: np.random.Generator) -> EraseDraws:
        """The draws for one (C, H, W) image, in timm's order: erase?, count, then per box up to 10 tries of
        (area, aspect) and, for a box that fits, (top, left) and its fill."""
        chan, img_h, img_w = shape
        if self.mode == "pixel" and chan * img_h * img_w > 1 << NOISE_BITS:
            raise ValueError(f"RandomErasing mode='pixel' reads at most 2^{NOISE_BITS} noise values per image; "
                             f"a {chan} x {img_h} x {img_w} image needs more")
        boxes = np.zeros((self.slots, 4), np.int32)
        colours = np.zeros((self.slots, chan), np.float32)
        keys = np.zeros((self.slots, 2), np.int64)
        if rng.random() > self.probability:
            return EraseDraws(boxes, colours, keys)
        area = img_h * img_w
        max_count = self.max_count or self.min_count
        count = self.min_count if self.min_count == max_count else int(rng.integers(self.min_count, max_count + 1))
        log_ratio = (math.log(self.min_aspect), math.log(self.max_aspect or 1 / self.min_aspect))
        for r in range(count):
            for _attempt in range(10):
                target_area = rng.uniform(self.min_area, self.max_area) * area / count
                aspect = math.exp(rng.uniform(*log_ratio))
                h = round(math.sqrt(target_area * aspect))
                w = round(math.sqrt(target_area / aspect))
                if w < img_w and h < img_h:
                    top, left = int(rng.integers(0, img_h - h + 1)), int(rng.integers(0, img_w - w + 1))
                    boxes[r] = (top, left, h, w)
                    if self.mode == "rand":
                        colours[r] = rng.standard_normal(chan, dtype=np.float32)
                    elif self.mode == "pixel":
                        keys[r] = rng.integers(0, 1 << NOISE_BITS, 2, dtype=np.int64)
                    break
        return EraseDraws(boxes, colours, keys)

    def fill(self, draws: EraseDraws, r: int, shape: tuple[int, int, int]) -> np.ndarray:
        """The (C, h, w) pixels box `r` writes into a (C, H, W) image."""
        top, left, h, w = (int(v) for v in draws.boxes[r])
        chan, img_h, img_w = shape
        if self.mode == "pixel":
            c, y, x = np.meshgrid(np.arange(chan), np.arange(top, top + h), np.arange(left, left + w), indexing="ij")
            return pixel_noise(draws.keys[r], (c * img_h + y) * img_w + x)
        colour = draws.colours[r] if self.mode == "rand" else np.zeros(chan, np.float32)
        return np.broadcast_to(colour[:, None, None], (chan, h, w)).astype(np.float32)

    def erase(self, img: np.ndarray, draws: EraseDraws) -> np.ndarray:
        """Write the drawn boxes into `img` (C, H, W) in place, in order (a later box overwrites an earlier one)."""
        for r in range(len(draws.boxes)):
            top, left, h, w = (int(v) for v in draws.boxes[r])
            if h > 0:
                img[:, top:top + h, left:left + w] = self.fill(draws, r, img.shape)
        return img

    def __call__(self, img: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Draw and erase in place; return `img` (C, H, W)."""
        return self.erase(img, self.draw(img.shape, rng))
