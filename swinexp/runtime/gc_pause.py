"""Python's cyclic garbage collector around the heavy imports of a job (MindSpore and the ~2,000 modules it brings).

Each generation-2 collection walks every object alive, and those imports create ~300,000 objects and trigger
collections all along: ~0.25 s of collections during the imports and ~0.1 s more during the first compile of the
train step on the 2-core reference host (BENCHMARKS.md). Importing them with the collector paused, then freezing
what was imported (module objects live as long as the process anyway), removes both; the objects the imports left
as garbage (~100,000 small ones, no measurable memory) stay frozen with the rest. Freezing also keeps forked data
workers from copying the parent's pages when they collect (Python's `gc.freeze` documentation).
"""
from __future__ import annotations

import gc
import sys
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["long_lived_imports"]


@contextmanager
def long_lived_imports(module: str) -> Iterator[None]:
    """Inside: no cyclic collection. On leaving (also by an exception): everything alive is frozen (moved out of
    the collector's reach for good) and the collector runs again if it was enabled before.

    Args:
        module: the module the block imports. If it is imported already (a later job of a sweep that runs its jobs
            in one process), the block runs as it is: there is nothing to gain, and freezing then would keep the
            earlier job's garbage for good.
    """
    if module in sys.modules:
        yield
        return
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if was_enabled:
            gc.enable()
