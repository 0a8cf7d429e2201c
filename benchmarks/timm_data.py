"""The PyTorch rows of `data`: timm's own dataset and transforms over the same JPEG folder (the `reference` extra).

Each image goes through what a timm training does per sample: `timm.data.ImageDataset` reads and decodes it (PIL
`open` + `convert('RGB')`), then `timm.data.create_transform` with the Swin recipe's arguments transforms it.
Only PIL and small torch tensor ops run, so unlike the train step this shares the bench process and takes turns
with swinexp's per-image work, image by image (`benchmarks.per_image`); measured here: timm's images/s with
MindSpore imported in the same process fall within the range of a clean process.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

__all__ = ["SWIN_TRAIN_ARGS", "per_image_work", "timm_transform", "timm_version"]

# timm's create_transform arguments of the official Swin config (data/augment=swin), per image; Mixup/CutMix is a
# per-batch step in both libraries and not part of the per-image loop
SWIN_TRAIN_ARGS = dict(is_training=True, color_jitter=0.4, auto_augment="rand-m9-mstd0.5-inc1",
                       interpolation="bicubic", re_prob=0.25, re_mode="pixel", re_count=1)


def _posterize_zero_bits_as_black() -> None:
    """Make timm's posterize give black for 0 bits, as Pillow did before it rejected 0.

    With Pillow 13, `ImageOps.posterize(img, 0)` raises, and timm's PosterizeIncreasing asks for 0 bits whenever
    the sampled magnitude is clipped to 10 (about 2 % of its uses at m9, mstd 0.5): timm's own training would crash.
    swinexp's posterize keeps the old result; timm's ops table gets it for this benchmark.
    """
    import timm.data.auto_augment as timm_ops

    from swinexp.data.ops import posterize

    for name, op in list(timm_ops.NAME_TO_OP.items()):
        if op is timm_ops.posterize:
            timm_ops.NAME_TO_OP[name] = posterize


def timm_transform(kind: str, img_size: int, crop_pct: float) -> Callable:
    """timm's swin train transform (`kind` 'train') or its bicubic eval transform ('eval')."""
    from timm.data import create_transform

    if kind == "train":
        _posterize_zero_bits_as_black()
        return create_transform(img_size, **SWIN_TRAIN_ARGS)
    return create_transform(img_size, is_training=False, interpolation="bicubic", crop_pct=crop_pct)


def per_image_work(folder: Path, transform: Callable, paths: Sequence[str], seed: int = 0) -> Callable[[int], object]:
    """Work on image i = `paths[i]` read and transformed by timm's ImageDataset over `folder` (which holds them)."""
    import random

    import torch
    from timm.data import ImageDataset

    dataset = ImageDataset(str(folder), transform=transform)
    position = {str(Path(name).resolve()): i for i, name in enumerate(dataset.filenames(absolute=True))}
    index = [position[str(Path(path).resolve())] for path in paths]
    random.seed(seed)  # timm's augmentations draw from Python's and torch's global generators
    torch.manual_seed(seed)
    # One thread, as in a PyTorch DataLoader worker: with its default pool, torch's ops on one image waited for
    # threads of the 2 shared cores and timm's eval took 13 ms an image instead of 0.9.
    torch.set_num_threads(1)

    def work(i: int) -> object:
        return dataset[index[i]]

    return work


def timm_version() -> str:
    import timm
    import torch

    return f"timm {timm.__version__}, PyTorch {torch.__version__.split('+')[0]}"
