"""Dataset builders (`conf/data/*.yaml`): each returns a DataSpec — the file lists plus the loader settings."""
from __future__ import annotations

import inspect
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from difflib import get_close_matches
from pathlib import Path
from typing import Any

from swinexp.data.folder import Sample, read_class_index, scan_image_folder
from swinexp.data.synthetic import SHAPES, generate
from swinexp.data.transforms import check_crop_mode
from swinexp.registry import DATASETS, ConfigError, check_kwargs

log = logging.getLogger(__name__)
PIPELINES = ("exact", "native")  # data.pipeline: timm's pixels (numpy+PIL) | MindSpore's vision ops (data/native.py)


@dataclass(frozen=True)
class DataSpec:
    """What the pipeline needs to read one dataset: samples per split and per-device loader settings."""

    root: Path
    classes: tuple[str, ...]
    train: tuple[Sample, ...]
    val: tuple[Sample, ...]
    img_size: int
    batch_size: int
    num_workers: int
    crop_pct: float
    python_multiprocessing: bool = True  # workers as processes (True) or threads
    pipeline: str = "exact"  # per-image transforms: exact (timm's pixels) | native (MindSpore's vision operations)
    crop_mode: str = "center"  # eval resize: center (keep the aspect ratio) | squash (both sides to one size)

    @property
    def num_classes(self) -> int:
        return len(self.classes)


def check_pipeline(pipeline: str) -> None:
    if pipeline not in PIPELINES:
        hint = get_close_matches(str(pipeline), PIPELINES, n=1)
        raise ConfigError(f"data.pipeline='{pipeline}' is not a pipeline; choose one of: {', '.join(PIPELINES)} "
                          "(exact: timm's pixels, the default; native: MindSpore's C++ vision operations)"
                          + (f". Did you mean '{hint[0]}'?" if hint else ""))


def _check_loader_args(batch_size: int, num_workers: int, img_size: int, crop_pct: float,
                       pipeline: str = "exact", crop_mode: str = "center") -> None:
    check_pipeline(pipeline)
    check_crop_mode(crop_mode)
    if batch_size < 1:
        raise ConfigError(f"data.batch_size={batch_size} must be >= 1 (it is the per-device batch)")
    if num_workers < 1:
        raise ConfigError(f"data.num_workers={num_workers} must be >= 1")
    if img_size < 1:
        raise ConfigError(f"data.img_size={img_size} must be >= 1")
    if not 0 < crop_pct <= 1:
        raise ConfigError(f"data.crop_pct={crop_pct} must be in (0, 1]; timm's default is 0.875")


