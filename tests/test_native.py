"""data.pipeline=native (swinexp/data/native.py): an ablation that changes only the per-image pixel transforms."""
from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path
from typing import Callable

import mindspore.dataset.vision as vision
import numpy as np
import pytest
from omegaconf import DictConfig
from PIL import Image

from swinexp.app.job import run
from swinexp.app.job_info import JobInfo
from swinexp.build import build_data_spec, build_experiment, resolve
from swinexp.data.augment import light, swin
from swinexp.data.datasets import imagefolder
from swinexp.data.native import NativeTransform, native_of, rand_augment_magnitude
from swinexp.data.pipeline import Loader
from swinexp.data.transforms import IMAGENET_MEAN, IMAGENET_STD, EvalTransform
from swinexp.registry import ConfigError
from swinexp.tracking import flatten
from tests.conftest import ROOT, SMOKE


def test_native_and_exact_plans_differ_only_in_data_pipeline(compose: Callable[..., DictConfig]) -> None:
    exact = flatten(resolve(compose("data/augment=swin")).values)
    native = flatten(resolve(compose("data/augment=swin", "data.pipeline=native")).values)
    assert exact["data.pipeline"] == "exact"  # the default
    assert {k for k in exact.keys() | native.keys() if exact.get(k) != native.get(k)} == {"data.pipeline"}


def test_an_unknown_pipeline_is_refused_naming_the_choices(compose: Callable[..., DictConfig]) -> None:
    with pytest.raises(ConfigError, match=r"data.pipeline='nativ'.*exact, native.*Did you mean 'native'"):
        resolve(compose("data.pipeline=nativ"))


def test_a_recipe_without_native_counterparts_is_refused_before_building(compose: Callable[..., DictConfig]) -> None:
    with pytest.raises(ConfigError, match="augmix"):
        resolve(compose("data.pipeline=native", "data/augment=swin", "data.augment.auto_augment=augmix-m5-w4-d2"))
    resolve(compose("data.pipeline=exact", "data/augment=swin", "data.augment.auto_augment=augmix-m5-w4-d2"))


def test_both_pipelines_feed_the_same_samples_labels_and_mixup(compose: Callable[..., DictConfig]) -> None:
    """Only the pixels differ: the batch's samples, labels and Mixup/CutMix targets are the same."""
    rows = {}
    for pipeline in ("exact", "native"):
        loader = build_experiment(resolve(compose("data/augment=swin", f"data.pipeline={pipeline}"))).train_loader
        row = next(iter(loader.raw_epoch(0)))
        rows[pipeline] = (row, loader.host_part(row))
    (exact, (exact_draws, exact_targets)), (native, (native_draws, native_targets)) = rows.values()
    assert np.array_equal(exact[2].asnumpy(), native[2].asnumpy())  # sample indices
    assert np.array_equal(exact[1].asnumpy(), native[1].asnumpy())  # labels
    np.testing.assert_array_equal(exact_targets.asnumpy(), native_targets.asnumpy())
    assert exact[0].shape == native[0].shape and not np.array_equal(exact[0].asnumpy(), native[0].asnumpy())


def test_the_swin_recipe_maps_to_mindspore_ops_with_its_numbers() -> None:
    native = native_of(swin(32, num_classes=10).transform)
    assert [type(op) for op in native.operations] == [vision.Decode, vision.RandomResizedCrop,
                                                       vision.RandomHorizontalFlip, vision.RandAugment]
    assert native.erasing is not None and native.img_size == 32  # erasing stays a host draw for the prologue
    assert rand_augment_magnitude(9) == 27  # m9 of 10 -> bin 27 of 31: 0.9 of each op's range, as timm
    with pytest.raises(ConfigError, match="interpolation='random'.*bicubic"):
        native_of(light(32, interpolation="random").transform)
    with pytest.raises(ConfigError, match="augmix"):
        native_of(swin(32, auto_augment="augmix-m5-w4-d2").transform)


