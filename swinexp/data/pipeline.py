"""Batches from a DataSpec: decode -> transform -> batch, in MindSpore dataset workers, one epoch at a time."""
from __future__ import annotations

import warnings
from typing import Iterator

import mindspore.dataset as msds
import numpy as np
from PIL import Image

from swinexp.data.datasets import DataSpec
from swinexp.data.folder import Sample
from swinexp.data.targets import BatchTransform, SmoothedTargets
from swinexp.data.transforms import EvalTransform, Transform
from swinexp.registry import ConfigError


class EpochSampler:
    """Yields `epoch * N + i` for this shard's sample indices i: a fresh permutation per epoch from (seed, epoch).

    Carrying the epoch inside the index lets the source seed each sample's augmentation from (seed, epoch, i)
    without shared state between worker processes.
    """

    def __init__(self, num_samples: int, seed: int, shuffle: bool, num_shards: int = 1, shard_id: int = 0) -> None:
        self.num_samples, self.seed, self.shuffle = num_samples, seed, shuffle
        self.num_shards, self.shard_id = num_shards, shard_id
        self.epoch = 0

    def indices(self) -> np.ndarray:
        order = (np.random.default_rng([self.seed, self.epoch]).permutation(self.num_samples)
                 if self.shuffle else np.arange(self.num_samples))
        return order[self.shard_id::self.num_shards]

    def __iter__(self) -> Iterator[int]:
        return iter((self.epoch * self.num_samples + self.indices()).tolist())

    def __len__(self) -> int:
        return len(range(self.shard_id, self.num_samples, self.num_shards))


class DecodeTransform:
    """Random-access source: index -> (float32 CHW image, int32 label, int64 epoch-carrying index)."""

    def __init__(self, samples: tuple[Sample, ...], transform: Transform, seed: int) -> None:
        self.samples, self.transform, self.seed = samples, transform, seed

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[np.ndarray, np.int32, np.int64]:
        epoch, i = divmod(int(index), len(self.samples))
        path, label = self.samples[i]
        with Image.open(path) as img:
            rgb = img.convert("RGB")
        return self.transform(rgb, np.random.default_rng([self.seed, epoch, i])), np.int32(label), np.int64(index)


class BatchTargets:
    """MindSpore per-batch map: stacks a batch and applies a BatchTransform seeded by the batch's sample indices."""

    def __init__(self, transform: BatchTransform, seed: int) -> None:
        self.transform, self.seed = transform, seed

    def __call__(self, images: list[np.ndarray], labels: list[np.ndarray], indices: list[np.ndarray],
                 batch_info: object) -> tuple[np.ndarray, np.ndarray]:
        rng = np.random.default_rng([self.seed, *np.stack(indices).tolist()])
        return self.transform(np.stack(images), np.stack(labels), rng)


class Loader:
    """One split of a dataset; `epoch(e)` iterates its batches as MindSpore tensors.

    A train loader (given `targets`) yields (images, soft targets (B, K)); a val loader yields (images, labels).
    """

    def __init__(self, samples: tuple[Sample, ...], transform: Transform, batch_size: int, num_workers: int,
                 seed: int, targets: BatchTransform | None = None) -> None:
        train = targets is not None
        self.sampler = EpochSampler(len(samples), seed, shuffle=train)
        self.batch_size, self.drop_remainder = batch_size, train
        if train and len(self.sampler) < batch_size:
            raise ConfigError(
                f"the train split has {len(self.sampler)} samples, fewer than one batch of data.batch_size={batch_size}; "
                "lower data.batch_size or add data"
            )
        source = DecodeTransform(samples, transform, seed)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dataset = msds.GeneratorDataset(source, ["image", "label", "index"], sampler=self.sampler,
                                            num_parallel_workers=num_workers,
                                            python_multiprocessing=num_workers > 1)
        if train:
            self.dataset = dataset.batch(batch_size, drop_remainder=True, per_batch_map=BatchTargets(targets, seed),
                                         input_columns=["image", "label", "index"],
                                         output_columns=["image", "target"])
        else:
            self.dataset = dataset.project(["image", "label"]).batch(batch_size, drop_remainder=False)

    def __len__(self) -> int:
        full, rest = divmod(len(self.sampler), self.batch_size)
        return full + (1 if rest and not self.drop_remainder else 0)

    def epoch(self, epoch: int) -> Iterator[tuple]:
        """Batches of epoch `epoch` (0-based): images (B, 3, H, W) float32 and targets or labels."""
        self.sampler.epoch = epoch
        return self.dataset.create_tuple_iterator(num_epochs=1)


def build_loaders(spec: DataSpec, train_transform: Transform, seed: int,
                  targets: BatchTransform | None = None) -> tuple[Loader, Loader]:
    """Train loader (shuffled per epoch, augmented, full batches, soft targets) and val loader (fixed order,
    eval transform, int labels). `targets` defaults to one-hot targets without smoothing."""
    targets = targets or SmoothedTargets(spec.num_classes, smoothing=0.0)
    train = Loader(spec.train, train_transform, spec.batch_size, spec.num_workers, seed, targets)
    val = Loader(spec.val, EvalTransform(spec.img_size, spec.crop_pct), spec.batch_size, spec.num_workers, seed)
    return train, val
