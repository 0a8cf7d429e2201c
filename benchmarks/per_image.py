"""One image at a time: swinexp's per-image work beside timm's on the same files (issue 39, point 4).

`data` and `loader` both take their per-image figures from `alternate`, so the two commands measure the same way:
decode included, one untimed pass over the files, then timed passes in which the candidates take turns image by
image (on image i: A then B, on image i+1: B then A), so a busy phase of a shared machine hits them alike. A
candidate's figure is the median of its per-pass ms per image.
"""
from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Callable, Mapping

import numpy as np
from PIL import Image

from swinexp.data.decode import load_rgb
from swinexp.data.folder import Sample

__all__ = ["PASSES", "ImageWork", "alternate", "median_ms", "swinexp_work", "time_ratio"]

ImageWork = Callable[[int], object]  # position of an image in the file list -> that image decoded and transformed
PASSES = 3


def swinexp_work(samples: tuple[Sample, ...],
                 transform: Callable[[Image.Image, np.random.Generator], object]) -> ImageWork:
    """swinexp's decode (`load_rgb`) and `transform(img, rng)` of sample i, a fresh generator per call as in a
    loader worker."""
    calls = itertools.count()

    def work(i: int) -> object:
        return transform(load_rgb(samples[i][0]), np.random.default_rng([0, next(calls), i]))

    return work


def alternate(works: Mapping[str, ImageWork], count: int, passes: int = PASSES) -> dict[str, tuple[float, ...]]:
    """ms per image of each work over images 0..count-1, one figure per timed pass, after one untimed pass.

    Args:
        works: Name -> the work on one image; all of them over the same files in the same order.
        count: Images per pass.
        passes: Timed passes.
    """
    names = list(works)
    for i in range(count):
        for name in names:
            works[name](i)
    per_pass: dict[str, list[float]] = {name: [] for name in names}
    for _ in range(passes):
        spent = dict.fromkeys(names, 0.0)
        for i in range(count):
            shift = i % len(names)  # who goes first changes from image to image
            for name in names[shift:] + names[:shift]:
                start = time.perf_counter()
                works[name](i)
                spent[name] += time.perf_counter() - start
        for name in names:
            per_pass[name].append(spent[name] * 1e3 / count)
    return {name: tuple(values) for name, values in per_pass.items()}


def median_ms(per_pass: tuple[float, ...]) -> float:
    """The figure of one work: the median of its per-pass ms per image."""
    return statistics.median(per_pass)


def time_ratio(timings: Mapping[str, tuple[float, ...]], ours: str = "swinexp", reference: str = "timm") -> float:
    """`ours`' time per image over `reference`'s (< 1: ours is faster), from medians measured side by side."""
    return median_ms(timings[ours]) / median_ms(timings[reference])
