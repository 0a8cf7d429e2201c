"""`gemm`: the GEMMs of every Linear layer of the train step, per shape and operand orientation, MindSpore against
torch (issue 42: GEMMs are ~2/3 of swinexp's step).

A Linear layer y = x W^T (x (R, in), W (out, in), R = batch x tokens) costs three GEMMs per step: the forward, the
input gradient dx = dy W and the weight gradient dW = dy^T x. Each can be computed with its operands in another
orientation (a transposed flag of the MatMul, an explicit transpose before or after it, the weight kept as (in, out));
`ORIENTATIONS` lists the ones timed, the first of each gradient being what MindSpore's autodiff of the Linear runs.
The shapes are read off the model (its Linear layers and the token count of their stage). Every GEMM is jitted
(graph mode) and timed alone, the orientations of one shape taking turns, median and min of `--iters` rounds;
torch's counterparts (`gemm_torch`) run in a process of their own on as many threads, each call right after
MindSpore's. GFLOP/s counts a multiply-add as one FLOP, as the `step` table and its MatMul peak do.
"""
from __future__ import annotations

import contextlib
import os
import re
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from dataclasses import dataclass

import numpy as np
from mindspore import Tensor, nn, ops

from benchmarks.harness import compose
from benchmarks.host import describe, load_average
from benchmarks.options import Options
from benchmarks.table import BenchResult, Table
from benchmarks.timing import progress
from benchmarks.timm_peer import torch_environment
from benchmarks.worker import IMPORT_ROOT
from swinexp.models.layers import Linear
from swinexp.registry import MODELS

__all__ = ["ORIENTATIONS", "GemmShape", "Orientation", "linear_shapes", "run"]


@dataclass(frozen=True)
class GemmShape:
    """One distinct Linear shape of the step.

    Attributes:
        rows: R, the rows of x (batch x tokens of the layer's stage; batch for the head).
        layers: The layers of this shape ("stage 2 fc1", "merging 1-2", "head").
        calls: How many Linear calls of this shape one forward makes.
    """

    rows: int
    fan_in: int
    fan_out: int
    layers: tuple[str, ...]
    calls: int

    @property
    def multiply_adds(self) -> int:
        return self.rows * self.fan_in * self.fan_out


@dataclass(frozen=True)
class Orientation:
    """One way to compute one of the three GEMMs: MatMul(a, b) with its transpose flags, and explicit transposes.

    Attributes:
        gradient: "forward", "input grad" or "weight grad".
        a, b: Operand names: x (R, in), w (out, in), wt (in, out), dy (R, out).
        pre_a: Transpose `a` with an op of its own before the MatMul; post: transpose the MatMul's result.
    """

    label: str
    gradient: str
    a: str
    b: str
    transpose_a: bool = False
    transpose_b: bool = False
    pre_a: bool = False
    post: bool = False


ORIENTATIONS = (
    Orientation("y = x W^T", "forward", "x", "w", transpose_b=True),
    Orientation("y = x Wt", "forward", "x", "wt"),  # a weight kept (in, out)
    Orientation("dx = dy W", "input grad", "dy", "w"),
    Orientation("dx = dy Wt^T", "input grad", "dy", "wt", transpose_b=True),
    Orientation("dW = dy^T x", "weight grad", "dy", "x", transpose_a=True),
    Orientation("dW = T(dy) x", "weight grad", "dy", "x", pre_a=True),
    Orientation("dW = T(x^T dy)", "weight grad", "x", "dy", transpose_a=True, post=True),
)
# gradient -> the first orientation listed for it, the one autodiff runs
AUTODIFF = {gradient: next(o.label for o in ORIENTATIONS if o.gradient == gradient)
            for gradient in dict.fromkeys(o.gradient for o in ORIENTATIONS)}


Timed = tuple[float, float]  # (median, min) seconds of the timed rounds


class _Gemm(nn.Cell):
    def __init__(self, orientation: Orientation) -> None:
        super().__init__()
        self.matmul = ops.MatMul(orientation.transpose_a, orientation.transpose_b)
        self.pre_a, self.post = orientation.pre_a, orientation.post

    def construct(self, a: Tensor, b: Tensor) -> Tensor:
        if self.pre_a:
            a = ops.transpose(a, (1, 0))
        y = self.matmul(a, b)
        if self.post:
            y = ops.transpose(y, (1, 0))
        return y


