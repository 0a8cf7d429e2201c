"""`native_distance`: how far data.pipeline=native's pixels are from the exact path's (timm's), per operation.

On real JPEGs (the first `--images` of CIFAR-10's test split from ../shared/datasets/cifar10; the generated
default's drawn shapes when the tars are absent), each row runs one operation both ways on the same input with the
same parameters: the exact path's numpy+PIL op (timm's pixels, bit for bit) and MindSpore's C++ vision op (eager),
and reports the mean and max |difference| in pixel levels (0..255) and the share of pixels off by more than 2.

Rows: JPEG decoding; the eval resize + center crop; a RandomResizedCrop with the same box (drawn as torchvision);
the horizontal flip; and the ops of timm's RandAugment that MindSpore's RandAugment also has, at the recipe's m9 of
10 (MindSpore's bin 27 of 31), with the recipe's bicubic interpolation and fill colour. Geometry ops (those with a
fill) are compared where both apply the same transform; shear is also given as each library applies it (about the
image centre in MindSpore, about the top-left corner in timm/PIL).
"""
from __future__ import annotations

import math
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import mindspore.dataset.vision as vision
import numpy as np
from PIL import Image

from benchmarks.data import CIFAR_TRAIN
from benchmarks.host import describe
from benchmarks.options import Options
from benchmarks.table import BenchResult, Table
from benchmarks.timing import progress
from swinexp.data import ops
from swinexp.data.cifar10 import extract
from swinexp.data.datasets import synthetic
from swinexp.data.decode import load_rgb
from swinexp.data.folder import Sample
from swinexp.data.native import native_eval, rand_augment_magnitude
from swinexp.data.transforms import IMAGENET_MEAN, EvalTransform, RandomResizedCropFlip

__all__ = ["COLUMNS", "MAGNITUDE", "run"]

COLUMNS = ("operation", "parameters", "mean abs diff (levels)", "max abs diff", "pixels off > 2 (%)")
MAGNITUDE = 9  # the recipe's rand-m9: 0.9 of each op's range on both paths
BICUBIC = Image.Resampling.BICUBIC
FILL = tuple(min(255, round(255 * m)) for m in IMAGENET_MEAN)  # timm's auto-augment fill: the mean colour


@dataclass(frozen=True)
class Pair:
    """One row: the same operation on the exact path (PIL image -> image) and the native path (HWC uint8 -> HWC)."""

    name: str
    parameters: str
    exact: Callable[[Image.Image, tuple[int, int, int, int]], Image.Image | np.ndarray]
    native: Callable[[np.ndarray, tuple[int, int, int, int]], np.ndarray]
    on_crop: bool = True  # the input is the recipe's crop (img_size px, as RandAugment sees it), else the decoded file


def _apply(operations: tuple, x: np.ndarray) -> np.ndarray:
    for op in operations:
        x = op(x)
    return x


def _shear_about_centre(img: Image.Image, factor: float, axis: int) -> Image.Image:
    """timm's shear, conjugated to pivot on the image centre as MindSpore's Affine does."""
    cx, cy = (img.size[0] - 1) / 2, (img.size[1] - 1) / 2
    matrix = (1, factor, -factor * cy, 0, 1, 0) if axis == 0 else (1, 0, 0, factor, 1, -factor * cx)
    return img.transform(img.size, Image.Transform.AFFINE, matrix, resample=BICUBIC, fillcolor=FILL)


