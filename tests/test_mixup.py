"""Mixup / CutMix batch transform: timm's target mixing, CutMix's area-corrected lam, label smoothing."""
from __future__ import annotations

import numpy as np
import pytest

from swinexp.data import Mixup
from swinexp.data.augment import build_targets
from swinexp.data.targets import SmoothedTargets
from swinexp.registry import ConfigError

B, K = 6, 10
LABELS = np.array([0, 1, 2, 3, 4, 5])  # all distinct, so target[i, label_i] reads lam directly


def _images() -> np.ndarray:
    """(B, 3, 8, 8) with every pixel distinct across images, so any paste or blend shows."""
    return np.arange(B * 3 * 8 * 8, dtype=np.float32).reshape(B, 3, 8, 8)


def test_mixup_blends_with_the_reversed_batch_and_targets_carry_the_same_lam() -> None:
    x = _images()
    out, targets = Mixup(mixup_alpha=0.8, cutmix_alpha=0.0, label_smoothing=0.0, num_classes=K)(
        x, LABELS, np.random.default_rng(0))
    lam = targets[0, LABELS[0]]
    assert 0 < lam < 1 and np.allclose(targets.sum(axis=1), 1)
    assert np.allclose(out, lam * x + (1 - lam) * x[::-1], atol=1e-3)
    assert np.allclose(targets[np.arange(B), LABELS[::-1]], 1 - lam)  # partner i <-> B-1-i
    assert np.array_equal(x, _images())  # the input batch is not modified


def test_cutmix_lam_equals_one_minus_the_pasted_area() -> None:
    x = _images()
    for seed in range(20):
        out, targets = Mixup(mixup_alpha=0.0, cutmix_alpha=1.0, label_smoothing=0.0, num_classes=K)(
            x, LABELS, np.random.default_rng(seed))
        pasted = (out != x).any(axis=1)  # (B, H, W)
        assert (pasted == pasted[0]).all()  # batch mode: one box for all images
        assert np.array_equal(out[:, :, pasted[0]], x[::-1][:, :, pasted[0]])
        area = pasted[0].sum() / pasted[0].size
        assert targets[:, LABELS].diagonal() == pytest.approx(np.full(B, 1 - area))
        assert np.allclose(targets.sum(axis=1), 1)


def test_cutmix_minmax_box_sides_stay_in_range_and_correct_lam() -> None:
    x = np.zeros((2, 1, 100, 100), np.float32)
    x[1] = 1
    mix = Mixup(mixup_alpha=0.0, cutmix_alpha=0.0, cutmix_minmax=(0.2, 0.4), label_smoothing=0.0, num_classes=2)
    assert mix.cutmix_alpha == 1.0
    out, targets = mix(x, np.array([0, 1]), np.random.default_rng(0))
    rows, cols = np.nonzero(out[0, 0])
    h, w = rows.ptp() + 1, cols.ptp() + 1
    assert 20 <= h < 40 and 20 <= w < 40 and out[0, 0].sum() == h * w
    assert targets[0, 0] == pytest.approx(1 - h * w / 10000)


def test_label_smoothing_without_mixing_gives_timms_values() -> None:
    x = _images()
    out, targets = Mixup(0.8, 1.0, prob=0.0, label_smoothing=0.1, num_classes=K)(x, LABELS, np.random.default_rng(0))
    assert np.array_equal(out, x)
    on, off = 1 - 0.1 + 0.1 / K, 0.1 / K
    expected = np.full((B, K), off, np.float32)
    expected[np.arange(B), LABELS] = on
    assert np.allclose(targets, expected) and targets[0, 0] == pytest.approx(0.91)
    _, plain = SmoothedTargets(K, 0.1)(x, LABELS, np.random.default_rng(0))
    assert np.allclose(plain, expected)


def test_smoothing_is_folded_into_mixed_targets() -> None:
    _, targets = Mixup(0.8, 0.0, label_smoothing=0.1, num_classes=K)(_images(), LABELS, np.random.default_rng(2))
    lam = (targets[0, LABELS[0]] - 0.01) / 0.9  # target = lam * 0.91 + (1 - lam) * 0.01
    assert np.allclose(targets.sum(axis=1), 1) and targets.min() == pytest.approx(0.01)
    assert targets[0, LABELS[-1]] == pytest.approx((1 - lam) * 0.9 + 0.01)


