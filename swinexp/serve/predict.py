"""Classify a folder of images with a trained run:
`python -m swinexp.serve.predict RUN_DIR_OR_CKPT IMAGE_DIR [--topk 5] [--out preds.csv]`.

Every image under IMAGE_DIR (recursively; any format PIL reads) gets the run's own eval transform (resize, center
crop to uint8 pixels, then normalize on the device as the loader does, from its config.yaml), then the model; the
CSV has one row per image: `image` (relative to IMAGE_DIR), then `class_1, prob_1, ..., class_k, prob_k`, best
first, with the run's class names (classes.txt). Unreadable files are reported and skipped. Trailing `key=value`
arguments override the run's config.
"""
from __future__ import annotations

import argparse
import csv
import logging
from collections.abc import Iterator, Sequence
from pathlib import Path

import mindspore as ms
import numpy as np
from mindspore import nn, ops

from swinexp.data.decode import DECODE_ERRORS, load_rgb
from swinexp.data.folder import IMAGE_SUFFIXES
from swinexp.data.prologue import Prologue
from swinexp.registry import ConfigError
from swinexp.serve.saved_run import CHECKPOINTS, SavedRun, eval_transform, load_model, open_run, setup

log = logging.getLogger("swinexp")


def image_files(folder: Path) -> list[Path]:
    files = sorted(p for p in Path(folder).rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
    if not files:
        raise ConfigError(f"no images under '{folder}' (looked for {', '.join(sorted(IMAGE_SUFFIXES))})")
    return files


def _batches(files: list[Path], transform, batch_size: int) -> Iterator[tuple[list[Path], np.ndarray]]:
    names, images = [], []
    for path in files:
        try:
            images.append(transform.pixels(load_rgb(str(path))))  # uint8 (H, W, 3): normalized on the device
        except DECODE_ERRORS as err:
            log.warning("skipping unreadable image '%s' (%s: %s)", path, type(err).__name__, err)
            continue
        names.append(path)
        if len(images) == batch_size:
            yield names, np.stack(images)
            names, images = [], []
    if images:
        yield names, np.stack(images)


def predict(run: SavedRun, model: nn.Cell, folder: Path, topk: int = 5,
            batch_size: int = 32) -> list[tuple[str, list[tuple[str, float]]]]:
    """(image path relative to `folder`, [(class name, probability)] best first) for every readable image."""
    transform = eval_transform(run)
    prologue = Prologue(transform.mean, transform.std)  # the loader's eval normalization, bit for bit
    k = min(topk, int(run.plan.get("model.num_classes")))
    rows = []
    for names, images in _batches(image_files(folder), transform, batch_size):
        probs = ops.softmax(ops.cast(model(prologue.eval(ms.Tensor(images))), ms.float32), axis=-1).asnumpy()
        best = np.argsort(-probs, axis=-1, kind="stable")[:, :k]  # (B, k)
        for name, labels, p in zip(names, best, probs):
            rows.append((name.relative_to(folder).as_posix(), [(run.class_name(int(c)), float(p[c])) for c in labels]))
    return rows


def write_csv(rows: list[tuple[str, list[tuple[str, float]]]], out: Path) -> None:
    k = len(rows[0][1]) if rows else 0
    with open(out, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["image", *[f"{col}_{r}" for r in range(1, k + 1) for col in ("class", "prob")]])
        for image, top in rows:
            writer.writerow([image, *[v for name, prob in top for v in (name, f"{prob:.6f}")]])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m swinexp.serve.predict", description=__doc__.split("\n\n")[0])
    parser.add_argument("source", type=Path, help="a run dir (outputs/<date>/<time>) or a .ckpt file")
    parser.add_argument("images", type=Path, help="folder of images (searched recursively)")
    parser.add_argument("overrides", nargs="*", help="key=value changes to the run's config")
    parser.add_argument("--topk", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path("preds.csv"))
    parser.add_argument("--checkpoint", default="best", choices=CHECKPOINTS, help="for a run dir: which checkpoint")
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_intermixed_args(argv)  # key=value overrides may follow the options
    try:
        if args.topk < 1:
            raise ConfigError(f"--topk {args.topk} must be >= 1")
        run = open_run(args.source, args.overrides, args.checkpoint)
        run = setup(run)
        rows = predict(run, load_model(run), args.images, args.topk, args.batch_size)
    except ConfigError as err:
        parser.exit(2, f"error: {err}\n")
    write_csv(rows, args.out)
    for image, top in rows[:5]:
        print(f"{image}: " + ", ".join(f"{name} {prob:.3f}" for name, prob in top))
    print(f"{len(rows)} images -> {args.out} (top-{len(rows[0][1]) if rows else args.topk}, {run.checkpoint})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
