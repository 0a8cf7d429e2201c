"""`data.pipeline=native`: the same train/eval recipe as MindSpore's own C++ `mindspore.dataset.vision` operations.

The exact path (the default) runs swinexp's numpy+PIL port of timm in Python workers, pixel for pixel timm's.
The native path reads each file's bytes and maps MindSpore's Decode, RandomResizedCrop, RandomHorizontalFlip and
RandAugment (or AutoAugment / RandomColorAdjust) over them in C++ threads; eval is Decode, Resize, CenterCrop. Both
hand the loader uint8 HWC pixels, so normalization, RandomErasing and Mixup/CutMix stay in the device prologue and
the two paths differ only in the per-image pixel transforms.

What differs from timm on the native path (`python -m benchmarks native_distance` measures it per operation):
- interpolation: OpenCV's bicubic/bilinear kernels, not PIL's; JPEG decoding by libjpeg-turbo through OpenCV;
- RandAugment is torchvision's: 14 ops (Identity instead of timm's Invert and SolarizeAdd), each applied always
  (timm: each with probability 0.5), a fixed magnitude (no `mstd` noise), timm's magnitude m of 10 mapped to bin
  round(3 m) of 31 (shear, rotate, translate, colour factors then match timm's 'inc1' ranges; Posterize keeps
  4 bits where timm's increasing Posterize keeps 1);
- AutoAugment ('original', 'v0', ...) is torchvision's ImageNet policy; AugMix and 'random' interpolation have no
  native counterpart and are refused;
- randomness: MindSpore's op generators, seeded per epoch from (seed, epoch) — reproducible for a fixed
  data.num_workers on one machine, but not across worker counts (rows reach the map threads in a different order),
  and a resumed mid-epoch run does not redraw the uninterrupted epoch's crops;
- unreadable files: a file that is empty, not an image or a truncated JPEG/PNG is logged by name and replaced by
  the next readable sample in its slot, as on the exact path (`encoded_problem` checks the bytes without decoding
  them: MindSpore's Decode kills the process with SIGFPE on some truncated JPEGs, and a failing Decode runs in a
  C++ map thread after the sample was chosen, where nothing can replace it); a file that passes the check but
  that Decode still refuses (corrupt data inside) stops the epoch with an error naming it (`unreadable_file_error`).
"""
from __future__ import annotations

import io
import math
import warnings
from dataclasses import dataclass
from typing import Any

import mindspore.dataset as msds
import mindspore.dataset.vision as vision
import numpy as np
from PIL import Image

from swinexp.data.auto_augment import AugMix, AutoAugment, RandAugment
from swinexp.data.decode import DECODE_ERRORS, read_in_slot
from swinexp.data.erasing import RandomErasing
from swinexp.data.factory import TrainTransform
from swinexp.data.folder import Sample
from swinexp.data.transforms import ColorJitter, EvalTransform
from swinexp.registry import ConfigError

INTERPOLATIONS = {"bicubic": vision.Inter.BICUBIC, "bilinear": vision.Inter.BILINEAR,
                  "nearest": vision.Inter.NEAREST}
MAGNITUDE_BINS = 31  # torchvision's RandAugment default: bin b of 31 is b/30 of each op's range (timm: m/10)


@dataclass(frozen=True)
class NativeTransform:
    """MindSpore vision operations the loader maps over a file's encoded bytes (Decode first): uint8 (S, S, 3)
    out, the same kind of pixels as a PixelTransform's `pixels`; normalization and erasing stay in the prologue."""

    operations: tuple[Any, ...]
    img_size: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    erasing: RandomErasing | None = None

    def pixels(self, img: Image.Image, rng: np.random.Generator | None = None) -> np.ndarray:
        """The operations after Decode, eagerly on a decoded image (`rng` unused: MindSpore's generators draw)."""
        x = np.asarray(img, np.uint8)
        for op in self.operations[1:]:
            x = op(x)
        return np.ascontiguousarray(x)

    def __repr__(self) -> str:
        return f"NativeTransform({', '.join(type(op).__name__ for op in self.operations)})"


def _interpolation(name: str) -> vision.Inter:
    if name not in INTERPOLATIONS:
        raise ConfigError(f"data.augment.interpolation='{name}' has no data.pipeline=native counterpart (MindSpore "
                          f"draws no interpolation per image); use one of: {', '.join(INTERPOLATIONS)}")
    return INTERPOLATIONS[name]


