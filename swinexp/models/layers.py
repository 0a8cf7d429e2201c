"""Swin building blocks that hold no attention: windows, cyclic shift, stochastic depth, MLP, patch embedding.

Everything here is a faithful MindSpore port of the helpers in microsoft/Swin-Transformer
(models/swin_transformer.py) and timm. Tensors are channels-last (B, H, W, C) inside the
stages, as in the official code. The numpy helpers build the constants once at init.
`Linear` and the layers that use `kernels.py`'s cells compute the official function with an optional hand-written
backward (`custom_bprop`), which is faster than MindSpore's autodiff kernels on CPU.
"""
from __future__ import annotations

import numpy as np
from mindspore import Tensor, mint, nn, ops
from mindspore.common.initializer import Initializer

from swinexp.models.kernels import (
    BiasAddFn,
    ExactGELU,
    GatherRowsFn,
    LastAxisLayerNorm,
    Permute,
    expand,
    reorder_axes,
    shared,
)
from swinexp.models.randomness import keep_elements

__all__ = [
    "DropPath",
    "KeyedDropout",
    "Linear",
    "Mlp",
    "PATCH_EMBED_MODES",
    "PatchEmbed",
    "PatchMatMul",
    "TokenWindows",
    "TruncNormal",
    "dense",
    "relative_position_index",
    "roll_hw",
    "shifted_window_mask",
    "stage_windows",
    "window_partition",
    "window_reverse",
    "window_token_order",
]

INIT_STD = 0.02  # timm's trunc_normal_(std=.02) for Linear weights, the bias table and the position embedding


class TruncNormal(Initializer):
    """timm's `trunc_normal_(std, a=-2, b=2)`: a normal clipped to the absolute bounds [a, b].

    Same distribution as MindSpore's `TruncatedNormal(sigma, a=-2, b=2)` but about 7x faster on CPU
    (swin_large builds in ~5 s instead of ~17 s). Seeded from numpy's global state, as MindSpore's own
    initializers are, so `mindspore.set_seed` makes it reproducible.

    Args:
        std: Standard deviation.
        a: Lower bound (absolute, not in units of std: with std .02 it never binds).
        b: Upper bound.
    """

    def __init__(self, std: float = INIT_STD, a: float = -2.0, b: float = 2.0) -> None:
        super().__init__(std=std, a=a, b=b)
        self.std, self.a, self.b = std, a, b

    def _initialize(self, arr: np.ndarray) -> None:
        rng = np.random.default_rng(np.random.randint(1 << 62))
        values = rng.standard_normal(arr.shape, dtype=np.float32) * np.float32(self.std)
        # resample out-of-bounds draws instead of clipping, so the result is the truncated distribution
        out = (values < self.a) | (values > self.b)
        while out.any():
            values[out] = rng.standard_normal(int(out.sum()), dtype=np.float32) * np.float32(self.std)
            out = (values < self.a) | (values > self.b)
        arr[...] = values


class Linear(nn.Dense):
    """`nn.Dense` (parameters `weight` (out, in), `bias`) on inputs of any rank; optionally `BiasAddFn`'s backward.

    A subclass, so AMP's white list (Dense in low precision under O1) still applies; the MatMul and its gradient
    stay MindSpore's own.

    Args:
        in_features: Input width.
        out_features: Output width.
        has_bias: Whether to add a bias.
        custom_bprop: Sum the bias gradient with a MatMul instead of BiasAddGrad.
        weight_init: Initial weight (out, in); default trunc_normal(std=.02).
    """

    def __init__(self, in_features: int, out_features: int, has_bias: bool = True, custom_bprop: bool = False,
                 weight_init: Initializer | Tensor | str | None = None) -> None:
        weight_init = TruncNormal(INIT_STD) if weight_init is None else weight_init
        super().__init__(in_features, out_features, weight_init=weight_init, bias_init="zeros", has_bias=has_bias)
        self.fn = shared(self, LinearFn, has_bias, custom_bprop)

    def construct(self, x: Tensor) -> Tensor:
        return self.fn(x, self.weight, self.bias)  # no super().construct (see ExactGELU)


