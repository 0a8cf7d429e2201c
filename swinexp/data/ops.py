"""timm's augmentation ops as two tables, keyed by timm's op names.

`OPS[name](img, *args, fillcolor=..., resample=...)` applies one op to an RGB PIL image; geometric ops use the
keywords, colour ops ignore them. `LEVEL_TO_ARG[name](magnitude, hparams, rng)` maps a magnitude on timm's 0..10
scale to the op's arguments, exactly as timm's `_*_level_to_arg` functions do. timm flips the sign of signed
arguments with the global `random`; here the coin comes from `rng` (the sample's Generator), and `rng=None` keeps
the positive sign, which makes the mapping itself testable.
"""
from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from typing import Any, Callable, Optional

import numpy as np
from PIL import Image, ImageEnhance, ImageFilter, ImageOps

LEVEL_DENOM = 10.0  # magnitude M maps to the fraction M / 10 of each op's range
DEFAULT_FILL = (128, 128, 128)
DEFAULT_HPARAMS: dict[str, Any] = {"translate_const": 250, "img_mean": DEFAULT_FILL}

Op = Callable[..., Image.Image]
LevelToArg = Optional[Callable[[float, Mapping[str, Any], Optional[np.random.Generator]], tuple]]


def _affine(img: Image.Image, matrix: tuple[float, ...], fillcolor: Any = DEFAULT_FILL,
            resample: int = Image.Resampling.BILINEAR, **_: Any) -> Image.Image:
    # PIL maps each output pixel (x, y) to input (a*x + b*y + c, d*x + e*y + f)
    return img.transform(img.size, Image.Transform.AFFINE, matrix, resample=resample, fillcolor=fillcolor)


def shear_x(img: Image.Image, factor: float, **kw: Any) -> Image.Image:
    return _affine(img, (1, factor, 0, 0, 1, 0), **kw)


def shear_y(img: Image.Image, factor: float, **kw: Any) -> Image.Image:
    return _affine(img, (1, 0, 0, factor, 1, 0), **kw)


def translate_x_abs(img: Image.Image, pixels: float, **kw: Any) -> Image.Image:
    return _affine(img, (1, 0, pixels, 0, 1, 0), **kw)  # positive pixels move the content left


def translate_y_abs(img: Image.Image, pixels: float, **kw: Any) -> Image.Image:
    return _affine(img, (1, 0, 0, 0, 1, pixels), **kw)


def translate_x_rel(img: Image.Image, pct: float, **kw: Any) -> Image.Image:
    return translate_x_abs(img, pct * img.size[0], **kw)


def translate_y_rel(img: Image.Image, pct: float, **kw: Any) -> Image.Image:
    return translate_y_abs(img, pct * img.size[1], **kw)


def rotate(img: Image.Image, degrees: float, fillcolor: Any = DEFAULT_FILL,
           resample: int = Image.Resampling.BILINEAR, **_: Any) -> Image.Image:
    return img.rotate(degrees, resample=resample, fillcolor=fillcolor)  # counter-clockwise, about the centre


def auto_contrast(img: Image.Image, **_: Any) -> Image.Image:
    return ImageOps.autocontrast(img)


def invert(img: Image.Image, **_: Any) -> Image.Image:
    return ImageOps.invert(img)


def equalize(img: Image.Image, **_: Any) -> Image.Image:
    return ImageOps.equalize(img)


def solarize(img: Image.Image, thresh: int, **_: Any) -> Image.Image:
    return ImageOps.solarize(img, thresh)  # inverts pixels >= thresh


def solarize_add(img: Image.Image, add: int, thresh: int = 128, **_: Any) -> Image.Image:
    """Add `add` (clipped at 255) to pixels below `thresh`."""
    lut = [min(255, i + add) if i < thresh else i for i in range(256)]
    if img.mode not in ("L", "RGB"):
        return img
    return img.point(lut * (3 if img.mode == "RGB" else 1))


def posterize(img: Image.Image, bits_to_keep: int, **_: Any) -> Image.Image:
    """Keep the `bits_to_keep` high bits; 0 bits gives black, as older Pillow did (Pillow >= 10 rejects 0)."""
    if bits_to_keep >= 8:
        return img
    mask = ~(2 ** (8 - bits_to_keep) - 1) & 0xFF
    return img.point([i & mask for i in range(256)] * len(img.getbands()))


def contrast(img: Image.Image, factor: float, **_: Any) -> Image.Image:
    return ImageEnhance.Contrast(img).enhance(factor)


def color(img: Image.Image, factor: float, **_: Any) -> Image.Image:
    return ImageEnhance.Color(img).enhance(factor)


def brightness(img: Image.Image, factor: float, **_: Any) -> Image.Image:
    return ImageEnhance.Brightness(img).enhance(factor)


def sharpness(img: Image.Image, factor: float, **_: Any) -> Image.Image:
    return ImageEnhance.Sharpness(img).enhance(factor)


def gaussian_blur(img: Image.Image, radius: float, **_: Any) -> Image.Image:
    return img.filter(ImageFilter.GaussianBlur(radius=radius))


def desaturate(img: Image.Image, factor: float, **_: Any) -> Image.Image:
    return ImageEnhance.Color(img).enhance(min(1.0, max(0.0, 1.0 - factor)))  # factor 1 = grayscale


def _sign(value: float, rng: np.random.Generator | None) -> float:
    return -value if rng is not None and rng.random() > 0.5 else value


def _rotate_arg(level: float, hp: Mapping[str, Any], rng: np.random.Generator | None = None) -> tuple:
    return (_sign((level / LEVEL_DENOM) * 30.0, rng),)  # [-30, 30] degrees


