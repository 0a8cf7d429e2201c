"""`data`: images/s of the input pipeline (the `swin` train recipe and the eval transform) for 1..N workers.

Input: the first `--images` CIFAR-10 train JPEGs from ../shared (drawn shapes when that tar is absent), resized to
`--source-size` (default: `--img-size` square; 500x375 is an ImageNet-sized photo) and re-encoded as JPEG
(quality 90) into a temporary ImageFolder of 10 class folders. The in-process rows decode and transform one image
at a time without MindSpore, the single-core ceiling, timed by `benchmarks.per_image.alternate` as in `loader`:
with the `reference` extra installed, timm's ImageDataset and transforms work on the same files, taking turns with
swinexp's image by image, and a note gives the ratio of the times per image. The Loader rows time full epochs;
pipelines take turns (round-robin) and the first epoch of each is untimed, so worker start-up is not counted.
"""
from __future__ import annotations

import io
import itertools
import re
import tarfile
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
from PIL import Image

from benchmarks.harness import IMPORT_ROOT
from benchmarks.host import describe
from benchmarks.options import Options
from benchmarks.per_image import alternate, median_ms, swinexp_work, time_ratio
from benchmarks.table import BenchResult, Table
from benchmarks.timing import progress, round_robin
from benchmarks.timm_peer import reference_installed
from swinexp.data.augment import swin
from swinexp.data.datasets import DataSpec, imagefolder
from swinexp.data.pipeline import Loader
from swinexp.data.synthetic import SHAPES, draw_image
from swinexp.data.transforms import EvalTransform
from swinexp.registry import ConfigError

__all__ = ["CIFAR_TRAIN", "NO_TIMM_MESSAGE", "run", "source_images"]

CIFAR_TRAIN = IMPORT_ROOT.parent / "shared" / "datasets" / "cifar10" / "train.tar"
CLASSES = 10  # images go to class folders round-robin: labels do not matter for throughput
NO_TIMM_MESSAGE = ("data: no timm rows: install the reference extra with pip install -e '.[reference]' "
                   "(torch, torchvision, timm) to time timm's transforms on the same images.")
PIPELINES = {"train": "swin train", "eval": "eval"}


def parse_size(text: str) -> tuple[int, int]:
    """'WxH' -> (W, H)."""
    match = re.fullmatch(r"(\d+)x(\d+)", text.strip())
    if not match or min(int(match[1]), int(match[2])) < 1:
        raise ConfigError(f"--source-size={text!r}: give width x height in pixels, e.g. 500x375")
    return int(match[1]), int(match[2])


def source_images(count: int, size: tuple[int, int]) -> Iterator[Image.Image]:
    """`count` RGB images of `size` (W, H): CIFAR-10 train JPEGs upscaled (bicubic), or drawn shapes without the tar."""
    if CIFAR_TRAIN.is_file():
        with tarfile.open(CIFAR_TRAIN) as tar:
            members = (m for m in tar if m.isfile() and m.name.endswith(".jpg"))
            for member in itertools.islice(members, count):
                img = Image.open(io.BytesIO(tar.extractfile(member).read())).convert("RGB")
                yield img.resize(size, Image.Resampling.BICUBIC)
        return
    names = list(SHAPES)
    for i in range(count):
        yield draw_image(np.random.default_rng(i), names[i % len(names)], max(size)).resize(size)


def write_folder(root: Path, count: int, size: tuple[int, int]) -> None:
    """The same images as train/ and val/ of an ImageFolder with CLASSES class folders."""
    for i, img in enumerate(source_images(count, size)):
        for split in ("train", "val"):
            folder = root / split / f"c{i % CLASSES}"
            folder.mkdir(parents=True, exist_ok=True)
            img.save(folder / f"{i:05d}.jpg", quality=90)


def _pipeline(loader: Loader) -> Callable[[], None]:
    epoch = itertools.count()

    def call() -> None:
        for _ in loader.epoch(next(epoch)):
            pass

    return call


Candidate = tuple[Callable[[], Callable[[], None]], int, tuple[str, ...]]


def candidates(spec: DataSpec, max_workers: int) -> dict[str, Candidate]:
    """The Loader rows: name -> (builder of one epoch's call, images per epoch, the row's first cells)."""
    augment = swin(spec.img_size, num_classes=spec.num_classes, label_smoothing=0.1)
    evaluation = EvalTransform(spec.img_size, spec.crop_pct, "bicubic")
    batch = spec.batch_size
    train_images = len(spec.train) // batch * batch  # the train loader drops the last incomplete batch
    rows = {}
    for workers in range(1, max_workers + 1):
        for processes in ((False,) if workers == 1 else (True, False)):
            kind = "processes" if processes else "threads"

            def train(w: int = workers, p: bool = processes) -> Callable[[], None]:
                return _pipeline(Loader(spec.train, augment.transform, batch, w, 0, augment.targets, p))

            def val(w: int = workers, p: bool = processes) -> Callable[[], None]:
                return _pipeline(Loader(spec.val, evaluation, batch, w, 0, python_multiprocessing=p))

            how = (f"Loader, batch {batch}", str(workers), kind)
            rows[f"train/{workers}_{kind}"] = (train, train_images, (PIPELINES["train"], *how))
            rows[f"eval/{workers}_{kind}"] = (val, len(spec.val), (PIPELINES["eval"], *how))
    return rows