def pairs(img_size: int) -> tuple[Pair, ...]:
    """The rows after decoding, at the recipe's settings for `img_size` px outputs."""
    level = MAGNITUDE / 10
    shear, degrees, factor = 0.3 * level, 30 * level, 1 + 0.9 * level  # timm's inc1 ranges at m9
    translate = 0.45 * level  # timm's TranslateXRel: a fraction of the side
    threshold = 256 - int(level * 256)  # timm's SolarizeIncreasing at m9
    bits = 8 - round(rand_augment_magnitude(MAGNITUDE) / ((31 - 1) / 4))  # what MindSpore's RandAugment keeps at m9
    eval_ = EvalTransform(img_size, 0.875)
    native_eval_ops = native_eval(eval_).operations[1:]  # after Decode
    angle = math.degrees(math.atan(shear))
    kw = {"fillcolor": FILL, "resample": BICUBIC}

    def ms_affine(translate_xy: tuple[float, float], shear_xy: tuple[float, float]) -> Callable:
        return vision.Affine(0.0, list(translate_xy), 1.0, list(shear_xy), vision.Inter.BICUBIC, FILL)

    def crop(img: Image.Image, box: tuple[int, int, int, int]) -> Image.Image:
        top, left, h, w = box
        return img.crop((left, top, left + w, top + h)).resize((img_size, img_size), BICUBIC)

    return (
        Pair("resize + center crop (eval)", f"short side {math.floor(img_size / 0.875)}, crop {img_size}, bicubic",
             lambda img, _: eval_.pixels(img), lambda x, _: _apply(native_eval_ops, x), on_crop=False),
        Pair("random resized crop, same box", f"to {img_size}, bicubic", crop,
             lambda x, b: vision.ResizedCrop(*b, (img_size, img_size), vision.Inter.BICUBIC)(x), on_crop=False),
        Pair("horizontal flip", "", lambda img, _: img.transpose(Image.Transpose.FLIP_LEFT_RIGHT),
             lambda x, _: vision.HorizontalFlip()(x)),
        Pair("Rotate", f"{degrees:g} deg, bicubic", lambda img, _: ops.rotate(img, degrees, **kw),
             lambda x, _: vision.Rotate(degrees, vision.Inter.BICUBIC, False, None, FILL)(x)),
        Pair("ShearX, same pivot (centre)", f"{shear:g}, bicubic", lambda img, _: _shear_about_centre(img, shear, 0),
             lambda x, _: ms_affine((0.0, 0.0), (angle, 0.0))(x)),
        Pair("ShearX, as each applies it", "timm: corner pivot; MindSpore: centre",
             lambda img, _: ops.shear_x(img, shear, **kw), lambda x, _: ms_affine((0.0, 0.0), (angle, 0.0))(x)),
        Pair("ShearY, same pivot (centre)", f"{shear:g}, bicubic", lambda img, _: _shear_about_centre(img, shear, 1),
             lambda x, _: ms_affine((0.0, 0.0), (0.0, angle))(x)),
        Pair("TranslateX", f"{translate:g} of the width, bicubic",
             lambda img, _: ops.translate_x_rel(img, translate, **kw), lambda x, _: ms_affine((-translate, 0.0),
                                                                                                (0.0, 0.0))(x)),
        Pair("TranslateY", f"{translate:g} of the height, bicubic",
             lambda img, _: ops.translate_y_rel(img, translate, **kw), lambda x, _: ms_affine((0.0, -translate),
                                                                                                (0.0, 0.0))(x)),
        Pair("Brightness", f"factor {factor:g}", lambda img, _: ops.brightness(img, factor),
             lambda x, _: vision.AdjustBrightness(factor)(x)),
        Pair("Contrast", f"factor {factor:g}", lambda img, _: ops.contrast(img, factor),
             lambda x, _: vision.AdjustContrast(factor)(x)),
        Pair("Color (saturation)", f"factor {factor:g}", lambda img, _: ops.color(img, factor),
             lambda x, _: vision.AdjustSaturation(factor)(x)),
        Pair("Sharpness", f"factor {factor:g}", lambda img, _: ops.sharpness(img, factor),
             lambda x, _: vision.AdjustSharpness(factor)(x)),
        Pair("Solarize", f"threshold {threshold}", lambda img, _: ops.solarize(img, threshold),
             lambda x, _: vision.Solarize(float(threshold))(x)),
        Pair("Posterize, same bits", f"{bits} bits", lambda img, _: ops.posterize(img, bits),
             lambda x, _: vision.Posterize(bits)(x)),
        Pair("Posterize, each at m9", f"timm inc1: {4 - int(level * 4)} bit, MindSpore: {bits} bits",
             lambda img, _: ops.posterize(img, 4 - int(level * 4)), lambda x, _: vision.Posterize(bits)(x)),
        Pair("AutoContrast", "", lambda img, _: ops.auto_contrast(img), lambda x, _: vision.AutoContrast()(x)),
        Pair("Equalize", "", lambda img, _: ops.equalize(img), lambda x, _: vision.Equalize()(x)),
    )