def _enhance_arg(level: float, hp: Mapping[str, Any], rng: np.random.Generator | None = None) -> tuple:
    return ((level / LEVEL_DENOM) * 1.8 + 0.1,)  # [0.1, 1.9]; 1.0 is identity, so M is not severity here


def _enhance_increasing_arg(level: float, hp: Mapping[str, Any], rng: np.random.Generator | None = None) -> tuple:
    return (max(0.1, 1.0 + _sign((level / LEVEL_DENOM) * 0.9, rng)),)  # 1 -/+ 0.9 M/10: severity grows with M


def _minmax_arg(level: float, hp: Mapping[str, Any], rng: np.random.Generator | None = None,
                min_val: float = 0.0, max_val: float = 1.0) -> tuple:
    return (max(min_val, min(max_val, min_val + (max_val - min_val) * (level / LEVEL_DENOM))),)


def _blur_rand_arg(level: float, hp: Mapping[str, Any], rng: np.random.Generator | None = None) -> tuple:
    # timm draws the radius inside the op from U(0.1, 2 * factor); drawn here so the op stays deterministic
    factor = _minmax_arg(level, hp)[0]
    u = 0.5 if rng is None else rng.random()
    return (0.1 + (2.0 * factor - 0.1) * u,)  # Python's uniform(a, b), which also allows b < a (factor < 0.05)


def _shear_arg(level: float, hp: Mapping[str, Any], rng: np.random.Generator | None = None) -> tuple:
    return (_sign((level / LEVEL_DENOM) * 0.3, rng),)  # [-0.3, 0.3]


def _translate_abs_arg(level: float, hp: Mapping[str, Any], rng: np.random.Generator | None = None) -> tuple:
    return (_sign((level / LEVEL_DENOM) * float(hp["translate_const"]), rng),)


def _translate_rel_arg(level: float, hp: Mapping[str, Any], rng: np.random.Generator | None = None) -> tuple:
    return (_sign((level / LEVEL_DENOM) * hp.get("translate_pct", 0.45), rng),)  # [-0.45, 0.45] of the side


def _posterize_arg(level: float, hp: Mapping[str, Any], rng: np.random.Generator | None = None) -> tuple:
    return (int((level / LEVEL_DENOM) * 4),)  # keep 0..4 bits: TPU EfficientNet, severity falls with M


def _posterize_increasing_arg(level: float, hp: Mapping[str, Any], rng: np.random.Generator | None = None) -> tuple:
    return (4 - _posterize_arg(level, hp)[0],)  # keep 4..0 bits


def _posterize_original_arg(level: float, hp: Mapping[str, Any], rng: np.random.Generator | None = None) -> tuple:
    return (int((level / LEVEL_DENOM) * 4) + 4,)  # keep 4..8 bits, as in the AutoAugment paper


def _solarize_arg(level: float, hp: Mapping[str, Any], rng: np.random.Generator | None = None) -> tuple:
    return (min(256, int((level / LEVEL_DENOM) * 256)),)  # threshold; severity falls with M


def _solarize_increasing_arg(level: float, hp: Mapping[str, Any], rng: np.random.Generator | None = None) -> tuple:
    return (256 - _solarize_arg(level, hp)[0],)


def _solarize_add_arg(level: float, hp: Mapping[str, Any], rng: np.random.Generator | None = None) -> tuple:
    return (min(128, int((level / LEVEL_DENOM) * 110)),)


OPS: dict[str, Op] = {
    "AutoContrast": auto_contrast, "Equalize": equalize, "Invert": invert, "Rotate": rotate,
    "Posterize": posterize, "PosterizeIncreasing": posterize, "PosterizeOriginal": posterize,
    "Solarize": solarize, "SolarizeIncreasing": solarize, "SolarizeAdd": solarize_add,
    "Color": color, "ColorIncreasing": color, "Contrast": contrast, "ContrastIncreasing": contrast,
    "Brightness": brightness, "BrightnessIncreasing": brightness,
    "Sharpness": sharpness, "SharpnessIncreasing": sharpness,
    "ShearX": shear_x, "ShearY": shear_y, "TranslateX": translate_x_abs, "TranslateY": translate_y_abs,
    "TranslateXRel": translate_x_rel, "TranslateYRel": translate_y_rel,
    "Desaturate": desaturate, "GaussianBlur": gaussian_blur, "GaussianBlurRand": gaussian_blur,
}

LEVEL_TO_ARG: dict[str, LevelToArg] = {
    "AutoContrast": None, "Equalize": None, "Invert": None, "Rotate": _rotate_arg,
    "Posterize": _posterize_arg, "PosterizeIncreasing": _posterize_increasing_arg,
    "PosterizeOriginal": _posterize_original_arg,
    "Solarize": _solarize_arg, "SolarizeIncreasing": _solarize_increasing_arg, "SolarizeAdd": _solarize_add_arg,
    "Color": _enhance_arg, "ColorIncreasing": _enhance_increasing_arg,
    "Contrast": _enhance_arg, "ContrastIncreasing": _enhance_increasing_arg,
    "Brightness": _enhance_arg, "BrightnessIncreasing": _enhance_increasing_arg,
    "Sharpness": _enhance_arg, "SharpnessIncreasing": _enhance_increasing_arg,
    "ShearX": _shear_arg, "ShearY": _shear_arg, "TranslateX": _translate_abs_arg, "TranslateY": _translate_abs_arg,
    "TranslateXRel": _translate_rel_arg, "TranslateYRel": _translate_rel_arg,
    "Desaturate": partial(_minmax_arg, min_val=0.5, max_val=1.0),
    "GaussianBlur": partial(_minmax_arg, min_val=0.1, max_val=2.0),
    "GaussianBlurRand": _blur_rand_arg,
}
