"""timm's RandomErasing (Zhong et al., arXiv:1708.04896), split into host draws and their application.

`RandomErasing.draw` makes every random decision of one image on the host (the boxes, a colour per box for 'rand',
a noise key per box for 'pixel') from the image's numpy Generator, in timm's order; the draws are small arrays that
travel with the uint8 pixels. `erase` applies them to a normalized float32 CHW image here, and
`swinexp.data.prologue` applies the same draws to a batch on the device. Per-pixel noise is a pure function of
(key, element index), `pixel_noise`, so both give the same pixels.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

ERASE_MODES = ("const", "rand", "pixel")
_U32 = 0xFFFFFFFF


@dataclass(frozen=True)
class EraseDraws:
    """The draws of one image (or, stacked, of a batch: a leading B axis on every array).

    Attributes:
        boxes: int32 (R, 4) top, left, height, width of each box in the order timm writes them; height 0: no box.
        colours: float32 (R, C): the fill of each box in 'rand' mode (zeros otherwise).
        keys: int64 (R, 2): two 32-bit words per box keying its per-pixel noise in 'pixel' mode (zeros otherwise).
    """

    boxes: np.ndarray
    colours: np.ndarray
    keys: np.ndarray


def _mul32_np(x: np.ndarray, c: int) -> np.ndarray:
    return (x * np.uint64(c)) & np.uint64(_U32)  # x < 2^32, c < 2^32: the product fits 64 bits


def mix32_np(x: np.ndarray) -> np.ndarray:
    """lowbias32 (C. Wellons) on uint64 holding 32-bit values: the numpy twin of the prologue's hash."""
    x = x ^ (x >> np.uint64(16))
    x = _mul32_np(x, 0x7FEB352D)
    x = x ^ (x >> np.uint64(15))
    x = _mul32_np(x, 0x846CA68B)
    return x ^ (x >> np.uint64(16))


def pixel_noise(key: np.ndarray, index: np.ndarray) -> np.ndarray:
    """float32 N(0, 1) for each element index (of the C*H*W image), a pure function of (key, index): Box-Muller
    over two hashed 32-bit words. `swinexp.data.prologue.pixel_noise` computes the same on the device."""
    n = index.astype(np.uint64) * np.uint64(2)
    k0, k1 = np.uint64(int(key[0]) & _U32), np.uint64(int(key[1]) & _U32)
    h1 = mix32_np(mix32_np(n ^ k0) ^ k1)
    h2 = mix32_np(mix32_np((n + np.uint64(1)) ^ k0) ^ k1)
    u1 = (h1.astype(np.float32) + np.float32(0.5)) * np.float32(2.0**-32)  # (0, 1]: log stays finite
    u2 = h2.astype(np.float32) * np.float32(2.0**-32)
    radius = np.sqrt(np.float32(-2.0) * np.log(u1))
    return (radius * np.cos(np.float32(2 * math.pi) * u2)).astype(np.float32)


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
                        keys[r] = rng.integers(0, 2**32, 2, dtype=np.int64)
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