@pytest.mark.parametrize("mode", ["pair", "elem"])
def test_pair_and_elem_modes_mix_per_image(mode: str) -> None:
    x = _images()
    _, targets = Mixup(0.8, 1.0, mode=mode, label_smoothing=0.0, num_classes=K)(x, LABELS, np.random.default_rng(4))
    lam = targets[np.arange(B), LABELS]
    assert np.allclose(targets.sum(axis=1), 1) and len(np.unique(lam.round(6))) > 1  # not one lam for all
    if mode == "pair":
        assert np.allclose(lam, lam[::-1])  # i and B-1-i share a lam


def test_mixing_is_reproducible_from_the_rng() -> None:
    mix = Mixup(0.8, 1.0, num_classes=K)
    a = mix(_images(), LABELS, np.random.default_rng(7))
    b = mix(_images(), LABELS, np.random.default_rng(7))
    assert all(np.array_equal(u, v) for u, v in zip(a, b))


def test_builder_disables_mixing_cleanly_and_checks_arguments() -> None:
    args = {"cutmix_minmax": None, "mixup_prob": 1.0, "mixup_switch_prob": 0.5, "mixup_mode": "batch"}
    assert build_targets(K, 0.1, 0.0, 0.0, **args) == SmoothedTargets(K, 0.1)
    assert isinstance(build_targets(K, 0.1, 0.8, 0.0, **args), Mixup)
    with pytest.raises(ConfigError, match="mixup_alpha=-1"):
        build_targets(K, 0.1, -1.0, 0.0, **args)
    with pytest.raises(ConfigError, match="cutmix_minmax"):
        build_targets(K, 0.1, 0.0, 0.0, **{**args, "cutmix_minmax": [0.5, 0.2]})
    with pytest.raises(ValueError, match="even batch"):
        Mixup(0.8, mode="pair", num_classes=K)(_images()[:5], LABELS[:5], np.random.default_rng(0))


# --- the host draws applied equal timm's Mixup given the same draws (needs the reference extra) ---------------------

MIX_CASES = [  # (mode, mixup_alpha, cutmix_alpha, cutmix_minmax, prob, correct_lam)
    ("batch", 0.8, 1.0, None, 1.0, True), ("batch", 0.8, 0.0, None, 1.0, True), ("batch", 0.0, 1.0, None, 1.0, False),
    ("batch", 0.8, 1.0, None, 0.5, True), ("batch", 0.0, 0.0, (0.2, 0.6), 1.0, True),
    ("elem", 0.8, 1.0, None, 0.7, True), ("elem", 0.0, 1.0, None, 1.0, False), ("pair", 0.8, 1.0, None, 0.8, True),
    ("pair", 0.8, 0.0, None, 1.0, True),
]


@pytest.mark.parametrize("mode,mixup_alpha,cutmix_alpha,minmax,prob,correct_lam", MIX_CASES)
def test_draws_applied_equal_timms_mixup(monkeypatch: pytest.MonkeyPatch, mode: str, mixup_alpha: float,
                                         cutmix_alpha: float, minmax, prob: float, correct_lam: bool) -> None:
    torch = pytest.importorskip("torch", reason="the reference extra (torch, timm) is not installed")
    timm_mixup = pytest.importorskip("timm.data.mixup")
    from swinexp.data.mixup import mix_images
    from tests.replay import NumpyWith, Recorder, Replay

    kwargs = dict(mixup_alpha=mixup_alpha, cutmix_alpha=cutmix_alpha, cutmix_minmax=minmax, prob=prob,
                  switch_prob=0.5, mode=mode, correct_lam=correct_lam, label_smoothing=0.1, num_classes=K)
    ours = Mixup(**kwargs)
    reference = timm_mixup.Mixup(**kwargs)
    x = np.random.default_rng(1).standard_normal((B, 3, 21, 17)).astype(np.float32)  # odd sides: box rounding
    for seed in range(12):
        recorder = Recorder(np.random.default_rng([seed, 5]))
        draws = ours.draw(B, 21, 17, recorder)
        replay = Replay(recorder)
        monkeypatch.setattr(timm_mixup, "np", NumpyWith(replay))
        x_ref, t_ref = reference(torch.from_numpy(x.copy()), torch.from_numpy(LABELS))
        assert replay.exhausted()
        assert np.array_equal(mix_images(x, draws), x_ref.numpy()), (mode, seed)
        assert np.allclose(ours.targets(LABELS, draws), t_ref.numpy(), rtol=0, atol=1e-7), (mode, seed)


def test_the_same_draws_come_from_the_same_generator_state() -> None:
    mix = Mixup(0.8, 1.0, mode="elem", num_classes=K)
    a, b = (mix.draw(B, 8, 8, np.random.default_rng([3, 1, 2])) for _ in range(2))
    assert all(np.array_equal(getattr(a, f), getattr(b, f)) for f in ("weight", "partner_weight", "box", "lam"))
