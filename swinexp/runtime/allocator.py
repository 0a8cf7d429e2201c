"""A malloc replacement preloaded into the process (jemalloc, tcmalloc, mimalloc): refused on MindSpore's CPU backend.

`LD_PRELOAD=libjemalloc.so.2` (or tcmalloc) is common advice for faster CPU training, and MindSpore's graph compile
is malloc-bound: on the reference host it cut swin_tiny's cold first train step from 9.8-10.1 s to 6.4-6.7 s. But
MindSpore 2.10's CPU train step then computes wrong results: in a swin_micro run its loss fell to 0.0-0.45 from
the 13th optimizer step on, while the same weights and batch gave 2.44 through the model outside the step, and the
weights left the run's own course (swinexp's resume tests: 189 of 193 tensors off). It happened with jemalloc
(plain, junk- or zero-filled) and tcmalloc, with MindSpore's kernels as with swinexp's, and never with glibc's
malloc (also not with glibc's MALLOC_PERTURB_ filling); its cause inside MindSpore was not found (BENCHMARKS.md).
So a CPU run stops before any work and says how to go on; an accelerator run, whose tensors live in the card's
memory pool rather than malloc's, warns (not verified on a card). `SWINEXP_ALLOW_PRELOADED_MALLOC=1` runs anyway.
"""
from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path

from swinexp.registry import ConfigError

__all__ = ["ALLOW_ENV", "REPLACEMENTS", "check", "current", "in_use"]

log = logging.getLogger("swinexp")

ALLOW_ENV = "SWINEXP_ALLOW_PRELOADED_MALLOC"
REPLACEMENTS = ("libjemalloc", "libtcmalloc", "libmimalloc")  # file-name prefixes of the libraries mapped
_WARNED: set[tuple[Path, str]] = set()


def in_use(maps: Path = Path("/proc/self/maps")) -> Path | None:
    """The malloc replacement mapped into this process, or None: the C library's own malloc."""
    try:
        text = maps.read_text()
    except OSError:  # not Linux: nothing to read, nothing preloaded the way this module knows
        return None
    files = (Path(line[line.index("/"):]) for line in text.splitlines() if "/" in line)  # a mapping's file
    return next((file for file in files if file.name.startswith(REPLACEMENTS)), None)


def current(maps: Path = Path("/proc/self/maps")) -> str:
    """The malloc this process runs on, for run tags and dry runs: a library's file name, or 'system'."""
    library = in_use(maps)
    return library.name if library else "system"


def check(device_target: str, maps: Path = Path("/proc/self/maps"), environ: Mapping[str, str] | None = None) -> None:
    """Refuse a preloaded malloc replacement on the CPU backend, warn on an accelerator (module docstring).

    Raises:
        ConfigError: on CPU, with one in use and SWINEXP_ALLOW_PRELOADED_MALLOC unset.
    """
    library = in_use(maps)
    if library is None:
        return
    allowed = (os.environ if environ is None else environ).get(ALLOW_ENV) == "1"
    problem = (f"{library} is preloaded in place of the C library's malloc (LD_PRELOAD), and under it MindSpore "
               "2.10's CPU train step computed wrong losses and weights in swinexp's tests (swinexp/runtime/"
               "allocator.py)")
    if device_target == "CPU" and not allowed:
        raise ConfigError(f"{problem}. Run without it (unset LD_PRELOAD, or remove the library from it), or set "
                          f"{ALLOW_ENV}=1 to run anyway")
    if (library, device_target) not in _WARNED:  # checked before launch and again by apply(), per job of a sweep
        _WARNED.add((library, device_target))
        log.warning("%s%s", problem, "; running anyway" if allowed else
                    f"; on {device_target} it was not verified either way: compare with a run without it")
