"""`loader`: can the input pipeline feed a card? Worker and main-process cost, bytes moved, cores needed (issue 39).

On a real JPEG folder (CIFAR-10 from ../shared/datasets/cifar10, `--images` per split; skipped when the tars are
absent) and on the generated default dataset (data=synthetic's drawn shapes), for the swin train transform and the
eval transform, each as data.pipeline=exact (timm's pixels) and =native (MindSpore's vision ops), to
`--img-size` px:

- per image, one image at a time with decode (`benchmarks.per_image.alternate`, the timing `data` uses too): what
  one loader worker does (decode, transform to uint8, erase draws), swinexp's whole per-image transform (float,
  normalized, erased: timm's pixels), data.pipeline=native's MindSpore vision ops run eagerly and, with the
  `reference` extra, timm's ImageDataset + create_transform on the same files, taking turns image by image;
- for workers = 1..`--workers`: images/s through the Loader (workers stack whole batches -> the main process),
  main-process CPU per batch in the steady state, mean and median batch (getrusage of this process from the first
  batch to the last: MindSpore's iterator threads, the Mixup draws and targets; with 1 worker the worker is a thread
  of this process and is counted too), the CPU of starting and stopping the epoch's workers, and the bytes per image
  that cross from the workers (uint8 pixels, and all columns: label, index, flags, erase draws);
- cores per card: what sustaining `--batch` images every `--step-ms` ms takes, from the single-core worker cost
  and the main-process steady-state cost per image (the host's cores, not this machine's, are the limit being
  projected).

The device prologue (uint8 -> normalized, erased, mixed float32) runs on the card in training; here, on the CPU,
its time per batch is given in a note, outside the host figures.
"""
from __future__ import annotations

import os
import resource
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from benchmarks.data import CIFAR_TRAIN
from benchmarks.host import describe
from benchmarks.options import Options
from benchmarks.per_image import ImageWork, alternate, median_ms, swinexp_work, time_ratio
from benchmarks.table import BenchResult, Table
from benchmarks.timing import progress
from benchmarks.timm_peer import reference_installed
from swinexp.data.augment import swin
from swinexp.data.cifar10 import extract
from swinexp.data.datasets import DataSpec, cifar10_folder, synthetic
from swinexp.data.native import native_of
from swinexp.data.pipeline import Loader
from swinexp.data.transforms import EvalTransform, PixelTransform

__all__ = ["COLUMNS", "run"]

CIFAR_DIR = CIFAR_TRAIN.parent
CARDS = 8
COLUMNS = ("dataset", "pipeline", "per-image ops", "workers", "images/s", "worker ms/image", "swinexp ms/image",
           "timm ms/image",
           "main CPU ms/batch", "median main CPU ms/batch", "main CPU ms/image", "start+stop CPU ms/epoch",
           "pixel bytes/image", "bytes/image",
           "cores/card")


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


@dataclass(frozen=True)
class EpochCost:
    """One epoch of raw batches through a Loader, with the main process's host share."""

    seconds: float
    images: int
    batches: int
    steady_cpu_ms: float  # main-process CPU per batch from the first batch to the last
    median_cpu_ms: float  # the median batch of those: a few spikes on a shared host decide the mean
    start_stop_cpu_ms: float  # main-process CPU up to the first batch (starting the workers) and after the last
    pixel_bytes: float  # per image, of the first batch
    all_bytes: float


def _loader_epoch(loader: Loader, epoch: int, train: bool) -> EpochCost:
    cpu, start = _cpu_s(), time.perf_counter()
    marks = []
    images = 0
    sizes = (0.0, 0.0)
    for row in loader.raw_epoch(epoch):
        if train:
            loader.host_part(row)
        if not marks:
            count = int(row[0].shape[0])
            sizes = (row[0].nbytes / count, sum(t.nbytes for t in row) / count)
        images += int(row[0].shape[0])
        marks.append(_cpu_s())
    seconds, total = time.perf_counter() - start, _cpu_s() - cpu
    steady = (marks[-1] - marks[0]) / (len(marks) - 1) if len(marks) > 1 else float("nan")
    median = float(np.median(np.diff(marks))) if len(marks) > 1 else float("nan")
    start_stop = total - (marks[-1] - marks[0])
    return EpochCost(seconds, images, len(marks), steady * 1e3, median * 1e3, start_stop * 1e3, *sizes)


