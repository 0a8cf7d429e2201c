"""swinexp's deterministic image transforms against torchvision's and timm's own, pixel for pixel.

Needs the `reference` extra (torch, torchvision, timm); skipped without it. The random parts (RandAugment ops,
erasing, Mixup) are checked against hand-computed pixels in test_augment.py; here the shared deterministic path is
compared bit for bit: decode, resize + center crop, crop box -> resize -> flip, ToTensor + Normalize.
"""
from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from swinexp.data.decode import load_rgb
from swinexp.data.transforms import IMAGENET_MEAN, IMAGENET_STD, EvalTransform, RandomResizedCropFlip, to_normalized_chw

torch = pytest.importorskip("torch", reason="the reference extra (torch, torchvision, timm) is not installed")
transforms = pytest.importorskip("torchvision.transforms")
timm_data = pytest.importorskip("timm.data")
F = pytest.importorskip("torchvision.transforms.functional")


def _jpeg(tmp_path, width: int, height: int, seed: int) -> str:
    """A photo-like JPEG: smooth gradients plus noise, so resampling filters differ visibly."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:height, 0:width]
    base = np.stack([xx * 255 / width, yy * 255 / height, (xx + yy) * 127 / (width + height)], axis=-1)
    pixels = np.clip(base + rng.normal(0, 25, base.shape), 0, 255).astype(np.uint8)
    path = tmp_path / f"{width}x{height}_{seed}.jpg"
    Image.fromarray(pixels).save(path, quality=90)
    return str(path)


SHAPES = [(500, 375), (375, 500), (224, 224), (300, 301), (97, 61)]


@pytest.mark.parametrize("width,height", SHAPES)
def test_eval_transform_equals_timms_eval_transform(tmp_path, width: int, height: int) -> None:
    path = _jpeg(tmp_path, width, height, seed=width)
    theirs = timm_data.create_transform(224, is_training=False, interpolation="bicubic", crop_pct=0.875)
    with open(path, "rb") as f:  # timm's ImageDataset reader
        expected = theirs(Image.open(f).convert("RGB")).numpy()
    ours = EvalTransform(224, crop_pct=0.875, interpolation="bicubic")(load_rgb(path))
    assert ours.shape == expected.shape == (3, 224, 224)
    assert np.array_equal(ours, expected)


@pytest.mark.parametrize("width,height,crop_pct", [(500, 375, 1.0), (300, 460, 1.0), (500, 375, 0.875)])
def test_squash_eval_transform_equals_timms_squash_and_differs_from_center(tmp_path, width: int, height: int,
                                                                          crop_pct: float) -> None:
    path = _jpeg(tmp_path, width, height, seed=width)
    theirs = timm_data.create_transform(64, is_training=False, interpolation="bicubic", crop_pct=crop_pct,
                                        crop_mode="squash")
    with open(path, "rb") as f:
        expected = theirs(Image.open(f).convert("RGB")).numpy()
    img = load_rgb(path)
    ours = EvalTransform(64, crop_pct, crop_mode="squash")(img)
    assert ours.shape == expected.shape == (3, 64, 64)
    assert np.array_equal(ours, expected)
    assert np.abs(ours - EvalTransform(64, crop_pct)(img)).mean() > 0.1  # center crops: a different view


def test_normalization_equals_torchvisions_to_tensor_and_normalize(tmp_path) -> None:
    img = load_rgb(_jpeg(tmp_path, 64, 48, seed=1))
    expected = transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD)(transforms.ToTensor()(img)).numpy()
    assert np.array_equal(to_normalized_chw(img), expected)


@pytest.mark.parametrize("interpolation", ["bicubic", "bilinear"])
@pytest.mark.parametrize("seed", range(6))
def test_random_resized_crop_equals_torchvisions_for_the_same_box(tmp_path, seed: int, interpolation: str) -> None:
    img = load_rgb(_jpeg(tmp_path, 500, 375, seed))
    crop = RandomResizedCropFlip(224, interpolation=interpolation, hflip=0.5)
    rng = np.random.default_rng(seed)
    top, left, h, w = crop.crop_box(*img.size, rng)
    flipped = rng.random() < 0.5
    ours = crop(img, np.random.default_rng(seed))  # the same draws: box, then the flip
    mode = {"bicubic": F.InterpolationMode.BICUBIC, "bilinear": F.InterpolationMode.BILINEAR}[interpolation]
    theirs = F.resized_crop(img, top, left, h, w, [224, 224], mode)
    if flipped:
        theirs = F.hflip(theirs)
    expected = transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD)(transforms.ToTensor()(theirs)).numpy()
    assert np.array_equal(ours, expected)


LEVELS = (0.0, 3.0, 7.5, 9.0, 10.0)
HPARAMS = {"translate_const": 100, "img_mean": (124, 116, 104)}
DRAWS = (0.25, 0.75)  # each random draw of both libraries: a positive sign, then a negative one


class Pinned:
    """A numpy-Generator stand-in whose random() always returns `value`, as Python's pinned `random.random`."""

    def __init__(self, value: float) -> None:
        self.value = value

    def random(self) -> float:
        return self.value


