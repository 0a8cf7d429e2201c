"""RandAugment, AutoAugment and AugMix with timm's semantics, op names and config strings.

Each transform maps (PIL image, numpy Generator) -> PIL image, drawing every random choice from the Generator.
Policies and op lists are data (module-level tables); `rand_augment_transform`, `auto_augment_transform` and
`augment_and_mix_transform` parse timm's strings (`rand-m9-mstd0.5-inc1`, `original-mstd0.5`, `augmix-m5-w4-d2`)
into those objects, so Swin's published recipe string can be used verbatim.
"""
from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from difflib import get_close_matches
from typing import Any

import numpy as np
from PIL import Image

from swinexp.data.ops import DEFAULT_FILL, DEFAULT_HPARAMS, LEVEL_DENOM, LEVEL_TO_ARG, OPS
from swinexp.registry import ConfigError

RANDOM_RESAMPLE = (Image.Resampling.BILINEAR, Image.Resampling.BICUBIC)
RESAMPLE = {"bilinear": Image.Resampling.BILINEAR, "bicubic": Image.Resampling.BICUBIC,
            "nearest": Image.Resampling.NEAREST}

RAND_TRANSFORMS = ("AutoContrast", "Equalize", "Invert", "Rotate", "Posterize", "Solarize", "SolarizeAdd", "Color",
                   "Contrast", "Brightness", "Sharpness", "ShearX", "ShearY", "TranslateXRel", "TranslateYRel")
# `inc1`: the same kinds of op, with arguments whose severity grows with the magnitude
RAND_INCREASING_TRANSFORMS = ("AutoContrast", "Equalize", "Invert", "Rotate", "PosterizeIncreasing",
                              "SolarizeIncreasing", "SolarizeAdd", "ColorIncreasing", "ContrastIncreasing",
                              "BrightnessIncreasing", "SharpnessIncreasing", "ShearX", "ShearY", "TranslateXRel",
                              "TranslateYRel")
RAND_3A = ("SolarizeIncreasing", "Desaturate", "GaussianBlur")
# op-choice weights: `w0` (older timm, over the kinds of RAND_TRANSFORMS), `tweights` and `t3aw` (newer timm)
RAND_CHOICE_WEIGHTS_0 = {"Rotate": 0.3, "ShearX": 0.2, "ShearY": 0.2, "TranslateXRel": 0.1, "TranslateYRel": 0.1,
                         "Color": 0.025, "Sharpness": 0.025, "AutoContrast": 0.025, "Solarize": 0.005,
                         "SolarizeAdd": 0.005, "Contrast": 0.005, "Brightness": 0.005, "Equalize": 0.005,
                         "Posterize": 0.0, "Invert": 0.0}
RAND_WEIGHTED_0 = {"Rotate": 3, "ShearX": 2, "ShearY": 2, "TranslateXRel": 1, "TranslateYRel": 1,
                   "ColorIncreasing": 0.25, "SharpnessIncreasing": 0.25, "AutoContrast": 0.25,
                   "SolarizeIncreasing": 0.05, "SolarizeAdd": 0.05, "ContrastIncreasing": 0.05,
                   "BrightnessIncreasing": 0.05, "Equalize": 0.05, "PosterizeIncreasing": 0.05, "Invert": 0.05}
RAND_WEIGHTED_3A = {"SolarizeIncreasing": 6, "Desaturate": 6, "GaussianBlur": 6, "Rotate": 3, "ShearX": 2,
                    "ShearY": 2, "PosterizeIncreasing": 1, "AutoContrast": 1, "ColorIncreasing": 1,
                    "SharpnessIncreasing": 1, "ContrastIncreasing": 1, "BrightnessIncreasing": 1, "Equalize": 1,
                    "Invert": 1}
AUGMIX_TRANSFORMS = ("AutoContrast", "ColorIncreasing", "ContrastIncreasing", "BrightnessIncreasing",
                     "SharpnessIncreasing", "Equalize", "Rotate", "PosterizeIncreasing", "SolarizeIncreasing",
                     "ShearX", "ShearY", "TranslateXRel", "TranslateYRel")

Policy = Sequence[Sequence[tuple[str, float, int]]]  # sub-policies of (op, probability, magnitude)