def linear_shapes(plan_overrides: list[str]) -> list[GemmShape]:
    """The distinct (R, in, out) of the model's Linear layers at the config's batch and image size, largest first."""
    plan = compose(plan_overrides)
    model = MODELS.build(plan.section("model"))
    batch, grid = int(plan.get("data.batch_size")), int(plan.get("model.img_size")) // int(plan.get("model.patch_size"))
    found: dict[tuple[int, int, int], list[str]] = defaultdict(list)
    for name, cell in model.cells_and_names():
        if not isinstance(cell, Linear):
            continue
        if match := re.match(r"layers\.(\d+)\.blocks\.\d+\..*?(\w+)$", name):
            stage = int(match.group(1))
            rows, layer = batch * (grid >> stage) ** 2, f"stage {stage} {match.group(2)}"
        elif match := re.match(r"layers\.(\d+)\.downsample", name):
            stage = int(match.group(1))  # merges stage i's map into stage i+1's tokens
            rows, layer = batch * (grid >> (stage + 1)) ** 2, f"merging {stage}-{stage + 1}"
        else:  # the head, on the pooled features
            rows, layer = batch, name
        found[(rows, cell.in_channels, cell.out_channels)].append(layer)
    shapes = [GemmShape(*key, tuple(dict.fromkeys(layers)), len(layers)) for key, layers in found.items()]
    return sorted(shapes, key=lambda s: -s.multiply_adds * s.calls)


def _operands(shape: GemmShape) -> dict[str, Tensor]:
    rng = np.random.default_rng(0)
    w = rng.standard_normal((shape.fan_out, shape.fan_in), np.float32)
    return {"x": Tensor(rng.standard_normal((shape.rows, shape.fan_in), np.float32)), "w": Tensor(w),
            "wt": Tensor(np.ascontiguousarray(w.T)),
            "dy": Tensor(rng.standard_normal((shape.rows, shape.fan_out), np.float32))}


class TorchPeer:
    """`gemm_torch` in a process of its own, running one timed torch GEMM per request (a context manager)."""

    def __init__(self, threads: int) -> None:
        self.process = subprocess.Popen([sys.executable, "-m", "benchmarks.gemm_torch", str(threads)],
                                        cwd=IMPORT_ROOT, env=torch_environment(), stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, text=True, bufsize=1)
        self.version = ""

    def _ask(self, command: str) -> str:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(command + "\n")
        answer = self.process.stdout.readline().strip()
        if not answer:
            raise RuntimeError(f"the torch GEMM process exited with {self.process.wait()} on '{command}'")
        return answer

    def prepare(self, shape: GemmShape, warmup: int) -> None:
        self.version = self._ask(f"shape {shape.rows} {shape.fan_in} {shape.fan_out} {warmup}")

    def time(self, orientation: int) -> float:
        return float(self._ask(f"time {orientation}"))

    def __enter__(self) -> TorchPeer:
        return self

    def __exit__(self, *exc: object) -> None:
        assert self.process.stdin is not None
        if self.process.poll() is None:
            self.process.stdin.write("quit\n")
        self.process.stdin.close()
        self.process.wait(timeout=60)


def time_shape(shape: GemmShape, warmup: int, iters: int,
               peer: TorchPeer | None) -> tuple[list[Timed], list[Timed] | None]:
    """(Median, min) seconds of each of `ORIENTATIONS` on `shape`, MindSpore's (jitted) and, given a peer, torch's.

    Each round runs every orientation once, MindSpore's call and then torch's, so a slow phase of a shared machine
    hits all of them alike.
    """
    operands = _operands(shape)
    cells = [(_Gemm(o), operands[o.a], operands[o.b]) for o in ORIENTATIONS]
    for _ in range(1 + warmup):  # the first round compiles
        for cell, a, b in cells:
            cell(a, b)
    if peer is not None:
        peer.prepare(shape, warmup)
    ours: list[list[float]] = [[] for _ in cells]
    theirs: list[list[float]] = [[] for _ in cells]
    for _ in range(iters):
        for i, (cell, a, b) in enumerate(cells):
            start = time.perf_counter()
            cell(a, b)  # on CPU a graph-mode call returns once the graph has run
            ours[i].append(time.perf_counter() - start)
            if peer is not None:
                theirs[i].append(peer.time(i))
    medians = [(statistics.median(s), min(s)) for s in ours]
    return medians, [(statistics.median(s), min(s)) for s in theirs] if peer is not None else None