def rand_augment_magnitude(magnitude: float) -> int:
    """timm's magnitude (0..10) as the bin of MindSpore's 31-bin RandAugment covering the same fraction of range."""
    return min(MAGNITUDE_BINS - 1, max(1, round(magnitude * (MAGNITUDE_BINS - 1) / 10)))  # MindSpore refuses 0


def _colour_ops(color: tuple[Any, ...], interpolation: vision.Inter, fill: tuple[int, ...]) -> list[Any]:
    """The native counterparts of a TrainTransform's colour stage (timm's auto-augment or colour jitter)."""
    ops: list[Any] = []
    for op in color:
        if isinstance(op, RandAugment):
            magnitude = rand_augment_magnitude(op.ops[0].magnitude)  # timm gives every op of a policy the same m
            ops.append(vision.RandAugment(num_ops=op.num_layers, magnitude=magnitude, num_magnitude_bins=MAGNITUDE_BINS,
                                          interpolation=interpolation, fill_value=fill))
        elif isinstance(op, AutoAugment):
            ops.append(vision.AutoAugment(vision.AutoAugmentPolicy.IMAGENET, interpolation, fill))
        elif isinstance(op, ColorJitter):
            ops.append(vision.RandomColorAdjust((max(0.0, 1 - op.brightness), 1 + op.brightness),
                                                (max(0.0, 1 - op.contrast), 1 + op.contrast),
                                                (max(0.0, 1 - op.saturation), 1 + op.saturation), (-op.hue, op.hue)))
        elif isinstance(op, AugMix):
            raise ConfigError("data.augment.auto_augment='augmix-...' has no data.pipeline=native counterpart; use "
                              "data.pipeline=exact, or a rand-/original auto_augment")
        else:
            raise ConfigError(f"{op!r} has no data.pipeline=native counterpart; use data.pipeline=exact")
    return ops


def native_train(transform: TrainTransform) -> NativeTransform:
    """The native operations of an exact train transform: the same crop box ranges, flip probability, colour
    stage and fill colour; its RandomErasing stays as host draws for the prologue."""
    crop = transform.crop
    if crop.vflip > 0:
        raise ConfigError("vflip has no data.pipeline=native counterpart in this recipe; use data.pipeline=exact")
    interpolation = _interpolation(crop.interpolation)
    fill = tuple(min(255, round(255 * m)) for m in transform.mean)
    ops = [vision.Decode(),
           vision.RandomResizedCrop(crop.img_size, scale=crop.scale, ratio=crop.ratio, interpolation=interpolation),
           *([vision.RandomHorizontalFlip(crop.hflip)] if crop.hflip > 0 else []),
           *_colour_ops(transform.color, interpolation, fill)]
    return NativeTransform(tuple(ops), crop.img_size, transform.mean, transform.std, transform.erasing)


def native_eval(transform: EvalTransform) -> NativeTransform:
    """Decode, resize the short side (crop_mode 'squash': both sides) to floor(img_size / crop_pct), center-crop
    img_size: timm's eval recipe."""
    side = math.floor(transform.img_size / transform.crop_pct)
    resize = (side, side) if transform.crop_mode == "squash" else side  # an int: the short side
    ops = (vision.Decode(), vision.Resize(resize, _interpolation(transform.interpolation)),
           vision.CenterCrop(transform.img_size))
    return NativeTransform(ops, transform.img_size, transform.mean, transform.std)


def native_of(transform: Any) -> NativeTransform:
    """The native counterpart of an exact per-image transform (a train preset's, or the eval transform)."""
    if isinstance(transform, NativeTransform):
        return transform
    if isinstance(transform, EvalTransform):
        return native_eval(transform)
    if isinstance(transform, TrainTransform):
        return native_train(transform)
    raise ConfigError(f"data.pipeline=native cannot translate {type(transform).__name__}; use data.pipeline=exact")


