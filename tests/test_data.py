from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from swinexp.data.augment import light
from swinexp.data.datasets import imagefolder, synthetic
from swinexp.data.folder import scan_split
from swinexp.data.pipeline import EpochSampler, build_loaders
from swinexp.data.synthetic import generate
from swinexp.data.targets import smooth_one_hot
from swinexp.data.transforms import EvalTransform, RandomResizedCropFlip
from swinexp.registry import ConfigError


def _digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*.jpg"))}


def _write_folder(root: Path, layout: dict[str, dict[str, int]]) -> None:
    for split, classes in layout.items():
        for name, count in classes.items():
            (root / split / name).mkdir(parents=True, exist_ok=True)
            for i in range(count):
                Image.new("RGB", (12, 10), (i * 40 % 256, 0, 0)).save(root / split / name / f"{i}.jpg")


def test_synthetic_generation_is_byte_identical(tmp_path: Path) -> None:
    a = generate(tmp_path / "a", num_train=30, num_val=10, num_classes=10, img_size=32, seed=3)
    b = generate(tmp_path / "b", num_train=30, num_val=10, num_classes=10, img_size=32, seed=3)
    other = generate(tmp_path / "c", num_train=30, num_val=10, num_classes=10, img_size=32, seed=4)
    assert len(_digest(a)) == 40
    assert _digest(a) == _digest(b)
    assert _digest(a) != _digest(other)
    with Image.open(next(a.rglob("*.jpg"))) as img:
        assert img.format == "JPEG" and img.size == (32, 32) and img.mode == "RGB"


def test_synthetic_builder_reads_its_folder_with_balanced_sorted_classes(tmp_path: Path) -> None:
    spec = synthetic(root=str(tmp_path / "s"), num_train=40, num_val=20, num_classes=4, img_size=16)
    assert spec.classes == ("00_circle", "01_square", "02_triangle", "03_cross")
    assert np.bincount([label for _, label in spec.train]).tolist() == [10, 10, 10, 10]
    assert all(Path(path).parent.name == spec.classes[label] for path, label in spec.val)


def test_imagefolder_labels_are_sorted_class_folder_indices(tmp_path: Path) -> None:
    _write_folder(tmp_path, {"train": {"zebra": 2, "apple": 1, "mango": 3}, "val": {"zebra": 1, "apple": 1, "mango": 1}})
    classes, samples = scan_split(tmp_path, "train")
    assert classes == ["apple", "mango", "zebra"]
    assert sorted({(Path(p).parent.name, label) for p, label in samples}) == [("apple", 0), ("mango", 1), ("zebra", 2)]
    assert len(samples) == 6


@pytest.mark.parametrize("layout,message", [
    ({"train": {"a": 1}}, "has no 'val/' folder"),
    ({"train": {"a": 1, "b": 0}, "val": {"a": 1, "b": 1}}, "holds no images"),
    ({"train": {"a": 1, "b": 1}, "val": {"a": 1, "c": 1}}, r"different class folders.*only in train: \['b'\]"),
])
def test_bad_folders_fail_with_a_clear_error(tmp_path: Path, layout: dict, message: str) -> None:
    _write_folder(tmp_path, layout)
    with pytest.raises(ConfigError, match=message):
        imagefolder(str(tmp_path), num_classes=2)


def test_imagefolder_class_count_must_match_num_classes(tmp_path: Path) -> None:
    _write_folder(tmp_path, {"train": {"a": 1, "b": 1}, "val": {"a": 1, "b": 1}})
    with pytest.raises(ConfigError, match="set data.num_classes=2"):
        imagefolder(str(tmp_path), num_classes=1000)
    with pytest.raises(ConfigError, match="does not exist"):
        imagefolder(str(tmp_path / "nowhere"))


def test_sampler_shards_cover_each_sample_once_and_reshuffle_per_epoch() -> None:
    shards = [EpochSampler(10, seed=1, shuffle=True, num_shards=3, shard_id=i) for i in range(3)]
    epoch0 = np.concatenate([s.indices() for s in shards])
    assert sorted(epoch0.tolist()) == list(range(10))
    for s in shards:
        s.epoch = 1
    epoch1 = np.concatenate([s.indices() for s in shards])
    assert sorted(epoch1.tolist()) == list(range(10)) and epoch1.tolist() != epoch0.tolist()
    assert [len(s) for s in shards] == [4, 3, 3]
    assert list(shards[0])[0] == 10 + shards[0].indices()[0]  # the epoch travels inside the index


def test_eval_transform_resizes_short_side_then_center_crops() -> None:
    img = Image.new("RGB", (300, 200))
    img.paste((255, 255, 255), (0, 0, 150, 200))  # left half white
    out = EvalTransform(224, crop_pct=0.875)(img)
    assert out.shape == (3, 224, 224) and out.dtype == np.float32
    # short side 200 -> 256, long side 384; the 224 crop starts at x=80 of 384, the white edge sits at x=192
    white = (1.0 - 0.485) / 0.229
    assert np.isclose(out[0, 112, 100], white, atol=1e-2) and out[0, 112, 200] < 0


def test_random_resized_crop_stays_in_bounds_and_is_seeded() -> None:
    crop = RandomResizedCropFlip(32, scale=(0.08, 1.0))
    for seed in range(200):
        top, left, h, w = crop.crop_box(50, 40, np.random.default_rng(seed))
        assert 0 <= top and top + h <= 40 and 0 <= left and left + w <= 50
        assert 0.08 * 2000 * 0.5 <= h * w <= 2000
    img = Image.effect_noise((50, 40), 60).convert("RGB")
    a = crop(img, np.random.default_rng(5))
    assert np.array_equal(a, crop(img, np.random.default_rng(5)))
    assert not np.array_equal(a, crop(img, np.random.default_rng(6)))


def test_loaders_give_batches_of_normalized_images_and_labels(tmp_path: Path) -> None:
    spec = synthetic(root=str(tmp_path / "s"), num_train=20, num_val=7, num_classes=2, img_size=16, batch_size=4)
    train, val = build_loaders(spec, light(16), seed=0)
    batches = [(x.asnumpy(), y.asnumpy()) for x, y in train.epoch(0)]
    assert len(batches) == len(train) == 5 and batches[0][0].shape == (4, 3, 16, 16)
    assert batches[0][1].shape == (4, 2) and np.allclose(batches[0][1].sum(axis=1), 1)  # soft targets
    val_batches = [(x.shape[0], y.asnumpy()) for x, y in val.epoch(0)]
    assert [n for n, _ in val_batches] == [4, 3] and len(val) == 2  # val keeps the remainder
    assert val_batches[0][1].dtype == np.int32
    again = [y.asnumpy() for _, y in train.epoch(0)]
    assert all(np.array_equal(a[1], b) for a, b in zip(batches, again))
    assert any(not np.array_equal(a[1], y.asnumpy()) for a, (_, y) in zip(batches, train.epoch(1)))


def test_train_split_smaller_than_a_batch_is_rejected(tmp_path: Path) -> None:
    spec = synthetic(root=str(tmp_path / "s"), num_train=4, num_val=4, num_classes=2, img_size=16, batch_size=8)
    with pytest.raises(ConfigError, match="fewer than one batch"):
        build_loaders(spec, light(16), seed=0)


def test_smoothed_targets_follow_timm() -> None:
    targets = smooth_one_hot(np.array([2, 0]), num_classes=4, smoothing=0.1)
    assert np.allclose(targets[0], [0.025, 0.025, 0.925, 0.025]) and np.allclose(targets.sum(axis=1), 1)
