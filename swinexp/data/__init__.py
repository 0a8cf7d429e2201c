"""Datasets, augmentation presets and the loader pipeline; importing registers DATASETS and AUGMENTS."""
from swinexp.data import augment, datasets  # noqa: F401  (register data/* and data/augment/* builders)
from swinexp.data.augment import TrainAugment
from swinexp.data.datasets import DataSpec
from swinexp.data.factory import create_transform
from swinexp.data.mixup import Mixup
from swinexp.data.pipeline import Loader, build_loaders
from swinexp.registry import AUGMENTS, DATASETS

__all__ = ["AUGMENTS", "DATASETS", "DataSpec", "Loader", "Mixup", "TrainAugment", "build_loaders",
           "create_transform"]
