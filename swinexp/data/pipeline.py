"""Batches from a DataSpec: decode -> transform to uint8 -> stack whole batches in MindSpore dataset workers, then
the device prologue (normalize, erase, mix), one epoch at a time."""
from __future__ import annotations

import copy
import logging
import warnings
from collections.abc import Iterator

import mindspore.dataset as msds
import numpy as np
from mindspore import Tensor

from swinexp.data.batches import BatchKeys, BatchSource, batch_count
from swinexp.data.datasets import DataSpec
from swinexp.data.decode import load_rgb, read_in_slot
from swinexp.data.erasing import RandomErasing
from swinexp.data.folder import Sample
from swinexp.data.mixup import Mixup
from swinexp.data.native import (
    EncodedSource,
    NativeTransform,
    native_dataset,
    native_of,
    seed_epoch,
    unreadable_file_error,
)
from swinexp.data.prologue import Prologue
from swinexp.data.shm import fitting_prefetch, free_shm, queue_bytes
from swinexp.data.targets import BatchTransform, MixDraws, SmoothedTargets
from swinexp.data.transforms import EvalTransform, PixelTransform
from swinexp.registry import ConfigError

log = logging.getLogger(__name__)


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

    def indices(self, epoch: int | None = None) -> np.ndarray:
        """This shard's sample indices in the order of epoch `epoch` (default: `self.epoch`)."""
        epoch = self.epoch if epoch is None else epoch
        order = (np.random.default_rng([self.seed, epoch]).permutation(self.num_samples)
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
    """Random-access source: index -> (uint8 HWC pixels, int32 label, int64 epoch-carrying index, int32 skipped,
    and with `erasing` the image's erase draws: int32 boxes (R, 4), float32 colours (R, 3), int64 keys (R, 2)).

    The pixels are the transform's output before normalization (`pixels`); normalization, erasing and mixing run
    on the device (`swinexp.data.prologue`). The erase draws come from the image's generator right after its pixel
    transform, where timm's RandomErasing draws them. An unreadable file (corrupt, truncated, not an image) is
    logged by name and replaced by the next readable sample, as timm's ImageDataset does; `skipped` is 1 for such a
    sample, so the count reaches the main process through the batches even when workers are separate processes.
    """

    def __init__(self, samples: tuple[Sample, ...], transform: PixelTransform, seed: int,
                 erasing: RandomErasing | None = None) -> None:
        if not callable(getattr(transform, "pixels", None)):
            raise TypeError(f"{type(transform).__name__} has no pixels(img, rng) method: the loader's workers send "
                            "uint8 pixels and normalize on the device (see swinexp.data.transforms.PixelTransform)")
        self.samples, self.transform, self.seed, self.erasing = samples, transform, seed, erasing

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[np.ndarray, ...]:
        epoch, i = divmod(int(index), len(self.samples))
        rgb, label, skipped = read_in_slot(self.samples, i, load_rgb)
        rng = np.random.default_rng([self.seed, epoch, i])
        pixels = self.transform.pixels(rgb, rng)
        row = (pixels, np.int32(label), np.int64(index), np.int32(skipped))
        if self.erasing is None:
            return row
        draws = self.erasing.draw((pixels.shape[2], *pixels.shape[:2]), rng)
        return (*row, draws.boxes, draws.colours, draws.keys)


COLUMNS = ["image", "label", "index", "skipped"]
ERASE_COLUMNS = ["erase_boxes", "erase_colours", "erase_keys"]


class Loader:
    """One split of a dataset; `epoch(e)` iterates its batches as MindSpore tensors.

    A train loader (given `targets`) yields (images, soft targets (B, K)); a val loader yields (images, labels).
    Workers decode and transform to uint8 pixels and stack whole batches (`swinexp.data.batches`: one message per
    batch, nothing per image in the main process); the main process draws the batch's Mixup/CutMix from its sample
    indices and computes the targets, and the device prologue turns the uint8 batch into the normalized, erased,
    mixed float32 batch.
    `skipped_files` counts the unreadable files replaced so far in the current epoch (reset by `epoch`).
    `prefetch` is the MindSpore prefetch size its worker processes run with, lowered at build time until their
    result queues fit in /dev/shm (`swinexp.data.shm`); None without worker processes.
    """

    def __init__(self, samples: tuple[Sample, ...], transform: PixelTransform | NativeTransform, batch_size: int,
                 num_workers: int, seed: int, targets: BatchTransform | None = None,
                 python_multiprocessing: bool = True, num_shards: int = 1, shard_id: int = 0, jit: bool = True) -> None:
        train = targets is not None
        self.skipped_files = 0
        self.sampler = EpochSampler(len(samples), seed, shuffle=train, num_shards=num_shards, shard_id=shard_id)
        self.batch_size, self.drop_remainder = batch_size, train
        if train and len(self.sampler) < batch_size:
            raise ConfigError(
                f"the train split has {len(self.sampler)} samples, fewer than one batch of "
                f"data.batch_size={batch_size}; lower data.batch_size or add data"
            )
        erasing = getattr(transform, "erasing", None) if train else None
        self._source = BatchSource(DecodeTransform(samples, transform, seed, erasing), self.sampler.indices,
                                   len(samples), batch_size, len(self))
        self.keys = BatchKeys(len(self))
        self._native = (EncodedSource(samples, transform, seed, erasing)  # data.pipeline=native
                        if isinstance(transform, NativeTransform) else None)
        self._columns = COLUMNS + (ERASE_COLUMNS if erasing is not None else [])
        self._targets, self._seed, self._workers = targets, seed, num_workers
        self._multiprocessing = python_multiprocessing and num_workers > 1
        self.prefetch = self._shm_prefetch() if self._multiprocessing and self._native is None else None
        self.prologue = Prologue(transform.mean, transform.std, erasing.mode if erasing is not None else None,
                                 mixes=not isinstance(targets, SmoothedTargets), jit=jit)
        self.dataset = self._pipeline()

    def _shm_prefetch(self) -> int:
        """MindSpore's prefetch size lowered, if need be, until the workers' result queues fit in /dev/shm."""
        batch_bytes = self.batch_size * sum(np.asarray(column).nbytes for column in self._source.per_image[0])
        wanted, free = msds.config.get_prefetch_size(), free_shm()
        prefetch = fitting_prefetch(batch_bytes, self._workers, wanted, free)
        if prefetch < wanted:
            log.warning("/dev/shm has %.0f MB free: prefetch size lowered from %d to %d so the result queues of %d "
                        "worker processes fit (%.0f MB); a larger --shm-size keeps the deeper queues", free / 2**20,
                        wanted, prefetch, self._workers, queue_bytes(batch_bytes, self._workers, prefetch) / 2**20)
        return prefetch

    def _pipeline(self, start_batch: int = 0) -> msds.Dataset:
        """The epoch's pipeline from batch `start_batch` on (0: the shared one, whose samplers follow the epoch)."""
        if self._native is not None:  # per image through MindSpore's vision ops, batched by MindSpore
            sampler = self.sampler
            if start_batch:
                sampler = copy.copy(sampler)
                sampler.start = start_batch * self.batch_size
            return native_dataset(self._native, self._columns, sampler, self._workers, self.batch_size,
                                  self.drop_remainder)
        keys = self.keys
        if start_batch:
            keys = copy.copy(keys)
            keys.start = start_batch
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return msds.GeneratorDataset(self._source, self._columns, sampler=keys,
                                         num_parallel_workers=self._workers,
                                         python_multiprocessing=self._multiprocessing)

    def __len__(self) -> int:
        return batch_count(self.sampler.epoch_length(), self.batch_size, self.drop_remainder)

    def raw_epoch(self, epoch: int, start_batch: int = 0) -> Iterator[tuple[Tensor, ...]]:
        """The batches as the workers send them: uint8 (B, H, W, 3) pixels, labels, indices, skipped flags (and
        the erase draws); `epoch` runs the prologue on these."""
        self.sampler.epoch = self.keys.epoch = epoch
        self.skipped_files = 0
        dataset = self.dataset
        if start_batch:  # MindSpore fixes a pipeline's length when it is built: a shorter epoch needs its own
            dataset = self._pipeline(start_batch)
        if self._native is not None and self._targets is not None:
            seed_epoch(self._seed, epoch)
        if self.prefetch is not None and msds.config.get_prefetch_size() > self.prefetch:
            # A global: the worker pool reads it when the iterator starts it. Only ever lowered, so another
            # loader's queues can only get shallower, never outgrow the space this one was checked against.
            msds.config.set_prefetch_size(self.prefetch)
        iterator = dataset.create_tuple_iterator(num_epochs=1)
        batch = start_batch
        try:
            for row in iterator:
                self.skipped_files += int(row[3].asnumpy().sum())
                yield tuple(row)
                batch += 1
        except RuntimeError as err:
            named = None
            if self._native is not None:
                named = unreadable_file_error(self._native, self._read_ahead(epoch, batch))
            if named is None:
                raise
            raise named from err
        finally:
            # A caller that stops early (limit_train_batches) must not leave this pipeline running: its workers
            # would go on drawing from the shared sampler while the next epoch's pipeline starts.
            iterator.stop()

    def _read_ahead(self, epoch: int, batch: int) -> np.ndarray:
        """The samples a native pipeline may have read when batch `batch` failed: its own and those MindSpore's
        queues (prefetch size rows or batches each) and map threads can hold beyond it."""
        window = (msds.config.get_prefetch_size() + 2) * (self.batch_size + self._workers)
        start = batch * self.batch_size
        return self.sampler.indices(epoch)[start:start + window]

    def host_part(self, row: tuple[Tensor, ...]) -> tuple[MixDraws, Tensor]:
        """The main process's share of a raw train batch: its Mixup/CutMix draws and its targets (B, K).

        The draws come from a generator seeded by (seed, the batch's epoch-carrying sample indices), so a resumed
        epoch redraws exactly what the uninterrupted one drew.
        """
        pixels, labels = row[0], row[1]
        batch, height, width = pixels.shape[:3]
        rng = np.random.default_rng([self._seed, *row[2].asnumpy().tolist()])
        draws = self._targets.draw(batch, height, width, rng)
        return draws, Tensor(self._targets.targets(labels.asnumpy(), draws))

    def finish(self, row: tuple[Tensor, ...]) -> tuple[Tensor, Tensor]:
        """One raw batch -> (float32 (B, 3, H, W) images, targets (B, K) or labels (B,)) through the prologue."""
        if self._targets is None:
            return self.prologue.eval(row[0]), row[1]
        draws, targets = self.host_part(row)
        return self.prologue.train(row[0], tuple(row[4:7]) if len(row) > 4 else None, draws), targets

    def epoch(self, epoch: int, start_batch: int = 0) -> Iterator[tuple[Tensor, Tensor]]:
        """Batches of epoch `epoch` (0-based): images (B, 3, H, W) float32 and targets or labels.

        `start_batch` skips that many batches without reading them; the rest are exactly the batches an uninterrupted
        epoch yields (order and augmentation are drawn from (seed, epoch, sample index)). While it runs,
        `skipped_files` counts the unreadable files replaced in the batches yielded so far.
        """
        for row in self.raw_epoch(epoch, start_batch):
            yield self.finish(row)


def build_loaders(spec: DataSpec, train_transform: PixelTransform, seed: int, targets: BatchTransform | None = None,
                  num_shards: int = 1, shard_id: int = 0) -> tuple[Loader, Loader]:
    """Train loader (shuffled per epoch, augmented, full batches, soft targets) and val loader (fixed order,
    eval transform, int labels), each reading shard `shard_id` of `num_shards` (one per data-parallel rank); with
    spec.pipeline 'native', both transforms run as MindSpore's vision operations (`swinexp.data.native`).
    `targets` defaults to one-hot targets without smoothing."""
    targets = targets or SmoothedTargets(spec.num_classes, smoothing=0.0)
    if isinstance(targets, Mixup) and targets.mode == "pair" and spec.batch_size % 2:
        raise ConfigError(f"data.augment.mixup_mode=pair mixes image i with B-1-i and needs an even "
                          f"data.batch_size, got {spec.batch_size}")
    eval_transform = EvalTransform(spec.img_size, spec.crop_pct, crop_mode=spec.crop_mode)
    if spec.pipeline == "native":
        train_transform, eval_transform = native_of(train_transform), native_of(eval_transform)
    train = Loader(spec.train, train_transform, spec.batch_size, spec.num_workers, seed, targets,
                   spec.python_multiprocessing, num_shards, shard_id)
    val = Loader(spec.val, eval_transform, spec.batch_size, spec.num_workers, seed,
                 python_multiprocessing=spec.python_multiprocessing, num_shards=num_shards, shard_id=shard_id)
    return train, val
