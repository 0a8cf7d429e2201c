"""Mixup / CutMix as a BatchTransform with timm's `Mixup` arguments and semantics.

Each image i is mixed with image B-1-i (the batch reversed); targets are the same mix of the two label-smoothed
one-hot vectors, so label smoothing is folded in here exactly as in timm's `mixup_target`.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from swinexp.data.targets import smooth_one_hot

MIX_MODES = ("batch", "pair", "elem")
Box = tuple[int, int, int, int]  # (y_low, y_high, x_low, x_high)


def rand_bbox(shape: tuple[int, ...], lam: float, rng: np.random.Generator, margin: float = 0.0) -> Box:
    """A box of area ~(1 - lam) of the image, centred uniformly, clipped at the border (may shrink)."""
    img_h, img_w = shape[-2:]
    ratio = np.sqrt(1 - lam)
    cut_h, cut_w = int(img_h * ratio), int(img_w * ratio)
    margin_y, margin_x = int(margin * cut_h), int(margin * cut_w)
    cy = int(rng.integers(margin_y, img_h - margin_y))
    cx = int(rng.integers(margin_x, img_w - margin_x))
    return (int(np.clip(cy - cut_h // 2, 0, img_h)), int(np.clip(cy + cut_h // 2, 0, img_h)),
            int(np.clip(cx - cut_w // 2, 0, img_w)), int(np.clip(cx + cut_w // 2, 0, img_w)))


def rand_bbox_minmax(shape: tuple[int, ...], minmax: Sequence[float], rng: np.random.Generator) -> Box:
    """A box whose sides are uniform fractions in [min, max) of the image sides, placed inside the image."""
    img_h, img_w = shape[-2:]
    cut_h = int(rng.integers(int(img_h * minmax[0]), int(img_h * minmax[1])))
    cut_w = int(rng.integers(int(img_w * minmax[0]), int(img_w * minmax[1])))
    yl, xl = int(rng.integers(0, img_h - cut_h)), int(rng.integers(0, img_w - cut_w))
    return yl, yl + cut_h, xl, xl + cut_w


def cutmix_bbox_and_lam(shape: tuple[int, ...], lam: float, rng: np.random.Generator,
                        ratio_minmax: Sequence[float] | None = None, correct_lam: bool = True) -> tuple[Box, float]:
    """The CutMix box and the lam to use for targets: 1 - box area / image area when corrected."""
    box = rand_bbox_minmax(shape, ratio_minmax, rng) if ratio_minmax is not None else rand_bbox(shape, lam, rng)
    if correct_lam or ratio_minmax is not None:
        yl, yh, xl, xh = box
        lam = 1.0 - (yh - yl) * (xh - xl) / float(shape[-2] * shape[-1])
    return box, float(lam)


@dataclass
class Mixup:
    """Mixup (alpha `mixup_alpha`) or CutMix (alpha `cutmix_alpha`) per batch, pair or element.

    Args:
        mixup_alpha: Beta(a, a) for mixup's lam; 0 disables mixup (Swin: 0.8).
        cutmix_alpha: Beta(a, a) for CutMix's lam; 0 disables CutMix (Swin: 1.0).
        cutmix_minmax: CutMix box side range as image fractions; when set, forces cutmix_alpha 1 (timm).
        prob: chance of mixing a batch (or element).
        switch_prob: chance of CutMix rather than mixup when both are enabled.
        mode: 'batch' (one lam per batch), 'pair' (per pair i, B-1-i; even batches only) or 'elem'.
        correct_lam: recompute lam from the clipped CutMix box area.
        label_smoothing: epsilon of the smoothed one-hot targets being mixed.
        num_classes: K, the target width.
    """

    mixup_alpha: float = 1.0
    cutmix_alpha: float = 0.0
    cutmix_minmax: Sequence[float] | None = None
    prob: float = 1.0
    switch_prob: float = 0.5
    mode: str = "batch"
    correct_lam: bool = True
    label_smoothing: float = 0.1
    num_classes: int = 1000

    def __post_init__(self) -> None:
        if self.mode not in MIX_MODES:
            raise ValueError(f"Mixup mode='{self.mode}'; use one of {', '.join(MIX_MODES)}")
        if self.cutmix_minmax is not None:
            if len(self.cutmix_minmax) != 2:
                raise ValueError(f"Mixup cutmix_minmax={self.cutmix_minmax} must be [min, max]")
            self.cutmix_alpha = 1.0  # timm: minmax implies CutMix with alpha 1
        if self.mixup_alpha <= 0 and self.cutmix_alpha <= 0:
            raise ValueError("Mixup needs mixup_alpha > 0 or cutmix_alpha > 0 (or cutmix_minmax)")

    def _draw(self, rng: np.random.Generator, size: int) -> tuple[np.ndarray, np.ndarray]:
        """Per-draw (lam, use_cutmix) for `size` draws; lam is 1 where the draw does not mix."""
        if self.mixup_alpha > 0 and self.cutmix_alpha > 0:
            use_cutmix = rng.random(size) < self.switch_prob
            lam_mix = np.where(use_cutmix, rng.beta(self.cutmix_alpha, self.cutmix_alpha, size),
                               rng.beta(self.mixup_alpha, self.mixup_alpha, size))
        elif self.mixup_alpha > 0:
            use_cutmix = np.zeros(size, bool)
            lam_mix = rng.beta(self.mixup_alpha, self.mixup_alpha, size)
        else:
            use_cutmix = np.ones(size, bool)
            lam_mix = rng.beta(self.cutmix_alpha, self.cutmix_alpha, size)
        mix = rng.random(size) < self.prob
        return np.where(mix, lam_mix, 1.0).astype(np.float32), use_cutmix & mix

    def _mix_batch(self, x: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        lam_arr, cut_arr = self._draw(rng, 1)
        lam, use_cutmix = float(lam_arr[0]), bool(cut_arr[0])
        if lam == 1.0:
            return x, np.ones(len(x), np.float32)
        if use_cutmix:
            (yl, yh, xl, xh), lam = cutmix_bbox_and_lam(x.shape, lam, rng, self.cutmix_minmax, self.correct_lam)
            x = x.copy()
            x[:, :, yl:yh, xl:xh] = x[::-1, :, yl:yh, xl:xh].copy()  # paste the reversed batch's box
        else:
            x = x * np.float32(lam) + x[::-1] * np.float32(1.0 - lam)
        return x, np.full(len(x), lam, np.float32)

    def _mix_pairs(self, x: np.ndarray, rng: np.random.Generator, pairs: bool) -> tuple[np.ndarray, np.ndarray]:
        batch = len(x)
        n = batch // 2 if pairs else batch
        lam, use_cutmix = self._draw(rng, n)
        out = x.copy()
        for i in range(n):
            j = batch - i - 1
            if lam[i] == 1.0:
                continue
            if use_cutmix[i]:
                (yl, yh, xl, xh), lam[i] = cutmix_bbox_and_lam(x[i].shape, lam[i], rng, self.cutmix_minmax,
                                                               self.correct_lam)
                out[i][:, yl:yh, xl:xh] = x[j][:, yl:yh, xl:xh]
                if pairs:
                    out[j][:, yl:yh, xl:xh] = x[i][:, yl:yh, xl:xh]
            else:
                out[i] = x[i] * lam[i] + x[j] * (1 - lam[i])
                if pairs:
                    out[j] = x[j] * lam[i] + x[i] * (1 - lam[i])
        return out, (np.concatenate([lam, lam[::-1]]) if pairs else lam)

    def __call__(self, images: np.ndarray, labels: np.ndarray,
                 rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """(B, C, H, W) images and (B,) int labels -> mixed images and (B, K) float32 targets summing to 1."""
        if self.mode == "pair" and len(images) % 2:
            raise ValueError(f"Mixup mode='pair' needs an even batch size, got {len(images)}")
        if self.mode == "batch":
            images, lam = self._mix_batch(images, rng)
        else:
            images, lam = self._mix_pairs(images, rng, pairs=self.mode == "pair")
        y1 = smooth_one_hot(labels, self.num_classes, self.label_smoothing)
        lam = lam[:, None]
        return images, (y1 * lam + y1[::-1] * (1.0 - lam)).astype(np.float32)