# ImageNet policy of the AutoAugment paper (arXiv:1805.09501); 'originalr' swaps in PosterizeIncreasing
POLICY_ORIGINAL: Policy = (
    (("PosterizeOriginal", 0.4, 8), ("Rotate", 0.6, 9)), (("Solarize", 0.6, 5), ("AutoContrast", 0.6, 5)),
    (("Equalize", 0.8, 8), ("Equalize", 0.6, 3)), (("PosterizeOriginal", 0.6, 7), ("PosterizeOriginal", 0.6, 6)),
    (("Equalize", 0.4, 7), ("Solarize", 0.2, 4)), (("Equalize", 0.4, 4), ("Rotate", 0.8, 8)),
    (("Solarize", 0.6, 3), ("Equalize", 0.6, 7)), (("PosterizeOriginal", 0.8, 5), ("Equalize", 1.0, 2)),
    (("Rotate", 0.2, 3), ("Solarize", 0.6, 8)), (("Equalize", 0.6, 8), ("PosterizeOriginal", 0.4, 6)),
    (("Rotate", 0.8, 8), ("Color", 0.4, 0)), (("Rotate", 0.4, 9), ("Equalize", 0.6, 2)),
    (("Equalize", 0.0, 7), ("Equalize", 0.8, 8)), (("Invert", 0.6, 4), ("Equalize", 1.0, 8)),
    (("Color", 0.6, 4), ("Contrast", 1.0, 8)), (("Rotate", 0.8, 8), ("Color", 1.0, 2)),
    (("Color", 0.8, 8), ("Solarize", 0.8, 7)), (("Sharpness", 0.4, 7), ("Invert", 0.6, 8)),
    (("ShearX", 0.6, 5), ("Equalize", 1.0, 9)), (("Color", 0.4, 0), ("Equalize", 0.6, 3)),
    (("Equalize", 0.4, 7), ("Solarize", 0.2, 4)), (("Solarize", 0.6, 5), ("AutoContrast", 0.6, 5)),
    (("Invert", 0.6, 4), ("Equalize", 1.0, 8)), (("Color", 0.6, 4), ("Contrast", 1.0, 8)),
    (("Equalize", 0.8, 8), ("Equalize", 0.6, 3)),
)
# ImageNet 'v0' policy of the TPU EfficientNet code; 'v0r' swaps in PosterizeIncreasing
POLICY_V0: Policy = (
    (("Equalize", 0.8, 1), ("ShearY", 0.8, 4)), (("Color", 0.4, 9), ("Equalize", 0.6, 3)),
    (("Color", 0.4, 1), ("Rotate", 0.6, 8)), (("Solarize", 0.8, 3), ("Equalize", 0.4, 7)),
    (("Solarize", 0.4, 2), ("Solarize", 0.6, 2)), (("Color", 0.2, 0), ("Equalize", 0.8, 8)),
    (("Equalize", 0.4, 8), ("SolarizeAdd", 0.8, 3)), (("ShearX", 0.2, 9), ("Rotate", 0.6, 8)),
    (("Color", 0.6, 1), ("Equalize", 1.0, 2)), (("Invert", 0.4, 9), ("Rotate", 0.6, 0)),
    (("Equalize", 1.0, 9), ("ShearY", 0.6, 3)), (("Color", 0.4, 7), ("Equalize", 0.6, 0)),
    (("Posterize", 0.4, 6), ("AutoContrast", 0.4, 7)), (("Solarize", 0.6, 8), ("Color", 0.6, 9)),
    (("Solarize", 0.2, 4), ("Rotate", 0.8, 9)), (("Rotate", 1.0, 7), ("TranslateYRel", 0.8, 9)),
    (("ShearX", 0.0, 0), ("Solarize", 0.8, 4)), (("ShearY", 0.8, 0), ("Color", 0.6, 4)),
    (("Color", 1.0, 0), ("Rotate", 0.6, 2)), (("Equalize", 0.8, 4), ("Equalize", 0.0, 8)),
    (("Equalize", 1.0, 4), ("AutoContrast", 0.6, 2)), (("ShearY", 0.4, 7), ("SolarizeAdd", 0.6, 7)),
    (("Posterize", 0.8, 2), ("Solarize", 0.6, 10)), (("Solarize", 0.6, 8), ("Equalize", 0.6, 1)),
    (("Color", 0.8, 6), ("Rotate", 0.4, 5)),
)
POLICY_3A: Policy = ((("Solarize", 1.0, 5),), (("Desaturate", 1.0, 10),), (("GaussianBlurRand", 1.0, 10),))


