"""The torch side of `gemm`: the same GEMMs, timed with torch on the same shapes, in a process of its own.

    python -m benchmarks.gemm_torch '{"shapes": [[784, 384, 1536]], "warmup": 2, "iters": 9, "threads": 2}'

prints one JSON line: {"seconds": [[[median, min] s per orientation of `ORIENTATIONS`] per shape], "threads", "torch"}.
torch and MindSpore never share a process (see `timm_peer`); this module imports no MindSpore.
"""
from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["ORIENTATIONS", "measure"]

Operands = dict[str, Any]  # x (R, in), w (out, in), wt (in, out), dy (R, out): torch tensors
# `gemm.ORIENTATIONS`' labels, in its order, with torch's way of computing each
ORIENTATIONS: dict[str, Callable[[Operands], Any]] = {
    "y = x W^T": lambda o: o["x"] @ o["w"].t(),
    "y = x Wt": lambda o: o["x"] @ o["wt"],
    "dx = dy W": lambda o: o["dy"] @ o["w"],
    "dx = dy Wt^T": lambda o: o["dy"] @ o["wt"].t(),
    "dW = dy^T x": lambda o: o["dy"].t() @ o["x"],
    "dW = T(dy) x": lambda o: o["dy"].t().contiguous() @ o["x"],
    "dW = T(x^T dy)": lambda o: (o["x"].t() @ o["dy"]).t().contiguous(),
}


def _operands(rows: int, fan_in: int, fan_out: int) -> Operands:
    import torch

    rng = np.random.default_rng(0)
    w = rng.standard_normal((fan_out, fan_in), np.float32)
    return {"x": torch.from_numpy(rng.standard_normal((rows, fan_in), np.float32)), "w": torch.from_numpy(w),
            "wt": torch.from_numpy(np.ascontiguousarray(w.T)),
            "dy": torch.from_numpy(rng.standard_normal((rows, fan_out), np.float32))}


def measure(shapes: list[tuple[int, int, int]], warmup: int, iters: int) -> list[list[tuple[float, float]]]:
    """(Median, min) seconds of each orientation per (rows, in, out) shape, the orientations taking turns per round."""
    import torch

    medians = []
    with torch.no_grad():
        for shape in shapes:
            operands = _operands(*shape)
            calls = list(ORIENTATIONS.values())
            for _ in range(1 + warmup):
                for call in calls:
                    call(operands)
            seconds: list[list[float]] = [[] for _ in calls]
            for _ in range(iters):
                for i, call in enumerate(calls):
                    start = time.perf_counter()
                    call(operands)  # CPU tensors: the call returns when the GEMM is done
                    seconds[i].append(time.perf_counter() - start)
            medians.append([(statistics.median(s), min(s)) for s in seconds])
    return medians


def main(argv: list[str] | None = None) -> None:
    import torch

    settings = json.loads((argv or sys.argv[1:])[0])
    torch.set_num_threads(int(settings["threads"]))
    seconds = measure([tuple(s) for s in settings["shapes"]], int(settings["warmup"]), int(settings["iters"]))
    print(json.dumps({"seconds": seconds, "threads": torch.get_num_threads(), "torch": torch.__version__}))


if __name__ == "__main__":
    main()