def run(opts: Options) -> BenchResult:
    """The `gemm` sub-benchmark (see the module docstring)."""
    overrides = [*opts.model_overrides("swin_tiny", 4, 224), f"data.num_classes={opts.num_classes}",
                 "tracking=none", *opts.overrides]
    shapes = linear_shapes(overrides)
    loads = [load_average()]
    torch_note = "torch not installed: no torch columns (pip install -e '.[reference]')"
    ours: list[list[Timed]] = []
    theirs: list[list[Timed]] | None = [] if _torch_installed() else None
    progress(f"gemm: {len(shapes)} Linear shapes x {len(ORIENTATIONS)} orientations, MindSpore"
             + (" and torch taking turns" if theirs is not None else ""))
    with contextlib.ExitStack() as stack:
        peer = stack.enter_context(TorchPeer(len(os.sched_getaffinity(0)))) if theirs is not None else None
        for shape in shapes:
            mine, other = time_shape(shape, opts.warmup, opts.iters, peer)
            ours.append(mine)
            if theirs is not None and other is not None:
                theirs.append(other)
            loads.append(load_average())
            progress(f"{shape.rows} x {shape.fan_in} -> {shape.fan_out}: " + ", ".join(
                f"{o.label} {1e3 * s[0]:.2f} ms" for o, s in zip(ORIENTATIONS, mine, strict=True)))
        if peer is not None:
            torch_note = peer.version
    plan = compose(overrides)
    title = (f"The Linear layers' GEMMs per shape and orientation: {plan.get('model.name')}, batch "
             f"{plan.get('data.batch_size')}, {plan.get('data.img_size')} px, fp32, MindSpore jitted (graph mode), "
             f"median and min of {opts.iters} rounds after {1 + opts.warmup}; {torch_note}; 1-minute load average "
             f"{min(loads):.1f}-{max(loads):.1f}; {describe()}")
    return gemm_table(shapes, ours, theirs, title)


def _torch_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("torch") is not None


def gemm_table(shapes: list[GemmShape], ours: list[list[Timed]], theirs: list[list[Timed]] | None,
               title: str) -> BenchResult:
    """One row per shape and orientation; "vs autodiff" and "MindSpore / torch" compare medians (the calls took
    turns, so the load of a shared machine hit them alike)."""
    columns = ["layers (calls per step)", "R x in -> out", "gemm", "orientation", "MindSpore median (ms)",
               "MindSpore min (ms)", "vs autodiff (median)", "MindSpore GFLOP/s (min)"]
    if theirs is not None:
        columns += ["torch median (ms)", "torch min (ms)", "torch GFLOP/s (min)", "MindSpore / torch (median)"]
    rows, metrics = [], {}
    per_step: dict[str, float] = defaultdict(float)  # ms per step of autodiff's orientations, the fastest, torch's
    for shape, mine_all, theirs_all in zip(shapes, ours, theirs or [None] * len(shapes), strict=True):
        label = f"{', '.join(shape.layers)} ({shape.calls})"
        size = f"{shape.rows} x {shape.fan_in} -> {shape.fan_out}"
        reference = {o.gradient: mine_all[i] for i, o in enumerate(ORIENTATIONS) if AUTODIFF[o.gradient] == o.label}
        fastest: dict[str, float] = {}
        for i, orientation in enumerate(ORIENTATIONS):
            (median, best), gradient = mine_all[i], orientation.gradient
            fastest[gradient] = min(fastest.get(gradient, median), median)
            row = [label, size, gradient, orientation.label, f"{1e3 * median:.3f}", f"{1e3 * best:.3f}",
                   f"{median / reference[gradient][0]:.2f}", f"{shape.multiply_adds / best / 1e9:.1f}"]
            if theirs_all is not None:
                other_median, other_best = theirs_all[i]
                row += [f"{1e3 * other_median:.3f}", f"{1e3 * other_best:.3f}",
                        f"{shape.multiply_adds / other_best / 1e9:.1f}", f"{median / other_median:.2f}"]
                if AUTODIFF[gradient] == orientation.label:
                    per_step[f"torch {gradient}"] += shape.calls * 1e3 * other_median
            rows.append(tuple(row))
            metrics[f"gemm/{shape.rows}x{shape.fan_in}x{shape.fan_out}/{orientation.label}/median_ms"] = 1e3 * median
        for gradient, (median, _) in reference.items():
            per_step[f"autodiff {gradient}"] += shape.calls * 1e3 * median
            per_step[f"fastest {gradient}"] += shape.calls * 1e3 * fastest[gradient]
    notes = ["Per step (sum over shapes of calls x ms): " + "; ".join(
        f"{gradient}: MindSpore with autodiff's orientation {per_step[f'autodiff {gradient}']:.1f} (median), "
        f"with the fastest orientation per shape {per_step[f'fastest {gradient}']:.1f} (median)"
        + (f", torch {per_step[f'torch {gradient}']:.1f} (median)" if theirs is not None else "")
        for gradient in AUTODIFF) + ".",
        "Operands: x (R, in), W (out, in), Wt = W^T stored (in, out), dy (R, out); T(.) is a Transpose op of its "
        "own, ^T a MatMul transpose flag (torch: a view). The first orientation of each gemm is the one autodiff "
        "of MindSpore's MatMul(transpose_b=True) runs (its IR: MatMul(dy, W) and MatMul(dy, x, transpose_a)); "
        "'vs autodiff' < 1 is faster."]
    metrics.update({f"gemm/per_step/{key}/ms": value for key, value in per_step.items()})
    return BenchResult("gemm", Table(title, tuple(columns), tuple(rows), tuple(notes)), metrics)
