"""The device prologue: uint8 HWC batches from the loader's workers -> the float32 NCHW batch the model sees.

Workers send pixels as uint8 (3 bytes a pixel instead of 12) and the few numbers of their random decisions; the
per-pixel work timm's pipeline does on the host happens here, in one small jitted graph per batch shape:

    float -> /255 -> -mean -> /std   (torchvision's ToTensor + Normalize, same float32 ops in the same order)
    -> RandomErasing from the per-image draws (boxes; a colour, or a key into a fixed noise table, per box)
    -> Mixup / CutMix from the per-batch draws (pixel weights and a box per image, partner B-1-i)

`swinexp.data.erasing` and `swinexp.data.mixup` apply the same draws with numpy (`RandomErasing.erase`,
`mixup.mix_images`); the tests hold the two equal.
"""
from __future__ import annotations

from collections.abc import Sequence

import mindspore as ms
import numpy as np
from mindspore import Tensor, ops

from swinexp.data.erasing import NOISE_BITS, EraseDraws, noise_table
from swinexp.data.targets import MixDraws

__all__ = ["Prologue", "normalize", "pixel_noise"]

def pixel_noise(table: Tensor, keys: Tensor, size: int) -> Tensor:
    """float32 (B, size) N(0, 1): row b is `erasing.pixel_noise(keys[b], arange(size))`, read from the same table.

    Args:
        table: float32 (2^NOISE_BITS,), `erasing.noise_table()`.
        keys: int64 (B, 2) (xor mask, offset), one box's noise key per image, each < 2^NOISE_BITS.
        size: C * H * W.
    """
    index = ops.arange(0, size, dtype=ms.int32).reshape(1, size)
    keys = ops.cast(keys, ms.int32)  # int32 all the way: (B, C*H*W) int64 intermediates were 300 MB each
    position = ops.bitwise_and(ops.bitwise_xor(index, keys[:, 0:1]) + keys[:, 1:2], (1 << NOISE_BITS) - 1)
    return ops.gather(table, position.reshape(-1), 0).reshape(-1, size)


def normalize(pixels: Tensor, mean: Tensor, std: Tensor) -> Tensor:
    """uint8 (B, H, W, C) -> float32 (B, C, H, W), (x/255 - mean) / std; mean, std float32 (C, 1, 1)."""
    x = ops.cast(ops.transpose(pixels, (0, 3, 1, 2)), ms.float32)
    return (x / 255.0 - mean) / std


def _box_mask(h: int, w: int, top: Tensor, bottom: Tensor, left: Tensor, right: Tensor) -> Tensor:
    """bool (B, 1, H, W): rows [top, bottom) x columns [left, right) of each image; bounds int32 (B,)."""
    ys = ops.arange(0, h, dtype=ms.int32).reshape(1, h, 1)
    xs = ops.arange(0, w, dtype=ms.int32).reshape(1, 1, w)
    rows = ops.logical_and(ys >= top.reshape(-1, 1, 1), ys < bottom.reshape(-1, 1, 1))
    cols = ops.logical_and(xs >= left.reshape(-1, 1, 1), xs < right.reshape(-1, 1, 1))
    return ops.expand_dims(ops.logical_and(rows, cols), 1)


def erase(x: Tensor, boxes: Tensor, colours: Tensor, keys: Tensor, table: Tensor, mode: str) -> Tensor:
    """RandomErasing of every image from its draws, box by box (a later box overwrites an earlier one).

    Args:
        x: float32 (B, C, H, W), normalized.
        boxes: int32 (B, R, 4) top, left, height, width (height 0: no box).
        colours: float32 (B, R, C), the 'rand' fills; keys: int64 (B, R, 2), the 'pixel' noise keys.
        table: the 'pixel' noise table.
        mode: 'const', 'rand' or 'pixel'.
    """
    b, c, h, w = x.shape
    for r in range(boxes.shape[1]):
        top, left, bh, bw = boxes[:, r, 0], boxes[:, r, 1], boxes[:, r, 2], boxes[:, r, 3]
        inside = ops.broadcast_to(_box_mask(h, w, top, top + bh, left, left + bw), (b, c, h, w))
        if mode == "pixel":
            fill = pixel_noise(table, keys[:, r], c * h * w).reshape(b, c, h, w)
        elif mode == "rand":
            fill = ops.broadcast_to(colours[:, r].reshape(b, c, 1, 1), (b, c, h, w))
        else:
            fill = ops.zeros_like(x)
        x = ops.where(inside, fill, x)
    return x


