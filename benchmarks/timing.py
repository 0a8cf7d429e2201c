"""Round-robin timing: the first call of each candidate alone, then warm-up and timed rounds, one call each."""
from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from benchmarks.host import MemoryGuard, load_average

__all__ = ["Samples", "Timing", "round_robin"]


@dataclass(frozen=True)
class Samples:
    """Durations in seconds of the timed calls of one candidate."""

    seconds: tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    @property
    def min(self) -> float:
        return min(self.seconds)

    @property
    def max(self) -> float:
        return max(self.seconds)


@dataclass(frozen=True)
class Timing:
    """One candidate's measurement.

    Attributes:
        first_s: The first call (for a jitted train step: graph compilation plus one step).
        samples: The timed calls after warm-up.
        load: Mean 1-minute load average over the timed rounds (the whole machine; the same for all candidates).
    """

    first_s: float
    samples: Samples
    load: float


def progress(message: str) -> None:
    """Progress goes to stderr so stdout holds only the tables."""
    print(message, file=sys.stderr, flush=True)


def _timed(call: Callable[[], object]) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def round_robin(builders: Mapping[str, Callable[[], Callable[[], object]]], warmup: int, iters: int,
                guard: MemoryGuard | None = None, failed: dict[str, str] | None = None) -> dict[str, Timing]:
    """Build and first-call every candidate in turn, then run `warmup` untimed and `iters` timed rounds.

    A round calls each candidate once (A, B, C, A, B, C, ...), so a slow phase of a shared machine hits all of them
    alike. Each call must return only once its work is finished (e.g. after reading a result back to the host).

    Args:
        builders: Name -> function that builds the candidate and returns its zero-argument call.
        warmup: Untimed rounds after the first calls.
        iters: Timed rounds.
        guard: Checked before building each candidate (host memory).
        failed: If given, a candidate whose build or first call raises is left out and its error recorded here
            (name -> "Type: message"), so one broken variant does not cost the others' measurement.

    Returns:
        Name -> Timing of the candidates that ran, in the order of `builders`.
    """
    if iters < 1:
        raise ValueError(f"--iters={iters} must be >= 1")
    calls: dict[str, Callable[[], object]] = {}
    first: dict[str, float] = {}
    for name, build in builders.items():
        if guard is not None:
            guard.before_compile(name, len(calls))
        try:
            call = build()
            first[name] = _timed(call)
        except Exception as err:  # any failure of one candidate: `failed` reports it
            if failed is None:
                raise
            failed[name] = f"{type(err).__name__}: {(str(err).strip().splitlines() or [''])[0]}"
            progress(f"{name}: failed, left out ({failed[name]})")
            continue
        calls[name] = call
        if guard is not None:
            guard.after_compile()
        progress(f"{name}: first call {first[name]:.1f} s")
    for _ in range(warmup):
        for call in calls.values():
            call()
    seconds: dict[str, list[float]] = {name: [] for name in calls}
    loads = []
    for round_ in range(iters):
        for name, call in calls.items():
            seconds[name].append(_timed(call))
        loads.append(load_average())
        progress(f"round {round_ + 1}/{iters}: " + ", ".join(f"{n} {s[-1]:.3f} s" for n, s in seconds.items()))
    load = statistics.mean(loads)
    return {name: Timing(first[name], Samples(tuple(seconds[name])), load) for name in calls}