@pytest.mark.parametrize("width,height", [(500, 375), (300, 460)])
def test_native_squash_resizes_both_sides_as_the_exact_one(width: int, height: int) -> None:
    yy, xx = np.mgrid[0:height, 0:width]  # smooth, so OpenCV's and PIL's bicubic kernels agree within a level
    img = Image.fromarray(np.stack([xx * 255 / width, yy * 255 / height, (xx + yy) * 127 / (width + height)],
                                   axis=-1).astype(np.uint8))
    exact = EvalTransform(64, 1.0, crop_mode="squash")
    squashed = native_of(exact).pixels(img).astype(np.int16)
    assert squashed.shape == exact.pixels(img).shape == (64, 64, 3)
    assert np.abs(squashed - exact.pixels(img)).max() <= 2
    centered = native_of(EvalTransform(64, 1.0)).pixels(img)
    assert np.abs(centered - exact.pixels(img).astype(np.int16)).mean() > 4  # the center crop loses the long side


def _by_index(loader: Loader, epoch: int) -> dict[int, np.ndarray]:
    """uint8 pixels of one epoch's raw batches, keyed by sample (the epoch-carrying index mod N)."""
    out = {}
    for row in loader.raw_epoch(epoch):
        for index, pixels in zip(row[2].asnumpy(), row[0].asnumpy()):
            out[int(index) % len(loader.sampler.indices())] = pixels
    return out


@pytest.mark.parametrize("workers", [1, 2])
def test_native_epochs_repeat_with_the_seed_and_differ_between_epochs(compose: Callable[..., DictConfig],
                                                                      workers: int) -> None:
    spec = build_data_spec(resolve(compose("data.pipeline=native")))
    aug = swin(spec.img_size, num_classes=spec.num_classes)

    def loader() -> Loader:
        return Loader(spec.train, native_of(aug.transform), spec.batch_size, workers, 5, aug.targets)

    first, again = _by_index(loader(), 0), _by_index(loader(), 0)
    assert first.keys() == again.keys() and all(np.array_equal(first[i], again[i]) for i in first)
    second = _by_index(loader(), 1)
    same = [i for i in first.keys() & second.keys() if np.array_equal(first[i], second[i])]
    assert len(same) < len(first) // 4, "epoch 1 repeated epoch 0's augmentation"


def test_native_training_runs_on_augmented_uint8_batches(compose: Callable[..., DictConfig], tmp_path: Path) -> None:
    cfg = compose("data.pipeline=native", "data/augment=swin")
    exp = build_experiment(resolve(cfg))
    assert isinstance(exp.train_loader._native.erasing, type(swin(32).transform.erasing))  # erase draws travel
    row = next(iter(exp.train_loader.raw_epoch(0)))
    pixels = row[0].asnumpy()
    assert pixels.shape == (8, 32, 32, 3) and pixels.dtype == np.uint8 and pixels.max() > pixels.min()
    images, targets = exp.train_loader.finish(row)
    assert images.shape == (8, 3, 32, 32) and targets.shape == (8, 10)
    x = images.asnumpy()
    assert x.dtype == np.float32 and np.isfinite(x).all()
    low = min((0 - m) / s for m, s in zip(IMAGENET_MEAN, IMAGENET_STD))
    assert x.min() < low + 0.5 and x.max() > 1.0  # normalized, not raw 0..255 (pixel erasing adds N(0, 1) values)
    np.testing.assert_allclose(targets.asnumpy().sum(1), 1.0, atol=1e-5)  # mixed, smoothed soft targets
    val_pixels = next(iter(exp.val_loader.raw_epoch(0)))[0].asnumpy()
    assert val_pixels.shape == (8, 32, 32, 3) and val_pixels.dtype == np.uint8
    assert isinstance(exp.val_loader._native.transform, NativeTransform)  # eval runs the native ops too
    metrics = run(cfg, JobInfo(run_dir=tmp_path))
    assert metrics["train/optimizer_steps"] > 0
    for key in ("train/loss", "val/loss", "val/top1"):
        assert np.isfinite(metrics[key]), key