class LinearFn(nn.Cell):
    """x (..., in) @ weight.T + bias, for the Linear layers of a model (one shared instance per kind)."""

    def __init__(self, has_bias: bool, custom_bprop: bool) -> None:
        super().__init__()
        self.matmul = ops.MatMul(transpose_b=True)
        self.bias_add = ops.BiasAdd()
        self.has_bias = has_bias
        self.bias_fn = BiasAddFn() if custom_bprop and has_bias else None

    def construct(self, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        shape = x.shape
        y = self.matmul(ops.reshape(x, (-1, shape[-1])), weight)  # (R, out)
        if self.bias_fn is not None:
            # an explicit cast, so that under amp o2/o3 its autodiff returns the fp32 parameter's gradient in fp32
            # (a parameter handed to a hand-written bprop would get the fp16 gradient)
            y = self.bias_fn(y, ops.cast(bias, y.dtype))
        elif self.has_bias:
            y = self.bias_add(y, bias)
        return ops.reshape(y, shape[:-1] + (weight.shape[0],))


def dense(in_features: int, out_features: int, has_bias: bool = True, custom_bprop: bool = False) -> Linear:
    """A Linear layer with Swin's init: weight ~ trunc_normal(std=.02), bias zeros.

    Args:
        in_features: Input width.
        out_features: Output width; the weight has PyTorch's (out, in) layout.
        has_bias: Whether to add a bias.
        custom_bprop: See `Linear`.

    Returns:
        The initialised `Linear` (an `nn.Dense`).
    """
    return Linear(in_features, out_features, has_bias=has_bias, custom_bprop=custom_bprop)


def window_partition(x: Tensor, window_size: int, reorder: nn.Cell | None = None) -> Tensor:
    """Split (B, H, W, C) into (B*nW, ws, ws, C) non-overlapping windows; H and W must divide by ws.

    Args:
        x: Channels-last feature map.
        window_size: Side of a square window.
        reorder: The permutation kernel (a `Permute`); None: `ops.transpose`.

    Returns:
        Windows ordered batch-major, then row-major over the window grid (the official order).
    """
    b, h, w, c = x.shape
    ws = window_size
    x = ops.reshape(x, (b, h // ws, ws, w // ws, ws, c))  # (B, H/ws, ws, W/ws, ws, C)
    x = reorder_axes(x, (0, 1, 3, 2, 4, 5), reorder)  # (B, H/ws, W/ws, ws, ws, C)
    return ops.reshape(x, (-1, ws, ws, c))  # (B*nW, ws, ws, C)


def window_reverse(windows: Tensor, window_size: int, h: int, w: int, reorder: nn.Cell | None = None) -> Tensor:
    """Inverse of `window_partition`: (B*nW, ws, ws, C) back to (B, H, W, C).

    Args:
        windows: Output of `window_partition` (or anything of that layout).
        window_size: Side of a square window.
        h: Height of the feature map.
        w: Width of the feature map.
        reorder: The permutation kernel (a `Permute`); None: `ops.transpose`.

    Returns:
        The reassembled channels-last feature map.
    """
    ws = window_size
    c = windows.shape[-1]
    b = windows.shape[0] // ((h // ws) * (w // ws))
    x = ops.reshape(windows, (b, h // ws, w // ws, ws, ws, c))  # (B, H/ws, W/ws, ws, ws, C)
    x = reorder_axes(x, (0, 1, 3, 2, 4, 5), reorder)  # (B, H/ws, ws, W/ws, ws, C)
    return ops.reshape(x, (b, h, w, c))  # (B, H, W, C)


def roll_hw(x: Tensor, shift: int) -> Tensor:
    """`torch.roll(x, (shift, shift), dims=(1, 2))` for (B, H, W, C), as a split and a concat per axis.

    MindSpore 2.10 has no CPU kernel for `ops.roll`/`mint.roll` ("The kernel Roll unregistered"). A split
    differentiates to a concat, where slices would each need a zero-filled StridedSliceGrad.

    Args:
        x: Channels-last feature map.
        shift: Positive rolls towards higher indices (as torch.roll); Swin uses -ws//2 before attention.

    Returns:
        The rolled map, same shape as `x`.
    """
    if shift == 0:
        return x
    for axis in (1, 2):
        n = x.shape[axis]
        k = shift % n  # torch.roll(x, k)[i] == x[i - k]: the last k rows come first
        head, tail = ops.split(x, (n - k, k), axis)
        x = ops.concat((tail, head), axis)
    return x


def window_token_order(resolution: int, window_size: int, shift: int) -> np.ndarray:
    """The rows of a (B, H*W, C) map that `roll_hw(-shift)` then `window_partition` put in (B*nW*N) order.

    Output row r is input row order[r]: the cyclic shift and the partition compose into one permutation of the
    H*W tokens (np.roll by -shift, then row-major windows of row-major tokens).
    """
    r, ws = resolution, window_size
    tokens = np.roll(np.arange(r * r).reshape(r, r), (-shift, -shift), (0, 1))  # the rolled map's token ids
    return tokens.reshape(r // ws, ws, r // ws, ws).transpose(0, 2, 1, 3).reshape(-1).astype(np.int32)


class TokenWindows(nn.Cell):
    """A block's change of layout: (B, L, C) tokens -> shifted by -shift -> (B*nW, N, C) windows, and back.

    With `Permute("gather")` each direction is one row Gather by `window_token_order` (the backward gathers by its
    inverse): one kernel, and one small graph for the compiler, where `roll_hw` + `window_partition` are a split, a
    concat and a permutation per axis. Otherwise those, with the permutation kernel of `permute`.

    Args:
        resolution: Side of the square feature map, H = W.
        window_size: Side of a window; divides `resolution`.
        shift: The cyclic shift before attention (undone after), 0 for none.
        permute: The permutation kernel, one of PERMUTE_MODES.
    """

    def __init__(self, resolution: int, window_size: int, shift: int, permute: str = "transpose") -> None:
        super().__init__()
        self.resolution, self.window_size, self.shift = resolution, window_size, shift
        self.reorder = shared(self, Permute, permute)
        if permute == "gather":
            order = window_token_order(resolution, window_size, shift)
            self.order, self.inverse = Tensor(order), Tensor(np.argsort(order).astype(np.int32))
            self.rows = shared(self, GatherRowsFn)
        else:
            self.rows = None

    def split(self, x: Tensor) -> Tensor:
        """(B, L, C) -> (B*nW, N, C), the windows of the map rolled by -shift."""
        b, _, c = x.shape
        r, ws = self.resolution, self.window_size
        if self.rows is not None:
            return ops.reshape(self.rows(x, self.order, self.inverse), (-1, ws * ws, c))
        x = roll_hw(ops.reshape(x, (b, r, r, c)), -self.shift)  # (B, H, W, C)
        return ops.reshape(window_partition(x, ws, self.reorder), (-1, ws * ws, c))

    def merge(self, x: Tensor) -> Tensor:
        """(B*nW, N, C) -> (B, L, C): the inverse of `split`."""
        c = x.shape[-1]
        r, ws = self.resolution, self.window_size
        b = x.shape[0] // ((r // ws) * (r // ws))
        if self.rows is not None:
            return self.rows(ops.reshape(x, (b, r * r, c)), self.inverse, self.order)
        x = window_reverse(ops.reshape(x, (-1, ws, ws, c)), ws, r, r, self.reorder)  # (B, H, W, C)
        return ops.reshape(roll_hw(x, self.shift), (b, r * r, c))

    def extend_repr(self) -> str:
        return f"window_size={self.window_size}, shift={self.shift}"


def stage_windows(resolution: int, window_size: int, shift_size: int) -> tuple[int, int]:
    """The official rule: a window not smaller than the map shrinks to the map and is not shifted.

    Args:
        resolution: Side of the square feature map.
        window_size: Requested window side.
        shift_size: Requested cyclic shift.

    Returns:
        (window_size, shift_size) actually used at this resolution.
    """
    if resolution <= window_size:
        return resolution, 0
    return window_size, shift_size


def relative_position_index(window_size: int) -> np.ndarray:
    """Index into the ((2ws-1)^2, heads) bias table for every (query, key) pair of one window.

    Args:
        window_size: Side of a square window.

    Returns:
        int32 array (ws*ws, ws*ws); entry [i, j] encodes the offset of token i relative to token j.
    """
    ws = window_size
    coords = np.stack(np.meshgrid(np.arange(ws), np.arange(ws), indexing="ij"))  # (2, ws, ws)
    coords = coords.reshape(2, -1)  # (2, N)
    rel = coords[:, :, None] - coords[:, None, :]  # (2, N, N), offsets in [-(ws-1), ws-1]
    rel = rel.transpose(1, 2, 0) + (ws - 1)  # (N, N, 2), shifted to start at 0
    return (rel[..., 0] * (2 * ws - 1) + rel[..., 1]).astype(np.int32)  # (N, N), row-major (dh, dw)


def shifted_window_mask(h: int, w: int, window_size: int, shift_size: int) -> np.ndarray:
    """The official SW-MSA mask: -100 between tokens that the cyclic shift brought from different regions.

    After rolling by -shift, the last `window_size` rows (and columns) of the map hold up to three
    regions that were not adjacent in the image; the mask stops attention across them.

    Args:
        h: Height of the feature map.
        w: Width of the feature map.
        window_size: Side of a square window.
        shift_size: The cyclic shift, 0 < shift_size < window_size.

    Returns:
        float32 array (nW, N, N) with 0 for same-region pairs and -100 otherwise, N = ws*ws.
    """
    ws, s = window_size, shift_size
    img_mask = np.zeros((1, h, w, 1), np.float32)  # (1, H, W, 1) region id per position
    bands = (slice(0, -ws), slice(-ws, -s), slice(-s, None))
    for i, (hs, wsl) in enumerate((hs, wsl) for hs in bands for wsl in bands):
        img_mask[:, hs, wsl, :] = i
    win = img_mask.reshape(1, h // ws, ws, w // ws, ws, 1)  # (1, H/ws, ws, W/ws, ws, 1)
    win = win.transpose(0, 1, 3, 2, 4, 5).reshape(-1, ws * ws)  # (nW, N) region ids per window
    diff = win[:, None, :] - win[:, :, None]  # (nW, N, N)
    return np.where(diff != 0, -100.0, 0.0).astype(np.float32)


class DropPath(nn.Cell):
    """Stochastic depth: scale each sample's residual branch by its host-drawn factor, 0 (dropped) or 1/(1-p).

    The factors come from `randomness.draw` (keep probability 1 - `drop_prob`, timm's semantics); the cell holds no
    RNG. It is the identity without them and when it is not training.

    Args:
        drop_prob: Probability of dropping the branch, in [0, 1) (only for the model's `RandomSites` and repr).
    """

    def __init__(self, drop_prob: float) -> None:
        super().__init__()
        self.drop_prob = drop_prob

    def construct(self, x: Tensor, scale: Tensor | None = None) -> Tensor:
        """x (B, ...) times scale (B,) broadcast over the other axes; x itself when `scale` is None."""
        if scale is None or not self.training:
            return x
        return x * expand(ops.reshape(ops.cast(scale, x.dtype), (x.shape[0],) + (1,) * (x.ndim - 1)), x.shape)

    def extend_repr(self) -> str:
        return f"drop_prob={self.drop_prob}"


class KeyedDropout(nn.Cell):
    """Dropout whose mask is a stateless hash of (the site's key, element index) (`randomness.keep_elements`).

    Kept elements are scaled by 1/(1-p). The identity without a key, when p is 0 and when not training.

    Args:
        p: Drop probability, in [0, 1).
    """

    def __init__(self, p: float = 0.0) -> None:
        super().__init__()
        self.p = p

    def construct(self, x: Tensor, key: Tensor | None = None) -> Tensor:
        if key is None or self.p == 0.0 or not self.training:
            return x
        keep = ops.cast(keep_elements(x.shape, key, self.p), x.dtype)
        return x * keep * (1.0 / (1.0 - self.p))

    def extend_repr(self) -> str:
        return f"p={self.p}"


class Mlp(nn.Cell):
    """Transformer feed-forward: fc1 -> GELU (exact erf) -> dropout -> fc2 -> dropout (timm's drop1, drop2).

    Args:
        in_features: Input and output width.
        hidden_features: Width of the hidden layer (dim * mlp_ratio in Swin).
        drop: Dropout rate after the activation and after fc2.
        custom_bprop: Hand-written backward passes for the Dense biases and GELU (see `Linear`, `ExactGELU`).
        fused: GELU as the fused CPU kernel (`ExactGELU`'s `fused`).
    """

    def __init__(self, in_features: int, hidden_features: int, drop: float = 0.0, custom_bprop: bool = False,
                 fused: bool = False) -> None:
        super().__init__()
        self.fc1 = dense(in_features, hidden_features, custom_bprop=custom_bprop)
        self.act = ExactGELU(custom_bprop, fused)
        self.fc2 = dense(hidden_features, in_features, custom_bprop=custom_bprop)
        self.drop1 = KeyedDropout(drop)
        self.drop2 = KeyedDropout(drop)

    def construct(self, x: Tensor, key1: Tensor | None = None, key2: Tensor | None = None) -> Tensor:
        """key1, key2: the dropout keys of the two sites (see KeyedDropout); None computes without dropout."""
        x = self.drop1(self.act(self.fc1(x)), key1)
        return self.drop2(self.fc2(x), key2)


PATCH_EMBED_MODES = ("conv", "matmul")


class PatchMatMul(nn.Conv2d):
    """A conv whose kernel is its stride (no padding), computed as one MatMul of the flattened patches.

    The same function and parameters as `nn.Conv2d` (weight (out, in, p, p), bias; the same initial draws), but it
    returns channels-last tokens (B, H/p*W/p, out), the layout the Swin stages take. MindSpore 2.10's CPU backend runs
    the patch embedding's Conv2D in oneDNN's reference fallback (`jit_uni_ncsp:conv+ref`, plain NCHW): ~270 ms
    forward for swin_tiny's batch of 4 at 224 px, where this MatMul takes ~6 ms (BENCHMARKS.md). A subclass, so AMP
    lists that name `Conv2d` still apply.

    Args:
        in_chans: Image channels.
        out_channels: Token width.
        patch_size: Side of a square patch: the kernel and the stride.
        custom_bprop: Sum the bias gradient with a MatMul instead of BiasAddGrad (see `Linear`).
    """

    def __init__(self, in_chans: int, out_channels: int, patch_size: int, custom_bprop: bool = False) -> None:
        super().__init__(in_chans, out_channels, kernel_size=patch_size, stride=patch_size, pad_mode="valid",
                         has_bias=True)
        self.patch_size = patch_size
        self.rows_matmul = ops.MatMul(transpose_b=True)
        self.add_bias = ops.BiasAdd()
        self.bias_fn = shared(self, BiasAddFn) if custom_bprop else None

    def construct(self, x: Tensor) -> Tensor:
        b, c, h, w = x.shape  # no super().construct (see ExactGELU)
        p = self.patch_size
        patches = ops.reshape(x, (b, c, h // p, p, w // p, p))
        # (B, H/p, W/p, C, p, p): one patch per row, in the weight's (in, kh, kw) order. mint.permute: the images carry
        # no gradient, so its slow backward never runs, and its forward costs ~6 ms at batch 4; with ops.transpose or
        # a row Gather here swin_tiny's peak at batch 16 was 4.60 GiB, against 3.82 (BENCHMARKS.md)
        patches = mint.permute(patches, (0, 2, 4, 1, 3, 5))
        rows = ops.reshape(patches, (-1, c * p * p))  # (B*L, C*p*p)
        weight = ops.reshape(ops.cast(self.weight, x.dtype), (self.out_channels, -1))  # (out, C*p*p)
        y = self.rows_matmul(rows, weight)  # (B*L, out)
        bias = ops.cast(self.bias, y.dtype)  # explicit casts: fp32 parameter gradients under amp o2/o3 (`Linear`)
        y = self.add_bias(y, bias) if self.bias_fn is None else self.bias_fn(y, bias)
        return ops.reshape(y, (b, (h // p) * (w // p), self.out_channels))


class PatchEmbed(nn.Cell):
    """Image to patch tokens: a patch_size-strided conv, then an optional LayerNorm.

    The conv keeps MindSpore's default init, which is PyTorch's Conv2d default (as in the official code).

    Args:
        img_size: Side of the square input image; divisible by patch_size.
        patch_size: Side of a square patch.
        in_chans: Image channels.
        embed_dim: Token width.
        patch_norm: Whether to LayerNorm the tokens.
        permute_mode: The permutation kernel, one of PERMUTE_MODES.
        custom_bprop: `LastAxisLayerNorm`'s hand-written LayerNorm (and `PatchMatMul`'s bias gradient).
        kernel: One of PATCH_EMBED_MODES: "conv" is `nn.Conv2d` (the official), "matmul" `PatchMatMul`.
        fused: The LayerNorm's fused CPU backward (`LastAxisLayerNorm`'s `fused`).
    """

    def __init__(self, img_size: int, patch_size: int, in_chans: int, embed_dim: int, patch_norm: bool,
                 permute_mode: str = "transpose", custom_bprop: bool = False, kernel: str = "conv",
                 fused: bool = False) -> None:
        super().__init__()
        # the conv's (B, C, L) -> (B, L, C) as a function, not a `Permute` cell: MindSpore 2.10's O1 rewrite of a
        # PatchEmbed holding one generates code naming a class it never defines (NameError: PermuteOpt_1); for this
        # permutation the `Permute` modes are ops.transpose ("transpose", "gather") or mint.permute ("mint")
        self.tokens_by_mint = permute_mode == "mint"
        self.img_size = img_size
        self.patch_size = patch_size
        self.patches_resolution = img_size // patch_size
        self.num_patches = self.patches_resolution**2
        self.kernel = kernel
        if kernel == "matmul":
            self.proj = PatchMatMul(in_chans, embed_dim, patch_size, custom_bprop)
        else:
            self.proj = nn.Conv2d(
                in_chans, embed_dim, kernel_size=patch_size, stride=patch_size, pad_mode="valid", has_bias=True
            )
        self.norm = LastAxisLayerNorm(embed_dim, custom_bprop, fused=fused) if patch_norm else None

    def construct(self, x: Tensor) -> Tensor:
        x = self.proj(x)  # conv: (B, C, H/p, W/p); matmul: already (B, H/p*W/p, C)
        if self.kernel == "conv":
            b, c, h, w = x.shape
            x = ops.reshape(x, (b, c, h * w))  # (B, C, L)
            x = mint.permute(x, (0, 2, 1)) if self.tokens_by_mint else ops.transpose(x, (0, 2, 1))  # (B, L, C)
        if self.norm is not None:
            x = self.norm(x)
        return x

    def extend_repr(self) -> str:
        return f"kernel={self.kernel}"
