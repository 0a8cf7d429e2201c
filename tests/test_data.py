from __future__ import annotations

import copy
import hashlib
import logging
import os
from pathlib import Path

import mindspore.dataset as msds
import numpy as np
import pytest
from PIL import Image

from swinexp.data.augment import light, swin
from swinexp.data.cifar10 import extract
from swinexp.data.datasets import cifar10_folder, imagefolder, imagenet, synthetic
from swinexp.data.decode import DECODE_ERRORS, load_rgb
from swinexp.data.folder import scan_split
from swinexp.data.pipeline import COLUMNS, ERASE_COLUMNS, DecodeTransform, EpochSampler, Loader, build_loaders
from swinexp.data.synthetic import generate
from swinexp.data.targets import smooth_one_hot
from swinexp.data.transforms import IMAGENET_MEAN, IMAGENET_STD, EvalTransform, RandomResizedCropFlip, to_normalized_chw
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
    _write_folder(tmp_path, {"train": {"zebra": 2, "apple": 1, "mango": 3},
                             "val": {"zebra": 1, "apple": 1, "mango": 1}})
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


def test_crop_mode_reaches_the_val_loader_and_a_bad_one_names_the_choices(tmp_path: Path) -> None:
    _write_folder(tmp_path, {"train": {"a": 1, "b": 1}, "val": {"a": 1, "b": 1}})
    spec = imagefolder(str(tmp_path), img_size=16, batch_size=2, num_workers=1, crop_pct=1.0, crop_mode="squash")
    assert build_loaders(spec, light(16).transform, seed=0)[1]._source.per_image.transform.crop_mode == "squash"
    with pytest.raises(ConfigError, match=r"data.crop_mode='squish'.*center, squash.*Did you mean 'squash'"):
        imagefolder(str(tmp_path), crop_mode="squish")


def test_imagefolder_class_count_must_match_num_classes(tmp_path: Path) -> None:
    _write_folder(tmp_path, {"train": {"a": 1, "b": 1}, "val": {"a": 1, "b": 1}})
    with pytest.raises(ConfigError, match="set data.num_classes=2"):
        imagefolder(str(tmp_path), num_classes=1000)
    with pytest.raises(ConfigError, match="does not exist"):
        imagefolder(str(tmp_path / "nowhere"))


def test_imagefolder_counts_its_class_folders_unless_told(tmp_path: Path) -> None:
    _write_folder(tmp_path, {split: dict.fromkeys("abcd", 1) for split in ("train", "val")})
    spec = imagefolder(str(tmp_path))  # data.num_classes: null, the imagefolder default
    assert spec.num_classes == 4 and spec.classes == ("a", "b", "c", "d")
    assert imagenet(str(tmp_path), num_classes=None).num_classes == 4
    with pytest.raises(ConfigError, match=r"has 4 class folders but data.num_classes=1000; set data.num_classes=4, "
                                          r"or data.num_classes=null to count the class folders"):
        imagenet(str(tmp_path))  # ImageNet keeps its 1000: a partial copy must not train silently


def test_loader_workers_are_cut_to_the_cpus_of_the_process_with_one_warning(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    _write_folder(tmp_path, {"train": {"a": 4, "b": 4}, "val": {"a": 2, "b": 2}})
    cpus = len(os.sched_getaffinity(0))
    with caplog.at_level(logging.WARNING, logger="swinexp.data"):
        spec = imagefolder(str(tmp_path), num_classes=2, img_size=16, batch_size=4, num_workers=cpus + 2)
    assert spec.num_workers == cpus
    assert [r.getMessage() for r in caplog.records] == [
        f"data.num_workers={cpus + 2} but this process has {cpus} CPUs; using {cpus} loader workers"]
    train, val = build_loaders(spec, light(16, num_classes=2), seed=0)  # MindSpore refused cpus + 2 workers here
    assert sum(1 for _ in train.epoch(0)) == 2 and sum(x.shape[0] for x, _ in val.epoch(0)) == 4


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to pin the process to one")
def test_worker_count_follows_the_cores_the_process_is_pinned_to(tmp_path: Path) -> None:
    _write_folder(tmp_path, {"train": {"a": 1}, "val": {"a": 1}})
    cores = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(cores)})  # as a sweep that runs its jobs on disjoint cores pins each job
    try:
        assert imagefolder(str(tmp_path), num_classes=1, num_workers=2).num_workers == 1
    finally:
        os.sched_setaffinity(0, cores)
    assert imagefolder(str(tmp_path), num_classes=1, num_workers=2).num_workers == 2


