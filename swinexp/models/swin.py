"""Swin Transformer (Liu et al. 2021), a faithful MindSpore port of microsoft/Swin-Transformer.

Layout follows timm: attention -> block -> merging -> stage -> model, then the registered size builders, whose
numbers live in conf/model/<size>.yaml (they load `pretrained` weights; name conversion lives in convert.py).
Parameter names match the official PyTorch state dict name by name, with MindSpore's LayerNorm `gamma`/`beta` for
PyTorch's `weight`/`bias`.

Three switches select equivalent formulations of the same function (the ablations of this project):

- `qkv`: `fused` (one Dense, 5-D reshape/transpose, indexing; official), `split` (three Dense `q`, `k`, `v`),
  `fused_split` (one Dense, split into three).
- `patch_merging`: `slice` (strided slices + concat; official), `reshape` (reshape + transpose + reshape).
- `rel_pos_bias`: `gather` (index the table; official), `onehot` (constant one-hot matrix @ table).

Four more keep the computation and change its kernels:

- `custom_bprop`: hand-written backward passes for GELU, softmax, LayerNorm and the bias adds (kernels.py) instead
  of MindSpore's autodiff kernels, which are slow on CPU.
- `permute`: `transpose` (`ops.transpose`), `mint` (`mint.permute`) or `gather` (whole rows of the last axis by one
  Gather where a permutation keeps the first and last axes) for the axis permutations; on CPU the first holds
  buffers for the graph's life, the second is slow, the third neither (kernels.py `Permute`, BENCHMARKS.md).
- `patch_embed`: `conv` (`nn.Conv2d`; official) or `matmul` (the patches as rows of one MatMul, `PatchMatMul`): on
  CPU MindSpore's Conv2D runs this conv ~50x slower than the MatMul (BENCHMARKS.md).
- `kernels`: `mindspore` (its primitives) or `fused_cpu` (GELU, LayerNorm, and the attention's bias add with its
  softmax, as C++ passes where MindSpore's CPU backend runs chains of elementwise kernels and a slow `Erf`:
  fused_cpu.py; float32 tensors only, others take the MindSpore path).
"""
from __future__ import annotations

import functools
import inspect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from mindspore import Parameter, Tensor, nn, ops
from mindspore.common.initializer import initializer

from swinexp.models.fused_cpu import DTYPE as FUSED_DTYPE
from swinexp.models.fused_cpu import KERNEL_MODES, FusedBiasSoftmaxFn
from swinexp.models.kernels import (
    PERMUTE_MODES,
    AddBroadcast,
    LastAxisLayerNorm,
    LastAxisSoftmax,
    Permute,
    expand,
    reorder_axes,
    shared,
    sharing_function_cells,
)
from swinexp.models.layers import (
    INIT_STD,
    PATCH_EMBED_MODES,
    DropPath,
    KeyedDropout,
    Linear,
    Mlp,
    PatchEmbed,
    TokenWindows,
    TruncNormal,
    dense,
    relative_position_index,
    shifted_window_mask,
    stage_windows,
)
from swinexp.models.pretrained import LOAD_DEFAULTS, prepare
from swinexp.models.randomness import RandomSites
from swinexp.registry import MODELS, ConfigError

__all__ = [
    "SWIN_SIZES",
    "BasicLayer",
    "Formulation",
    "PatchMerging",
    "SwinTransformer",
    "SwinTransformerBlock",
    "WindowAttention",
]

QKV_MODES = ("fused", "split", "fused_split")
MERGING_MODES = ("slice", "reshape")
REL_POS_BIAS_MODES = ("gather", "onehot")


@dataclass(frozen=True)
class Formulation:
    """How the official Swin's function is written as kernels (see the module docstring): every choice computes the
    same function, and each backend has the one measured fastest for it (conf/model/formulation/)."""

    qkv: str = "fused"
    patch_merging: str = "slice"
    rel_pos_bias: str = "gather"
    custom_bprop: bool = False
    permute: str = "transpose"
    patch_embed: str = "conv"
    kernels: str = "mindspore"

    @property
    def fused_cpu(self) -> bool:
        """The C++ kernels of fused_cpu.py for GELU, LayerNorm and softmax (`kernels="fused_cpu"`)."""
        return self.kernels == "fused_cpu"

    def __post_init__(self) -> None:
        modes = {"qkv": QKV_MODES, "patch_merging": MERGING_MODES, "rel_pos_bias": REL_POS_BIAS_MODES,
                 "permute": PERMUTE_MODES, "patch_embed": PATCH_EMBED_MODES, "kernels": KERNEL_MODES}
        for key, allowed in modes.items():
            if getattr(self, key) not in allowed:
                raise ConfigError(f"model.{key}={getattr(self, key)!r} is not a known option; choose one of: "
                                  f"{', '.join(allowed)}")


