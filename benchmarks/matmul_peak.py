"""What these cores can do at best: the GFLOP/s of one large fp32 MatMul, the yardstick the `step` table's GFLOP/s is
read against. Counted as the step counts (one multiply-add is one FLOP, the official Swin convention)."""
from __future__ import annotations

import time

import numpy as np

__all__ = ["PEAK_SIZE", "matmul_peak_gflops"]

PEAK_SIZE = 2048  # 8.6 G multiply-adds: ~0.1 s a MatMul on two cores, long enough to time, short to repeat


def matmul_peak_gflops(size: int = PEAK_SIZE, repeats: int = 5) -> float:
    """The best of `repeats` timed size x size x size fp32 MatMuls (after one warm-up), in G multiply-adds per s."""
    from mindspore import Tensor, ops

    rng = np.random.default_rng(0)
    a, b = (Tensor(rng.standard_normal((size, size), np.float32)) for _ in range(2))
    ops.matmul(a, b).asnumpy()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        ops.matmul(a, b).asnumpy()
        best = min(best, time.perf_counter() - start)
    return size**3 / best / 1e9
