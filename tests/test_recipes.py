"""The official ImageNet-1k presets, trainer.stop_after_epoch (a screen of the full schedule) and the named sweeps'
screen default, composed from the real config; the dry run that states a recipe in numbers."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest
from omegaconf import DictConfig
from PIL import Image

from swinexp.app.dry_run import describe, epoch_end_lr
from swinexp.build import build_schedule, resolve
from swinexp.config import read
from swinexp.registry import ConfigError
from tests.conftest import ROOT

PRESETS = {"swin_tiny_in1k": ("swin_tiny", 0.2), "swin_small_in1k": ("swin_small", 0.3),
           "swin_base_in1k": ("swin_base", 0.5)}  # drop_path_rate of the official configs
SCREENING_SWEEPS = ("accumulation", "amp_ablation", "index_rewrites", "pipeline_ablation")


def _folder(root: Path, classes: int = 2, per_class: int = 3) -> Path:
    """A tiny ImageNet-layout folder: <root>/{train,val}/<class>/<n>.JPEG."""
    for split in ("train", "val"):
        for c in range(classes):
            (root / split / f"n{c:08d}").mkdir(parents=True)
            for i in range(per_class):
                Image.new("RGB", (40, 40), (40 * i, 80, 120)).save(root / split / f"n{c:08d}" / f"{i}.JPEG")
    return root


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_preset_is_the_official_in1k_recipe(compose: Callable[..., DictConfig], preset: str) -> None:
    cfg = compose(f"experiment={preset}", "data.root=/data/imagenet", smoke=False)
    model, drop_path = PRESETS[preset]
    assert (cfg.model.name, cfg.model.drop_path_rate) == (model, drop_path)
    assert (cfg.trainer.epochs, cfg.trainer.clip_grad, cfg.trainer.lr_batch_size) == (300, 5.0, 512)
    assert cfg.trainer.stop_after_epoch is None and cfg.trainer.label_smoothing == 0.1
    plan = read(cfg)  # data.img_size: null = the model's native 224 px
    assert (plan.get("data.name"), plan.get("data.batch_size"), plan.get("data.img_size"),
            plan.get("data.augment.name"), plan.get("model.img_size")) == ("imagenet", 128, 224, "swin", 224)
    assert (cfg.optimizer.name, cfg.optimizer.lr, cfg.scheduler.warmup_epochs) == ("adamw_swin", 5e-4, 20)
    screen = compose(f"experiment={preset}", "data.root=/data/imagenet", "trainer.stop_after_epoch=10", smoke=False)
    assert read(screen).trainer.stop_after_epoch == 10 and read(screen).trainer.epochs == 300


@pytest.mark.parametrize("stop", [0, 3])
def test_stop_after_epoch_outside_the_run_is_a_config_error(compose: Callable[..., DictConfig], stop: int) -> None:
    with pytest.raises(ConfigError, match=f"trainer.stop_after_epoch={stop} must be between 1 and trainer.epochs=2"):
        resolve(compose(f"trainer.stop_after_epoch={stop}"))  # trainer=smoke: 2 epochs


@pytest.mark.parametrize("sweep", SCREENING_SWEEPS)
def test_named_sweep_screens_at_epoch_10_of_the_full_schedule(compose: Callable[..., DictConfig], sweep: str) -> None:
    full = compose(f"sweep={sweep}", "experiment=swin_tiny_in1k", "data.root=/data/imagenet", smoke=False)
    assert read(full).trainer.epochs == 300 and read(full).trainer.stop_after_epoch == 10
    assert read(compose(f"sweep={sweep}")).trainer.stop_after_epoch == 2  # a 2-epoch run: stop at its end
    continued = compose(f"sweep={sweep}", "trainer.epochs=300", "trainer.stop_after_epoch=null")
    assert read(continued).trainer.stop_after_epoch is None
    comment = (ROOT / "sweeps" / f"{sweep}.yaml").read_text()
    assert "trainer.stop_after_epoch=null hydra.mode=RUN hydra.run.dir=<sweep dir>/<job num>" in comment


def test_a_screen_logs_the_lr_of_the_full_schedule_not_a_squeezed_one(compose: Callable[..., DictConfig]) -> None:
    def at_epoch_10(*overrides: str) -> tuple[float, str]:
        cfg = compose("trainer.limit_train_batches=null", "scheduler.warmup_epochs=1", *overrides)
        text = describe(resolve(cfg))
        return float(text.rsplit("epoch 10: ", 1)[1]), text

    screen, text = at_epoch_10("trainer.epochs=300", "trainer.stop_after_epoch=10")
    squeezed, _ = at_epoch_10("trainer.epochs=10")
    cfg = compose("trainer.limit_train_batches=null", "scheduler.warmup_epochs=1", "trainer.epochs=300")
    steps = 96 // 8  # the SMOKE data: 96 train images in batches of 8
    assert f"over 300 epochs x {steps} optimizer steps" in text and "stop: after epoch 10 of 300 (a screen" in text
    assert screen == pytest.approx(epoch_end_lr(build_schedule(resolve(cfg), 8, steps), steps, 10), rel=1e-3)
    assert squeezed == pytest.approx(cfg.scheduler.min_lr, rel=0.1)  # 10 epochs: epoch 10 is at the cosine floor
    assert screen > 100 * squeezed


@pytest.mark.slow
def test_dry_run_of_the_preset_prints_the_full_recipe(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, str(ROOT / "run.py"), "experiment=swin_tiny_in1k",
                          f"data.root={_folder(tmp_path / 'in1k')}", "data.num_classes=2", "dry_run=true"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    for line in ("model: swin_tiny, 224 px, 2 classes, drop_path_rate 0.2",
                 "data: imagenet at", "6 train / 6 val images, augment swin, total batch 128",
                 "optimizer: adamw_swin, lr 0.0005 quoted at total batch 512, weight_decay 0.05",
                 "trainer: 300 epochs, clip_grad 5.0, label_smoothing 0.1", "stop: after epoch 300 of 300",
                 "schedule: warmup_cosine (warmup_epochs=20, warmup_lr=5e-07, min_lr=5e-06)"):
        assert line in out.stdout, (line, out.stdout)
    assert not (tmp_path / "mlflow.db").exists()  # a dry run opens no store
