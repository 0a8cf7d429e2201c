"""Real MindSpore training steps on the micro model: invariants, determinism, learnability, checkpoints."""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np
from mindspore import Tensor
from omegaconf import DictConfig, OmegaConf

from swinexp import checkpoint, hardware
from swinexp.build import build_experiment, node
from swinexp.registry import MODELS
from swinexp.train import JobInfo, fit, run


def _setup(cfg: DictConfig) -> None:
    hardware.apply(OmegaConf.to_object(cfg.hardware), int(cfg.seed))


def test_smoke_run_trains_evaluates_and_checkpoints(compose: Callable[..., DictConfig], tmp_path: Path) -> None:
    metrics = run(compose(), JobInfo(run_dir=tmp_path))
    for key in ("train/loss", "val/loss", "val/top1", "val/top5", "lr", "epoch_time_s", "train/images_per_s"):
        assert np.isfinite(metrics[key]), key
    assert 0 <= metrics["val/top1"] <= metrics["val/top5"] <= 100
    assert (tmp_path / "checkpoints" / "last.ckpt").is_file() and (tmp_path / "checkpoints" / "best.ckpt").is_file()
    assert OmegaConf.load(tmp_path / "config.yaml").model.name == "swin_micro"


def test_same_seed_gives_identical_losses(compose: Callable[..., DictConfig], tmp_path: Path) -> None:
    cfg = compose("seed=7", "data/augment=light")
    a = run(cfg, JobInfo(run_dir=tmp_path / "a"))
    b = run(cfg, JobInfo(run_dir=tmp_path / "b"))
    assert a["train/loss"] == b["train/loss"] and a["val/loss"] == b["val/loss"]


def test_overfits_a_small_fixed_set(compose: Callable[..., DictConfig], tmp_path: Path) -> None:
    cfg = compose("data.num_train=16", "data.batch_size=16", "trainer.epochs=60", "trainer.limit_val_batches=1",
                  "trainer.label_smoothing=0", "scheduler=constant", "optimizer.lr=1e-3", "optimizer.weight_decay=0",
                  "model.drop_path_rate=0")
    _setup(cfg)
    history = fit(build_experiment(cfg), tmp_path, jit=True)  # one batch per epoch: 60 steps on the same images
    assert len(history) == 60
    assert history[-1]["train/loss"] < 0.3 * history[0]["train/loss"], [m["train/loss"] for m in history]


def test_checkpoint_restores_identical_outputs(compose: Callable[..., DictConfig], tmp_path: Path) -> None:
    cfg = compose()
    _setup(cfg)
    exp = build_experiment(cfg)
    fit(exp, tmp_path, jit=True)
    images = Tensor(np.random.default_rng(0).normal(size=(2, 3, 32, 32)).astype(np.float32))
    exp.model.set_train(False)
    trained = exp.model(images).asnumpy()

    fresh = MODELS.build(node(cfg, "model"))
    fresh.set_train(False)
    assert not np.allclose(fresh(images).asnumpy(), trained)
    meta = checkpoint.load(tmp_path / "checkpoints" / "last.ckpt", fresh)
    np.testing.assert_array_equal(fresh(images).asnumpy(), trained)
    assert meta["epoch"] == 2
