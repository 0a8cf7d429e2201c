"""The ImageNet layout: `<root>/<split>/<class>/<image>`, labels = index of the sorted class folder name."""
from __future__ import annotations

import json
from pathlib import Path

from swinexp.registry import ConfigError

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff", ".ppm", ".gif"}

Sample = tuple[str, int]


def scan_split(root: Path, split: str, order: list[str] | None = None) -> tuple[list[str], list[Sample]]:
    """List `(path, label)` for every image under `root/split/<class>/`, classes sorted by name (or in `order`).

    Raises:
        ConfigError: the split folder is missing, holds no class folders, or a class folder holds no images.
    """
    split_dir = Path(root) / split
    if not split_dir.is_dir():
        found = sorted(p.name for p in Path(root).iterdir() if p.is_dir()) if Path(root).is_dir() else []
        raise ConfigError(
            f"data.root='{root}' has no '{split}/' folder (found: {found or 'nothing'}); the layout must be "
            f"<root>/{split}/<class>/<image>, as in ImageNet"
        )
    classes = sorted(p.name for p in split_dir.iterdir() if p.is_dir())
    if not classes:
        raise ConfigError(f"'{split_dir}' holds no class folders; expected {split_dir}/<class>/<image>")
    if order is not None:
        if set(order) != set(classes):
            raise ConfigError(
                f"data.class_index names {len(order)} classes but '{split_dir}' holds {len(classes)} class folders "
                f"(only in the index: {sorted(set(order) - set(classes))[:5]}, only in the folder: "
                f"{sorted(set(classes) - set(order))[:5]})")
        classes = list(order)
    samples: list[Sample] = []
    for label, name in enumerate(classes):
        files = sorted(p for p in (split_dir / name).iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
        if not files:
            suffixes = ", ".join(sorted(IMAGE_SUFFIXES))
            raise ConfigError(f"class folder '{split_dir / name}' holds no images ({suffixes})")
        samples.extend((str(p), label) for p in files)
    return classes, samples


def read_class_index(path: Path) -> list[str]:
    """Class folder names in label order from a text file (one per line; the first word counts, so
    `n01440764 tench` works) or a JSON `{"0": ["n01440764", "tench"], ...}` (the common imagenet_class_index.json)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"data.class_index='{path}' does not exist; give a text file with one class folder per line")
    if path.suffix == ".json":
        table = json.loads(path.read_text())
        return [table[str(i)][0] for i in range(len(table))]
    return [line.split()[0] for line in path.read_text().splitlines() if line.strip()]


def scan_image_folder(root: Path, train_split: str, val_split: str,
                      order: list[str] | None = None) -> tuple[list[str], list[Sample], list[Sample]]:
    """Scan train and val splits and check that they name the same classes."""
    classes, train = scan_split(root, train_split, order)
    val_classes, val = scan_split(root, val_split, order)
    if val_classes != classes:
        only_train = sorted(set(classes) - set(val_classes))[:5]
        only_val = sorted(set(val_classes) - set(classes))[:5]
        raise ConfigError(
            f"'{root}/{train_split}' and '{root}/{val_split}' hold different class folders "
            f"(only in {train_split}: {only_train}, only in {val_split}: {only_val}); labels would not match"
        )
    return classes, train, val