OFFICIAL = Formulation()


class WindowAttention(nn.Cell):
    """Multi-head self-attention inside (shifted) windows, with a learned relative position bias.

    Args:
        dim: Token width; divisible by num_heads.
        window_size: Side of a square window.
        num_heads: Number of attention heads.
        qkv_bias: Whether the q/k/v projections have a bias.
        attn_drop: Dropout rate on the attention weights.
        proj_drop: Dropout rate after the output projection.
        formulation: How q, k, v are projected (`qkv`), the bias table looked up (`rel_pos_bias`), axes permuted
            (`permute`), and whether the projections, the bias + mask add and the softmax use hand-written backward
            passes (`custom_bprop`, see kernels.py).
    """

    def __init__(
        self,
        dim: int,
        window_size: int,
        num_heads: int,
        qkv_bias: bool = True,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        formulation: Formulation = OFFICIAL,
    ) -> None:
        super().__init__()
        qkv, rel_pos_bias, custom_bprop = formulation.qkv, formulation.rel_pos_bias, formulation.custom_bprop
        self.dim = dim
        self.window_size = window_size
        self.reorder = shared(self, Permute, formulation.permute)
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.scale = self.head_dim**-0.5
        self.qkv_mode = qkv
        self.rel_pos_bias_mode = rel_pos_bias

        num_rel = (2 * window_size - 1) ** 2
        self.relative_position_bias_table = Parameter(initializer(TruncNormal(INIT_STD), (num_rel, num_heads)))
        # Constants are plain Tensor attributes: not parameters, so never trained or checkpointed.
        index = relative_position_index(window_size).reshape(-1)  # (N*N,)
        if rel_pos_bias == "gather":
            self.relative_position_index = Tensor(index)
        else:
            # float32 one-hot rows, cast at use to the table's dtype (fp16 under AMP O3; a no-op in fp32)
            self.relative_position_onehot = Tensor(np.eye(num_rel, dtype=np.float32)[index])  # (N*N, (2ws-1)^2)

        # One (3*dim, dim) draw for every qkv mode, so the same seed gives the same initial function whichever
        # formulation is chosen: the ablation changes the computation, not the starting weights.
        qkv_weight = initializer(TruncNormal(INIT_STD), (3 * dim, dim)).init_data().asnumpy()
        if qkv == "split":
            self.q, self.k, self.v = (
                Linear(dim, dim, qkv_bias, custom_bprop, weight_init=Tensor(w))
                for w in np.split(qkv_weight, 3))  # rows in q, k, v order, as the fused weight stores them
        else:
            self.qkv = Linear(dim, 3 * dim, qkv_bias, custom_bprop, weight_init=Tensor(qkv_weight))
        # the Split primitive: ops.split's Python is ~30 small graphs per call for the compiler
        self.split_qkv = ops.Split(axis=-1, output_num=3) if qkv == "fused_split" else None
        self.attn_drop = KeyedDropout(attn_drop)
        self.proj = dense(dim, dim, custom_bprop=custom_bprop)
        self.proj_drop = KeyedDropout(proj_drop)
        # a cell, so AMP cell lists (keep softmax in fp32) can reach it
        self.softmax = LastAxisSoftmax(custom_bprop, formulation.fused_cpu)
        self.add_bias = shared(self, AddBroadcast) if custom_bprop else None
        # fp32 attention: bias add and softmax as one C++ pass each way (an fp16 amp policy takes the cells above)
        self.bias_softmax = shared(self, FusedBiasSoftmaxFn) if formulation.fused_cpu else None
        self.fused_dtype = FUSED_DTYPE
        # BatchMatMul primitives, not ops.matmul: the functional form differentiates through explicit Transposes
        # (four per block), the primitive through BatchMatMuls with transpose flags; q @ k^T needs no k^T either
        self.qk_matmul = ops.BatchMatMul(transpose_b=True)
        self.av_matmul = ops.BatchMatMul()

    def _heads(self, x: Tensor) -> Tensor:
        b_, n, _ = x.shape
        x = ops.reshape(x, (b_, n, self.num_heads, self.head_dim))  # (B_, N, heads, hd)
        return self.reorder(x, (0, 2, 1, 3))  # (B_, heads, N, hd)

    def _project_qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        b_, n, _ = x.shape
        if self.qkv_mode == "fused":
            qkv = ops.reshape(self.qkv(x), (b_, n, 3, self.num_heads, self.head_dim))  # (B_, N, 3, heads, hd)
            qkv = self.reorder(qkv, (2, 0, 3, 1, 4))  # (3, B_, heads, N, hd)
            return qkv[0], qkv[1], qkv[2]
        if self.qkv_mode == "split":
            return self._heads(self.q(x)), self._heads(self.k(x)), self._heads(self.v(x))
        q, k, v = self.split_qkv(self.qkv(x))  # 3 x (B_, N, C), the rows of the fused weight in q, k, v order
        return self._heads(q), self._heads(k), self._heads(v)

    def _relative_position_bias(self) -> Tensor:
        table = self.relative_position_bias_table
        if self.rel_pos_bias_mode == "gather":
            bias = ops.gather(table, self.relative_position_index, 0)  # (N*N, heads)
        else:
            bias = ops.matmul(ops.cast(self.relative_position_onehot, table.dtype), table)  # (N*N, heads)
        n = self.window_size * self.window_size
        bias = ops.reshape(bias, (n, n, self.num_heads))  # (N, N, heads)
        return self.reorder(bias, (2, 0, 1))  # (heads, N, N)

    def construct(self, x: Tensor, mask: Tensor | None = None, attn_key: Tensor | None = None,
                  proj_key: Tensor | None = None) -> Tensor:
        """Attend within each window.

        Args:
            x: Windows of tokens, (B*nW, N, C) with N = ws*ws.
            mask: (1, nW, 1, N, N) additive mask for shifted windows, or None.
            attn_key: Dropout key of the attention weights (see KeyedDropout), or None: no dropout.
            proj_key: Dropout key of the output projection, or None.

        Returns:
            (B*nW, N, C).
        """
        b_, n, c = x.shape
        q, k, v = self._project_qkv(x)  # 3 x (B_, heads, N, hd)
        attn = self.qk_matmul(q * self.scale, k)  # (B_, heads, N, N)
        bias = self._relative_position_bias()  # (heads, N, N)
        if mask is not None:
            # one add of bias + mask, precombined per window: (nW, heads, N, N), not two of the big tensor
            nw = mask.shape[1]
            bias = ops.cast(ops.reshape(mask, (nw, 1, n, n)), bias.dtype) + bias  # (nW, heads, N, N)
            attn = ops.reshape(attn, (b_ // nw, nw, self.num_heads, n, n))  # (B, nW, heads, N, N)
        bias = ops.cast(bias, attn.dtype)
        if self.bias_softmax is not None and attn.dtype == self.fused_dtype:
            attn = self.bias_softmax(attn, bias)  # softmax(attn + bias), the bias repeating over B (and nW)
        else:
            # broadcast over B (and nW)
            attn = attn + expand(bias, attn.shape) if self.add_bias is None else self.add_bias(attn, bias)
            attn = self.softmax(attn)
        attn = ops.reshape(attn, (b_, self.num_heads, n, n))  # (B_, heads, N, N)
        attn = self.attn_drop(attn, attn_key)
        x = self.reorder(self.av_matmul(attn, v), (0, 2, 1, 3))  # (B_, N, heads, hd)
        x = ops.reshape(x, (b_, n, c))  # (B_, N, C)
        return self.proj_drop(self.proj(x), proj_key)

    def extend_repr(self) -> str:
        return f"dim={self.dim}, window_size={self.window_size}, num_heads={self.num_heads}, qkv={self.qkv_mode}"


class SwinTransformerBlock(nn.Cell):
    """One Swin block: (shifted) window attention and an MLP, each pre-norm with a residual.

    Args:
        dim: Token width.
        input_resolution: Side of the square feature map this block sees.
        num_heads: Number of attention heads.
        window_size: Requested window side; shrunk to the resolution when that is not larger (official rule).
        shift_size: Cyclic shift; forced to 0 when the window covers the whole map.
        mlp_ratio: MLP hidden width over dim.
        qkv_bias: Whether the q/k/v projections have a bias.
        drop: Dropout rate after attention projection and in the MLP.
        attn_drop: Dropout rate on the attention weights.
        drop_path: Stochastic depth rate of each residual branch; the two branches draw independently.
        formulation: See WindowAttention; `custom_bprop` also reaches layers.Mlp and layers.LastAxisLayerNorm.
        index: Position of the block in the whole model: its branches are rows 2*index (attention) and
            2*index + 1 (MLP) of `drop_scales`, its dropout cells rows 1 + 4*index ... 4 + 4*index of
            `dropout_keys` (attention weights, projection, MLP hidden, MLP output; row 0 is the embedding's).
    """

    def __init__(
        self,
        dim: int,
        input_resolution: int,
        num_heads: int,
        window_size: int = 7,
        shift_size: int = 0,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        drop: float = 0.0,
        attn_drop: float = 0.0,
        drop_path: float = 0.0,
        formulation: Formulation = OFFICIAL,
        index: int = 0,
    ) -> None:
        super().__init__()
        custom_bprop = formulation.custom_bprop
        self.dim = dim
        self.input_resolution = input_resolution
        self.path_row, self.key_row = 2 * index, 1 + 4 * index
        self.window_size, self.shift_size = stage_windows(input_resolution, window_size, shift_size)
        self.windows = TokenWindows(input_resolution, self.window_size, self.shift_size, formulation.permute)
        self.norm1 = LastAxisLayerNorm(dim, custom_bprop, fused=formulation.fused_cpu)
        self.attn = WindowAttention(dim, self.window_size, num_heads, qkv_bias, attn_drop, drop, formulation)
        # timm's drop_path1 / drop_path2: one cell per branch, fed its own row of draws
        self.drop_path1 = DropPath(drop_path) if drop_path > 0.0 else None
        self.drop_path2 = DropPath(drop_path) if drop_path > 0.0 else None
        self.norm2 = LastAxisLayerNorm(dim, custom_bprop, fused=formulation.fused_cpu)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), drop, custom_bprop, fused=formulation.fused_cpu)
        if self.shift_size > 0:
            mask = shifted_window_mask(input_resolution, input_resolution, self.window_size, self.shift_size)
            self.attn_mask = Tensor(mask[None, :, None])  # (1, nW, 1, N, N), broadcasts over batch and heads
        else:
            self.attn_mask = None

    def construct(self, x: Tensor, drop_scales: Tensor | None = None, dropout_keys: Tensor | None = None) -> Tensor:
        """x (B, L, C); the rows of the whole model's drop_scales (branches, B) and dropout_keys (sites, 2), as
        Tensors or as the tuples SwinTransformer unstacks them into; or None."""
        k = self.key_row
        shortcut = x
        x = self.windows.split(self.norm1(x))  # (B*nW, N, C), shifted by -shift_size
        x = self.attn(x, self.attn_mask, _row(dropout_keys, k), _row(dropout_keys, k + 1))  # (B*nW, N, C)
        x = self.windows.merge(x)  # (B, L, C), shifted back
        if self.drop_path1 is not None:
            x = self.drop_path1(x, _row(drop_scales, self.path_row))
        x = shortcut + x
        y = self.mlp(self.norm2(x), _row(dropout_keys, k + 2), _row(dropout_keys, k + 3))
        if self.drop_path2 is not None:
            y = self.drop_path2(y, _row(drop_scales, self.path_row + 1))
        return x + y

    def extend_repr(self) -> str:
        return f"input_resolution={self.input_resolution}, window_size={self.window_size}, shift={self.shift_size}"


