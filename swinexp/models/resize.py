"""Resize position tensors of a Swin checkpoint to another window size or resolution, in numpy (no torch).

Two ways, named by `model.pretrained_resize`:

- `official`: microsoft/Swin-Transformer utils.py `load_pretrained` — each head's ((2W1-1)^2,) bias column as a
  (2W1-1)^2 grid, `F.interpolate(..., mode='bicubic')` (align_corners=False, torch's cubic a=-0.75, edge pixels
  repeated) to (2W2-1)^2; the absolute position embedding the same way on its token grid.
- `timm`: timm 1.0.29 `resize_rel_pos_bias_table` (what `checkpoint_filter_fn` calls): BEiT's geometric progression
  of source offsets (denser near 0), sampled at the integer target offsets by linear interpolation (timm's
  RegularGridInterpolator; edges held). timm's Swin has no absolute position embedding: an `ape` model's embedding
  is resized as `official` in both modes.

Both are separable, so each is written as two weight matrices: out = Wy @ grid @ Wx^T, per channel.
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np

__all__ = ["RESIZE_MODES", "bicubic_matrix", "bicubic_resize", "resize_abs_pos_embed", "resize_positions",
           "resize_rel_pos_table", "timm_matrix"]

RESIZE_MODES = ("official", "timm", "none")  # none: a window size or resolution change is refused
CUBIC_A = -0.75  # torch's (and OpenCV's) bicubic convolution coefficient
TABLE = "relative_position_bias_table"
ABS_POS = "absolute_pos_embed"


def _cubic_weights(t: np.ndarray) -> np.ndarray:
    """Keys' cubic convolution weights of the 4 taps at offsets -1, 0, 1, 2 for fractions t (n,) -> (n, 4)."""
    a = CUBIC_A

    def near(x: np.ndarray) -> np.ndarray:  # |x| <= 1
        return ((a + 2) * x - (a + 3)) * x * x + 1

    def far(x: np.ndarray) -> np.ndarray:  # 1 < |x| < 2
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a

    return np.stack([far(t + 1), near(t), near(1 - t), far(2 - t)], axis=1)


def bicubic_matrix(src: int, dst: int, align_corners: bool = False) -> np.ndarray:
    """(dst, src) matrix of torch's 1-D bicubic upsample_bicubic2d weights: source coordinate
    (i + 0.5) * src / dst - 0.5 (or i * (src-1)/(dst-1) with align_corners), taps clamped to the edge."""
    i = np.arange(dst, dtype=np.float64)
    if align_corners:
        coord = i * ((src - 1) / (dst - 1) if dst > 1 else 0.0)
    else:
        coord = (i + 0.5) * (src / dst) - 0.5  # not clamped at 0 for cubic, as torch does
    base = np.minimum(np.floor(coord), src - 1).astype(np.int64)
    t = np.clip(coord - base, 0.0, 1.0)
    out = np.zeros((dst, src), np.float64)
    taps = np.clip(base[:, None] + np.arange(-1, 3)[None, :], 0, src - 1)  # (dst, 4), repeated edge
    np.add.at(out, (np.repeat(np.arange(dst), 4), taps.reshape(-1)), _cubic_weights(t).reshape(-1))
    return out


def bicubic_resize(grid: np.ndarray, size: tuple[int, int], align_corners: bool = False) -> np.ndarray:
    """torch.nn.functional.interpolate(grid[None], size, mode='bicubic', align_corners=...)[0] in numpy.

    Args:
        grid: (C, H, W) values.
        size: (H2, W2).

    Returns:
        (C, H2, W2), the dtype of `grid`.
    """
    wy = bicubic_matrix(grid.shape[1], size[0], align_corners)
    wx = bicubic_matrix(grid.shape[2], size[1], align_corners)
    return np.einsum("yh,chw,xw->cyx", wy, grid.astype(np.float64), wx).astype(grid.dtype)  # (C, H2, W2)