def encoded_problem(data: np.ndarray) -> str | None:
    """Why MindSpore's Decode cannot read these encoded bytes, or None: empty, not an image PIL recognizes, or a
    JPEG/PNG cut short (no end-of-image marker after the last scan, no IEND chunk). Reads headers only."""
    if data.size == 0:
        return "empty file"
    raw = data.tobytes()
    try:
        with Image.open(io.BytesIO(raw)) as img:
            kind = img.format
    except DECODE_ERRORS as err:
        return f"not an image: {type(err).__name__}: {err}"
    # In JPEG scan data a 0xFF byte is always followed by 0x00 or a restart marker, so an EOI after the last
    # start-of-scan is the real end of the image.
    if kind == "JPEG" and raw.rfind(b"\xff\xd9") < raw.rfind(b"\xff\xda"):
        return "truncated JPEG: no end-of-image marker after the last scan"
    if kind == "PNG" and b"IEND" not in raw[-12:]:
        return "truncated PNG: no IEND chunk at the end"
    return None


class EncodedSource:
    """Random-access source of the native path: index -> (the file's encoded bytes uint8 (N,), int32 label, int64
    epoch-carrying index, int32 skipped, and with `erasing` the erase draws of `DecodeTransform`).

    The erase draws come from (seed, epoch, i) as on the exact path, so they are reproducible whatever the workers.
    A file `encoded_problem` refuses is logged by name and replaced by the next readable sample (`skipped` 1).
    """

    def __init__(self, samples: tuple[Sample, ...], transform: NativeTransform, seed: int,
                 erasing: RandomErasing | None = None) -> None:
        self.samples, self.transform, self.seed, self.erasing = samples, transform, seed, erasing
        self.img_size = transform.img_size

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[np.ndarray, ...]:
        epoch, i = divmod(int(index), len(self.samples))
        data, label, skipped = read_in_slot(self.samples, i, _encoded_bytes)
        row = (data, np.int32(label), np.int64(index), np.int32(skipped))
        if self.erasing is None:
            return row
        draws = self.erasing.draw((3, self.img_size, self.img_size), np.random.default_rng([self.seed, epoch, i]))
        return (*row, draws.boxes, draws.colours, draws.keys)


def _encoded_bytes(path: str) -> np.ndarray:
    """The file's bytes, or ValueError when `encoded_problem` finds them unreadable for Decode."""
    data = np.fromfile(path, np.uint8)
    if problem := encoded_problem(data):
        raise ValueError(problem)
    return data


def native_dataset(source: EncodedSource, columns: list[str], sampler: Any, workers: int, batch_size: int,
                   drop_remainder: bool) -> msds.Dataset:
    """The native path's batches: one Python thread reads each file's bytes (and makes its erase draws), `workers`
    C++ map threads decode and transform them, MindSpore's batch op stacks the uint8 images."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dataset = msds.GeneratorDataset(source, columns, sampler=sampler, num_parallel_workers=1,
                                        python_multiprocessing=False)
    dataset = dataset.map(list(source.transform.operations), input_columns=["image"], num_parallel_workers=workers)
    return dataset.batch(batch_size, drop_remainder=drop_remainder)


def unreadable_file_error(source: EncodedSource, candidates: np.ndarray) -> RuntimeError | None:
    """The error for a native epoch that stopped in MindSpore: names the first of the `candidates` (sample indices
    in the order the pipeline read them, from the failed batch on) that Decode refuses, and what to do; None when
    every candidate decodes (the pipeline failed for another reason)."""
    decode = source.transform.operations[0]
    for i in candidates:
        path = source.samples[int(i)][0]
        data = np.fromfile(path, np.uint8)
        if encoded_problem(data):  # the source skipped it; Decode might kill the process
            continue
        try:
            decode(data)
        except (RuntimeError, ValueError) as err:
            reason = next((line.strip() for line in str(err).splitlines() if "[ERROR]" in line), type(err).__name__)
            return RuntimeError(
                f"data.pipeline=native cannot decode '{path}' ({reason}); the native path stops on an unreadable "
                "file (its C++ decoder cannot take the next sample in its place). Remove or replace the file, or "
                "use data.pipeline=exact, which logs such a file and uses the next readable sample")
    return None


def seed_epoch(seed: int, epoch: int) -> None:
    """Seed MindSpore's dataset generators for one epoch's iterator.

    MindSpore seeds its random vision ops when an iterator is built, from the global dataset seed: without a new
    seed per epoch every epoch would repeat the first epoch's draws position by position. One of the two global
    settings outside `runtime.hardware` (the other: the prefetch size `Loader.raw_epoch` lowers to fit /dev/shm);
    it changes only the dataset engine's seed.
    """
    msds.config.set_seed(int(np.random.default_rng([seed, epoch]).integers(2**31 - 1)))
