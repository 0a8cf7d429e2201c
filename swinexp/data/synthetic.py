"""The embedded default dataset: procedurally drawn shapes written as a real JPEG ImageFolder.

Every image is drawn from its own seeded generator, so the same arguments always give byte-identical files.
The folder is written under a temporary name and renamed when complete, so an interrupted run never leaves half
a dataset behind.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Callable

import numpy as np
from PIL import Image, ImageDraw

Drawer = Callable[[ImageDraw.ImageDraw, np.random.Generator, int, tuple[int, int, int]], None]


def _box(rng: np.random.Generator, size: int) -> tuple[float, float, float]:
    """Random centre and half-extent for a shape covering 30-70% of the image side."""
    half = size * rng.uniform(0.15, 0.35)
    cx, cy = rng.uniform(half, size - half, size=2)
    return cx, cy, half


def _circle(d: ImageDraw.ImageDraw, rng: np.random.Generator, size: int, fg: tuple[int, int, int]) -> None:
    cx, cy, r = _box(rng, size)
    d.ellipse([cx - r, cy - r, cx + r, cy + r], fill=fg)


def _square(d: ImageDraw.ImageDraw, rng: np.random.Generator, size: int, fg: tuple[int, int, int]) -> None:
    cx, cy, r = _box(rng, size)
    d.rectangle([cx - r, cy - r, cx + r, cy + r], fill=fg)


def _triangle(d: ImageDraw.ImageDraw, rng: np.random.Generator, size: int, fg: tuple[int, int, int]) -> None:
    cx, cy, r = _box(rng, size)
    d.polygon([(cx, cy - r), (cx - r, cy + r), (cx + r, cy + r)], fill=fg)


def _cross(d: ImageDraw.ImageDraw, rng: np.random.Generator, size: int, fg: tuple[int, int, int]) -> None:
    cx, cy, r = _box(rng, size)
    t = max(2.0, r / 3)
    d.rectangle([cx - r, cy - t, cx + r, cy + t], fill=fg)
    d.rectangle([cx - t, cy - r, cx + t, cy + r], fill=fg)


def _ring(d: ImageDraw.ImageDraw, rng: np.random.Generator, size: int, fg: tuple[int, int, int]) -> None:
    cx, cy, r = _box(rng, size)
    d.ellipse([cx - r, cy - r, cx + r, cy + r], outline=fg, width=max(2, int(r / 4)))


def _stripes(vertical: bool) -> Drawer:
    def draw(d: ImageDraw.ImageDraw, rng: np.random.Generator, size: int, fg: tuple[int, int, int]) -> None:
        period = int(rng.integers(6, 14))
        offset = int(rng.integers(0, period))
        for p in range(offset - period, size, period):
            box = [p, 0, p + period // 2, size] if vertical else [0, p, size, p + period // 2]
            d.rectangle(box, fill=fg)

    return draw


def _checker(d: ImageDraw.ImageDraw, rng: np.random.Generator, size: int, fg: tuple[int, int, int]) -> None:
    cell = int(rng.integers(6, 14))
    ox, oy = rng.integers(0, cell, size=2)
    for y in range(-cell, size, cell):
        for x in range(-cell, size, cell):
            if ((x // cell) + (y // cell)) % 2 == 0:
                d.rectangle([x + ox, y + oy, x + ox + cell - 1, y + oy + cell - 1], fill=fg)


def _dots(d: ImageDraw.ImageDraw, rng: np.random.Generator, size: int, fg: tuple[int, int, int]) -> None:
    for _ in range(int(rng.integers(5, 10))):
        r = size * rng.uniform(0.04, 0.08)
        cx, cy = rng.uniform(r, size - r, size=2)
        d.ellipse([cx - r, cy - r, cx + r, cy + r], fill=fg)


def _diagonal(d: ImageDraw.ImageDraw, rng: np.random.Generator, size: int, fg: tuple[int, int, int]) -> None:
    period = int(rng.integers(8, 16))
    for p in range(-size, 2 * size, period):
        d.line([(p, 0), (p + size, size)], fill=fg, width=max(2, period // 3))


SHAPES: dict[str, Drawer] = {
    "circle": _circle,
    "square": _square,
    "triangle": _triangle,
    "cross": _cross,
    "ring": _ring,
    "hstripes": _stripes(vertical=False),
    "vstripes": _stripes(vertical=True),
    "checker": _checker,
    "dots": _dots,
    "diagonal": _diagonal,
}


def class_names(num_classes: int) -> list[str]:
    """Folder names `00_circle`, `01_square`, ... so that sorted order is label order."""
    return [f"{i:02d}_{name}" for i, name in enumerate(list(SHAPES)[:num_classes])]


def draw_image(rng: np.random.Generator, shape: str, size: int) -> Image.Image:
    """One RGB image: random background, a contrasting foreground shape, then pixel noise."""
    bg = rng.integers(0, 256, size=3)
    fg = (bg + rng.integers(80, 176, size=3)) % 256  # at least 80 levels away per channel, so the shape shows
    img = Image.new("RGB", (size, size), tuple(int(c) for c in bg))
    SHAPES[shape](ImageDraw.Draw(img), rng, size, tuple(int(c) for c in fg))
    pixels = np.asarray(img, dtype=np.float32) + rng.normal(0.0, 12.0, size=(size, size, 3))
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))


def generate(root: Path, num_train: int, num_val: int, num_classes: int, img_size: int, seed: int) -> Path:
    """Write `root/{train,val}/<class>/NNNNN.jpg` unless it is already complete; return `root`."""
    root = Path(root)
    if root.is_dir():
        return root
    tmp = root.with_name(f"{root.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    names = class_names(num_classes)
    for split_id, (split, count) in enumerate((("train", num_train), ("val", num_val))):
        for name in names:
            (tmp / split / name).mkdir(parents=True)
        for index in range(count):
            label = index % num_classes  # balanced classes
            rng = np.random.default_rng([seed, split_id, index])
            img = draw_image(rng, names[label].split("_", 1)[1], img_size)
            img.save(tmp / split / names[label] / f"{index:05d}.jpg", quality=92)
    try:
        tmp.rename(root)
    except OSError:  # another process finished first; its copy is identical
        shutil.rmtree(tmp, ignore_errors=True)
    return root
