"""The ImageNet layout: `<root>/<split>/<class>/<image>`, labels = index of the sorted class folder name."""
from __future__ import annotations

from pathlib import Path

from swinexp.registry import ConfigError

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff", ".ppm", ".gif"}

Sample = tuple[str, int]


def scan_split(root: Path, split: str) -> tuple[list[str], list[Sample]]:
    """List `(path, label)` for every image under `root/split/<class>/`, classes sorted by name.

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
    samples: list[Sample] = []
    for label, name in enumerate(classes):
        files = sorted(p for p in (split_dir / name).iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
        if not files:
            raise ConfigError(f"class folder '{split_dir / name}' holds no images ({', '.join(sorted(IMAGE_SUFFIXES))})")
        samples.extend((str(p), label) for p in files)
    return classes, samples


def scan_image_folder(root: Path, train_split: str, val_split: str) -> tuple[list[str], list[Sample], list[Sample]]:
    """Scan train and val splits and check that they name the same classes."""
    classes, train = scan_split(root, train_split)
    val_classes, val = scan_split(root, val_split)
    if val_classes != classes:
        only_train = sorted(set(classes) - set(val_classes))[:5]
        only_val = sorted(set(val_classes) - set(classes))[:5]
        raise ConfigError(
            f"'{root}/{train_split}' and '{root}/{val_split}' hold different class folders "
            f"(only in {train_split}: {only_train}, only in {val_split}: {only_val}); labels would not match"
        )
    return classes, train, val
