"""The torch side of `gemm`: a process that times torch's GEMMs one call at a time, on request.

    python -m benchmarks.gemm_torch THREADS

reads commands from stdin, one a line, and answers each with one line on stdout:
`shape R IN OUT WARMUP` (make the operands, run every orientation 1 + WARMUP times; answers the torch version),
`time I` (run orientation I of `ORIENTATIONS` once; answers its seconds), `quit`. So `gemm` can alternate
MindSpore's and torch's calls, and the load of a shared machine hits both alike; torch and MindSpore never share a
process (see `timm_peer`), and this module imports no MindSpore.
"""
from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["ORIENTATIONS", "serve"]

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


def serve(threads: int, commands: Any = sys.stdin, answers: Any = sys.stdout) -> None:
    """Answer `commands` (see the module docstring) until `quit` or their end."""
    import torch

    torch.set_num_threads(threads)
    torch.set_grad_enabled(False)
    calls = list(ORIENTATIONS.values())
    operands: Operands = {}
    for line in commands:
        command, *args = line.split()
        if command == "quit":
            break
        if command == "shape":
            rows, fan_in, fan_out, warmup = map(int, args)
            operands = _operands(rows, fan_in, fan_out)
            for _ in range(1 + warmup):
                for call in calls:
                    call(operands)
            answer = f"torch {torch.__version__} on {torch.get_num_threads()} threads"
        else:
            call = calls[int(args[0])]
            start = time.perf_counter()
            call(operands)  # CPU tensors: the call returns when the GEMM is done
            answer = repr(time.perf_counter() - start)
        print(answer, file=answers, flush=True)


if __name__ == "__main__":
    serve(int(sys.argv[1]))
