"""Robust image decoding: any PIL-readable file, identified by content, to 8-bit RGB."""
from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TypeVar

import numpy as np
from PIL import Image

log = logging.getLogger(__name__)
T = TypeVar("T")

# what PIL raises for unreadable, truncated or hostile files (UnidentifiedImageError is an OSError)
DECODE_ERRORS = (OSError, ValueError, SyntaxError, EOFError, Image.DecompressionBombError)
MAX_CONSECUTIVE_SKIPS = 50  # more unreadable files in a row means a broken dataset, not a stray bad file


def load_rgb(path: str) -> Image.Image:
    """Decode `path` fully and return it as RGB.

    The format comes from the file's bytes, not its name (a PNG saved as .JPEG reads fine). Grayscale, CMYK,
    palette and RGBA images become RGB as with timm's `convert('RGB')`; 16-bit grayscale is scaled to 8 bits
    rather than clipped.

    Raises:
        One of DECODE_ERRORS when the file is not a readable image or is truncated.
    """
    with Image.open(path) as img:
        img.load()  # decode now: a truncated file fails here, not later in a transform
        if img.mode in ("I", "I;16", "I;16B", "I;16L"):  # 16-bit PNG/TIFF: keep the 8 high bits
            values = np.asarray(img, np.uint32)
            return Image.fromarray((values >> 8 if values.max() > 255 else values).astype(np.uint8)).convert("RGB")
        if img.mode == "P" and "transparency" in img.info:
            img = img.convert("RGBA")  # PIL warns when palette transparency goes straight to RGB
        return img.convert("RGB")


def read_in_slot(samples: Sequence[tuple[str, int]], i: int, read: Callable[[str], T]) -> tuple[T, int, bool]:
    """`read` of sample i's file, or, when it raises one of DECODE_ERRORS, of the next readable sample's: (what
    `read` returned, that sample's label, whether a file was skipped). Each skipped file is logged by name.

    Raises:
        RuntimeError: MAX_CONSECUTIVE_SKIPS files in a row are unreadable (a broken dataset).
    """
    for attempt in range(min(MAX_CONSECUTIVE_SKIPS, len(samples))):
        path, label = samples[(i + attempt) % len(samples)]
        try:
            return read(path), label, attempt > 0
        except DECODE_ERRORS as err:
            log.warning("skipping unreadable image '%s' (%s: %s); using the next sample", path, type(err).__name__,
                        err)
    raise RuntimeError(f"{MAX_CONSECUTIVE_SKIPS} consecutive unreadable images starting at '{samples[i][0]}'; "
                       "check the files under data.root")