def _swap(policy: Policy, old: str, new: str) -> Policy:
    return tuple(tuple((new if name == old else name, p, m) for name, p, m in sub) for sub in policy)


POLICIES: dict[str, Policy] = {
    "original": POLICY_ORIGINAL,
    "originalr": _swap(POLICY_ORIGINAL, "PosterizeOriginal", "PosterizeIncreasing"),
    "v0": POLICY_V0,
    "v0r": _swap(POLICY_V0, "Posterize", "PosterizeIncreasing"),
    "3a": POLICY_3A,
}


@dataclass
class AugmentOp:
    """One op applied with probability `prob` at `magnitude` (0..10), optionally with Gaussian magnitude noise.

    hparams keys (timm's): translate_const, translate_pct, img_mean (fill colour), interpolation (a name or
    PIL enum; absent = bilinear or bicubic at random per call), magnitude_std (inf = uniform in [0, M]),
    magnitude_max (clip bound, default 10).
    """

    name: str
    prob: float = 0.5
    magnitude: float = 10
    hparams: Mapping[str, Any] = field(default_factory=lambda: dict(DEFAULT_HPARAMS))

    def __post_init__(self) -> None:
        if self.name not in OPS:
            hint = get_close_matches(self.name, OPS, n=1)
            raise ConfigError(f"augmentation op '{self.name}' is unknown; timm's ops are: {', '.join(OPS)}"
                              + (f". Did you mean '{hint[0]}'?" if hint else ""))
        self.hparams = {**self.hparams}
        self.magnitude_std = float(self.hparams.get("magnitude_std", 0.0))
        self.magnitude_max = self.hparams.get("magnitude_max")
        interp = self.hparams.get("interpolation")
        self._resample = RESAMPLE.get(interp, interp) if interp is not None else RANDOM_RESAMPLE
        self._fill = tuple(self.hparams.get("img_mean", DEFAULT_FILL))

    def sample_magnitude(self, rng: np.random.Generator) -> float:
        """The magnitude for one call: noisy if magnitude_std > 0, clipped to [0, magnitude_max or 10]."""
        magnitude = self.magnitude
        if self.magnitude_std == float("inf"):
            magnitude = rng.uniform(0, magnitude)
        elif self.magnitude_std > 0:
            magnitude = rng.normal(magnitude, self.magnitude_std)
        return max(0.0, min(magnitude, self.magnitude_max or LEVEL_DENOM))

    def __call__(self, img: Image.Image, rng: np.random.Generator) -> Image.Image:
        if self.prob < 1.0 and rng.random() > self.prob:
            return img
        level_fn = LEVEL_TO_ARG[self.name]
        args = level_fn(self.sample_magnitude(rng), self.hparams, rng) if level_fn is not None else ()
        resample = self._resample if not isinstance(self._resample, tuple) else \
            self._resample[int(rng.integers(len(self._resample)))]
        return OPS[self.name](img, *args, fillcolor=self._fill, resample=resample)

    def __repr__(self) -> str:
        mmax = f", mmax={self.magnitude_max}" if self.magnitude_max is not None else ""
        return f"AugmentOp(name={self.name}, p={self.prob}, m={self.magnitude}, mstd={self.magnitude_std}{mmax})"


@dataclass
class RandAugment:
    """Apply `num_layers` ops drawn from `ops` (with replacement, or weighted without replacement)."""

    ops: Sequence[AugmentOp]
    num_layers: int = 2
    choice_weights: np.ndarray | None = None

    def __call__(self, img: Image.Image, rng: np.random.Generator) -> Image.Image:
        picks = rng.choice(len(self.ops), self.num_layers, replace=self.choice_weights is None, p=self.choice_weights)
        for i in picks:
            img = self.ops[int(i)](img, rng)
        return img

    def __repr__(self) -> str:
        return f"RandAugment(n={self.num_layers}, ops=[{', '.join(map(repr, self.ops))}])"