def per_image_rows(spec: DataSpec, root: Path, with_timm: bool,
                   passes: int) -> tuple[dict[str, tuple[tuple[float, ...], tuple[str, ...]]], dict[str, float]]:
    """The in-process rows, swinexp's per-image transform and timm's taking turns image by image on the same files
    (`benchmarks.per_image.alternate`, as in `loader`): (name -> (ms per image of each pass, the row's first cells),
    data/<kind>/swinexp_time_over_timm)."""
    transforms = {"train": swin(spec.img_size, num_classes=spec.num_classes, label_smoothing=0.1).transform,
                  "eval": EvalTransform(spec.img_size, spec.crop_pct, "bicubic")}
    rows, ratios = {}, {}
    for kind, samples, split in (("train", spec.train, "train"), ("eval", spec.val, "val")):
        works = {"swinexp": swinexp_work(samples, transforms[kind])}
        if with_timm:
            from benchmarks import timm_data

            works["timm"] = timm_data.per_image_work(root / split, timm_data.timm_transform(
                kind, spec.img_size, spec.crop_pct), [path for path, _ in samples])
        progress(f"data: {PIPELINES[kind]}, one image at a time")
        timings = alternate(works, len(samples), passes)
        rows[f"{kind}/in_process"] = (timings["swinexp"],
                                      (PIPELINES[kind], "in-process loop (no MindSpore)", "-", "-"))
        if with_timm:
            rows[f"{kind}/timm_in_process"] = (timings["timm"], (PIPELINES[kind], "in-process loop, "
                                                                 f"{timm_data.timm_version()}", "-", "-"))
            ratios[f"data/{kind}/swinexp_time_over_timm"] = time_ratio(timings)
    return rows, ratios


def run(opts: Options) -> BenchResult:
    """The `data` sub-benchmark."""
    img_size, batch = opts.img_size or 224, opts.batch or 64
    source_size = parse_size(opts.source_size) if opts.source_size else (img_size, img_size)
    if opts.images < max(batch, CLASSES):
        raise ValueError(f"--images={opts.images} must be >= --batch={batch} and >= {CLASSES}")
    with tempfile.TemporaryDirectory() as tmp:
        write_folder(Path(tmp), opts.images, source_size)
        spec = imagefolder(tmp, num_classes=CLASSES, img_size=img_size, batch_size=batch, num_workers=1,
                           crop_pct=0.875)
        with_timm = reference_installed()
        if not with_timm:
            progress(NO_TIMM_MESSAGE)
        per_image, ratios = per_image_rows(spec, Path(tmp), with_timm, opts.iters)
        rows = candidates(spec, opts.workers)
        # the first (untimed) epoch of each row is its warm-up: an epoch is long enough to need no more
        timings = round_robin({name: build for name, (build, _, _) in rows.items()}, 0, opts.iters)
    table_rows, metrics = [], {}
    for name, (per_pass, cells) in per_image.items():
        rates = sorted(1e3 / ms for ms in per_pass)
        table_rows.append((*cells, f"{1e3 / median_ms(per_pass):.0f}", f"{rates[0]:.0f}", f"{rates[-1]:.0f}"))
        metrics[f"data/{name}/images_per_s"] = 1e3 / median_ms(per_pass)
    for name, timing in timings.items():
        _, images, cells = rows[name]
        rates = sorted(images / s for s in timing.samples.seconds)
        rate = float(np.median(rates))
        table_rows.append((*cells, f"{rate:.0f}", f"{rates[0]:.0f}", f"{rates[-1]:.0f}"))
        metrics[f"data/{name}/images_per_s"] = rate
    metrics.update(ratios)
    source = "CIFAR-10 train JPEGs upscaled" if CIFAR_TRAIN.is_file() else "drawn-shape JPEGs"
    title = (f"Input pipeline, {opts.images} {source} to {source_size[0]} x {source_size[1]} px (JPEG q90), "
             f"output {img_size} px; "
             f"in-process rows: {opts.iters} timed passes after one untimed, one image at a time, taking turns image "
             f"by image; Loader rows: {opts.iters} timed epochs after one untimed, round-robin; {describe()}")
    notes = ["swin train: RandomResizedCrop bicubic + flip, RandAugment rand-m9-mstd0.5-inc1, normalize, "
             "RandomErasing 0.25, Mixup 0.8 / CutMix 1.0 with label smoothing 0.1 (Loader rows; the in-process "
             "loops stop at the per-image transform). eval: resize the short side to "
             f"{img_size}/0.875 (bicubic), center crop {img_size}, normalize."]
    if ratios:
        per_kind = ", ".join(f"{PIPELINES[key.split('/')[1]]} {value:.2f}" for key, value in ratios.items())
        notes.append(f"swinexp / timm time per image, in-process loops (medians, decode included, the same files): "
                     f"{per_kind}; < 1 means swinexp is faster.")
    notes.append(f"Mean 1-minute load average during the timed Loader epochs: "
                 f"{next(iter(timings.values())).load:.1f}.")
    columns = ("pipeline", "how", "workers", "worker kind", "median (images/s)", "min (images/s)", "max (images/s)")
    return BenchResult("data", Table(title, columns, tuple(table_rows), tuple(notes)), metrics)
