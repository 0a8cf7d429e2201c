"""Batch-level target transforms: a batch's host draws (`draw`) and its soft targets (B, K) float32 (`targets`).

The train loss is always a soft-target cross entropy; label smoothing (and batch mixing such as Mixup/CutMix)
lives here, on the host, where timm puts it too. The pixels are mixed on the device from the same draws
(`swinexp.data.prologue`); calling a BatchTransform does both on the host, for tests and interactive use.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np

if TYPE_CHECKING:
    from swinexp.data.mixup import MixDraws


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
        from swinexp.data.mixup import MixDraws  # mixup imports smooth_one_hot from here

        return MixDraws.identity(batch)

    def targets(self, labels: np.ndarray, draws: MixDraws) -> np.ndarray:
        return smooth_one_hot(labels, self.num_classes, self.smoothing)

    def __call__(self, images: np.ndarray, labels: np.ndarray,
                 rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        return images, smooth_one_hot(labels, self.num_classes, self.smoothing)