def test_val_shards_cover_each_sample_exactly_once() -> None:
    shards = [EpochSampler(10, seed=1, shuffle=False, num_shards=3, shard_id=i) for i in range(3)]
    assert sorted(np.concatenate([s.indices() for s in shards]).tolist()) == list(range(10))
    assert [len(s) for s in shards] == [4, 3, 3]


def test_train_shards_are_disjoint_equal_and_reshuffled_per_epoch() -> None:
    shards = [EpochSampler(10, seed=1, shuffle=True, num_shards=3, shard_id=i) for i in range(3)]
    epoch0 = np.concatenate([s.indices() for s in shards])
    assert len(set(epoch0.tolist())) == 9 and [len(s) for s in shards] == [3, 3, 3]  # equal steps on every rank
    for s in shards:
        s.epoch = 1
    epoch1 = np.concatenate([s.indices() for s in shards])
    assert len(set(epoch1.tolist())) == 9 and epoch1.tolist() != epoch0.tolist()
    assert list(shards[0])[0] == 10 + shards[0].indices()[0]  # the epoch travels inside the index
    whole = EpochSampler(10, seed=1, shuffle=True)
    assert sorted(whole.indices().tolist()) == list(range(10))  # one process: every sample, every epoch


def test_eval_transform_resizes_short_side_then_center_crops() -> None:
    img = Image.new("RGB", (300, 200))
    img.paste((255, 255, 255), (0, 0, 150, 200))  # left half white
    out = EvalTransform(224, crop_pct=0.875)(img)
    assert out.shape == (3, 224, 224) and out.dtype == np.float32
    # short side 200 -> 256, long side 384; the 224 crop starts at x=80 of 384, the white edge sits at x=192
    white = (1.0 - 0.485) / 0.229
    assert np.isclose(out[0, 112, 100], white, atol=1e-2) and out[0, 112, 200] < 0


@pytest.mark.parametrize("mean,std", [(IMAGENET_MEAN, IMAGENET_STD), ((0.5, 0.25, 0.0), (0.5, 1.0, 3.0))])
def test_normalization_is_bit_identical_to_divide_subtract_divide_in_float32(mean: tuple, std: tuple) -> None:
    pixels = np.random.default_rng(0).integers(0, 256, (37, 53, 3), dtype=np.uint8)
    pixels[0, :3] = [[0, 0, 0], [255, 255, 255], [1, 128, 254]]
    # torchvision's ToTensor (uint8 -> float32 / 255) then Normalize ((x - mean) / std), channels first
    x = pixels.astype(np.float32) / np.float32(255)
    expected = ((x - np.float32(mean)) / np.float32(std)).transpose(2, 0, 1)
    out = to_normalized_chw(Image.fromarray(pixels), mean, std)
    assert out.dtype == np.float32 and out.shape == (3, 37, 53) and out.flags.c_contiguous
    assert np.array_equal(out, expected)


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


# SWINEXP_CIFAR10_TARS (.ci/run sets it), else ../shared beside the checkout
CIFAR_TAR = Path(os.environ.get("SWINEXP_CIFAR10_TARS")
                 or Path(__file__).resolve().parents[1].parent / "shared" / "datasets" / "cifar10")


def _write_bad_inputs(folder: Path) -> dict[str, tuple[int, int, int]]:
    """One real file per awkward case; returns the RGB each readable one must decode to (top-left pixel)."""
    folder.mkdir(parents=True, exist_ok=True)
    Image.new("RGBA", (8, 8), (10, 20, 30, 0)).save(folder / "rgba.png")
    Image.new("L", (8, 8), 77).save(folder / "gray.jpg", quality=100)
    Image.new("CMYK", (8, 8), (0, 255, 255, 0)).save(folder / "cmyk.jpg", quality=100)  # pure red in CMYK
    palette = Image.new("P", (8, 8), 1)
    palette.putpalette([0, 0, 0, 200, 40, 60] + [0] * 762)
    palette.info["transparency"] = 0
    palette.save(folder / "palette.png", transparency=0)
    Image.new("RGB", (8, 8), (1, 2, 3)).save(folder / "png_named.JPEG", format="PNG")  # content wins over name
    return {"rgba.png": (10, 20, 30), "gray.jpg": (77, 77, 77), "cmyk.jpg": (255, 0, 0),
            "palette.png": (200, 40, 60), "png_named.JPEG": (1, 2, 3)}


