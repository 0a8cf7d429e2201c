"""Mixup / CutMix with timm's `Mixup` arguments and semantics, split into host draws and their application.

Each image i is mixed with image B-1-i (the batch reversed); targets are the same mix of the two label-smoothed
one-hot vectors, so label smoothing is folded in here exactly as in timm's `mixup_target`. `Mixup.draw` makes every
random decision of a batch on the host, in the order timm's `Mixup` makes them (lam, CutMix or mixup, the box), and
returns them as a few (B,) arrays (`MixDraws`); `mix_images` applies them here and `swinexp.data.prologue` on the
device, with the same float32 arithmetic as timm's.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from swinexp.data.targets import MixDraws, smooth_one_hot

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
    # (cut + 1) // 2 below the centre: an odd side keeps its length (timm >= 1.0)
    return (int(np.clip(cy - cut_h // 2, 0, img_h)), int(np.clip(cy + (cut_h + 1) // 2, 0, img_h)),
            int(np.clip(cx - cut_w // 2, 0, img_w)), int(np.clip(cx + (cut_w + 1) // 2, 0, img_w)))


def rand_bbox_minmax(shape: tuple[int, ...], minmax: Sequence[float], rng: np.random.Generator) -> Box:
    """A box whose sides are uniform fractions in [min, max) of the image sides, placed inside the image."""
    img_h, img_w = shape[-2:]
    cut_h = int(rng.integers(int(img_h * minmax[0]), int(img_h * minmax[1])))
    cut_w = int(rng.integers(int(img_w * minmax[0]), int(img_w * minmax[1])))
    yl, xl = int(rng.integers(0, img_h - cut_h + 1)), int(rng.integers(0, img_w - cut_w + 1))
    return yl, yl + cut_h, xl, xl + cut_w


def cutmix_bbox_and_lam(shape: tuple[int, ...], lam: float, rng: np.random.Generator,
                        ratio_minmax: Sequence[float] | None = None, correct_lam: bool = True) -> tuple[Box, float]:
    """The CutMix box and the lam to use for targets: 1 - box area / image area when corrected."""
    box = rand_bbox_minmax(shape, ratio_minmax, rng) if ratio_minmax is not None else rand_bbox(shape, lam, rng)
    if correct_lam or ratio_minmax is not None:
        yl, yh, xl, xh = box
        lam = 1.0 - (yh - yl) * (xh - xl) / float(shape[-2] * shape[-1])
    return box, float(lam)


def mix_images(x: np.ndarray, draws: MixDraws) -> np.ndarray:
    """Apply `draws` to (B, C, H, W) float32 images (a new array): the host twin of the device prologue."""
    partner = x[::-1]
    w = draws.weight[:, None, None, None]
    p = draws.partner_weight[:, None, None, None]
    out = x * w + partner * p
    for i, (yl, yh, xl, xh) in enumerate(draws.box.tolist()):
        out[i, :, yl:yh, xl:xh] = partner[i, :, yl:yh, xl:xh]
    return out


def mix_targets(labels: np.ndarray, draws: MixDraws, num_classes: int, smoothing: float) -> np.ndarray:
    """(B,) int labels -> (B, K) float32 targets: timm's `mixup_target` with the drawn lams."""
    y = smooth_one_hot(labels, num_classes, smoothing)
    return y * draws.lam[:, None] + y[::-1] * draws.partner_lam[:, None]


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

    def _params_per_batch(self, rng: np.random.Generator) -> tuple[float, bool]:
        """timm's `_params_per_batch`: (lam, use_cutmix), lam 1.0 when the batch is not mixed."""
        if rng.random() >= self.prob:
            return 1.0, False
        if self.mixup_alpha > 0 and self.cutmix_alpha > 0:
            use_cutmix = bool(rng.random() < self.switch_prob)
            alpha = self.cutmix_alpha if use_cutmix else self.mixup_alpha
            return float(rng.beta(alpha, alpha)), use_cutmix
        if self.mixup_alpha > 0:
            return float(rng.beta(self.mixup_alpha, self.mixup_alpha)), False
        return float(rng.beta(self.cutmix_alpha, self.cutmix_alpha)), True

    def _params_per_elem(self, rng: np.random.Generator, size: int) -> tuple[np.ndarray, np.ndarray]:
        """timm's `_params_per_elem`: float32 (size,) lam (1 where not mixed) and bool (size,) use_cutmix."""
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
        lam = np.where(rng.random(size) < self.prob, lam_mix.astype(np.float32), np.ones(size, np.float32))
        return lam.astype(np.float32), use_cutmix

    def draw(self, batch: int, img_h: int, img_w: int, rng: np.random.Generator) -> MixDraws:
        """Every random decision for a batch of `batch` (C, img_h, img_w) images, in timm's order.

        Raises:
            ValueError: mode 'pair' with an odd batch.
        """
        if self.mode == "pair" and batch % 2:
            raise ValueError(f"Mixup mode='pair' needs an even batch size, got {batch}")
        d = MixDraws.identity(batch)
        shape = (img_h, img_w)
        if self.mode == "batch":
            lam, use_cutmix = self._params_per_batch(rng)
            if lam == 1.0:
                return d
            if use_cutmix:
                box, lam = cutmix_bbox_and_lam(shape, lam, rng, self.cutmix_minmax, self.correct_lam)
                d.box[:] = box
            else:  # timm: x * lam + x.flip(0) * (1. - lam), python floats applied in float32
                d.weight[:], d.partner_weight[:] = np.float32(lam), np.float32(1.0 - lam)
            d.lam[:], d.partner_lam[:] = np.float32(lam), np.float32(1.0 - lam)
            return d
        pairs = self.mode == "pair"
        n = batch // 2 if pairs else batch
        lams, use_cutmix = self._params_per_elem(rng, n)
        for i in range(n):
            j = batch - i - 1
            if lams[i] == 1.0:
                continue
            members = (i, j) if pairs else (i,)
            if use_cutmix[i]:
                box, lam = cutmix_bbox_and_lam(shape, float(lams[i]), rng, self.cutmix_minmax, self.correct_lam)
                lams[i] = lam  # timm stores the corrected lam into its float32 lam_batch
                for k in members:
                    d.box[k] = box
            else:  # timm: x[i] * lam + x_orig[j] * (1 - lam) with lam a float32
                for k in members:
                    d.weight[k], d.partner_weight[k] = lams[i], np.float32(1 - lams[i])
        lam_batch = np.concatenate([lams, lams[::-1]]) if pairs else lams
        d.lam[:] = lam_batch
        d.partner_lam[:] = np.float32(1.0) - lam_batch  # timm: y2 * (1. - lam) on a float32 tensor
        return d

    def targets(self, labels: np.ndarray, draws: MixDraws) -> np.ndarray:
        """(B,) int labels -> (B, K) float32 mixed, smoothed targets summing to 1."""
        return mix_targets(labels, draws, self.num_classes, self.label_smoothing)

    def __call__(self, images: np.ndarray, labels: np.ndarray,
                 rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """(B, C, H, W) images and (B,) int labels -> mixed images and (B, K) float32 targets summing to 1."""
        draws = self.draw(len(images), *images.shape[-2:], rng)
        return mix_images(images, draws), self.targets(labels, draws)
