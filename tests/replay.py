"""Record the draws swinexp makes from a numpy Generator and replay them to timm's own code, call for call.

timm's Mixup draws from numpy's global `np.random` and its RandomErasing from Python's `random`; swinexp draws the
same decisions from a per-batch (per-image) Generator. A `Recorder` wraps that Generator and files each result
under the kind of call; a `Replay` stands in for timm's source and answers each call with the next recorded result
of that kind, checking its arguments, so timm computes with exactly swinexp's draws.
"""
from __future__ import annotations

from collections import defaultdict, deque
from typing import Any

import numpy as np


class Recorder:
    def __init__(self, rng: np.random.Generator) -> None:
        self.rng, self.calls = rng, defaultdict(deque)

    def _keep(self, kind: str, args: tuple, value: Any) -> Any:
        self.calls[kind].append((args, value))
        return value

    def random(self, size: int | None = None) -> Any:
        return self._keep("random", (size,), self.rng.random(size))

    def uniform(self, low: float, high: float) -> float:
        return self._keep("uniform", (low, high), self.rng.uniform(low, high))

    def beta(self, a: float, b: float, size: int | None = None) -> Any:
        return self._keep("beta", (a, b, size), self.rng.beta(a, b, size))

    def integers(self, low: int, high: int, size: int | None = None, dtype: Any = np.int64) -> Any:
        kind = "integers" if size is None else "integer_array"  # noise keys: not timm's
        return self._keep(kind, (low, high, size), self.rng.integers(low, high, size, dtype=dtype))

    def standard_normal(self, size: Any = None, dtype: Any = np.float64) -> Any:
        return self._keep("normal", (size,), self.rng.standard_normal(size, dtype=dtype))


class Replay:
    """timm's side: numpy-style (rand, beta, randint with an exclusive high) or Python-style (random, uniform,
    randint with an inclusive high) calls answered from a Recorder."""

    def __init__(self, recorder: Recorder, python_randint: bool = False) -> None:
        self.calls, self.python_randint = recorder.calls, python_randint

    def _next(self, kind: str, args: tuple) -> Any:
        recorded_args, value = self.calls[kind].popleft()
        assert recorded_args == args, f"timm called {kind}{args}, swinexp drew {kind}{recorded_args}"
        return value

    def rand(self, *size: int) -> Any:
        return self._next("random", (size[0] if size else None,))

    def random(self) -> float:
        return self._next("random", (None,))

    def uniform(self, low: float, high: float) -> float:
        return self._next("uniform", (low, high))

    def beta(self, a: float, b: float, size: int | None = None) -> Any:
        return self._next("beta", (a, b, size))

    def randint(self, low: int, high: int, size: int | None = None) -> Any:
        return self._next("integers", (low, high + 1 if self.python_randint else high, size))

    def exhausted(self) -> bool:
        return not any(self.calls[k] for k in ("random", "uniform", "beta", "integers"))


class NumpyWith:
    """The numpy module with `np.random` replaced: what timm's mixup.py sees as `np`."""

    def __init__(self, random: Replay) -> None:
        self.random = random

    def __getattr__(self, name: str) -> Any:
        return getattr(np, name)