def _prologue_ms(loader: Loader, train: bool) -> float:
    row = next(iter(loader.raw_epoch(0)))
    loader.finish(row)[0].asnumpy()  # compile
    start = time.perf_counter()
    for _ in range(3):
        loader.finish(row)[0].asnumpy()
    return (time.perf_counter() - start) * 1e3 / 3


def _datasets(tmp: Path, opts: Options, img_size: int, batch: int) -> tuple[dict[str, tuple[DataSpec, Path]], list]:
    notes, sets = [], {}
    per_class = max(1, opts.images // 10)
    if (CIFAR_DIR / "train.tar").is_file() and (CIFAR_DIR / "test.tar").is_file():
        root = extract(CIFAR_DIR, tmp / "cifar10", train_per_class=per_class, test_per_class=per_class)
        spec = cifar10_folder(str(root), img_size=img_size, batch_size=batch, num_workers=1, crop_pct=0.875)
        sets[f"CIFAR-10 JPEG 32 px ({len(spec.train)})"] = (spec, root)
    else:
        notes.append(f"CIFAR-10 rows skipped: no tars under {CIFAR_DIR}.")
    root = tmp / "synthetic"
    spec = synthetic(root=str(root), num_train=per_class * 10, num_val=per_class * 10, num_classes=10,
                     img_size=img_size, batch_size=batch)
    sets[f"generated default, {img_size} px ({len(spec.train)})"] = (spec, root)
    return sets, notes


def _native_work(samples: tuple, operations: tuple) -> ImageWork:
    """data.pipeline=native's operations on sample i, eagerly: what one of its map threads does per image."""
    def work(i: int) -> object:
        x = np.fromfile(samples[i][0], np.uint8)
        for op in operations:
            x = op(x)
        return x

    return work


def per_image_works(samples: tuple, folder: Path, kind: str, transform: PixelTransform, img_size: int,
                    crop_pct: float, with_timm: bool) -> dict[str, ImageWork]:
    """The per-image works `loader` times side by side: 'worker' (what a loader worker does: decode, uint8 pixels,
    the erase draws), 'swinexp' (decode and the whole per-image transform: timm's pixels), 'native'
    (data.pipeline=native's operations) and, with the reference extra, 'timm' (ImageDataset + create_transform)."""
    def worker(img: Image.Image, rng: np.random.Generator) -> object:
        pixels = transform.pixels(img, rng)
        return transform.erasing.draw((3, *pixels.shape[:2]), rng) if kind == "train" else pixels

    works = {"worker": swinexp_work(samples, worker), "swinexp": swinexp_work(samples, transform),
             "native": _native_work(samples, native_of(transform).operations)}
    if with_timm:
        from benchmarks import timm_data

        works["timm"] = timm_data.per_image_work(folder, timm_data.timm_transform(kind, img_size, crop_pct),
                                                 [path for path, _ in samples])
    return works


def run(opts: Options) -> BenchResult:
    """The `loader` sub-benchmark."""
    img_size, batch, step_ms = opts.img_size or 224, opts.batch or 64, opts.step_ms
    workers = min(opts.workers, len(os.sched_getaffinity(0)))
    need_per_s = batch * 1e3 / step_ms  # images/s one card consumes
    with_timm = reference_installed()
    rows, metrics, notes, ratios = [], {}, [], []
    with tempfile.TemporaryDirectory() as tmp:
        sets, notes = _datasets(Path(tmp), opts, img_size, batch)
        for name, (spec, root) in sets.items():
            augment = swin(img_size, num_classes=spec.num_classes, label_smoothing=0.1)
            evaluation = EvalTransform(img_size, spec.crop_pct, "bicubic")
            for kind, samples, split, transform in (("train", spec.train, "train", augment.transform),
                                                    ("eval", spec.val, "val", evaluation)):
                progress(f"loader: {name}, {kind}")
                folder = root / split if (root / split).is_dir() else root / ("test" if split == "val" else split)
                works = per_image_works(samples, folder, kind, transform, img_size, spec.crop_pct, with_timm)
                timings = alternate(works, len(samples))
                ms = {work: median_ms(per_pass) for work, per_pass in timings.items()}
                key = f"loader/{'cifar10' if name.startswith('CIFAR') else 'synthetic'}/{kind}"
                metrics.update({f"{key}/{work}_ms_per_image": value for work, value in ms.items()})
                if with_timm:
                    metrics[f"{key}/swinexp_time_over_timm"] = time_ratio(timings)
                    ratios.append(f"{name} {kind} {metrics[f'{key}/swinexp_time_over_timm']:.2f}")
                prologue = None
                for pipeline, ops in (("exact", transform), ("native", native_of(transform))):
                    native = pipeline == "native"
                    worker_ms = ms["native" if native else "worker"]
                    for w in range(1, workers + 1):
                        loader = (Loader(spec.train, ops, batch, w, 0, augment.targets) if kind == "train"
                                  else Loader(spec.val, ops, batch, w, 0))
                        _loader_epoch(loader, 0, kind == "train")  # worker start-up
                        cost = _loader_epoch(loader, 1, kind == "train")
                        if prologue is None:
                            prologue = _prologue_ms(loader, kind == "train")
                        main_ms_per_image = cost.steady_cpu_ms / (cost.images / cost.batches)
                        # native: its C++ map threads decode inside this process, so its CPU time is all of it
                        cores = need_per_s * (main_ms_per_image if native else worker_ms + main_ms_per_image) / 1e3
                        at = f"{key}/{pipeline}/{w}"
                        metrics.update({f"{at}/images_per_s": cost.images / cost.seconds,
                                        f"{at}/main_cpu_ms_per_batch": cost.steady_cpu_ms,
                                        f"{at}/median_main_cpu_ms_per_batch": cost.median_cpu_ms,
                                        f"{at}/main_cpu_ms_per_image": main_ms_per_image,
                                        f"{at}/start_stop_cpu_ms": cost.start_stop_cpu_ms,
                                        f"{at}/pixel_bytes_per_image": cost.pixel_bytes,
                                        f"{at}/bytes_per_image": cost.all_bytes,
                                        f"{at}/cores_per_card": cores})
                        rows.append((name, kind, pipeline, str(w), f"{cost.images / cost.seconds:.0f}",
                                     f"{worker_ms:.2f}", "-" if native else f"{ms['swinexp']:.2f}",
                                     f"{ms['timm']:.2f}" if with_timm and not native else "-",
                                     f"{cost.steady_cpu_ms:.2f}", f"{cost.median_cpu_ms:.2f}",
                                     f"{main_ms_per_image:.3f}",
                                     f"{cost.start_stop_cpu_ms:.0f}", f"{cost.pixel_bytes:.0f}",
                                     f"{cost.all_bytes:.0f}", f"{cores:.2f}"))
                notes.append(f"{name}, {kind}: device prologue {prologue:.1f} ms per batch of {batch} on this CPU "
                             "(on a card it runs on the device; the same for both pipelines).")
    train_cores = {f"{r[0]}, {r[2]}": float(r[-1]) for r in rows if r[1] == "train" and r[3] == str(workers)}
    projection = "; ".join(f"{name}: {CARDS} x {c:.2f} = {CARDS * c:.1f} cores" for name, c in train_cores.items())
    notes = [f"cores/card = {need_per_s:.0f} images/s (batch {batch} every {step_ms:g} ms) x (worker ms/image + main "
             f"CPU ms/image) / 1000. {CARDS}-card host, train: {projection}.",
             "Per image (one core, decode included, the median of 3 passes after an untimed one, the works taking "
             "turns image by image on the same files, as in `data`): worker = decode + transform to uint8 (+ the "
             "erase draws); swinexp = decode + the whole per-image transform (float, normalized, erased: timm's "
             "pixels); timm = ImageDataset + create_transform.",
             *([f"swinexp / timm time per image (< 1: swinexp is faster): {', '.join(ratios)}."] if ratios else []),
             "native (data.pipeline=native): worker ms/image is its MindSpore vision ops run eagerly on one core; "
             "in the Loader they run as C++ map threads of this process, so main CPU ms/batch holds all the "
             "decoding and cores/card is that figure alone.",
             "main CPU ms/batch: this process from the first batch of an epoch to its last (iterator, Mixup draws "
             "and targets), per batch, the mean and the median batch (a few spikes of a shared host decide the "
             "mean); with 1 worker the worker runs as a thread here and its decoding is counted too. start+stop CPU "
             "ms/epoch: the main process's CPU up to the first batch and after the last (each epoch starts its "
             "worker processes anew and stops them).",
             *notes]
    title = (f"Loader feed, output {img_size} px, batch {batch}, workers 1..{workers}; {describe()}")
    return BenchResult("loader", Table(title, COLUMNS, tuple(rows), tuple(notes)), metrics)