@pytest.fixture()
def pin_python_random(monkeypatch: pytest.MonkeyPatch):
    """Pins Python's `random.random` and `random.uniform` (timm's signs and in-op draws) to one draw; returns the
    setter. `uniform` is pinned too: it is a method of the module's hidden Random, which ignores `random.random`."""
    import random

    def pin(value: float) -> None:
        monkeypatch.setattr(random, "random", lambda: value)
        monkeypatch.setattr(random, "uniform", lambda a, b: a + (b - a) * value)  # CPython's formula

    return pin


def test_randaugment_level_to_arg_equals_timms_at_every_level(pin_python_random) -> None:
    import timm.data.auto_augment as timm_ops

    from swinexp.data.ops import LEVEL_TO_ARG

    assert set(LEVEL_TO_ARG) == set(timm_ops.LEVEL_TO_ARG)
    for draw in DRAWS:
        pin_python_random(draw)
        for name, ours in LEVEL_TO_ARG.items():
            if name == "GaussianBlurRand":
                continue  # swinexp draws the radius here, timm inside the op: compared as pixels below
            theirs = timm_ops.LEVEL_TO_ARG[name]
            for level in LEVELS:
                expected = theirs(level, HPARAMS) if theirs else ()
                got = ours(level, HPARAMS, Pinned(draw)) if ours else ()
                assert got == pytest.approx(expected), (name, level, draw)


@pytest.mark.parametrize("resample", [Image.Resampling.BICUBIC, Image.Resampling.BILINEAR])
def test_randaugment_ops_give_timms_pixels(tmp_path, pin_python_random, resample: int) -> None:
    import timm.data.auto_augment as timm_ops

    from swinexp.data.ops import LEVEL_TO_ARG, OPS

    img = load_rgb(_jpeg(tmp_path, 96, 80, seed=3))
    kwargs = {"fillcolor": HPARAMS["img_mean"], "resample": resample}
    compared = 0
    for draw in DRAWS:
        pin_python_random(draw)
        for name, op in OPS.items():
            for level in LEVELS:
                ours_args = LEVEL_TO_ARG[name](level, HPARAMS, Pinned(draw)) if LEVEL_TO_ARG[name] else ()
                their_args = timm_ops.LEVEL_TO_ARG[name](level, HPARAMS) if timm_ops.LEVEL_TO_ARG[name] else ()
                if name.startswith("Posterize") and their_args[0] <= 0:
                    continue  # Pillow 13 rejects 0 bits in timm's call; swinexp gives black (test_augment.py)
                ours = np.asarray(op(img, *ours_args, **kwargs))
                theirs = np.asarray(timm_ops.NAME_TO_OP[name](img, *their_args, **kwargs))
                assert np.array_equal(ours, theirs), (name, level, draw)
                compared += 1
    assert compared > 2 * len(LEVELS) * (len(OPS) - 3)
