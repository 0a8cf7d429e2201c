"""`kernels`: memory that MindSpore kernels hold per call, and what the model's and AdamW's steps hold.

On MindSpore 2.10's CPU backend some kernels keep about four output-sized buffers per call for as long as the
compiled graph runs (`ops.transpose`, divisions, Adds and Muls whose operands differ in shape); the model and the
optimizer avoid them (models/kernels.py, "Kernels that hold memory"). Each probe runs in a fresh process, because a
process's peak resident set only grows:

- a kernel probe chains CALLS calls of one op on a (1024, 49, 96) fp32 input (a window-attention-sized tensor) in
  one compiled graph, forward only; the figure is the growth of peak RSS per call in units of that tensor;
- `swin blocks, permute=<mode>` is the forward + backward of stage-1 Swin blocks (the CPU formulation with that
  permutation kernel); the figure is the growth per block in units of the block's input (B, 56*56, 96), from 1
  block to 3;
- `adamw update` is one AdamW step of a single 16 Mi-float parameter; the figure is the growth in parameter sizes.

    python -m benchmarks.kernels <probe>   # the worker; prints one JSON line
"""
from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence

import numpy as np

from benchmarks.host import describe, rss_gb
from benchmarks.peak import peak_rss_gb
from benchmarks.table import BenchResult, Table
from benchmarks.timing import progress
from benchmarks.worker import json_from_worker

__all__ = ["KERNEL_PROBES", "WORKLOADS", "held", "run"]

CALLS = 8
SHAPE = (1024, 49, 96)  # (windows of a batch of 16 at 56x56, tokens per window, channels): stage 1 of swin_tiny
BLOCK_BATCH = 8
PARAM_SIZE = 16 * 2**20
TIMEOUT_S = 600


def _kernel_ops() -> dict[str, Callable]:
    """Probe name -> op(x, y, row, col) returning a tensor of x's shape (or its transpose, for the permutations).

    Named functions, not lambdas: MindSpore's graph parser reads each op's source line.
    """
    from mindspore import mint, ops

    from swinexp.models.kernels import expand

    def same_shape_add(x, y, row, col):
        return x + y

    def scalar_mul(x, y, row, col):
        return x * 0.5

    def transpose(x, y, row, col):
        return ops.transpose(x, (0, 2, 1))

    def mint_permute(x, y, row, col):
        return mint.permute(x, (0, 2, 1))

    def divide(x, y, row, col):
        return x / y

    def mul_reciprocal(x, y, row, col):
        return x * ops.reciprocal(y)

    def broadcast_add(x, y, row, col):
        return x + col

    def expanded_add(x, y, row, col):
        return x + expand(col, x.shape)

    def broadcast_mul(x, y, row, col):
        return x * row

    def expanded_mul(x, y, row, col):
        return x * expand(row, x.shape)

    ops_in_order = (same_shape_add, scalar_mul, transpose, mint_permute, divide, mul_reciprocal, broadcast_add,
                    expanded_add, broadcast_mul, expanded_mul)
    return dict(zip(KERNEL_PROBES, ops_in_order, strict=True))


KERNEL_PROBES = ("x + y (same shape)", "x * 0.5 (a scalar)", "ops.transpose", "mint.permute", "x / y",
                 "x * ops.reciprocal(y)", "x + b, b (96,)", "x + expand(b)", "x * s, s (1024, 1, 1)", "x * expand(s)")
BLOCKS = "swin blocks, permute="
WORKLOADS = (f"{BLOCKS}mint", f"{BLOCKS}gather", f"{BLOCKS}transpose", "adamw update")


def _kernel_growth(name: str) -> float:
    import mindspore as ms
    from mindspore import Tensor, nn

    op = _kernel_ops()[name]

    class Chain(nn.Cell):
        def construct(self, x, y, row, col):
            for _ in range(CALLS):
                x = op(x, y, row, col)
            return x.sum()

    rng = np.random.default_rng(0)
    x, y = (Tensor(rng.random(SHAPE, np.float32) + 0.5) for _ in range(2))
    row = Tensor(rng.random((SHAPE[0], 1, 1), np.float32))
    col = Tensor(rng.random((SHAPE[-1],), np.float32))
    chain = ms.jit(Chain())
    before = rss_gb()
    for _ in range(2):
        chain(x, y, row, col).asnumpy()
    return (peak_rss_gb() - before) / (x.nbytes / 2**30) / CALLS


