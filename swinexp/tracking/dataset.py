"""A run's datasets as MLflow run inputs: one record per split, identified by a digest of its file list."""
from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

DIGEST_CHARS = 36  # MLflow's limit on a dataset digest


@dataclass(frozen=True)
class DatasetRecord:
    """One split of the data a run trained or evaluated on, as the tracker logs it."""

    name: str                # e.g. "synthetic/train"
    digest: str              # file_list_digest(...): equal digests mean the same files, labels and classes
    source: str              # the split's folder
    context: str             # "training" | "validation" (MLflow's mlflow.data.context tag)
    num_samples: int
    classes: tuple[str, ...]

    def profile(self) -> str:
        """MLflow's free-form dataset profile: sizes and the class names (label i = classes[i])."""
        return json.dumps({"num_samples": self.num_samples, "num_classes": len(self.classes),
                           "classes": list(self.classes)})


def file_list_digest(root: Path, samples: Sequence[tuple[str, int]], num_classes: int) -> str:
    """SHA-256 of the class count and every (path relative to `root`, label), in order.

    Relative paths keep the digest of a dataset that was copied or mounted elsewhere; it does not read the files,
    so an image replaced under the same name keeps the digest.
    """
    digest = hashlib.sha256(f"classes={num_classes}\n".encode())
    for path, label in samples:
        digest.update(f"{Path(path).relative_to(root).as_posix()}\t{label}\n".encode())
    return digest.hexdigest()[:DIGEST_CHARS]


def split_records(name: str, root: Path, classes: Sequence[str], train: Sequence[tuple[str, int]],
                  val: Sequence[tuple[str, int]]) -> list[DatasetRecord]:
    """The train and val records of one dataset (a `DataSpec`'s fields), named `<name>/train`, `<name>/val`."""
    def record(split: str, samples: Sequence[tuple[str, int]], context: str) -> DatasetRecord:
        source = str(Path(samples[0][0]).parents[1]) if samples else str(root)  # <root>/<split>/<class>/<file>
        return DatasetRecord(f"{name}/{split}", file_list_digest(root, samples, len(classes)), source, context,
                             len(samples), tuple(classes))

    return [record("train", train, "training"), record("val", val, "validation")]
