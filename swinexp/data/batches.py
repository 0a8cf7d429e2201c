"""Whole batches made in the loader's workers: one message per batch between processes, no batch op in the main
process.

MindSpore's `GeneratorDataset(batch_sampler=...)` still fetches one row per sample and batches them in the main
process (it inserts a `batch` op there), so the workers get batch keys instead: `BatchKeys` yields one key per
batch, `BatchSource[key]` decodes that batch's images one by one, exactly as the per-image source does, and stacks
every column.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Protocol

import numpy as np

__all__ = ["BatchKeys", "BatchSource", "PerImageSource", "batch_count"]


class PerImageSource(Protocol):
    """Epoch-carrying sample index (`epoch * num_samples + i`) -> that sample's columns."""

    def __getitem__(self, index: int) -> tuple[np.ndarray, ...]: ...


def batch_count(samples: int, batch_size: int, drop_remainder: bool) -> int:
    """Batches in an epoch of `samples` samples (the last one short unless `drop_remainder`)."""
    full, rest = divmod(samples, batch_size)
    return full + (1 if rest and not drop_remainder else 0)


class BatchKeys:
    """Sampler of batch keys `epoch * num_batches + b` for the batches b >= `start` of epoch `epoch`.

    The key carries the epoch so a worker process finds the epoch's sample order without state shared with the
    main process.
    """

    def __init__(self, num_batches: int) -> None:
        self.num_batches = num_batches
        self.epoch = 0
        self.start = 0  # batches of the epoch to skip (a resumed epoch starts mid-way)

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.epoch * self.num_batches + self.start, (self.epoch + 1) * self.num_batches))

    def __len__(self) -> int:
        return self.num_batches - self.start


class BatchSource:
    """Random-access source: batch key -> every column of that batch, stacked along a new first axis.

    Args:
        per_image: The per-image source whose rows are stacked.
        order: epoch -> this shard's sample indices i in the epoch's order.
        num_samples: Samples in the split (all shards).
        batch_size: Samples per batch; the last batch of an epoch may be shorter.
        num_batches: Batches per epoch, `batch_count(len(order(e)), batch_size, drop_remainder)`.
    """

    def __init__(self, per_image: PerImageSource, order: Callable[[int], np.ndarray],
                 num_samples: int, batch_size: int, num_batches: int) -> None:
        self.per_image, self.order = per_image, order
        self.num_samples, self.batch_size, self.num_batches = num_samples, batch_size, num_batches
        self._epoch, self._order = -1, np.empty(0, np.int64)  # a worker's cache: one permutation per epoch

    def __len__(self) -> int:
        return self.num_batches

    def sample_indices(self, key: int) -> np.ndarray:
        """The epoch-carrying sample indices of batch `key`, in batch order."""
        epoch, b = divmod(int(key), self.num_batches)
        if epoch != self._epoch:
            self._epoch, self._order = epoch, self.order(epoch)
        return epoch * self.num_samples + self._order[b * self.batch_size:(b + 1) * self.batch_size]

    def __getitem__(self, key: int) -> tuple[np.ndarray, ...]:
        rows = [self.per_image[int(index)] for index in self.sample_indices(key)]
        return tuple(np.stack(column) for column in zip(*rows))
