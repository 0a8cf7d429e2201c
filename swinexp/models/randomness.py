"""Randomness as data: the stochastic-depth masks and dropout keys of one micro-batch, drawn from counters.

A stateful kernel RNG (MindSpore's dropout) restarts its stream with the process and, in graph mode, gives two
call sites of one cell the same mask; neither a resumed nor a repeated run can then reproduce its draws. Here every
random decision of the model is a pure function of counters instead:

- on the host, `draw(sites, key, step, micro, batch)` runs numpy's Philox, a counter-based generator, once per
  random site (a residual branch or a dropout cell) with its 256-bit counter set to (optimizer step, micro-batch,
  site, 0) and its key derived from (seed, rank) by `philox_key`; the same counters give the same draws in any
  process, in any order;
- stochastic depth is one draw per sample and branch: `DropPath` gets a (B,) column of 0 or 1/(1-p);
- dropout needs one draw per element, too many to send from the host, so each dropout site gets two 32-bit words
  from its Philox stream and `keep_elements` hashes (element index, words) in the graph, statelessly.

The model takes the draws as inputs (`SwinTransformer.construct(x, drop_scales, dropout_keys)`) and does not drop
without them, so evaluation, inspection and every caller that passes images only compute the deterministic function.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from mindspore import Tensor, ops
from mindspore import dtype as mstype

__all__ = ["RandomSites", "draw", "keep_elements", "philox_key"]

_U32 = 0xFFFFFFFF


@dataclass(frozen=True)
class RandomSites:
    """Where a model draws: the rate of each residual branch (2 per block: attention, MLP) and each dropout cell.

    Attributes:
        drop_path_rates: Row i of `drop_scales` belongs to the branch with this rate (0: never dropped).
        dropout_rates: Row j of `dropout_keys` belongs to the dropout cell with this rate (0: identity).
    """

    drop_path_rates: tuple[float, ...]
    dropout_rates: tuple[float, ...]


def philox_key(seed: int, rank: int) -> np.ndarray:
    """The 128-bit Philox key of one process of a run: a hash of (seed, rank), so ranks draw independently."""
    return np.random.SeedSequence([seed & (2**64 - 1), rank]).generate_state(2, np.uint64)


def _stream(key: np.ndarray, step: int, micro: int, site: int) -> np.random.Generator:
    # counter words, lowest first: (position within the site's draws, site, micro-batch, optimizer step)
    return np.random.Generator(np.random.Philox(counter=(step << 192) | (micro << 128) | (site << 64), key=key))


def draw(sites: RandomSites, key: np.ndarray, step: int, micro: int, batch: int) -> tuple[np.ndarray, np.ndarray]:
    """The random inputs of micro-batch `micro` of optimizer step `step`.

    Returns:
        drop_scales: float32 (branches, batch): 1/(1-p) for a kept sample's branch, 0 for a dropped one, 1 where
            p = 0 (timm's drop_path: keep with probability 1-p and rescale).
        dropout_keys: int64 (dropout cells, 2), two 32-bit words per cell (zeros where p = 0).
    """
    scales = np.ones((len(sites.drop_path_rates), batch), np.float32)
    for i, p in enumerate(sites.drop_path_rates):
        if p > 0:
            keep = _stream(key, step, micro, i).random(batch) >= p
            scales[i] = keep.astype(np.float32) / np.float32(1.0 - p)
    keys = np.zeros((len(sites.dropout_rates), 2), np.int64)
    offset = len(sites.drop_path_rates)
    for j, p in enumerate(sites.dropout_rates):
        if p > 0:
            keys[j] = _stream(key, step, micro, offset + j).integers(0, 2**32, 2, dtype=np.int64)
    return scales, keys


def _mul32(x: Tensor, c: int) -> Tensor:
    """(x * c) mod 2^32 for int64 x in [0, 2^32), in 16-bit halves of c so no intermediate exceeds 2^49."""
    lo, hi = c & 0xFFFF, c >> 16
    return ops.bitwise_and(x * lo + ops.bitwise_and(x * hi, 0xFFFF) * 65536, _U32)


def _mix32(x: Tensor) -> Tensor:
    """A 32-bit integer finalizer (lowbias32, C. Wellons): a bijection of [0, 2^32) with full avalanche."""
    x = ops.bitwise_xor(x, ops.floor_divide(x, 1 << 16))
    x = _mul32(x, 0x7FEB352D)
    x = ops.bitwise_xor(x, ops.floor_divide(x, 1 << 15))
    x = _mul32(x, 0x846CA68B)
    return ops.bitwise_xor(x, ops.floor_divide(x, 1 << 16))


def keep_elements(shape: tuple[int, ...], key: Tensor, p: float) -> Tensor:
    """A bool mask of `shape`, each element True with probability 1 - p, a pure function of (`key`, its index).

    Args:
        shape: Static shape of the tensor to drop from (fewer than 2^32 elements).
        key: int64 (2,), a dropout site's row of `dropout_keys`.
        p: Drop probability.
    """
    size = 1
    for d in shape:
        size *= d
    index = ops.arange(0, size, dtype=mstype.int64)
    h = _mix32(ops.bitwise_xor(_mix32(ops.bitwise_xor(index, key[0])), key[1]))  # two rounds: keys do not commute
    return ops.reshape(h >= round(p * 2**32), shape)
