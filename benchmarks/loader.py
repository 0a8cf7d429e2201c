"""`loader`: can the input pipeline feed a card? Worker and main-process cost, bytes moved, cores needed (issue 39).

On a real JPEG folder (CIFAR-10 from ../shared/datasets/cifar10, `--images` per split; skipped when the tars are
absent) and on the generated default dataset (data=synthetic's drawn shapes), for the swin train transform and the
eval transform, each as data.pipeline=exact (timm's pixels) and =native (MindSpore's vision ops), to `--img-size` px:

- worker ms per image: what one loader worker does per image (decode, transform to uint8, erase draws), in a plain
  loop on one core, beside timm's ImageDataset + create_transform on the same files (the `reference` extra);
- for workers = 1..`--workers`: images/s through the Loader (workers -> MindSpore's batch op -> the main process),
  main-process CPU ms per batch (getrusage of this process: MindSpore's batch and iterator threads, the Mixup
  draws and targets; with 1 worker the worker is a thread of this process and is counted too), and the bytes per
  image that cross from the workers (uint8 pixels, and all columns: label, index, flags, erase draws);
- cores per card: what sustaining `--batch` images every `--step-ms` ms takes, from the single-core worker cost
  and the main-process cost per image (the host's cores, not this machine's, are the limit being projected).

The device prologue (uint8 -> normalized, erased, mixed float32) runs on the card in training; here, on the CPU,
its time per batch is given in a note, outside the host figures.
"""
from __future__ import annotations

import os
import resource
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from benchmarks.data import CIFAR_TRAIN
from benchmarks.host import describe
from benchmarks.options import Options
from benchmarks.table import BenchResult, Table
from benchmarks.timing import progress
from benchmarks.timm_peer import reference_installed
from swinexp.data.augment import swin
from swinexp.data.cifar10 import extract
from swinexp.data.datasets import DataSpec, cifar10_folder, synthetic
from swinexp.data.decode import load_rgb
from swinexp.data.native import native_of
from swinexp.data.pipeline import Loader
from swinexp.data.transforms import EvalTransform

__all__ = ["COLUMNS", "run"]

CIFAR_DIR = CIFAR_TRAIN.parent
CARDS = 8
COLUMNS = ("dataset", "pipeline", "per-image ops", "workers", "images/s", "worker ms/image", "timm ms/image",
           "main CPU ms/batch", "pixel bytes/image", "bytes/image", "cores/card")


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _per_image_ms(samples: tuple, work: Callable[[object, np.random.Generator], object]) -> float:
    """The faster of 2 passes of one worker's ms per image, after one untimed pass."""
    def one_pass(e: int) -> float:
        start = time.perf_counter()
        for i, (path, _) in enumerate(samples):
            work(load_rgb(path), np.random.default_rng([0, e, i]))
        return (time.perf_counter() - start) * 1e3 / len(samples)

    one_pass(0)
    return min(one_pass(e) for e in (1, 2))


def _native_per_image_ms(samples: tuple, operations: tuple) -> float:
    """The faster of 2 passes of the native operations (eager, one core) per image, after one untimed pass."""
    def one_pass() -> float:
        start = time.perf_counter()
        for path, _ in samples:
            x = np.fromfile(path, np.uint8)
            for op in operations:
                x = op(x)
        return (time.perf_counter() - start) * 1e3 / len(samples)

    one_pass()
    return min(one_pass() for _ in range(2))


def _timm_ms(folder: Path, kind: str, img_size: int, crop_pct: float, count: int) -> float:
    from benchmarks import timm_data

    epoch = timm_data.in_process_epoch(folder, timm_data.timm_transform(kind, img_size, crop_pct))
    epoch()
    times = []
    for _ in range(2):
        start = time.perf_counter()
        epoch()
        times.append((time.perf_counter() - start) * 1e3 / count)
    return min(times)


def _loader_epoch(loader: Loader, epoch: int, train: bool) -> tuple[float, float, int, int, tuple[float, float]]:
    """One epoch of raw batches with the main process's host share: (seconds, main CPU s, images, batches,
    (pixel bytes, all bytes) per image of the first batch)."""
    cpu, start = _cpu_s(), time.perf_counter()
    images = batches = 0
    sizes = (0, 0)
    for row in loader.raw_epoch(epoch):
        if train:
            loader.host_part(row)
        if not batches:
            count = int(row[0].shape[0])
            sizes = (row[0].nbytes / count, sum(t.nbytes for t in row) / count)
        images += int(row[0].shape[0])
        batches += 1
    return time.perf_counter() - start, _cpu_s() - cpu, images, batches, sizes


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


