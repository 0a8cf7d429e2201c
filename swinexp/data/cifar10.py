"""`python -m swinexp.data.cifar10 SRC OUT`: unpack the JPEG CIFAR-10 tars (or a per-class subset) for
`data=cifar10_folder`. SRC holds `train.tar` and `test.tar` (layout `<split>/<class>/NNNN.jpg`)."""
from __future__ import annotations

import argparse
import tarfile
from collections.abc import Sequence
from pathlib import Path

from swinexp.registry import ConfigError


def extract(src: Path, out: Path, train_per_class: int | None = None, test_per_class: int | None = None) -> Path:
    """Unpack `train.tar` and `test.tar` from `src` into `out`, keeping at most N images per class if given."""
    for split, limit in (("train", train_per_class), ("test", test_per_class)):
        archive = Path(src) / f"{split}.tar"
        if not archive.is_file():
            raise ConfigError(f"'{archive}' not found; SRC must hold CIFAR-10's train.tar and test.tar")
        kept: dict[str, int] = {}
        with tarfile.open(archive) as tar:
            for member in tar:
                parts = Path(member.name).parts
                if not (member.isfile() and len(parts) == 3):
                    continue
                if limit is not None and kept.get(parts[1], 0) >= limit:
                    if len(kept) == 10 and all(v >= limit for v in kept.values()):
                        break  # every class is full: stop reading the archive
                    continue
                kept[parts[1]] = kept.get(parts[1], 0) + 1
                tar.extract(member, out, filter="data")
    return Path(out)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m swinexp.data.cifar10", description=__doc__)
    parser.add_argument("src", type=Path, help="folder with train.tar and test.tar, e.g. ../shared/datasets/cifar10")
    parser.add_argument("out", type=Path)
    parser.add_argument("--train-per-class", type=int, default=None, help="default: all 5,000")
    parser.add_argument("--test-per-class", type=int, default=None, help="default: all 1,000")
    args = parser.parse_args(argv)
    root = extract(args.src, args.out, args.train_per_class, args.test_per_class)
    count = sum(1 for _ in root.rglob("*.jpg"))
    print(f"{count} images under {root}; train with: python run.py experiment=cifar10_micro data.root={root}")


if __name__ == "__main__":
    main()