@dataclass
class AutoAugment:
    """Apply one sub-policy, drawn uniformly; each of its ops fires with its own probability."""

    policy: Sequence[Sequence[AugmentOp]]

    def __call__(self, img: Image.Image, rng: np.random.Generator) -> Image.Image:
        for op in self.policy[int(rng.integers(len(self.policy)))]:
            img = op(img, rng)
        return img

    def __repr__(self) -> str:
        return f"AutoAugment(policy=[{', '.join('[' + ', '.join(map(repr, sub)) + ']' for sub in self.policy)}])"


@dataclass
class AugMix:
    """AugMix (arXiv:1912.02781): blend `width` chains of 1..3 ops (Dirichlet weights) with the image (Beta)."""

    ops: Sequence[AugmentOp]
    alpha: float = 1.0
    width: int = 3
    depth: int = -1  # -1: each chain draws a depth in 1..3
    blended: bool = False

    def _chain(self, img: Image.Image, rng: np.random.Generator) -> Image.Image:
        depth = self.depth if self.depth > 0 else int(rng.integers(1, 4))
        for i in rng.choice(len(self.ops), depth, replace=True):
            img = self.ops[int(i)](img, rng)
        return img

    def __call__(self, img: Image.Image, rng: np.random.Generator) -> Image.Image:
        weights = np.float32(rng.dirichlet([self.alpha] * self.width))
        m = float(np.float32(rng.beta(self.alpha, self.alpha)))
        if self.blended:  # timm's faster variant: one PIL blend per chain with rescaled weights
            out, remaining = img, 1.0
            alphas = []
            for w in (weights * m)[::-1]:
                alphas.append(w / remaining)
                remaining *= 1 - alphas[-1]
            for a in alphas[::-1]:
                out = Image.blend(out, self._chain(img, rng), float(a))
            return out
        mixed = np.zeros((img.size[1], img.size[0], len(img.getbands())), np.float32)  # (H, W, C)
        for w in weights:
            mixed += w * np.asarray(self._chain(img, rng), dtype=np.float32)
        return Image.blend(img, Image.fromarray(np.clip(mixed, 0, 255).astype(np.uint8)), m)

    def __repr__(self) -> str:
        ops = ", ".join(map(repr, self.ops))
        return f"AugMix(alpha={self.alpha}, width={self.width}, depth={self.depth}, ops=[{ops}])"


def _sections(config_str: str, prefix: str, allowed: Sequence[str]) -> tuple[str, list[tuple[str, str]]]:
    """Split 'rand-m9-mstd0.5' into ('rand', [('m', '9'), ('mstd', '0.5')]), rejecting unknown keys."""
    head, *rest = config_str.split("-")
    if prefix and head != prefix:
        raise ConfigError(f"auto_augment='{config_str}' must start with '{prefix}-'")
    out = []
    for section in rest:
        key, val = (section[0], section[1:]) if section.startswith("t") and prefix == "rand" else \
            (re.split(r"(\d.*)", section) + [""])[:2]
        if key not in allowed or not val:
            raise ConfigError(f"auto_augment='{config_str}': section '{section}' is not understood; "
                              f"the {head} keys are {', '.join(allowed)}, each followed by its value (e.g. m9)")
        out.append((key, val))
    return head, out


