"""Images/s of the data pipeline: the full `swin` train recipe and the eval transform at 224 px on JPEG files.

    PYTHONPATH=. python benchmarks/data_pipeline.py [--images 512] [--src-size 224] [--batch-size 64]

Input: the first `--images` CIFAR-10 train JPEGs upscaled to `--src-size` and re-encoded as JPEG (or drawn
synthetic shapes when /work/shared/datasets/cifar10/train.tar is absent), in a temporary ImageFolder. Each row
times one epoch after a warm-up epoch (so worker start-up is excluded) and prints a markdown table.
"""
from __future__ import annotations

import argparse
import io
import os
import platform
import tarfile
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

from swinexp.data.augment import swin
from swinexp.data.datasets import imagefolder
from swinexp.data.decode import load_rgb
from swinexp.data.pipeline import Loader
from swinexp.data.synthetic import SHAPES, draw_image
from swinexp.data.transforms import EvalTransform

CIFAR_TRAIN = Path(__file__).resolve().parents[1].parent / "shared" / "datasets" / "cifar10" / "train.tar"


def source_images(count: int, size: int) -> list[tuple[str, Image.Image]]:
    """(class name, RGB image of side `size`) pairs from CIFAR-10, or synthetic shapes without the tar."""
    if CIFAR_TRAIN.is_file():
        out = []
        with tarfile.open(CIFAR_TRAIN) as tar:
            for member in tar:
                if member.isfile() and member.name.endswith(".jpg"):
                    img = Image.open(io.BytesIO(tar.extractfile(member).read())).convert("RGB")
                    out.append((Path(member.name).parts[1], img.resize((size, size), Image.Resampling.BICUBIC)))
                    if len(out) == count:
                        return out
    names = list(SHAPES)
    return [(names[i % 10], draw_image(np.random.default_rng(i), names[i % 10], size)) for i in range(count)]


def write_folder(root: Path, images: list[tuple[str, Image.Image]]) -> None:
    for split in ("train", "val"):
        for i, (name, img) in enumerate(images):
            (root / split / name).mkdir(parents=True, exist_ok=True)
            img.save(root / split / name / f"{i:05d}.jpg", quality=90)


def time_epoch(loader: Loader, images: int) -> float:
    """Images per second over one full epoch, after one warm-up epoch."""
    for _ in loader.epoch(0):
        pass
    start = time.perf_counter()
    seen = sum(int(x.shape[0]) for x, _ in loader.epoch(1))
    assert seen >= images - loader.batch_size, seen
    return seen / (time.perf_counter() - start)


def time_in_process(samples: tuple, transform: object, repeat: int = 1) -> float:
    """Decode + transform in this process, no MindSpore: the per-core ceiling."""
    start = time.perf_counter()
    for r in range(repeat):
        for i, (path, _) in enumerate(samples):
            transform(load_rgb(path), np.random.default_rng([0, r, i]))
    return repeat * len(samples) / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=512)
    parser.add_argument("--src-size", type=int, default=224)
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        pairs = source_images(args.images, args.src_size)
        write_folder(Path(tmp), pairs)
        spec = imagefolder(tmp, num_classes=len({n for n, _ in pairs}), img_size=224, batch_size=args.batch_size,
                           num_workers=1, crop_pct=0.875)
        augment = swin(224, num_classes=spec.num_classes, label_smoothing=0.1)
        evaluation = EvalTransform(224, 0.875, "bicubic")
        rows = [("swin train, in-process loop (no MindSpore)", "-", "-",
                 time_in_process(spec.train, augment.transform)),
                ("eval, in-process loop (no MindSpore)", "-", "-", time_in_process(spec.val, evaluation))]
        for workers in (1, 2):
            for processes in ((False,) if workers == 1 else (True, False)):
                kind = "processes" if processes else "threads"
                train = Loader(spec.train, augment.transform, spec.batch_size, workers, 0, augment.targets, processes)
                rows.append((f"swin train (RandAugment, RandomErasing, Mixup/CutMix), batch {spec.batch_size}",
                             workers, kind, time_epoch(train, len(spec.train))))
                val = Loader(spec.val, evaluation, spec.batch_size, workers, 0, python_multiprocessing=processes)
                rows.append((f"eval (resize 256, center crop 224), batch {spec.batch_size}", workers, kind,
                             time_epoch(val, len(spec.val))))
    source = "CIFAR-10 JPEGs upscaled" if CIFAR_TRAIN.is_file() else "synthetic JPEGs"
    print(f"{args.images} {source} to {args.src_size} px; output 224 px; {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} visible cores\n")
    print("| pipeline | workers | worker kind | images/s |\n|---|---|---|---|")
    for name, workers, kind, rate in rows:
        print(f"| {name} | {workers} | {kind} | {rate:.0f} |")


if __name__ == "__main__":
    main()
