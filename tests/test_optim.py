from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Callable

import numpy as np
import pytest
from mindspore import Parameter, Tensor, nn
from omegaconf import DictConfig

from swinexp.build import build_experiment, resolve
from swinexp.engine import checkpoint
from swinexp.models import fused_cpu
from swinexp.optim import OPTIMIZER_KERNELS, UPDATE_STEPS, adamw, lr_scale, param_groups, warmup_cosine
from swinexp.registry import MODELS, ConfigError


class _Net(nn.Cell):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Dense(3, 2)
        self.norm = nn.LayerNorm((2,))
        self.relative_position_bias_table = Parameter(Tensor(np.zeros((4, 2), np.float32)))

    def construct(self, x: Tensor) -> Tensor:
        return self.norm(self.fc(x)) + self.relative_position_bias_table.sum()


def test_weight_decay_skips_biases_norms_and_position_tables() -> None:
    decay, no_decay = param_groups(_Net(), 0.05)
    assert [p.name for p in decay["params"]] == ["fc.weight"] and decay["weight_decay"] == 0.05
    assert sorted(p.name for p in no_decay["params"]) == ["fc.bias", "norm.beta", "norm.gamma",
                                                          "relative_position_bias_table"]
    assert no_decay["weight_decay"] == 0.0


def _torch_adamw(p: np.ndarray, grads: list[np.ndarray], lrs: list[float], wd: float, b1: float = 0.9,
                 b2: float = 0.999, eps: float = 1e-8) -> np.ndarray:
    """torch.optim.AdamW's documented update, in float64."""
    m = np.zeros_like(p)
    v = np.zeros_like(p)
    for t, (g, lr) in enumerate(zip(grads, lrs), start=1):
        p = p * (1 - lr * wd)
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        p = p - lr * (m / (1 - b1 ** t)) / (np.sqrt(v / (1 - b2 ** t)) + eps)
    return p


@pytest.mark.parametrize("kernel", OPTIMIZER_KERNELS)
def test_adamw_follows_torch_adamw_with_bias_correction_and_per_step_lr(kernel: str) -> None:
    if kernel == "fused_cpu" and fused_cpu.compiler() is None:
        pytest.skip("no C++ compiler to build the fused kernels")
    net = nn.Dense(3, 2)
    w0 = net.weight.asnumpy().astype(np.float64)
    b0 = net.bias.asnumpy().astype(np.float64)
    lrs = [0.1, 0.05, 0.01]
    opt = adamw(net, Tensor(np.array(lrs, np.float32)), weight_decay=0.5, kernel=kernel)
    rng = np.random.default_rng(0)
    grads = [(rng.normal(size=(2, 3)), rng.normal(size=(2,))) for _ in lrs]
    for gw, gb in grads:
        opt((Tensor(gw.astype(np.float32)), Tensor(gb.astype(np.float32))))
    np.testing.assert_allclose(net.weight.asnumpy(), _torch_adamw(w0, [g[0] for g in grads], lrs, 0.5), atol=1e-5)
    np.testing.assert_allclose(net.bias.asnumpy(), _torch_adamw(b0, [g[1] for g in grads], lrs, 0.0), atol=1e-5)
    assert int(opt.global_step.asnumpy()[0]) == 3


def test_an_unknown_optimizer_kernel_is_refused_with_the_choices() -> None:
    with pytest.raises(ConfigError, match="optimizer.kernel='fast' is not one of mindspore, fused_cpu"):
        adamw(nn.Dense(3, 2), 1e-3, kernel="fast")


def test_a_checkpoint_without_the_update_count_resumes_with_it_equal_to_the_step(tmp_path: Path) -> None:
    # written before AdamW counted its updates apart from global_step; a zero count would make the first resumed
    # update ~10x too large (bias correction of step 1 on warmed-up moments)
    net = nn.Dense(3, 2)
    opt = adamw(net, lr=1e-3)
    for _ in range(3):
        opt((Tensor(np.ones((2, 3), np.float32)), Tensor(np.ones(2, np.float32))))
    path = checkpoint.save(tmp_path / "old.ckpt", net, opt)
    values = {k: v for k, v in checkpoint.read(path).items() if k != UPDATE_STEPS}
    fresh = adamw(net, lr=1e-3)
    checkpoint.load(values, net, fresh)
    assert int(fresh.update_steps.asnumpy()[0]) == int(fresh.global_step.asnumpy()[0]) == 3


def test_warmup_cosine_endpoints_follow_the_formula() -> None:
    lr = warmup_cosine(base_lr=1e-3, epochs=10, steps_per_epoch=10, warmup_epochs=2, warmup_lr=1e-6, min_lr=1e-5)
    assert lr.shape == (100,)
    assert lr[0] == pytest.approx(1e-6)
    assert lr[10] == pytest.approx(1e-6 + (1e-3 - 1e-6) * 10 / 20)
    assert lr[20] == pytest.approx(1e-3)  # warmup done: the peak
    assert lr[60] == pytest.approx(1e-5 + 0.5 * (1e-3 - 1e-5) * (1 + math.cos(math.pi * 40 / 80)))
    assert lr[-1] == pytest.approx(1e-5 + 0.5 * (1e-3 - 1e-5) * (1 + math.cos(math.pi * 79 / 80)))
    assert np.all(np.diff(lr[:20]) > 0) and np.all(np.diff(lr[20:]) < 0)