def mix(x: Tensor, weight: Tensor, partner_weight: Tensor, box: Tensor) -> Tensor:
    """Mixup / CutMix with partner B-1-i: where(in box_i, x_partner, x_i * w_i + x_partner * p_i)."""
    b, c, h, w = x.shape
    partner = ops.flip(x, (0,))
    blended = x * weight.reshape(-1, 1, 1, 1) + partner * partner_weight.reshape(-1, 1, 1, 1)
    inside = ops.broadcast_to(_box_mask(h, w, box[:, 0], box[:, 1], box[:, 2], box[:, 3]), (b, c, h, w))
    return ops.where(inside, partner, blended)


def _train(pixels: Tensor, mean: Tensor, std: Tensor, boxes: Tensor, colours: Tensor, keys: Tensor,
           table: Tensor, weight: Tensor, partner_weight: Tensor, box: Tensor, erase_mode: str,
           mixes: bool) -> Tensor:
    x = normalize(pixels, mean, std)
    if erase_mode:
        x = erase(x, boxes, colours, keys, table, erase_mode)
    if mixes:
        x = mix(x, weight, partner_weight, box)
    return x


_normalize_jit = ms.jit(normalize)
_train_jit = ms.jit(_train)


class Prologue:
    """The per-batch device work of one loader: `eval(pixels)` normalizes, `train(pixels, erase, mix)` also erases
    and mixes from the draws. Compiled once per batch shape (the last, shorter val batch is a second shape).

    Args:
        mean, std: per-channel normalization of [0, 1] pixels.
        erase_mode: the RandomErasing mode whose draws `train` receives; None: no erasing.
        mixes: apply Mixup/CutMix draws (False for targets that never mix pixels).
        jit: compile (graph); False runs the same ops eagerly.
    """

    def __init__(self, mean: Sequence[float], std: Sequence[float], erase_mode: str | None = None,
                 mixes: bool = True, jit: bool = True) -> None:
        self.mean = Tensor(np.asarray(mean, np.float32).reshape(-1, 1, 1))
        self.std = Tensor(np.asarray(std, np.float32).reshape(-1, 1, 1))
        self.erase_mode, self.mixes = erase_mode or "", mixes
        # uploaded once; a 1-element stand-in when no box reads it
        self.table = Tensor(noise_table() if erase_mode == "pixel" else np.zeros(1, np.float32))
        self._normalize, self._train = (_normalize_jit, _train_jit) if jit else (normalize, _train)

    def eval(self, pixels: Tensor) -> Tensor:
        """uint8 (B, H, W, C) -> normalized float32 (B, C, H, W)."""
        return self._normalize(pixels, self.mean, self.std)

    def train(self, pixels: Tensor, erase: EraseDraws | tuple[Tensor, Tensor, Tensor] | None,
              mix: MixDraws) -> Tensor:
        """uint8 (B, H, W, C) -> normalized, erased, mixed float32 (B, C, H, W).

        Args:
            pixels: the batch as the workers sent it.
            erase: the stacked per-image erase draws (B, R, ...) as arrays or tensors; None without erasing.
            mix: the batch's Mixup/CutMix draws.
        """
        if erase is None or not self.erase_mode:
            boxes, colours, keys = _NO_ERASE
        else:
            boxes, colours, keys = (erase.boxes, erase.colours, erase.keys) if isinstance(erase, EraseDraws) else erase
        return self._train(pixels, self.mean, self.std, _tensor(boxes), _tensor(colours), _tensor(keys), self.table,
                           Tensor(mix.weight), Tensor(mix.partner_weight), Tensor(mix.box), self.erase_mode,
                           self.mixes)


_NO_ERASE = (np.zeros((1, 1, 4), np.int32), np.zeros((1, 1, 3), np.float32), np.zeros((1, 1, 2), np.int64))


def _tensor(value: Tensor | np.ndarray) -> Tensor:
    return value if isinstance(value, Tensor) else Tensor(value)
