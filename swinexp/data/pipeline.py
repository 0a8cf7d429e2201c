"""Batches from a DataSpec: decode -> transform -> batch, in MindSpore dataset workers, one epoch at a time."""
from __future__ import annotations

import copy
import logging
import warnings
from collections.abc import Iterator

import mindspore.dataset as msds
import numpy as np

from swinexp.data.datasets import DataSpec
from swinexp.data.decode import DECODE_ERRORS, load_rgb
from swinexp.data.folder import Sample
from swinexp.data.mixup import Mixup
from swinexp.data.targets import BatchTransform, SmoothedTargets
from swinexp.data.transforms import EvalTransform, Transform
from swinexp.registry import ConfigError

log = logging.getLogger(__name__)
MAX_CONSECUTIVE_SKIPS = 50  # more unreadable files in a row means a broken dataset, not a stray bad file


class EpochSampler:
    """Yields `epoch * N + i` for this shard's sample indices i: a fresh permutation per epoch from (seed, epoch).

    Carrying the epoch inside the index lets the source seed each sample's augmentation from (seed, epoch, i)
    without shared state between worker processes.
    """

    def __init__(self, num_samples: int, seed: int, shuffle: bool, num_shards: int = 1, shard_id: int = 0) -> None:
        self.num_samples, self.seed, self.shuffle = num_samples, seed, shuffle
        self.num_shards, self.shard_id = num_shards, shard_id
        self.epoch = 0
        self.start = 0  # samples of the epoch's order to skip (a resumed epoch starts mid-way)

    def indices(self) -> np.ndarray:
        order = (np.random.default_rng([self.seed, self.epoch]).permutation(self.num_samples)
                 if self.shuffle else np.arange(self.num_samples))
        shard = order[self.shard_id::self.num_shards]
        # Shuffled (train) shards are cut to one length so every rank takes the same number of steps and no
        # all-reduce waits for a rank that has run out; the few samples left over differ from epoch to epoch.
        return shard[:self.num_samples // self.num_shards] if self.shuffle else shard

    def __iter__(self) -> Iterator[int]:
        return iter((self.epoch * self.num_samples + self.indices()[self.start:]).tolist())

    def __len__(self) -> int:
        return self.epoch_length() - self.start

    def epoch_length(self) -> int:
        """Samples in a whole epoch of this shard."""
        if self.shuffle:
            return self.num_samples // self.num_shards
        return len(range(self.shard_id, self.num_samples, self.num_shards))


class DecodeTransform:
    """Random-access source: index -> (float32 CHW image, int32 label, int64 epoch-carrying index, int32 skipped).

    An unreadable file (corrupt, truncated, not an image) is logged by name and replaced by the next readable
    sample, as timm's ImageDataset does; `skipped` is 1 for such a sample, so the count reaches the main process
    through the batches even when workers are separate processes.
    """

    def __init__(self, samples: tuple[Sample, ...], transform: Transform, seed: int) -> None:
        self.samples, self.transform, self.seed = samples, transform, seed

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[np.ndarray, np.int32, np.int64, np.int32]:
        epoch, i = divmod(int(index), len(self.samples))
        for attempt in range(min(MAX_CONSECUTIVE_SKIPS, len(self.samples))):
            path, label = self.samples[(i + attempt) % len(self.samples)]
            try:
                rgb = load_rgb(path)
            except DECODE_ERRORS as err:
                log.warning("skipping unreadable image '%s' (%s: %s); using the next sample", path,
                            type(err).__name__, err)
                continue
            image = self.transform(rgb, np.random.default_rng([self.seed, epoch, i]))
            return image, np.int32(label), np.int64(index), np.int32(attempt > 0)
        raise RuntimeError(f"{MAX_CONSECUTIVE_SKIPS} consecutive unreadable images starting at "
                           f"'{self.samples[i][0]}'; check the files under data.root")


class BatchTargets:
    """MindSpore per-batch map: stacks a batch and applies a BatchTransform seeded by the batch's sample indices."""

    def __init__(self, transform: BatchTransform, seed: int) -> None:
        self.transform, self.seed = transform, seed

    def __call__(self, images: list[np.ndarray], labels: list[np.ndarray], indices: list[np.ndarray],
                 skipped: list[np.ndarray], batch_info: object) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        rng = np.random.default_rng([self.seed, *np.stack(indices).tolist()])
        images_out, targets = self.transform(np.stack(images), np.stack(labels), rng)
        return images_out, targets, np.stack(skipped)


class Loader:
    """One split of a dataset; `epoch(e)` iterates its batches as MindSpore tensors.

    A train loader (given `targets`) yields (images, soft targets (B, K)); a val loader yields (images, labels).
    `skipped_files` counts the unreadable files replaced so far in the current epoch (reset by `epoch`).
    """

    def __init__(self, samples: tuple[Sample, ...], transform: Transform, batch_size: int, num_workers: int,
                 seed: int, targets: BatchTransform | None = None, python_multiprocessing: bool = True,
                 num_shards: int = 1, shard_id: int = 0) -> None:
        train = targets is not None
        self.skipped_files = 0
        self.sampler = EpochSampler(len(samples), seed, shuffle=train, num_shards=num_shards, shard_id=shard_id)
        self.batch_size, self.drop_remainder = batch_size, train
        if train and len(self.sampler) < batch_size:
            raise ConfigError(
                f"the train split has {len(self.sampler)} samples, fewer than one batch of "
                f"data.batch_size={batch_size}; lower data.batch_size or add data"
            )
        self._source = DecodeTransform(samples, transform, seed)
        self._targets, self._seed, self._workers = targets, seed, num_workers
        self._multiprocessing = python_multiprocessing and num_workers > 1
        self.dataset = self._pipeline(self.sampler)

    def _pipeline(self, sampler: EpochSampler) -> msds.Dataset:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dataset = msds.GeneratorDataset(self._source, ["image", "label", "index", "skipped"], sampler=sampler,
                                            num_parallel_workers=self._workers,
                                            python_multiprocessing=self._multiprocessing)
        if self._targets is not None:
            return dataset.batch(self.batch_size, drop_remainder=True,
                                 per_batch_map=BatchTargets(self._targets, self._seed),
                                 input_columns=["image", "label", "index", "skipped"],
                                 output_columns=["image", "target", "skipped"])
        return dataset.project(["image", "label", "skipped"]).batch(self.batch_size, drop_remainder=False)

    def __len__(self) -> int:
        full, rest = divmod(self.sampler.epoch_length(), self.batch_size)
        return full + (1 if rest and not self.drop_remainder else 0)

    def epoch(self, epoch: int, start_batch: int = 0) -> Iterator[tuple]:
        """Batches of epoch `epoch` (0-based): images (B, 3, H, W) float32 and targets or labels.

        `start_batch` skips that many batches without reading them; the rest are exactly the batches an uninterrupted
        epoch yields (order and augmentation are drawn from (seed, epoch, sample index)). While it runs,
        `skipped_files` counts the unreadable files replaced in the batches yielded so far.
        """
        self.sampler.epoch = epoch
        self.skipped_files = 0
        dataset = self.dataset
        if start_batch:  # MindSpore fixes a pipeline's length when it is built: a shorter epoch needs its own
            rest = copy.copy(self.sampler)
            rest.start = start_batch * self.batch_size
            dataset = self._pipeline(rest)
        iterator = dataset.create_tuple_iterator(num_epochs=1)
        try:
            for images, targets, skipped in iterator:
                self.skipped_files += int(skipped.asnumpy().sum())
                yield images, targets
        finally:
            # A caller that stops early (limit_train_batches) must not leave this pipeline running: its workers
            # would go on drawing from the shared sampler while the next epoch's pipeline starts.
            iterator.stop()


def build_loaders(spec: DataSpec, train_transform: Transform, seed: int, targets: BatchTransform | None = None,
                  num_shards: int = 1, shard_id: int = 0) -> tuple[Loader, Loader]:
    """Train loader (shuffled per epoch, augmented, full batches, soft targets) and val loader (fixed order,
    eval transform, int labels), each reading shard `shard_id` of `num_shards` (one per data-parallel rank).
    `targets` defaults to one-hot targets without smoothing."""
    targets = targets or SmoothedTargets(spec.num_classes, smoothing=0.0)
    if isinstance(targets, Mixup) and targets.mode == "pair" and spec.batch_size % 2:
        raise ConfigError(f"data.augment.mixup_mode=pair mixes image i with B-1-i and needs an even "
                          f"data.batch_size, got {spec.batch_size}")
    train = Loader(spec.train, train_transform, spec.batch_size, spec.num_workers, seed, targets,
                   spec.python_multiprocessing, num_shards, shard_id)
    val = Loader(spec.val, EvalTransform(spec.img_size, spec.crop_pct), spec.batch_size, spec.num_workers, seed,
                 python_multiprocessing=spec.python_multiprocessing, num_shards=num_shards, shard_id=shard_id)
    return train, val
