"""The loader's /dev/shm check (swinexp/data/shm.py): queues that would not fit get shallower, or the build stops."""
from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import mindspore.dataset as msds
import numpy as np
import pytest
from mindspore.dataset.engine import datasets_user_defined

from swinexp.data.augment import swin
from swinexp.data.datasets import synthetic
from swinexp.data.pipeline import Loader, build_loaders
from swinexp.data.shm import SHM_PATH, USABLE
from swinexp.registry import ConfigError


@pytest.fixture(autouse=True)
def _prefetch_restored() -> Iterator[None]:
    before = msds.config.get_prefetch_size()
    yield
    msds.config.set_prefetch_size(before)


def _fake_shm(monkeypatch: pytest.MonkeyPatch, free: int) -> None:
    real = os.statvfs

    class Stat:
        f_frsize, f_bavail = 1, free

    monkeypatch.setattr(os, "statvfs", lambda path: Stat() if str(path) == SHM_PATH else real(path))


def _queue_depths(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Records the result-queue size MindSpore gives each worker process it starts."""
    depths: list[int] = []
    worker = datasets_user_defined._GeneratorWorkerMp
    init = worker.__init__

    def recording(self: Any, *args: Any, **kwargs: Any) -> None:
        depths.append(args[3])  # (dataset, eof, max_rowsize, queue_size, ...)
        init(self, *args, **kwargs)

    monkeypatch.setattr(worker, "__init__", recording)
    return depths


def _batches(loader: Loader) -> list[tuple[np.ndarray, ...]]:
    return [tuple(t.asnumpy() for t in row) for row in loader.raw_epoch(0)]


def test_a_small_dev_shm_makes_the_queues_shallower_and_the_batches_stay_the_same(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = synthetic(root=str(tmp_path / "s"), num_train=24, num_val=4, num_classes=3, img_size=16, batch_size=4)
    aug = swin(16, num_classes=3)
    depths = _queue_depths(monkeypatch)
    want = _batches(Loader(spec.train, aug.transform, 4, 2, 0, aug.targets))
    roomy_depth = depths[-1]
    batch_bytes = sum(column.nbytes for column in want[0])
    free = 40 * batch_bytes  # less than 2 workers x (roomy depth + 2) batches at MindSpore's default prefetch
    assert 2 * (roomy_depth + 2) * batch_bytes > USABLE * free

    _fake_shm(monkeypatch, free)
    got = _batches(Loader(spec.train, aug.transform, 4, 2, 0, aug.targets))
    depth = depths[-1]
    assert depth < roomy_depth and 2 * (depth + 2) * batch_bytes <= USABLE * free
    assert len(got) == len(want) and all(np.array_equal(a, b) for g, w in zip(got, want) for a, b in zip(g, w))


def test_a_dev_shm_too_small_for_any_queue_stops_the_build_naming_the_fix(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = synthetic(root=str(tmp_path / "s"), num_train=24, num_val=4, num_classes=3, img_size=16, batch_size=4,
                     num_workers=2)
    _fake_shm(monkeypatch, 1 << 10)
    with pytest.raises(ConfigError, match=r"/dev/shm has 0 MB free.*docker run --shm-size=\d+m.*data.num_workers"):
        build_loaders(spec, swin(16, num_classes=3), seed=0)
    one_worker = synthetic(root=str(tmp_path / "s"), num_train=24, num_val=4, num_classes=3, img_size=16,
                           batch_size=4, num_workers=1)
    build_loaders(one_worker, swin(16, num_classes=3), seed=0)  # a worker thread needs no shared memory
