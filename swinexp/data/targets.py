"""Batch-level target transforms: a batch's host draws (`draw`) and its soft targets (B, K) float32 (`targets`).

The train loss is always a soft-target cross entropy; label smoothing (and batch mixing such as Mixup/CutMix)
lives here, on the host, where timm puts it too. The pixels are mixed on the device from the same draws
(`swinexp.data.prologue`); calling a BatchTransform does both on the host, for tests and interactive use.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np


@dataclass(frozen=True)
class MixDraws:
    """The draws of one batch as per-image arrays; image i's partner is image B-1-i.

    Pixels: out_i = where(in box_i, x_partner, x_i * weight_i + x_partner * partner_weight_i); an image left alone
    has weight 1, partner weight 0 and an empty box, a CutMix image the same weights and its box.
    Targets: lam_i * y_i + partner_lam_i * y_partner (smoothed one-hot y).

    Attributes:
        weight, partner_weight: float32 (B,) pixel weights, the float32 values timm multiplies by.
        box: int32 (B, 4) y_low, y_high, x_low, x_high of the pasted partner pixels (empty: all 0).
        lam, partner_lam: float32 (B,) target weights (CutMix: lam corrected to the pasted area).
    """

    weight: np.ndarray
    partner_weight: np.ndarray
    box: np.ndarray
    lam: np.ndarray
    partner_lam: np.ndarray

    @classmethod
    def identity(cls, batch: int) -> MixDraws:
        """No mixing: every image keeps its pixels and its own label."""
        ones, zeros = np.ones(batch, np.float32), np.zeros(batch, np.float32)
        return cls(ones, zeros, np.zeros((batch, 4), np.int32), ones.copy(), zeros.copy())  # filled in place


class BatchTransform(Protocol):
    def draw(self, batch: int, img_h: int, img_w: int, rng: np.random.Generator) -> MixDraws: ...

    def targets(self, labels: np.ndarray, draws: MixDraws) -> np.ndarray: ...

    def __call__(self, images: np.ndarray, labels: np.ndarray,
                 rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]: ...


def smooth_one_hot(labels: np.ndarray, num_classes: int, smoothing: float) -> np.ndarray:
    """(B,) int -> (B, K): 1 - eps + eps/K on the label, eps/K elsewhere (timm's `one_hot` with smoothing)."""
    off = smoothing / num_classes
    targets = np.full((labels.shape[0], num_classes), off, np.float32)
    targets[np.arange(labels.shape[0]), labels] = 1.0 - smoothing + off
    return targets


@dataclass(frozen=True)
class SmoothedTargets:
    """No mixing: smoothed one-hot targets."""

    num_classes: int
    smoothing: float = 0.1

    def draw(self, batch: int, img_h: int, img_w: int, rng: np.random.Generator) -> MixDraws:
        return MixDraws.identity(batch)

    def targets(self, labels: np.ndarray, draws: MixDraws) -> np.ndarray:
        return smooth_one_hot(labels, self.num_classes, self.smoothing)

    def __call__(self, images: np.ndarray, labels: np.ndarray,
                 rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        return images, smooth_one_hot(labels, self.num_classes, self.smoothing)