def _timm_offsets(src: int, dst: int) -> np.ndarray:
    """timm's `_calc`: the src offsets spread as a geometric progression whose half reaches dst // 2."""
    left, right = 1.01, 1.5
    while right - left > 1e-6:  # bisection on the ratio q, in Python floats as timm does
        q = (left + right) / 2.0
        if (1.0 - q ** (src // 2)) / (1.0 - q) > dst // 2:
            right = q
        else:
            left = q
    dis, cur = [], 1.0
    for i in range(src // 2):
        dis.append(cur)
        cur += q ** (i + 1)
    return np.array([-d for d in reversed(dis)] + [0.0] + dis, np.float32)  # torch.tensor(list): float32


def timm_matrix(src: int, dst: int) -> np.ndarray:
    """(dst, src) weights of timm's RegularGridInterpolator from the geometric offsets to integer ones."""
    points = _timm_offsets(src, dst).astype(np.float64)
    half = dst // 2
    x = np.arange(-half, half + 0.1, 1.0, dtype=np.float32).astype(np.float64)  # torch.arange(-ty, ty + 0.1, 1.0)
    right = np.minimum(np.searchsorted(points, x, side="left"), src - 1)  # torch.bucketize(x, p): right=False
    left = np.clip(right - 1, 0, src - 1)
    dist_left = np.maximum(x - points[left], 0.0)
    dist_right = np.maximum(points[right] - x, 0.0)
    both_zero = (dist_left == 0) & (dist_right == 0)
    dist_left[both_zero] = dist_right[both_zero] = 1.0
    out = np.zeros((dst, src), np.float64)
    rows = np.arange(dst)
    total = dist_left + dist_right
    np.add.at(out, (rows, left), dist_right / total)  # the nearer point weighs more
    np.add.at(out, (rows, right), dist_left / total)
    return out


def _side(rows: int, what: str) -> int:
    side = round(rows**0.5)
    if side * side != rows:
        raise ValueError(f"{what} has {rows} rows, not a square grid")
    return side


def resize_rel_pos_table(table: np.ndarray, rows: int, mode: str = "official") -> np.ndarray:
    """A ((2W1-1)^2, heads) relative position bias table resized to (rows, heads), rows = (2W2-1)^2.

    Args:
        table: The checkpoint's table.
        rows: The model's table rows.
        mode: "official" (bicubic) or "timm" (geometric progression + linear); see the module docstring.
    """
    src, dst = _side(table.shape[0], "the file's relative_position_bias_table"), _side(rows, "the model's table")
    grid = table.T.reshape(-1, src, src)  # (heads, S1, S1): row-major (dh, dw) offsets, as the index reads them
    if mode == "official":
        out = bicubic_resize(grid, (dst, dst))
    elif mode == "timm":
        w = timm_matrix(src, dst)
        out = np.einsum("yh,chw,xw->cyx", w, grid.astype(np.float64), w).astype(table.dtype)
    else:
        raise ValueError(f"resize mode {mode!r} is not one of {', '.join(RESIZE_MODES[:2])}")
    return out.reshape(table.shape[1], dst * dst).T  # (S2*S2, heads)


def resize_abs_pos_embed(embed: np.ndarray, tokens: int) -> np.ndarray:
    """A (1, L1, C) absolute position embedding resized bicubically (official) to (1, tokens, C)."""
    src, dst = _side(embed.shape[1], "the file's absolute_pos_embed"), _side(tokens, "the model's absolute_pos_embed")
    grid = embed.reshape(src, src, -1).transpose(2, 0, 1)  # (C, S1, S1)
    return bicubic_resize(grid, (dst, dst)).transpose(1, 2, 0).reshape(1, dst * dst, -1)


def resize_positions(state: Mapping[str, np.ndarray], expected: Mapping[str, tuple[int, ...]],
                     mode: str) -> tuple[dict[str, np.ndarray], tuple[str, ...]]:
    """Resize every bias table and absolute position embedding of `state` whose shape differs from the model's.

    Only the grid side may differ (same heads / channels); anything else is left for the strict shape check.

    Args:
        state: Name to array, already in the model's names.
        expected: The model's parameter name to shape.
        mode: One of RESIZE_MODES; "none" resizes nothing.

    Returns:
        The new state and one line per resized tensor, e.g. "layers.0.blocks.0.attn.relative_position_bias_table
        (169, 3) -> (529, 3) official".
    """
    if mode not in RESIZE_MODES:
        raise ValueError(f"resize mode {mode!r} is not one of {', '.join(RESIZE_MODES)}")
    out, resized = dict(state), []
    for name, value in state.items():
        want = tuple(expected.get(name, value.shape))
        if mode == "none" or want == value.shape or len(want) != value.ndim:
            continue
        if name.endswith(TABLE) and value.ndim == 2 and want[1] == value.shape[1]:
            out[name] = resize_rel_pos_table(value, want[0], mode)
            resized.append(f"{name} {value.shape} -> {want} {mode}")
        elif name.endswith(ABS_POS) and value.ndim == 3 and want[::2] == value.shape[::2]:
            out[name] = resize_abs_pos_embed(value, want[1])
            resized.append(f"{name} {value.shape} -> {want} official")
    return out, tuple(resized)