def _rows(draws: Tensor | None) -> tuple[Tensor, ...] | None:
    # one Unstack for all sites: indexing the Tensor once per site cost the compiler a dozen small graphs each
    # (~1/5 of all graphs in swin_tiny's train step); a tuple's item is free
    return None if draws is None else ops.unstack(draws, 0)


def _row(draws: Tensor | tuple[Tensor, ...] | None, i: int) -> Tensor | None:
    return None if draws is None else draws[i]


def _every_other_pixel(rows: Tensor, start: int, b: int, hw4: int, c: int) -> Tensor:
    pixels = ops.reshape(rows, (-1, c))  # (B*H/2*W, C), one pixel per row
    return ops.reshape(pixels[start::2], (b, hw4, c))  # (B, H/2*W/2, C): the pixels with w % 2 == start


def merge_2x2_slice(x: Tensor, h: int, w: int) -> Tensor:
    """Official patch merging, (B, H*W, C) -> (B, H/2*W/2, 4C), as concat(x0, x1, x2, x3) of stride-2 slices.

    On MindSpore 2.10 CPU, StridedSliceGrad crashes ("input memory out of bounds") for a stride-2 slice of
    an axis that has a non-unit axis before it, e.g. `x[:, 0::2, 0::2, :]` on (B, H, W, C). Striding the
    leading axis of a 2-D view differentiates correctly, so each slice is taken as rows of a reshape;
    H and W are even, so stepping by 2 across image boundaries keeps the parity per image.

    Args:
        x: Tokens of an h x w map, (B, H*W, C).
        h: Map height, even.
        w: Map width, even.

    Returns:
        (B, H/2*W/2, 4C), channel blocks in the official order.
    """
    b, _, c = x.shape
    hw4 = (h // 2) * (w // 2)
    rows = ops.reshape(x, (b * h, w * c))  # (B*H, W*C), one pixel row per row
    even_h, odd_h = rows[0::2], rows[1::2]  # (B*H/2, W*C) each: the rows with h % 2 == 0, 1
    x0 = _every_other_pixel(even_h, 0, b, hw4, c)  # x[:, 0::2, 0::2]
    x1 = _every_other_pixel(odd_h, 0, b, hw4, c)  # x[:, 1::2, 0::2]
    x2 = _every_other_pixel(even_h, 1, b, hw4, c)  # x[:, 0::2, 1::2]
    x3 = _every_other_pixel(odd_h, 1, b, hw4, c)  # x[:, 1::2, 1::2]
    return ops.concat((x0, x1, x2, x3), -1)  # (B, H/2*W/2, 4C)


def merge_2x2_reshape(x: Tensor, h: int, w: int, reorder: nn.Cell | None = None) -> Tensor:
    """Patch merging without slices; the same channel order x0, x1, x2, x3 as `merge_2x2_slice`."""
    b, _, c = x.shape
    x = ops.reshape(x, (b, h // 2, 2, w // 2, 2, c))  # (B, H/2, dh, W/2, dw, C)
    x = reorder_axes(x, (0, 1, 3, 4, 2, 5), reorder)  # (B, H/2, W/2, dw, dh, C): channel block 2*dw + dh
    return ops.reshape(x, (b, (h // 2) * (w // 2), 4 * c))  # (B, H/2*W/2, 4C)


class PatchMerging(nn.Cell):
    """Downsample 2x: concatenate each 2x2 neighbourhood (4C), LayerNorm, project to 2C without bias.

    Args:
        input_resolution: Side of the square input map; even.
        dim: Input width C.
        formulation: `patch_merging` (one of MERGING_MODES; both give the same function), the `permute` kernel of
            the reshape mode, and `custom_bprop` for the LayerNorm.
    """

    def __init__(self, input_resolution: int, dim: int, formulation: Formulation = OFFICIAL) -> None:
        super().__init__()
        self.reorder = shared(self, Permute, formulation.permute)
        self.input_resolution = input_resolution
        self.dim = dim
        self.mode = formulation.patch_merging
        self.reduction = dense(4 * dim, 2 * dim, has_bias=False)
        self.norm = LastAxisLayerNorm(4 * dim, formulation.custom_bprop, fused=formulation.fused_cpu)

    def construct(self, x: Tensor) -> Tensor:
        r = self.input_resolution
        if self.mode == "slice":
            x = merge_2x2_slice(x, r, r)
        else:
            x = merge_2x2_reshape(x, r, r, self.reorder)
        return self.reduction(self.norm(x))  # (B, H/2*W/2, 2C)

    def extend_repr(self) -> str:
        return f"input_resolution={self.input_resolution}, dim={self.dim}, mode={self.mode}"


class BasicLayer(nn.Cell):
    """One Swin stage: `depth` blocks alternating plain and shifted windows, then optional patch merging.

    Args:
        dim: Token width of the stage.
        input_resolution: Side of the square feature map.
        depth: Number of blocks.
        num_heads: Number of attention heads.
        window_size: Window side; odd blocks shift by window_size // 2.
        mlp_ratio: MLP hidden width over dim.
        qkv_bias: Whether the q/k/v projections have a bias.
        drop: Dropout rate.
        attn_drop: Attention dropout rate.
        drop_path: Stochastic depth rate per block.
        downsample: Whether to end with PatchMerging.
        formulation: See SwinTransformerBlock and PatchMerging.
        first_block: Model-wide index of the stage's first block (see SwinTransformerBlock's `index`).
    """

    def __init__(
        self,
        dim: int,
        input_resolution: int,
        depth: int,
        num_heads: int,
        window_size: int,
        mlp_ratio: float,
        qkv_bias: bool,
        drop: float,
        attn_drop: float,
        drop_path: Sequence[float],
        downsample: bool,
        formulation: Formulation = OFFICIAL,
        first_block: int = 0,
    ) -> None:
        super().__init__()
        self.blocks = nn.CellList(
            [
                SwinTransformerBlock(
                    dim,
                    input_resolution,
                    num_heads,
                    window_size,
                    shift_size=0 if i % 2 == 0 else window_size // 2,
                    mlp_ratio=mlp_ratio,
                    qkv_bias=qkv_bias,
                    drop=drop,
                    attn_drop=attn_drop,
                    drop_path=drop_path[i],
                    formulation=formulation,
                    index=first_block + i,
                )
                for i in range(depth)
            ]
        )
        self.downsample = PatchMerging(input_resolution, dim, formulation) if downsample else None

    def construct(self, x: Tensor, drop_scales: Tensor | None = None, dropout_keys: Tensor | None = None) -> Tensor:
        for blk in self.blocks:
            x = blk(x, drop_scales, dropout_keys)
        if self.downsample is not None:
            x = self.downsample(x)
        return x


class SwinTransformer(nn.Cell):
    """Swin Transformer classifier: patch embedding, hierarchical window-attention stages, pooled linear head.

    Args:
        img_size: Side of the square input image.
        patch_size: Side of a square patch.
        in_chans: Image channels.
        num_classes: Classes of the head; 0 gives no head (features only).
        embed_dim: Width of stage 0; stage i has embed_dim * 2**i.
        depths: Blocks per stage.
        num_heads: Attention heads per stage; each divides its stage width.
        window_size: Window side.
        mlp_ratio: MLP hidden width over the token width.
        qkv_bias: Whether the q/k/v projections have a bias.
        drop_rate: Dropout rate after the embedding, attention projections and MLPs.
        attn_drop_rate: Dropout rate on attention weights.
        drop_path_rate: Stochastic depth rate of the last block; rates rise linearly from 0 over the blocks. The
            masks (and dropout's) are inputs, drawn per micro-batch from counters (models/randomness.py, the
            train step does it); without them the model computes the deterministic function.
        ape: Whether to add a learned absolute position embedding.
        patch_norm: Whether to LayerNorm after the patch embedding.
        qkv: q/k/v projection formulation, one of "fused", "split", "fused_split".
        patch_merging: Patch-merging formulation, one of "slice", "reshape".
        rel_pos_bias: Relative position bias lookup, one of "gather", "onehot".
        custom_bprop: Hand-written backward passes for GELU, softmax, LayerNorm, the Dense biases and the attention
            bias (sums over an axis as MatMuls, GELU's derivative from its forward): the same function and gradients
            up to float rounding, faster where MindSpore's gradient kernels for them are slow (its CPU backend). See
            kernels.py.
        permute: Permutation kernel, one of "transpose" (`ops.transpose`), "mint" (`mint.permute`), "gather" (rows).
        patch_embed: Patch embedding kernel, one of "conv" (`nn.Conv2d`), "matmul" (`layers.PatchMatMul`).
        kernels: "mindspore" (MindSpore's primitives) or "fused_cpu" (GELU as one C++ pass each way, LayerNorm's and
            softmax's backward as one pass per row, compiled on first use: fused_cpu.py; CPU only, float32).

    Raises:
        ConfigError: If the arguments cannot build the official architecture; the message names the key.
    """

    @sharing_function_cells()  # one instance per kind of function cell in this model
    def __init__(
        self,
        img_size: int = 224,
        patch_size: int = 4,
        in_chans: int = 3,
        num_classes: int = 1000,
        embed_dim: int = 96,
        depths: Sequence[int] = (2, 2, 6, 2),
        num_heads: Sequence[int] = (3, 6, 12, 24),
        window_size: int = 7,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        drop_rate: float = 0.0,
        attn_drop_rate: float = 0.0,
        drop_path_rate: float = 0.2,
        ape: bool = False,
        patch_norm: bool = True,
        qkv: str = "fused",
        patch_merging: str = "slice",
        rel_pos_bias: str = "gather",
        custom_bprop: bool = False,
        permute: str = "transpose",
        patch_embed: str = "conv",
        kernels: str = "mindspore",
    ) -> None:
        super().__init__()
        depths, num_heads = _int_tuple("depths", depths), _int_tuple("num_heads", num_heads)
        self.formulation = formulation = Formulation(qkv, patch_merging, rel_pos_bias, custom_bprop, permute,
                                                     patch_embed, kernels)
        _validate(
            img_size, patch_size, in_chans, num_classes, embed_dim, depths, num_heads, window_size, mlp_ratio,
            {"drop_rate": drop_rate, "attn_drop_rate": attn_drop_rate, "drop_path_rate": drop_path_rate},
        )  # fmt: skip
        self.num_classes = num_classes
        self.num_layers = len(depths)
        self.embed_dim = embed_dim
        self.ape = ape
        self.num_features = embed_dim * 2 ** (self.num_layers - 1)

        self.patch_embed = PatchEmbed(img_size, patch_size, in_chans, embed_dim, patch_norm, permute, custom_bprop,
                                      patch_embed, fused=formulation.fused_cpu)
        resolution = self.patch_embed.patches_resolution
        if ape:
            self.absolute_pos_embed = Parameter(
                initializer(TruncNormal(INIT_STD), (1, self.patch_embed.num_patches, embed_dim))
            )  # (1, L, C)
        self.pos_drop = KeyedDropout(drop_rate)

        # stochastic depth decay rule: linear from 0 to drop_path_rate over all blocks
        dpr = np.linspace(0.0, drop_path_rate, sum(depths)).tolist()
        self.layers = nn.CellList(
            [
                BasicLayer(
                    dim=embed_dim * 2**i,
                    input_resolution=resolution // 2**i,
                    depth=depths[i],
                    num_heads=num_heads[i],
                    window_size=window_size,
                    mlp_ratio=mlp_ratio,
                    qkv_bias=qkv_bias,
                    drop=drop_rate,
                    attn_drop=attn_drop_rate,
                    drop_path=dpr[sum(depths[:i]) : sum(depths[: i + 1])],
                    downsample=i < self.num_layers - 1,
                    formulation=formulation,
                    first_block=sum(depths[:i]),
                )
                for i in range(self.num_layers)
            ]
        )
        # per block: attention and MLP branch; dropout: the embedding's, then 4 per block (see SwinTransformerBlock)
        self.random_sites = RandomSites(
            drop_path_rates=tuple(rate for rate in dpr for _ in range(2)),
            dropout_rates=(drop_rate, *(attn_drop_rate, drop_rate, drop_rate, drop_rate) * len(dpr)))
        self.norm = LastAxisLayerNorm(self.num_features, custom_bprop, fused=formulation.fused_cpu)
        self.head = (dense(self.num_features, num_classes, custom_bprop=custom_bprop) if num_classes > 0
                     else nn.Identity())

    def forward_features(self, x: Tensor, drop_scales: Tensor | None = None,
                         dropout_keys: Tensor | None = None) -> Tensor:
        """Images (B, in_chans, H, W) to normalised tokens (B, L, num_features) of the last stage.

        Args:
            x: Images.
            drop_scales: float (branches, B) stochastic-depth factors, or None (no stochastic depth).
            dropout_keys: int64 (dropout sites, 2) keys, or None (no dropout). Both as `randomness.draw` returns
                them for `self.random_sites`.
        """
        drop_scales, dropout_keys = _rows(drop_scales), _rows(dropout_keys)
        x = self.patch_embed(x)  # (B, L, C)
        if self.ape:
            x = x + self.absolute_pos_embed
        x = self.pos_drop(x, _row(dropout_keys, 0))
        for layer in self.layers:
            x = layer(x, drop_scales, dropout_keys)
        return self.norm(x)

    def forward_head(self, x: Tensor) -> Tensor:
        """Tokens (B, L, num_features) to logits (B, num_classes) by average pooling over tokens."""
        return self.head(ops.mean(x, 1))  # (B, num_features) before the head

    def construct(self, x: Tensor, drop_scales: Tensor | None = None, dropout_keys: Tensor | None = None) -> Tensor:
        return self.forward_head(self.forward_features(x, drop_scales, dropout_keys))


def _int_tuple(key: str, value: Any) -> tuple[int, ...]:
    # lists and tuples arrive here (from a Plan or from create_model); a string would iterate into characters
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise ConfigError(f"model.{key}={value!r} must be a list of ints, one per stage, e.g. [2, 2, 6, 2]")
    out = tuple(value)
    if not out or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in out):
        raise ConfigError(f"model.{key}={list(out)} must be a non-empty list of positive ints, one per stage")
    return out


def _resolution_problem(img_size: int, patch_size: int, window_size: int, stages: int) -> str | None:
    """Why the official architecture cannot run at this image size, or None if it can."""
    if img_size % patch_size:
        return f"img_size is not divisible by patch_size={patch_size}"
    r = img_size // patch_size
    for i in range(stages):
        if i > 0:
            if r % 2:
                return f"stage {i - 1} ends with 2x patch merging of an odd {r}x{r} map"
            r //= 2
        if r > window_size and r % window_size:
            return f"stage {i} has a {r}x{r} map, which is neither <= window_size nor divisible by it"
    return None


def _validate(
    img_size: int,
    patch_size: int,
    in_chans: int,
    num_classes: int,
    embed_dim: int,
    depths: tuple[int, ...],
    num_heads: tuple[int, ...],
    window_size: int,
    mlp_ratio: float,
    rates: Mapping[str, float],
) -> None:
    sizes = dict(img_size=img_size, patch_size=patch_size, in_chans=in_chans, embed_dim=embed_dim,
                 window_size=window_size)  # fmt: skip
    for key, value in sizes.items():
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ConfigError(f"model.{key}={value!r} must be a positive int")
    if not isinstance(num_classes, int) or num_classes < 0:
        raise ConfigError(f"model.num_classes={num_classes!r} must be an int >= 0 (0 means no head)")
    if not mlp_ratio > 0:
        raise ConfigError(f"model.mlp_ratio={mlp_ratio!r} must be > 0")
    for key, rate in rates.items():
        if not 0.0 <= rate < 1.0:
            raise ConfigError(f"model.{key}={rate!r} must be in [0, 1)")
    if len(depths) != len(num_heads):
        raise ConfigError(
            f"model.depths={list(depths)} and model.num_heads={list(num_heads)} must have one entry per stage each"
        )
    for i, heads in enumerate(num_heads):
        dim = embed_dim * 2**i
        if dim % heads:
            raise ConfigError(
                f"model.num_heads[{i}]={heads} does not divide the stage-{i} width embed_dim*2**{i}={dim}; "
                f"choose a divisor of {dim} or change model.embed_dim"
            )

    check_resolution(img_size, patch_size, window_size, len(depths))


def check_resolution(img_size: int, patch_size: int, window_size: int, stages: int) -> None:
    """Raise a ConfigError naming the nearest valid sizes when the architecture cannot run at `img_size`."""
    problem = _resolution_problem(img_size, patch_size, window_size, stages)
    if problem is None:
        return
    valid = [c for c in range(patch_size, 4 * img_size + 1, patch_size)
             if _resolution_problem(c, patch_size, window_size, stages) is None]  # fmt: skip
    below = [c for c in valid if c < img_size][-1:]
    above = [c for c in valid if c > img_size][:1]
    raise ConfigError(
        f"model.img_size={img_size} does not fit patch_size={patch_size}, window_size={window_size} and "
        f"{stages} stages: {problem}. The map of stage i, img_size/patch_size/2**i, must be even before each "
        f"merging and a multiple of window_size unless it is <= window_size (then the window shrinks to it). "
        f"Nearest valid model.img_size: {' or '.join(map(str, below + above)) or 'none'}"
    )


class SwinVariant:
    """The registered builder of one Swin size: `name(pretrained=None, **overrides) -> SwinTransformer`.

    Its defaults are those of `conf/model/<name>.yaml` (over `base_swin.yaml`), the one source of each size's
    numbers; they are read on first use, so the registry checks config keys against SwinTransformer's parameters
    plus the weight keys (pretrained.LOAD_DEFAULTS: `pretrained`, `pretrained_resize`, `head_init`, `freeze`), with
    this size's values as the defaults. `pretrained` is a weight file loaded after init (see pretrained.prepare).
    """

    def __init__(self, name: str) -> None:
        self.__name__ = self.__qualname__ = name
        self.__doc__ = f"Build {name} with the defaults of conf/model/{name}.yaml; keyword arguments win."

    @functools.cached_property
    def defaults(self) -> dict[str, Any]:
        from swinexp.models.factory import model_defaults  # factory reads the YAML; it imports the registry only

        return {k: v for k, v in model_defaults(self.__name__).items() if k not in LOAD_DEFAULTS}

    @property
    def __signature__(self) -> inspect.Signature:
        params = list(inspect.signature(SwinTransformer.__init__).parameters.values())[1:]  # drop self
        params = [p.replace(kind=p.KEYWORD_ONLY, default=self.defaults.get(p.name, p.default)) for p in params]
        weights = [inspect.Parameter(k, inspect.Parameter.KEYWORD_ONLY, default=v) for k, v in LOAD_DEFAULTS.items()]
        return inspect.Signature([*params, *weights], return_annotation=SwinTransformer)

    def __call__(self, **overrides: Any) -> SwinTransformer:
        weights = {k: overrides.pop(k) for k in LOAD_DEFAULTS if k in overrides}
        model = SwinTransformer(**{**self.defaults, **overrides})
        prepare(model, **weights)
        return model


SWIN_SIZES = ("swin_micro", "swin_tiny", "swin_small", "swin_base", "swin_large", "swin_base_384")
for _name in SWIN_SIZES:
    MODELS.register(_name)(SwinVariant(_name))