def run(opts: Options) -> BenchResult:
    """The `loader` sub-benchmark."""
    img_size, batch, step_ms = opts.img_size or 224, opts.batch or 64, opts.step_ms
    workers = min(opts.workers, len(os.sched_getaffinity(0)))
    need_per_s = batch * 1e3 / step_ms  # images/s one card consumes
    with_timm = reference_installed()
    rows, metrics, notes = [], {}, []
    with tempfile.TemporaryDirectory() as tmp:
        sets, notes = _datasets(Path(tmp), opts, img_size, batch)
        for name, (spec, root) in sets.items():
            augment = swin(img_size, num_classes=spec.num_classes, label_smoothing=0.1)
            evaluation = EvalTransform(img_size, spec.crop_pct, "bicubic")

            def train_work(img, rng, t=augment.transform):
                pixels = t.pixels(img, rng)
                return t.erasing.draw((3, *pixels.shape[:2]), rng)

            kinds = {"train": (spec.train, train_work, "train"),
                     "eval": (spec.val, lambda img, rng, t=evaluation: t.pixels(img), "val")}
            for kind, (samples, work, split) in kinds.items():
                progress(f"loader: {name}, {kind}")
                folder = root / split if (root / split).is_dir() else root / ("test" if split == "val" else split)
                timm_ms = _timm_ms(folder, kind, img_size, spec.crop_pct, len(samples)) if with_timm else float("nan")
                exact = augment.transform if kind == "train" else evaluation
                for pipeline, transform in (("exact", exact), ("native", native_of(exact))):
                    native = pipeline == "native"
                    worker_ms = (_native_per_image_ms(samples, transform.operations) if native
                                 else _per_image_ms(samples, work))
                    prologue = None
                    for w in range(1, workers + 1):
                        loader = (Loader(spec.train, transform, batch, w, 0, augment.targets) if kind == "train"
                                  else Loader(spec.val, transform, batch, w, 0))
                        _loader_epoch(loader, 0, kind == "train")  # worker start-up
                        seconds, cpu_s, images, batches, (pixel_bytes, all_bytes) = _loader_epoch(
                            loader, 1, kind == "train")
                        if prologue is None and not native:
                            prologue = _prologue_ms(loader, kind == "train")
                        main_ms_per_batch = cpu_s * 1e3 / batches
                        main_ms_per_image = main_ms_per_batch / (images / batches)
                        # native: the C++ map threads decode inside this process, so its CPU time is all of it
                        cores = need_per_s * (main_ms_per_image if native else worker_ms + main_ms_per_image) / 1e3
                        key = f"loader/{'cifar10' if name.startswith('CIFAR') else 'synthetic'}/{kind}/{pipeline}/{w}"
                        metrics.update({f"{key}/images_per_s": images / seconds, f"{key}/worker_ms": worker_ms,
                                        f"{key}/main_cpu_ms_per_batch": main_ms_per_batch,
                                        f"{key}/pixel_bytes_per_image": pixel_bytes,
                                        f"{key}/bytes_per_image": all_bytes, f"{key}/cores_per_card": cores})
                        rows.append((name, kind, pipeline, str(w), f"{images / seconds:.0f}", f"{worker_ms:.2f}",
                                     "-" if np.isnan(timm_ms) else f"{timm_ms:.2f}",
                                     f"{main_ms_per_batch:.2f}", f"{pixel_bytes:.0f}", f"{all_bytes:.0f}",
                                     f"{cores:.2f}"))
                    if prologue is not None:
                        notes.append(f"{name}, {kind}: device prologue {prologue:.1f} ms per batch of {batch} on "
                                     "this CPU (on a card it runs on the device; the same for both pipelines).")
    train_cores = {f"{r[0]}, {r[2]}": float(r[10]) for r in rows if r[1] == "train" and r[3] == str(workers)}
    projection = "; ".join(f"{name}: {CARDS} x {c:.2f} = {CARDS * c:.1f} cores" for name, c in train_cores.items())
    notes = [f"cores/card = {need_per_s:.0f} images/s (batch {batch} every {step_ms:g} ms) x (worker ms/image + main "
             f"CPU ms/image) / 1000. {CARDS}-card host, train: {projection}.",
             "worker ms/image: one core, decode + transform to uint8 (+ the erase draws), the faster of 2 passes; "
             "timm: ImageDataset + create_transform (float tensors, normalized, erased) on the same files.",
             "native (data.pipeline=native): MindSpore's vision ops; worker ms/image runs them eagerly on one core, "
             "and in the Loader they run as C++ map threads of this process, so main CPU ms/batch holds all the "
             "decoding and cores/card is that figure alone.",
             "main CPU ms/batch: this process over one epoch (batching, iterator, Mixup draws and targets); with 1 "
             "worker the worker runs as a thread here and its decoding is counted too; each epoch starts its worker "
             "processes anew, and that start-up is counted (short epochs overstate it).",
             *notes]
    title = (f"Loader feed, output {img_size} px, batch {batch}, workers 1..{workers}; {describe()}")
    return BenchResult("loader", Table(title, COLUMNS, tuple(rows), tuple(notes)), metrics)
