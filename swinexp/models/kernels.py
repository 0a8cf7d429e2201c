"""MindSpore CPU-kernel workarounds under Swin's layers: the same functions, computed with kernels that are fast and
hold no memory on MindSpore 2.10's CPU backend.

Two kinds, each explained at its section: kernels that keep output-sized buffers for the graph's life (broadcasting
with `expand`, the permutation kernel `Permute`), and hand-written backward passes (`custom_bprop`) for GELU,
softmax, LayerNorm and the bias adds. `layers.py` and `swin.py` choose them through the model's formulation.
"""
from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

import numpy as np
from mindspore import Tensor, mint, nn, ops
from mindspore.ops.primitive import constexpr

from swinexp.models import fused_cpu

__all__ = [
    "PERMUTE_MODES",
    "AddBroadcast",
    "BiasAddFn",
    "ExactGELU",
    "GatherRowsFn",
    "LastAxisLayerNorm",
    "LastAxisSoftmax",
    "Permute",
    "expand",
    "reorder_axes",
    "row_order",
    "shared",
    "sharing_function_cells",
]


_SHARED: contextvars.ContextVar[dict | None] = contextvars.ContextVar("shared_function_cells", default=None)


@contextlib.contextmanager
def sharing_function_cells() -> Iterator[None]:
    """While a model is built: `shared` hands out one instance per kind of function cell, for that model only."""
    token = _SHARED.set({})
    try:
        yield
    finally:
        _SHARED.reset(token)


def shared(owner: nn.Cell, function_cell: type[nn.Cell], *args: object) -> nn.Cell:
    """A function cell for `owner`: inside `sharing_function_cells`, the model's one instance of this class with
    these arguments among owners of `owner`'s class; a new instance outside it.

    MindSpore parses, infers and differentiates a cell's `construct` and `bprop` once per instance, so ~300
    identical function cells (a row Gather, a bias add, a LayerNorm per site) were ~300 graphs for the compiler;
    sharing them cut swin_tiny's train-step compile by ~15 % (BENCHMARKS.md). Only for cells without parameters
    that read nothing but their inputs (not `training`). AMP marks a cell's dtype on it and on its subcells, by
    the owner's class: one instance per owner class (a Conv2d's bias add kept in fp32 under o1_manual is not the
    Dense layers'), and per model (one model's policy does not reach another's).
    """
    cells = _SHARED.get()
    if cells is None:
        return function_cell(*args)
    key = (type(owner), function_cell, args)
    if key not in cells:
        cells[key] = function_cell(*args)
    return cells[key]

# ---------------------------------------------------------------------------------------------------------------
# Kernels that hold memory. On MindSpore 2.10's CPU backend some kernels keep about four output-sized buffers per
# call for as long as the compiled graph runs (peak RSS of a forward-only chain of 8 calls on a (1024, 49, 96) fp32
# tensor, BENCHMARKS.md): `ops.transpose`, every division (`/`, `ops.div`, `mint.div`), and an Add or Mul whose
# operands differ in shape (a scalar aside). `mint.permute`, `ops.reciprocal`, `ops.broadcast_to` and elementwise
# ops on equal shapes keep nothing. In Swin's train step they had added up to 2.7x the memory of timm's, so the model
# broadcasts explicitly with `expand` before an elementwise op, and `model.permute` chooses the permutation kernel
# (`Permute`): `mint.permute` keeps nothing but is slow on CPU (its copies to contiguous memory go element by
# element), `gather` copies whole rows with one Gather, as fast as `ops.transpose` and holding nothing.


def expand(small: Tensor, shape: tuple[int, ...]) -> Tensor:
    """`small` broadcast to `shape` as an op of its own, so the elementwise op that uses it sees equal shapes."""
    return ops.broadcast_to(small, shape)


PERMUTE_MODES = ("transpose", "mint", "gather")