def available_cpus() -> int:
    """CPUs this process may run on: its affinity set, so a job pinned to some cores (taskset, a sweep that gives
    each job its own cores) counts only those."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def clamp_workers(num_workers: int) -> int:
    """`num_workers`, cut to the available CPUs with a warning: MindSpore refuses more workers than CPUs."""
    cpus = available_cpus()
    if num_workers <= cpus:
        return num_workers
    log.warning("data.num_workers=%d but this process has %d CPUs; using %d loader workers", num_workers, cpus, cpus)
    return cpus


def check_data_args(node: Mapping[str, Any]) -> None:
    """The data checks that read no file, for build_experiment to run before the model is built.

    Checks the keys against the builder, the loader numbers, and that a root the dataset reads exists. A dataset
    whose `root` has a default (synthetic) generates its files and needs no existing root.

    Args:
        node: The `data` config without `augment`: `{name: ..., **builder kwargs}`.
    """
    if "name" not in node:
        return  # DATASETS.build names what is missing
    name = node["name"]
    builder = DATASETS.get(name)
    kwargs = {k: v for k, v in node.items() if k != "name"}
    check_kwargs(builder, kwargs, where=f"data '{name}'", path="data")
    signature = inspect.signature(builder)
    args = signature.bind(**kwargs)
    args.apply_defaults()
    values = args.arguments
    _check_loader_args(values["batch_size"], values["num_workers"], values["img_size"], values["crop_pct"],
                       values.get("pipeline", "exact"), values.get("crop_mode", "center"))
    root = signature.parameters.get("root")
    if root is not None and root.default is inspect.Parameter.empty and not Path(values["root"]).is_dir():
        raise ConfigError(
            f"data.root='{values['root']}' does not exist (resolved: {Path(values['root']).resolve()}); data={name} "
            "reads its images from there: point data.root at the dataset's folder, or use data=synthetic"
        )


def default_cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "swinexp"


@DATASETS.register("imagefolder")
def imagefolder(root: str, num_classes: int | None = None, img_size: int = 224, batch_size: int = 64,
                num_workers: int = 4, crop_pct: float = 0.875, train_split: str = "train", val_split: str = "val",
                class_index: str | None = None, pipeline: str = "exact", crop_mode: str = "center") -> DataSpec:
    """ImageNet layout `<root>/{train,val}/<class>/<image>`; num_classes=None takes the number of class folders,
    a number must equal it. Labels follow the sorted class folder names, or the order of the `class_index` file."""
    _check_loader_args(batch_size, num_workers, img_size, crop_pct, pipeline, crop_mode)
    if not Path(root).is_dir():
        raise ConfigError(f"data.root='{root}' does not exist; point it at a folder holding {train_split}/ and "
                          f"{val_split}/")
    order = read_class_index(Path(class_index)) if class_index else None
    classes, train, val = scan_image_folder(Path(root), train_split, val_split, order)
    if num_classes is not None and len(classes) != num_classes:
        raise ConfigError(
            f"data.root='{root}' has {len(classes)} class folders but data.num_classes={num_classes}; "
            f"set data.num_classes={len(classes)}, or data.num_classes=null to count the class folders"
        )
    return DataSpec(Path(root), tuple(classes), tuple(train), tuple(val), img_size, batch_size,
                    clamp_workers(num_workers), crop_pct, pipeline=pipeline, crop_mode=crop_mode)


@DATASETS.register("imagenet")
def imagenet(root: str, num_classes: int | None = 1000, img_size: int = 224, batch_size: int = 128,
             num_workers: int = 8, crop_pct: float = 0.875, class_index: str | None = None,
             pipeline: str = "exact", crop_mode: str = "center") -> DataSpec:
    """ImageNet-1k (`<root>/train/<wnid>/`, `<root>/val/<wnid>/`): the imagefolder reader with ImageNet's numbers.
    num_classes stays 1000 so a half-copied ImageNet fails; a subset sets its count or null."""
    return imagefolder(root, num_classes, img_size, batch_size, num_workers, crop_pct, "train", "val", class_index,
                       pipeline, crop_mode)


@DATASETS.register("synthetic")
def synthetic(root: str | None = None, num_train: int = 2000, num_val: int = 500, num_classes: int = 10,
              img_size: int = 64, batch_size: int = 64, num_workers: int = 1, crop_pct: float = 1.0,
              generator_seed: int = 0, pipeline: str = "exact", crop_mode: str = "center") -> DataSpec:
    """Shapes drawn into JPEG files on first use (deterministic), then read like any ImageFolder."""
    if not 2 <= num_classes <= len(SHAPES):
        raise ConfigError(f"data.num_classes={num_classes}: the synthetic set draws 2..{len(SHAPES)} shape classes")
    if num_train < num_classes or num_val < num_classes:
        raise ConfigError(f"data.num_train={num_train} and data.num_val={num_val} must each be >= num_classes")
    key = f"synthetic-s{generator_seed}-c{num_classes}-n{num_train}-v{num_val}-px{img_size}"
    folder = generate(Path(root) if root else default_cache_dir() / key, num_train, num_val, num_classes,
                      img_size, generator_seed)
    return imagefolder(str(folder), num_classes, img_size, batch_size, num_workers, crop_pct, pipeline=pipeline,
                       crop_mode=crop_mode)


@DATASETS.register("cifar10_folder")
def cifar10_folder(root: str, num_classes: int = 10, img_size: int = 32, batch_size: int = 128, num_workers: int = 2,
                   crop_pct: float = 1.0, pipeline: str = "exact", crop_mode: str = "center") -> DataSpec:
    """CIFAR-10 as JPEG class folders, `<root>/train/<class>/*.jpg` and `<root>/test/<class>/*.jpg` (test = val)."""
    return imagefolder(root, num_classes, img_size, batch_size, num_workers, crop_pct, train_split="train",
                       val_split="test", pipeline=pipeline, crop_mode=crop_mode)