def _official_warmup_cosine(t: int, base_lr: float, total: int, warmup: int, warmup_lr: float,
                            min_lr: float) -> float:
    """timm's CosineLRScheduler as the official build_scheduler sets it up: warmup_t=warmup (already truncated by
    the caller: int(warmup_epochs * steps_per_epoch)), warmup_prefix=True, t_initial=total - warmup."""
    if t < warmup:
        return warmup_lr + t * (base_lr - warmup_lr) / warmup
    return min_lr + 0.5 * (base_lr - min_lr) * (1 + math.cos(math.pi * (t - warmup) / (total - warmup)))


def test_fractional_warmup_truncates_like_the_official_scheduler() -> None:
    # 0.5 x 15 = 7.5 warmup steps: the official int() gives 7 (rounding gave 8 and an LR off by up to 12.5%)
    lr = warmup_cosine(base_lr=1e-3, epochs=2, steps_per_epoch=15, warmup_epochs=0.5, warmup_lr=1e-6, min_lr=1e-5)
    official = [_official_warmup_cosine(t, 1e-3, 30, int(0.5 * 15), 1e-6, 1e-5) for t in range(30)]
    np.testing.assert_allclose(lr, official, rtol=1e-6)
    assert lr[7] == pytest.approx(1e-3) and lr[6] < 1e-3  # the peak at step 7, not 8


def test_a_run_shorter_than_its_warmup_trains_with_the_warmup_cut_to_the_run(
        compose: Callable[..., DictConfig], caplog: pytest.LogCaptureFixture) -> None:
    # trainer.epochs=1 with the default warmup_epochs=1 used to fail: "warmup_epochs=1 must be < trainer.epochs=1"
    cfg = compose("trainer.epochs=1", "scheduler.warmup_epochs=1", "tracking=none")
    with caplog.at_level(logging.WARNING, logger="swinexp"):
        exp = build_experiment(resolve(cfg))
    assert "warmup is cut to the run's 3 steps" in caplog.text
    lr = exp.lr_schedule
    assert lr.shape == (3,) and lr[0] == pytest.approx(5e-7) and np.all(np.diff(lr) > 0) and lr[-1] < 2e-3
    longer = warmup_cosine(base_lr=1e-3, epochs=3, steps_per_epoch=4, warmup_epochs=5, warmup_lr=0.0)
    np.testing.assert_allclose(longer, 1e-3 * np.arange(12) / 12, rtol=1e-6)  # linear over the whole run
    with pytest.raises(ConfigError, match="scheduler.warmup_epochs=-1"):
        warmup_cosine(base_lr=1e-3, epochs=3, steps_per_epoch=4, warmup_epochs=-1)


def test_swin_no_decay_group_is_exactly_biases_norms_and_position_tables() -> None:
    net = MODELS.build({"name": "swin_micro", "img_size": 32, "num_classes": 10, "depths": [1, 1], "ape": True})
    decay, no_decay = param_groups(net, 0.05)
    expected = {p.name for p in net.trainable_params() if p.ndim == 1 or p.name.endswith(
        ("absolute_pos_embed", "relative_position_bias_table"))}
    assert {p.name for p in no_decay["params"]} == expected
    assert "absolute_pos_embed" in expected and any(n.endswith("relative_position_bias_table") for n in expected)
    assert all(p.ndim == 2 or p.ndim == 4 for p in decay["params"])  # Dense and Conv2d kernels only


def test_lr_scale_is_total_batch_over_reference_batch() -> None:
    assert lr_scale(1024, 512) == 2.0 and lr_scale(128, 512) == 0.25
    assert lr_scale(64, None) == 1.0  # disabled: the LR is used as given
    with pytest.raises(ConfigError, match="trainer.lr_batch_size=0 must be > 0"):
        lr_scale(64, 0)


def test_official_recipe_scales_every_lr_by_total_batch_and_counts_optimizer_steps(
        compose: Callable[..., DictConfig]) -> None:
    # smoke: 3 batches of 8 per epoch; accumulation 2 -> 1 optimizer step per epoch, total batch 16 = 2 x 8
    cfg = compose("optimizer=adamw_swin", "scheduler.warmup_epochs=20", "trainer=swin_official",
                  "trainer.epochs=40", "trainer.accumulation_steps=2", "trainer.lr_batch_size=8",
                  "trainer.limit_train_batches=3", "tracking=none")
    exp = build_experiment(resolve(cfg))
    scale = 16 / 8
    assert exp.total_batch == 16 and exp.steps_per_epoch == 1
    lr = exp.lr_schedule
    assert lr.shape == (40,)  # one entry per optimizer step
    assert lr[0] == pytest.approx(5e-7 * scale)  # warmup start
    assert lr[20] == pytest.approx(5e-4 * scale)  # 20 warmup epochs done: the peak
    assert lr[-1] == pytest.approx(scale * (5e-6 + 0.5 * (5e-4 - 5e-6) * (1 + math.cos(math.pi * 19 / 20))))
    assert exp.trainer.clip_grad == 5.0 and exp.trainer.label_smoothing == 0.1


def test_default_config_keeps_its_unscaled_lr(compose: Callable[..., DictConfig]) -> None:
    exp = build_experiment(resolve(compose("tracking=none")))
    assert exp.trainer.lr_batch_size is None and exp.lr_schedule.max() == pytest.approx(2e-3, rel=1e-3)