def row_order(shape: tuple[int, ...], axes: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """For a permutation `axes` of `shape` that keeps its first and last axis, viewed as (shape[0], rows, shape[-1]):
    the input row each output row takes, and the inverse order (which undoes it)."""
    inner = shape[1:-1]
    order = np.arange(int(np.prod(inner))).reshape(inner).transpose([a - 1 for a in axes[1:-1]]).reshape(-1)
    return order.astype(np.int32), np.argsort(order).astype(np.int32)


def reorder_axes(x: Tensor, axes: tuple[int, ...], reorder: nn.Cell | None = None) -> Tensor:
    """`x` with its axes reordered by `reorder` (a `Permute`), or by `ops.transpose` when it is None."""
    if reorder is None:
        return ops.transpose(x, axes)
    return reorder(x, axes)


# ---------------------------------------------------------------------------------------------------------------
# Hand-written backward passes (`custom_bprop=True`).
#
# On MindSpore 2.10's CPU backend MatMul (oneDNN) and plain elementwise kernels are fast, but some gradients are
# not (fwd+bwd timed in isolation, 2-core CPU): BiasAddGrad sums the rows of a (12544, 384) gradient in ~18 ms where
# a ones-vector MatMul takes ~3 ms; autodiff of the exact GELU (MindSpore writes it as erf(x / sqrt 2) op by op)
# adds a Div, a Pow, an Exp, a Neg and several Muls, ~25% more than GELU's own derivative; Softmax's backward
# (a ReduceSum over a 4-D tensor) is ~25% slower than with a MatMul row sum. Each cell below is a parameterless
# "function cell": it takes the weights as inputs (so its owner keeps the official parameter names), computes the
# same forward, and has a `bprop` that sums over rows or columns with MatMuls and reuses forward intermediates:
# the same gradients up to float rounding (tests/test_models.py). LayerNormGrad is slow as well: `_LayerNormFn`'s
# backward has no broadcasting elementwise op, as those run 3-10x slower than same-shape ones on this backend; it
# widens every (R, 1) or (C,) operand by a K=1 MatMul instead (forward + backward of a (12544, 96) input ~30 ms ->
# ~7 ms, BENCHMARKS.md).
# The `bprop` bodies use only `self`'s methods and primitives and Tensor methods, no module globals: MindSpore's
# O1 AMP (its `rewrite` module) copies a cell's bprop source into a generated module without this one's names.


class _FnCell(nn.Cell):
    """Base of the function cells: MatMul sums over rows and columns for their bprops."""

    def __init__(self) -> None:
        super().__init__()
        self.matmul = ops.MatMul()
        self.ones = ops.Ones()
        self.reshape = ops.Reshape()

    def row_sum(self, x: Tensor) -> Tensor:
        """(R, C) -> (R, 1) sums over the last axis."""
        return self.matmul(x, self.ones((x.shape[-1], 1), x.dtype))

    def row_mean(self, x: Tensor) -> Tensor:
        """(R, C) -> (R, 1) means over the last axis."""
        return self.row_sum(x) * (1.0 / x.shape[-1])

    def col_sum(self, x: Tensor) -> Tensor:
        """(R, C) -> (C,) sums over the first axis."""
        return self.reshape(self.matmul(self.ones((1, x.shape[0]), x.dtype), x), (x.shape[-1],))

    def widen(self, col: Tensor, width: int) -> Tensor:
        """(R, 1) -> (R, width), each row repeating its value."""
        return self.matmul(col, self.ones((1, width), col.dtype))

    def tile_rows(self, vec: Tensor, rows: int) -> Tensor:
        """(C,) -> (rows, C), each row a copy of `vec`."""
        return self.matmul(self.ones((rows, 1), vec.dtype), self.reshape(vec, (1, -1)))


class _GeluFn(_FnCell):
    """Exact GELU x * Phi(x), returning (y, Phi(x)) so the backward reuses Phi instead of differentiating erf."""

    def __init__(self) -> None:
        super().__init__()
        self.erf = ops.Erf()
        self.exp = ops.Exp()
        self.sqrt1_2 = 0.7071067811865476  # 1/sqrt(2): PyTorch's exact GELU multiplies by it (M_SQRT1_2)
        self.inv_sqrt_2pi = 0.3989422804014327  # 1/sqrt(2 pi): the standard normal density at 0

    def construct(self, x: Tensor) -> tuple[Tensor, Tensor]:
        cdf = (self.erf(x * self.sqrt1_2) + 1.0) * 0.5  # Phi(x), as torch: 0.5 * (1 + erf(x / sqrt 2))
        return x * cdf, cdf

    def bprop(self, x: Tensor, out: tuple, dout: tuple) -> tuple[Tensor]:
        pdf = self.exp(x * x * -0.5) * self.inv_sqrt_2pi  # phi(x)
        return (dout[0] * (out[1] + x * pdf),)  # d/dx x*Phi(x) = Phi(x) + x*phi(x)


class ExactGELU(nn.GELU):
    """Exact (erf) GELU, as PyTorch's default `nn.GELU()` of the official code; optionally `_GeluFn`'s backward or
    the fused CPU kernel.

    A subclass of `nn.GELU`, so AMP cell lists that name `GELU` still apply.

    Args:
        custom_bprop: Use `_GeluFn` (forward as torch's formula, backward Phi + x*phi) instead of autodiff of
            MindSpore's `gelu(approximate='none')`.
        fused: Compute float32 inputs with `fused_cpu.FusedGeluFn` (one C++ pass each way; model.kernels=fused_cpu);
            other dtypes (an fp16 amp policy) take the path `custom_bprop` chooses.
    """

    def __init__(self, custom_bprop: bool = False, fused: bool = False) -> None:
        super().__init__(approximate=False)
        self.fn = shared(self, _GeluFn) if custom_bprop else None
        self.fused = shared(self, fused_cpu.FusedGeluFn) if fused else None
        self.fused_dtype = fused_cpu.DTYPE

    def construct(self, x: Tensor) -> Tensor:
        # no super().construct: MindSpore's O1 rewrite copies construct into a subclass, where super() recurses
        if self.fused is not None and x.dtype == self.fused_dtype:
            return self.fused(x)
        if self.fn is None:
            return ops.gelu(x, approximate="none")
        return self.fn(x)[0]


class _SoftmaxFn(_FnCell):
    """Softmax over the last axis; the backward y * dy - y * sum(y * dy) sums with a MatMul."""

    def __init__(self) -> None:
        super().__init__()
        self.softmax = ops.Softmax(-1)

    def construct(self, x: Tensor) -> Tensor:
        return self.softmax(x)

    def bprop(self, x: Tensor, out: Tensor, dout: Tensor) -> tuple[Tensor]:
        gy = dout * out
        s = self.reshape(self.row_sum(self.reshape(gy, (-1, x.shape[-1]))), x.shape[:-1] + (1,))  # (..., 1)
        return (gy - out * s.broadcast_to(out.shape),)  # explicit broadcast: see "Kernels that hold memory"


class LastAxisSoftmax(nn.Softmax):
    """`nn.Softmax` over the last axis; optionally with `_SoftmaxFn`'s backward or the fused CPU one.

    A subclass of `nn.Softmax`, so AMP cell lists that name `Softmax` still apply.

    Args:
        custom_bprop: Use `_SoftmaxFn` instead of autodiff of the Softmax primitive.
        fused: Float32 inputs take `fused_cpu.FusedSoftmaxFn` (its backward one C++ pass per row;
            model.kernels=fused_cpu); other dtypes the path `custom_bprop` chooses.
    """

    def __init__(self, custom_bprop: bool = False, fused: bool = False) -> None:
        super().__init__(axis=-1)
        self.fn = shared(self, _SoftmaxFn) if custom_bprop else None
        self.fused = shared(self, fused_cpu.FusedSoftmaxFn) if fused else None
        self.fused_dtype = fused_cpu.DTYPE

    def construct(self, x: Tensor) -> Tensor:
        if self.fused is not None and x.dtype == self.fused_dtype:
            return self.fused(x)
        if self.fn is None:  # no super().construct (see ExactGELU)
            return self.softmax(x)
        return self.fn(x)


class GatherRowsFn(nn.Cell):
    """(x (B, R, C), order, inverse) -> x[:, order]: a permutation of rows, whose backward gathers by `inverse`.

    `Permute("gather")`: on CPU one Gather of contiguous rows is ~4x faster than `ops.transpose` forward and
    backward, ~50x faster than `mint.permute` (whose backward copies element by element), and holds no buffers.
    """

    def __init__(self) -> None:
        super().__init__()
        self.gather = ops.Gather()
        self.zeros_like = ops.ZerosLike()

    def construct(self, x: Tensor, order: Tensor, inverse: Tensor) -> Tensor:
        return self.gather(x, order, 1)

    def bprop(self, x: Tensor, order: Tensor, inverse: Tensor, out: Tensor,
              dout: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        return self.gather(dout, inverse, 1), self.zeros_like(order), self.zeros_like(inverse)


# Python on static shapes, run once per call site by the compiler (constexpr): the same numpy called inside a
# construct is interpreted node by node, which added ~1/3 to the type inference of swin_tiny's train step
@constexpr
def _row_orders(shape: tuple[int, ...], axes: tuple[int, ...]) -> tuple[Tensor, Tensor]:
    order, inverse = row_order(shape, axes)
    return Tensor(order), Tensor(inverse)


@constexpr
def _permuted(shape: tuple[int, ...], axes: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(shape[a] for a in axes)


class Permute(nn.Cell):
    """Reorder axes: one function, the kernel one of PERMUTE_MODES (`model.permute`).

    "transpose" is `ops.transpose`, "mint" `mint.permute`; "gather" copies whole rows of the last axis with one
    Gather (`GatherRowsFn`) when the permutation keeps the first and the last axis (windows, heads, merging), and is
    `ops.transpose` otherwise. A cell, so that the Gather's hand-written backward is a subcell of the model.

    Args:
        mode: One of PERMUTE_MODES.
    """

    def __init__(self, mode: str = "transpose") -> None:
        super().__init__()
        self.mode = mode
        self.rows = shared(self, GatherRowsFn) if mode == "gather" else None

    def construct(self, x: Tensor, axes: tuple[int, ...]) -> Tensor:
        if self.mode == "mint":
            return mint.permute(x, axes)
        if self.rows is None or axes[0] != 0 or axes[-1] != len(axes) - 1:
            return ops.transpose(x, axes)
        shape = x.shape
        order, inverse = _row_orders(shape, axes)
        rows = self.rows(ops.reshape(x, (shape[0], -1, shape[-1])), order, inverse)
        return ops.reshape(rows, _permuted(shape, axes))

    def extend_repr(self) -> str:
        return f"mode={self.mode}"


class _LayerNormFn(_FnCell):
    """LayerNorm over the last axis of (R, C): MindSpore's LayerNorm primitive, with a hand-written backward.

    Returns the primitive's (y, mean, variance), the (R, 1) statistics the backward needs. The forward kernel is as
    fast as any hand-written one (~7 ms for (12544, 96)) and one graph node; LayerNormGrad is what is slow. The
    backward recomputes x_hat from x and the two columns, and is dx = (g - mean(g) - x_hat * mean(g * x_hat)) / std
    with g = dy * gamma, every column and row operand widened by a K=1 MatMul.
    """

    def __init__(self, epsilon: float) -> None:
        super().__init__()
        self.layer_norm = ops.LayerNorm(begin_norm_axis=-1, begin_params_axis=-1, epsilon=epsilon)
        self.rsqrt = ops.Rsqrt()
        self.epsilon = epsilon

    def construct(self, x: Tensor, gamma: Tensor, beta: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        return self.layer_norm(x, gamma, beta)

    def bprop(self, x: Tensor, gamma: Tensor, beta: Tensor, out: tuple, dout: tuple) -> tuple[Tensor, ...]:
        dy, mean, inv_std = dout[0], out[1], self.rsqrt(out[2] + self.epsilon)
        rows, width = x.shape
        inv_std_wide = self.widen(inv_std, width)
        x_hat = (x - self.widen(mean, width)) * inv_std_wide
        gamma_rows = self.tile_rows(gamma, rows)
        dy_x_hat = dy * x_hat
        g = dy * gamma_rows
        mean_g = self.widen(self.row_mean(g), width)
        mean_g_x_hat = self.widen(self.row_mean(dy_x_hat * gamma_rows), width)
        dx = (g - mean_g - x_hat * mean_g_x_hat) * inv_std_wide
        return dx, self.col_sum(dy_x_hat), self.col_sum(dy)


class LastAxisLayerNorm(nn.LayerNorm):
    """`nn.LayerNorm` over the last axis (parameters `gamma`, `beta`); optionally `_LayerNormFn`'s computation.

    A subclass of `nn.LayerNorm`, so AMP cell lists and MindSpore's O2 black list still keep it in fp32.

    Args:
        width: Size of the normalised last axis.
        custom_bprop: Use `_LayerNormFn` (the LayerNorm primitive with a hand-written backward of MatMul sums
            and broadcasts) instead of autodiff's LayerNormGrad.
        epsilon: Added to the variance.
        fused: Float32 inputs take `fused_cpu.FusedLayerNormFn` (its backward one C++ pass per row;
            model.kernels=fused_cpu); other dtypes the path `custom_bprop` chooses.
    """

    def __init__(self, width: int, custom_bprop: bool = False, epsilon: float = 1e-5, fused: bool = False) -> None:
        super().__init__((width,), epsilon=epsilon)
        self.fn = shared(self, LastAxisLayerNormFn, epsilon, custom_bprop, fused)

    def construct(self, x: Tensor) -> Tensor:
        return self.fn(x, self.gamma, self.beta)  # no super().construct (see ExactGELU)


class LastAxisLayerNormFn(nn.Cell):
    """`LastAxisLayerNorm`'s computation, the parameters as inputs (one shared instance per kind in a model)."""

    def __init__(self, epsilon: float, custom_bprop: bool, fused: bool) -> None:
        super().__init__()
        self.layer_norm = ops.LayerNorm(begin_norm_axis=-1, begin_params_axis=-1, epsilon=epsilon)
        self.fn = _LayerNormFn(epsilon) if custom_bprop else None
        self.fused = fused_cpu.FusedLayerNormFn(epsilon) if fused else None
        self.fused_dtype = fused_cpu.DTYPE

    def construct(self, x: Tensor, gamma: Tensor, beta: Tensor) -> Tensor:
        # as nn.LayerNorm: parameters cast to the input's dtype (so amp o3 normalises in fp16, and the cast's
        # autodiff returns the fp32 parameters' gradients in fp32)
        gamma, beta = ops.cast(gamma, x.dtype), ops.cast(beta, x.dtype)
        shape = x.shape
        if self.fused is not None and x.dtype == self.fused_dtype:
            return ops.reshape(self.fused(ops.reshape(x, (-1, shape[-1])), gamma, beta)[0], shape)
        if self.fn is None:
            return self.layer_norm(x, gamma, beta)[0]
        return ops.reshape(self.fn(ops.reshape(x, (-1, shape[-1])), gamma, beta)[0], shape)


class AddBroadcast(_FnCell):
    """x + b where b's shape is x's trailing shape; the gradient of b sums over the leading axes with a MatMul."""

    def construct(self, x: Tensor, b: Tensor) -> Tensor:
        return x + expand(b, x.shape)

    def bprop(self, x: Tensor, b: Tensor, out: Tensor, dout: Tensor) -> tuple[Tensor, Tensor]:
        return dout, self.reshape(self.col_sum(self.reshape(dout, (-1, b.size))), b.shape)


class BiasAddFn(_FnCell):
    """(x (R, out), bias (out,)) -> x + bias; the bias gradient sums over rows with a MatMul (not BiasAddGrad)."""

    def __init__(self) -> None:
        super().__init__()
        self.bias_add = ops.BiasAdd()

    def construct(self, x: Tensor, bias: Tensor) -> Tensor:
        return self.bias_add(x, bias)

    def bprop(self, x: Tensor, bias: Tensor, out: Tensor, dout: Tensor) -> tuple[Tensor, Tensor]:
        return dout, self.col_sum(dout)