def _blocks_growth(permute: str, depth: int) -> float:
    """Peak RSS growth (GiB) of two forward + backward passes of `depth` stage-1 blocks."""
    import mindspore as ms
    from mindspore import Tensor, nn

    from swinexp.models.swin import Formulation, SwinTransformerBlock

    class Blocks(nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            formulation = Formulation(qkv="split", custom_bprop=True, permute=permute)
            self.blocks = nn.CellList([SwinTransformerBlock(96, 56, 3, 7, 0 if i % 2 == 0 else 3, drop_path=0.1,
                                                            formulation=formulation, index=i)
                                       for i in range(depth)])

        def construct(self, x, drop_scales):
            for block in self.blocks:
                x = block(x, drop_scales)
            return x.sum()

    blocks = Blocks()
    grad = ms.jit(ms.value_and_grad(blocks, None, blocks.trainable_params()))
    x = Tensor(np.random.default_rng(0).standard_normal((BLOCK_BATCH, 56 * 56, 96), np.float32))
    drop_scales = Tensor(np.full((2 * depth, BLOCK_BATCH), 1.25, np.float32))
    before = rss_gb()
    for _ in range(2):
        grad(x, drop_scales)[0].asnumpy()
    return peak_rss_gb() - before


def _adamw_growth() -> float:
    from mindspore import Parameter, Tensor, nn

    from benchmarks.harness import build_optimization, compose

    class One(nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.weight = Parameter(Tensor(np.ones((PARAM_SIZE // 1024, 1024), np.float32)))

    optimizer, _ = build_optimization(compose(["optimizer=adamw"]), One(), steps_per_epoch=1, total_batch=512)
    grads = (Tensor(np.full((PARAM_SIZE // 1024, 1024), 0.5, np.float32)),)
    before = rss_gb()
    for _ in range(2):
        optimizer(grads)
    float(optimizer.parameters[0][0, 0].asnumpy())
    return (peak_rss_gb() - before) / (PARAM_SIZE * 4 / 2**30)


def worker(probe: str) -> float:
    """This process's figure for `probe`: a KERNEL_PROBES name, 'adamw update', or 'swin blocks, permute=<mode> <depth>'
    (GiB)."""
    import mindspore as ms

    ms.set_context(mode=ms.GRAPH_MODE)
    if probe in KERNEL_PROBES:
        return _kernel_growth(probe)
    if probe.startswith(BLOCKS):
        permute, depth = probe.removeprefix(BLOCKS).split()
        return _blocks_growth(permute, int(depth))
    if probe == "adamw update":
        return _adamw_growth()
    raise ValueError(f"unknown probe {probe!r}; choose from {', '.join(KERNEL_PROBES + WORKLOADS)}")


def _in_process(probe: str) -> float:
    return float(json_from_worker("benchmarks.kernels", [probe], f"the memory probe '{probe}'", TIMEOUT_S))


def held(probe: str) -> float:
    """`probe`'s figure, measured in a fresh process: buffers per kernel call, per block, or per parameter size."""
    if probe.startswith(BLOCKS):
        one, three = _in_process(f"{probe} 1"), _in_process(f"{probe} 3")
        block_input_gb = BLOCK_BATCH * 56 * 56 * 96 * 4 / 2**30
        return (three - one) / 2 / block_input_gb
    return _in_process(probe)


def run(opts, probes: Sequence[str] = KERNEL_PROBES + WORKLOADS) -> BenchResult:
    """The `kernels` sub-benchmark: one row per probe, each in fresh processes."""
    rows, metrics = [], {}
    for probe in probes:
        progress(f"kernels: {probe} in a fresh process")
        figure = held(probe)
        unit = ("block inputs per block" if probe.startswith(BLOCKS) else
                "parameter sizes" if probe == "adamw update" else "outputs per call")
        rows.append((probe, f"{figure:.2f}", unit))
        metrics[f"kernels/{probe}"] = figure
    title = (f"Peak-RSS growth of MindSpore kernels and of the steps built from them, graph mode, each in a fresh "
             f"process; {describe()}")
    notes = (f"Kernels: {CALLS} chained calls on a {SHAPE} fp32 input, forward only; the chain itself keeps about "
             "two buffers alive at a time, so ~0.25 per call is the floor and ~4 per call is a kernel that holds its "
             "buffers. Swin blocks: forward + backward of stage-1 blocks (96 channels at 56x56, batch "
             f"{BLOCK_BATCH}, the CPU formulation, drop path on), growth from 1 to 3 blocks. AdamW: one update of a "
             f"{PARAM_SIZE // 2**20} Mi-float parameter (its moments and the gradient exist before).",)
    return BenchResult("kernels", Table(title, ("probe", "growth", "unit"), tuple(rows), notes), metrics)


def main(argv: Sequence[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    print(json.dumps(worker(" ".join(argv))), flush=True)


if __name__ == "__main__":
    main()