def _write_corrupt(folder: Path) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    good = folder / "good.jpg"
    Image.effect_noise((64, 64), 50).convert("RGB").save(good, quality=95)
    truncated, empty, text = folder / "truncated.jpg", folder / "empty.jpg", folder / "notes.jpg"
    truncated.write_bytes(good.read_bytes()[: len(good.read_bytes()) // 2])
    empty.write_bytes(b"")
    text.write_text("not an image")
    return [truncated, empty, text]


def test_awkward_modes_and_misnamed_files_decode_to_rgb(tmp_path: Path) -> None:
    for name, rgb in _write_bad_inputs(tmp_path).items():
        img = load_rgb(str(tmp_path / name))
        assert img.mode == "RGB", name
        assert np.allclose(np.asarray(img)[0, 0], rgb, atol=3), name  # JPEG may round by a level or two
    Image.fromarray(np.full((4, 4), 60000, np.uint16)).save(tmp_path / "deep.png")  # 16-bit gray: scaled, not clipped
    assert tuple(np.asarray(load_rgb(str(tmp_path / "deep.png")))[0, 0]) == (234, 234, 234)


def test_unreadable_files_raise_decode_errors(tmp_path: Path) -> None:
    for path in _write_corrupt(tmp_path):
        with pytest.raises(DECODE_ERRORS):
            load_rgb(str(path))


def test_unreadable_file_is_replaced_by_the_next_sample_logged_and_flagged(tmp_path: Path,
                                                                          caplog: pytest.LogCaptureFixture) -> None:
    bad = _write_corrupt(tmp_path)
    samples = ((str(bad[0]), 0), (str(tmp_path / "good.jpg"), 1))
    source = DecodeTransform(samples, EvalTransform(16, 1.0), seed=0)
    with caplog.at_level(logging.WARNING):
        image, label, index, skipped = source[0]
    assert label == 1 and skipped == 1 and index == 0 and image.shape == (16, 16, 3) and image.dtype == np.uint8
    assert "truncated.jpg" in caplog.text
    assert source[1][3] == 0


def test_loader_counts_skipped_files_per_epoch(tmp_path: Path) -> None:
    root = tmp_path / "set"
    _write_folder(root, {"train": {"a": 6, "b": 6}, "val": {"a": 2, "b": 2}})
    for path in _write_corrupt(tmp_path / "bad"):
        path.rename(root / "train" / "a" / path.name)
    (root / "val" / "b" / "broken.jpg").write_bytes(b"\xff\xd8\xff")
    train, val = build_loaders(imagefolder(str(root), num_classes=2, img_size=16, batch_size=3, num_workers=2),
                               light(16, num_classes=2), seed=0)
    assert sum(1 for _ in train.epoch(0)) == 5 and train.skipped_files == 3  # 15 files, 3 unreadable, all counted
    assert sum(x.shape[0] for x, _ in val.epoch(0)) == 5 and val.skipped_files == 1
    assert sum(1 for _ in train.epoch(1)) == 5 and train.skipped_files == 3  # reset, then counted again


def test_mixup_pair_mode_needs_an_even_batch(tmp_path: Path) -> None:
    spec = synthetic(root=str(tmp_path / "s"), num_train=20, num_val=4, num_classes=2, img_size=16, batch_size=3)
    aug = swin(16, num_classes=2, mixup_mode="pair")
    with pytest.raises(ConfigError, match="even data.batch_size"):
        build_loaders(spec, aug.transform, 0, aug.targets)


def test_swin_preset_loader_gives_mixed_soft_targets(tmp_path: Path) -> None:
    spec = synthetic(root=str(tmp_path / "s"), num_train=16, num_val=4, num_classes=4, img_size=32, batch_size=8)
    aug = swin(32, num_classes=4, label_smoothing=0.1)
    train, _ = build_loaders(spec, aug.transform, 0, aug.targets)
    targets = [y.asnumpy() for _, y in train.epoch(0)]
    assert len(targets) == 2 and all(np.allclose(t.sum(axis=1), 1) for t in targets)
    assert max((t > 0.03).sum(axis=1).max() for t in targets) == 2  # two classes per row: mixed
    assert all(np.array_equal(a, y.asnumpy()) for a, (_, y) in zip(targets, train.epoch(0)))  # reproducible


@pytest.fixture(scope="module")
def cifar_subset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """3 train and 2 test JPEGs per class, extracted from the shared CIFAR-10 tars (skip when absent)."""
    if not (CIFAR_TAR / "train.tar").is_file() or not (CIFAR_TAR / "test.tar").is_file():
        pytest.skip(f"CIFAR-10 tars not found under {CIFAR_TAR}: set SWINEXP_CIFAR10_TARS to the folder holding "
                    "train.tar and test.tar")
    root = extract(CIFAR_TAR, tmp_path_factory.mktemp("cifar10"), train_per_class=3, test_per_class=2)
    return root


def test_cifar10_folder_reads_train_and_test_splits(cifar_subset: Path) -> None:
    spec = cifar10_folder(str(cifar_subset), batch_size=10, num_workers=1)
    assert spec.classes[:3] == ("airplane", "automobile", "bird") and spec.num_classes == 10
    assert len(spec.train) == 30 and len(spec.val) == 20 and spec.img_size == 32
    aug = swin(32, num_classes=10)
    train, val = build_loaders(spec, aug.transform, 0, aug.targets)
    x, y = next(iter(train.epoch(0)))
    assert x.shape == (10, 3, 32, 32) and y.shape == (10, 10)
    assert next(iter(val.epoch(0)))[1].asnumpy()[:3].tolist() == [0, 0, 1]


@pytest.mark.parametrize("index_format", ["txt", "json"])
def test_class_index_file_sets_the_label_order(tmp_path: Path, index_format: str) -> None:
    _write_folder(tmp_path / "d", {"train": {"n02": 1, "n01": 2}, "val": {"n02": 1, "n01": 1}})
    if index_format == "txt":
        (tmp_path / "index.txt").write_text("n02 goldfish\nn01 tench\n")
    else:
        (tmp_path / "index.json").write_text('{"0": ["n02", "goldfish"], "1": ["n01", "tench"]}')
    spec = imagenet(str(tmp_path / "d"), num_classes=2, class_index=str(tmp_path / f"index.{index_format}"))
    assert spec.classes == ("n02", "n01")
    assert {Path(p).parent.name: label for p, label in spec.train} == {"n02": 0, "n01": 1}
    (tmp_path / "bad.txt").write_text("n02\nn03\n")
    with pytest.raises(ConfigError, match=r"only in the index: \['n03'\], only in the folder: \['n01'\]"):
        imagenet(str(tmp_path / "d"), num_classes=2, class_index=str(tmp_path / "bad.txt"))


# --- uint8 across the process boundary, normalize / erase / mix on the device ----------------------------------------

@pytest.mark.parametrize("mode,mixup_mode", [("pixel", "batch"), ("rand", "elem"), ("const", "pair")])
def test_device_prologue_gives_the_batches_of_the_host_pipeline(tmp_path: Path, mode: str, mixup_mode: str) -> None:
    """Each train batch equals what timm's order computes on the host from the same draws: per image transform +
    normalize + erase (generator (seed, epoch, i)), then Mixup/CutMix on the stack (generator (seed, *indices))."""
    spec = synthetic(root=str(tmp_path / "s"), num_train=12, num_val=5, num_classes=3, img_size=24, batch_size=4)
    aug = swin(24, num_classes=3, re_prob=0.8, re_mode=mode, re_count=2, mixup_mode=mixup_mode)
    train, val = build_loaders(spec, aug.transform, 7, aug.targets)
    for epoch in (0, 1):
        for row in train.raw_epoch(epoch):
            pixels, labels, indices = (t.asnumpy() for t in row[:3])
            assert pixels.dtype == np.uint8 and pixels.shape == (4, 24, 24, 3)  # 3 bytes a pixel cross over
            images, targets = (t.asnumpy() for t in train.finish(row))
            host = np.stack([aug.transform(load_rgb(spec.train[int(i) % 12][0]), np.random.default_rng([7, epoch,
                                                                                                    int(i) % 12]))
                             for i in indices])
            expected, expected_targets = aug.targets(host, labels, np.random.default_rng([7, *indices.tolist()]))
            assert np.array_equal(images, expected)  # bit for bit, the pixel noise included
            assert np.array_equal(targets, expected_targets)
    for (images, labels), row in zip(val.epoch(0), val.raw_epoch(0)):
        host = np.stack([EvalTransform(24, spec.crop_pct)(load_rgb(spec.val[int(i)][0])) for i in row[2].asnumpy()])
        assert np.array_equal(images.asnumpy(), host) and labels.dtype == row[1].dtype  # normalized bit for bit


def test_a_resumed_epoch_redraws_the_same_erasing_and_mixing(tmp_path: Path) -> None:
    spec = synthetic(root=str(tmp_path / "s"), num_train=16, num_val=4, num_classes=4, img_size=16, batch_size=4)
    aug = swin(16, num_classes=4, re_prob=0.5)
    train, _ = build_loaders(spec, aug.transform, 3, aug.targets)
    whole = [(x.asnumpy(), y.asnumpy()) for x, y in train.epoch(1)]
    resumed = [(x.asnumpy(), y.asnumpy()) for x, y in train.epoch(1, start_batch=2)]
    assert len(resumed) == 2 and all(np.array_equal(a[k], b[k]) for a, b in zip(whole[2:], resumed) for k in (0, 1))


# --- whole batches made in the workers ------------------------------------------------------------------------------

def _per_image_batches(loader: Loader, epoch: int) -> list[tuple[np.ndarray, ...]]:
    """The batches of the per-image pipeline the workers replaced: one row per sample, MindSpore's batch op."""
    sampler = copy.copy(loader.sampler)
    sampler.epoch = epoch
    per_image = loader._source.per_image
    columns = COLUMNS + (ERASE_COLUMNS if per_image.erasing is not None else [])
    dataset = msds.GeneratorDataset(per_image, columns, sampler=sampler, num_parallel_workers=1)
    batches = dataset.batch(loader.batch_size, drop_remainder=loader.drop_remainder)
    return [tuple(t.asnumpy() for t in row) for row in batches.create_tuple_iterator(num_epochs=1)]


@pytest.mark.parametrize("workers,processes", [(1, False), (2, True), (2, False)])
def test_worker_made_batches_equal_the_per_image_pipeline_for_any_worker_count(tmp_path: Path, workers: int,
                                                                               processes: bool) -> None:
    """Every column of every batch, bit for bit and dtype for dtype, train (erase draws, one shard of two, resumed
    mid-epoch) and val (a short last batch)."""
    spec = synthetic(root=str(tmp_path / "s"), num_train=21, num_val=7, num_classes=3, img_size=16, batch_size=4)
    aug = swin(16, num_classes=3, re_prob=0.8, re_count=2)
    train = Loader(spec.train, aug.transform, 4, workers, 5, aug.targets, processes, num_shards=2, shard_id=1)
    val = Loader(spec.val, EvalTransform(16, spec.crop_pct), 4, workers, 5, python_multiprocessing=processes)
    for loader, epoch, start in ((train, 0, 0), (train, 1, 0), (train, 1, 1), (val, 0, 0)):
        expected = _per_image_batches(loader, epoch)[start:]
        batches = [tuple(t.asnumpy() for t in row) for row in loader.raw_epoch(epoch, start)]
        assert len(batches) == len(expected) == len(loader) - start
        for got, want in zip(batches, expected):
            assert len(got) == len(want) and all(a.dtype == b.dtype and np.array_equal(a, b) for a, b in zip(got, want))
    assert [b[0].shape[0] for b in (tuple(t.asnumpy() for t in row) for row in val.raw_epoch(0))] == [4, 3]


def test_an_unreadable_file_keeps_its_slot_in_a_worker_made_batch(tmp_path: Path,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    """The next readable sample fills the slot (its pixels, its label, the slot's index and draws), the batch stays
    full, the file is logged by name and counted; all files unreadable stops with what to check."""
    root = tmp_path / "set"
    _write_folder(root, {"train": {"a": 5, "b": 4}, "val": {"a": 2, "b": 2}})
    for path in _write_corrupt(tmp_path / "bad"):
        path.rename(root / "train" / "a" / path.name)
    spec = imagefolder(str(root), num_classes=2, img_size=16, batch_size=4, num_workers=1)
    train, _ = build_loaders(spec, light(16, num_classes=2), seed=0)
    with caplog.at_level(logging.WARNING):
        rows = [tuple(t.asnumpy() for t in row) for row in train.raw_epoch(0)]
    assert [row[0].shape[0] for row in rows] == [4, 4, 4] and train.skipped_files == 3
    assert all(name in caplog.text for name in ("truncated.jpg", "empty.jpg", "notes.jpg"))
    source = train._source.per_image
    for row in rows:
        for slot in np.flatnonzero(row[3]):
            pixels, label, index, skipped = source[int(row[2][slot])]
            assert skipped == 1 and index == row[2][slot] and label == row[1][slot]
            assert np.array_equal(pixels, row[0][slot])
    unreadable = tuple((str(root / "train" / "a" / name), 0) for name in ("truncated.jpg", "empty.jpg", "notes.jpg"))
    everything_bad = Loader(unreadable, EvalTransform(16, 1.0), 2, 1, 0)
    with pytest.raises(RuntimeError, match="consecutive unreadable images .* check the files under data.root"):
        list(everything_bad.raw_epoch(0))