def rand_augment_transform(config_str: str, hparams: Mapping[str, Any] | None = None) -> RandAugment:
    """RandAugment from timm's string, e.g. 'rand-m9-mstd0.5-inc1' (Swin, DeiT).

    Args:
        config_str: 'rand' then dash-separated keys: m (magnitude, default 10), n (ops per image, 2),
            p (probability of each op, 0.5), mstd (magnitude noise std; > 100 means uniform in [0, m]),
            mmax (magnitude clip, default 10), inc (1: the increasing-severity op set), w0 (timm's old op-choice
            weights), t<name> (op set: weights, 3a, 3aw).
        hparams: op hyper-parameters (translate_const, img_mean, interpolation, ...), see AugmentOp.

    Returns:
        The RandAugment transform.
    """
    hp = {**DEFAULT_HPARAMS, **(hparams or {})}
    magnitude, num_layers, prob, increasing, weight_idx, choice = 10.0, 2, 0.5, False, None, None
    for key, val in _sections(config_str, "rand", ("m", "n", "p", "mstd", "mmax", "inc", "w", "t"))[1]:
        if key == "mstd":
            hp.setdefault("magnitude_std", float("inf") if float(val) > 100 else float(val))
        elif key == "mmax":
            hp.setdefault("magnitude_max", int(val))
        elif key == "inc":
            increasing = bool(int(val))  # timm tests bool('0'), which is True; 'inc0' here means off
        elif key == "m":
            magnitude = int(val)
        elif key == "n":
            num_layers = int(val)
        elif key == "p":
            prob = float(val)
        elif key == "w":
            weight_idx = int(val)
        else:
            choice = val
    names: Sequence[str] = RAND_INCREASING_TRANSFORMS if increasing else RAND_TRANSFORMS
    weights = None
    if choice is not None:
        sets = {"weights": RAND_WEIGHTED_0, "3aw": RAND_WEIGHTED_3A, "3a": RAND_3A}
        if choice not in sets:
            raise ConfigError(f"auto_augment='{config_str}': t{choice} is not an op set; "
                              "use one of tweights, t3a, t3aw")
        chosen = sets[choice]
        names = tuple(chosen)
        if isinstance(chosen, dict):
            weights = np.asarray(list(chosen.values()), np.float64)
    elif weight_idx is not None:
        if weight_idx != 0:
            raise ConfigError(f"auto_augment='{config_str}': only w0 exists")
        weights = np.asarray([RAND_CHOICE_WEIGHTS_0[n] for n in RAND_TRANSFORMS], np.float64)  # by position
    if weights is not None:
        weights = weights / weights.sum()
    ops = [AugmentOp(name, prob=prob, magnitude=magnitude, hparams=hp) for name in names]
    return RandAugment(ops, num_layers, weights)


def auto_augment_transform(config_str: str, hparams: Mapping[str, Any] | None = None) -> AutoAugment:
    """AutoAugment policy from timm's string: 'original', 'originalr', 'v0', 'v0r' or '3a', optionally '-mstd0.5'."""
    hp = {**DEFAULT_HPARAMS, **(hparams or {})}
    name, sections = _sections(config_str, "", ("mstd",))
    if name not in POLICIES:
        raise ConfigError(f"auto_augment='{config_str}': '{name}' is not an AutoAugment policy; "
                          f"use rand-..., augmix-... or one of {', '.join(POLICIES)}")
    for _, val in sections:
        hp.setdefault("magnitude_std", float(val))
    return AutoAugment([[AugmentOp(n, p, m, hp) for n, p, m in sub] for sub in POLICIES[name]])


def augment_and_mix_transform(config_str: str, hparams: Mapping[str, Any] | None = None) -> AugMix:
    """AugMix from timm's string, e.g. 'augmix-m5-w4-d2'; keys: m (severity, 3), w (width, 3), d (depth; default:
    1..3 at random per chain), a (Dirichlet/Beta alpha, 1), b (1: blended variant), mstd (default inf: uniform)."""
    hp = {**DEFAULT_HPARAMS, **(hparams or {})}
    magnitude, width, depth, alpha, blended = 3, 3, -1, 1.0, False
    for key, val in _sections(config_str, "augmix", ("m", "w", "d", "a", "b", "mstd"))[1]:
        if key == "mstd":
            hp.setdefault("magnitude_std", float(val))
        elif key == "m":
            magnitude = int(val)
        elif key == "w":
            width = int(val)
        elif key == "d":
            depth = int(val)
        elif key == "a":
            alpha = float(val)
        else:
            blended = bool(int(val))
    hp.setdefault("magnitude_std", float("inf"))
    return AugMix([AugmentOp(n, 1.0, magnitude, hp) for n in AUGMIX_TRANSFORMS], alpha, width, depth, blended)


def build_auto_augment(config_str: str, hparams: Mapping[str, Any]) -> RandAugment | AutoAugment | AugMix:
    """Dispatch on the string's head as timm's create_transform does: rand-*, augmix-*, else a policy name."""
    if config_str.startswith("rand"):
        return rand_augment_transform(config_str, hparams)
    if config_str.startswith("augmix"):
        return augment_and_mix_transform(config_str, {**hparams, "translate_pct": 0.3})
    return auto_augment_transform(config_str, hparams)