def _write_split(root: Path) -> None:
    for label in ("a", "b"):
        (root / label).mkdir(parents=True)
        for i in range(6):
            Image.effect_noise((24, 24), 40 + i).convert("RGB").save(root / label / f"{i}.jpg")


def test_unreadable_files_keep_their_slot_on_the_native_path_too(tmp_path: Path,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    """As on the exact path: the next readable sample fills the slot, the file is logged by name and counted. The
    JPEG cut in half is one on which MindSpore's Decode kills the process (SIGFPE); the one cut short by 40 bytes
    it decodes with a warning, where PIL refuses it."""
    for split in ("train", "val"):
        _write_split(tmp_path / split)
    whole = (tmp_path / "train" / "b" / "3.jpg").read_bytes()
    (tmp_path / "train" / "b" / "truncated.jpg").write_bytes(whole[: len(whole) // 2])
    (tmp_path / "train" / "b" / "cut_late.jpg").write_bytes(whole[:-40])
    (tmp_path / "train" / "b" / "empty.jpg").write_bytes(b"")
    (tmp_path / "train" / "a" / "notes.jpg").write_text("not an image")
    spec = imagefolder(str(tmp_path), img_size=16, batch_size=4, num_workers=2, crop_pct=1.0, pipeline="native")
    aug = swin(16, num_classes=2)
    loader = Loader(spec.train, native_of(aug.transform), 4, 2, 0, aug.targets)  # 16 files: every one is read
    with caplog.at_level(logging.WARNING):
        rows = [tuple(t.asnumpy() for t in row) for row in loader.raw_epoch(0)]
    assert [row[0].shape for row in rows] == [(4, 16, 16, 3)] * 4 and loader.skipped_files == 4
    assert all(name in caplog.text for name in ("truncated.jpg", "cut_late.jpg", "empty.jpg", "notes.jpg"))
    for row in rows:
        for slot in np.flatnonzero(row[3]):
            data, label, index, skipped = loader._native[int(row[2][slot])][:4]
            assert skipped == 1 and index == row[2][slot] and label == row[1][slot] and data.size > 0


def test_a_file_decode_refuses_stops_a_native_epoch_naming_the_file_and_the_fix(tmp_path: Path) -> None:
    for split in ("train", "val"):
        _write_split(tmp_path / split)
    bad = tmp_path / "val" / "b" / "noise.png"
    Image.effect_noise((24, 24), 40).convert("RGB").save(bad)
    whole = bytearray(bad.read_bytes())
    whole[len(whole) // 2:len(whole) // 2 + 40] = bytes(40)  # broken pixel data, intact headers and IEND
    bad.write_bytes(bytes(whole))
    spec = imagefolder(str(tmp_path), img_size=16, batch_size=4, num_workers=2, crop_pct=1.0, pipeline="native")
    loader = Loader(spec.val, native_of(EvalTransform(16, 1.0)), 4, 2, 0)
    with pytest.raises(RuntimeError, match=r"cannot decode '.*noise.png'.*Remove or replace the file.*"
                                           "data.pipeline=exact"):
        list(loader.raw_epoch(0))
    bad.unlink()
    assert sum(row[0].shape[0] for row in Loader(spec.val[:12], native_of(EvalTransform(16, 1.0)), 4, 2, 0)
               .raw_epoch(0)) == 12


@pytest.mark.slow
def test_the_pipeline_ablation_runs_through_the_cli(synthetic_root: Path, tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, str(ROOT / "run.py"), "-m", *SMOKE, f"data.root={synthetic_root}",
                          "data/augment=swin", "data.pipeline=exact,native", f"hydra.sweep.dir={tmp_path}"],
                         capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    for job, pipeline in (("0", "exact"), ("1", "native")):
        assert (tmp_path / job / "overrides.yaml").read_text().count(f"data.pipeline={pipeline}") == 1
        metrics = json.loads((tmp_path / job / "metrics.json").read_text())
        assert metrics["train/optimizer_steps"] > 0 and np.isfinite(metrics["val/loss"]), job
