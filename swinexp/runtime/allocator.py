"""A malloc replacement preloaded into the process (jemalloc, tcmalloc, mimalloc): jemalloc is verified on CPU.

MindSpore's graph compile is malloc-bound: with `LD_PRELOAD=libjemalloc.so.2` swin_tiny's cold first train step
took 6.4-6.7 s instead of 9.8-10.1 s on the reference host (BENCHMARKS.md). Under jemalloc and tcmalloc MindSpore
2.10's CPU LogSoftmax kernel returned an earlier call's result from about its 13th call on (timing-dependent; never
seen with glibc's malloc), which made swinexp's train step wrong; the loss now computes its log-softmax from
primitives (engine/step.py `log_softmax`), and a run on jemalloc equals the run on glibc bit for bit
(tests/test_allocator.py). So on the CPU backend jemalloc is accepted and the others, not verified, stop the run
before any work with the way on; an accelerator run, whose tensors live in the card's memory pool rather than
malloc's, warns for any (not verified on a card). `SWINEXP_ALLOW_PRELOADED_MALLOC=1` runs anyway.
"""
from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path

from swinexp.registry import ConfigError

__all__ = ["ALLOW_ENV", "REPLACEMENTS", "VERIFIED_ON_CPU", "check", "current", "in_use"]

log = logging.getLogger("swinexp")

ALLOW_ENV = "SWINEXP_ALLOW_PRELOADED_MALLOC"
REPLACEMENTS = ("libjemalloc", "libtcmalloc", "libmimalloc")  # file-name prefixes of the libraries mapped
VERIFIED_ON_CPU = ("libjemalloc",)  # a run on it equals the run on glibc's malloc (tests/test_allocator.py)
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
    """Accept jemalloc on the CPU backend, refuse another replacement there, warn on an accelerator (module docstring).

    Raises:
        ConfigError: on CPU, with an unverified one in use and SWINEXP_ALLOW_PRELOADED_MALLOC unset.
    """
    library = in_use(maps)
    if library is None or (device_target == "CPU" and library.name.startswith(VERIFIED_ON_CPU)):
        return
    allowed = (os.environ if environ is None else environ).get(ALLOW_ENV) == "1"
    verified = "glibc's malloc and jemalloc" if device_target == "CPU" else "glibc's malloc"
    problem = (f"{library} is preloaded in place of the C library's malloc (LD_PRELOAD), and swinexp's train step on "
               f"{device_target} was verified only with {verified} (under tcmalloc and jemalloc MindSpore 2.10's CPU "
               "LogSoftmax returned stale results; swinexp/runtime/allocator.py)")
    if device_target == "CPU" and not allowed:
        raise ConfigError(f"{problem}. Preload jemalloc instead (apt-get install libjemalloc2; LD_PRELOAD="
                          "libjemalloc.so.2) or none (unset LD_PRELOAD), or set "
                          f"{ALLOW_ENV}=1 to run anyway")
    if (library, device_target) not in _WARNED:  # checked before launch and again by apply(), per job of a sweep
        _WARNED.add((library, device_target))
        log.warning("%s%s", problem, "; running anyway" if allowed else "; compare with a run without it")