def _samples(tmp: Path, count: int) -> tuple[tuple[Sample, ...], str]:
    cifar = CIFAR_TRAIN.parent
    if (cifar / "train.tar").is_file() and (cifar / "test.tar").is_file():
        per_class = max(1, math.ceil(count / 10))
        root = extract(cifar, tmp / "cifar10", train_per_class=1, test_per_class=per_class)
        samples = tuple((str(p), 0) for p in sorted((root / "test").rglob("*.jpg")))[:count]
        return samples, f"{len(samples)} CIFAR-10 test JPEGs (32 px)"
    spec = synthetic(root=str(tmp / "synthetic"), num_train=10, num_val=max(10, count), img_size=64)
    return spec.val[:count], f"{min(count, len(spec.val))} generated-default JPEGs (64 px; no CIFAR-10 tars)"


class _Stats:
    def __init__(self) -> None:
        self.total, self.count, self.worst, self.off = 0.0, 0, 0, 0

    def add(self, exact: Image.Image | np.ndarray, native: np.ndarray) -> None:
        a, b = np.asarray(exact, np.int16), np.asarray(native, np.int16)
        assert a.shape == b.shape, (a.shape, b.shape)
        diff = np.abs(a - b)
        self.total += float(diff.sum())
        self.count += diff.size
        self.worst = max(self.worst, int(diff.max()))
        self.off += int((diff > 2).sum())

    def cells(self) -> tuple[str, str, str]:
        return f"{self.total / self.count:.2f}", str(self.worst), f"{100 * self.off / self.count:.1f}"


def run(opts: Options) -> BenchResult:
    """The `native_distance` sub-benchmark."""
    img_size = opts.img_size or 32
    rows_of = {name: _Stats() for name in ("decode (JPEG)", *(p.name for p in pairs(img_size)))}
    crop = RandomResizedCropFlip(img_size)
    with tempfile.TemporaryDirectory() as tmp:
        samples, source = _samples(Path(tmp), opts.images)
        progress(f"native_distance: {source}, {img_size} px")
        for i, (path, _) in enumerate(samples):
            img = load_rgb(path)
            rows_of["decode (JPEG)"].add(img, vision.Decode()(np.fromfile(path, np.uint8)))
            box = crop.crop_box(*img.size, np.random.default_rng([opts.seed, i]))
            top, left, h, w = box
            cropped = img.crop((left, top, left + w, top + h)).resize((img_size, img_size), BICUBIC)
            for pair in pairs(img_size):
                given = cropped if pair.on_crop else img
                rows_of[pair.name].add(pair.exact(given, box), pair.native(np.asarray(given), box))
    parameters = {p.name: p.parameters for p in pairs(img_size)} | {"decode (JPEG)": "PIL vs MindSpore Decode"}
    rows = tuple((name, parameters[name], *stats.cells()) for name, stats in rows_of.items())
    metrics = {f"native_distance/{name}/{key}": float(value) for name, _, *cells in rows
               for key, value in zip(("mean", "max", "off_pct"), cells)}
    notes = (f"Exact: swinexp's numpy+PIL ops (timm's pixels bit for bit); native: MindSpore's vision ops, eager, on "
             "the same input: the file (decode), the decoded image (eval, crop), else the exact path's crop of the "
             f"same box ({img_size} px). Geometry fill {FILL}; m{MAGNITUDE} of 10 = MindSpore's bin "
             f"{rand_augment_magnitude(MAGNITUDE)} of 31.",
             "Not comparable by operation: timm applies each chosen op with probability 0.5 and a magnitude drawn "
             "from N(9, 0.5); MindSpore always applies it at bin 27. timm's op set has Invert and SolarizeAdd, "
             "MindSpore's Identity instead.")
    title = f"data.pipeline=native against exact, per operation: {source}, output {img_size} px; {describe()}"
    return BenchResult("native_distance", Table(title, COLUMNS, rows, notes), metrics)
