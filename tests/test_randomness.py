"""Randomness as data: stochastic-depth and dropout draws are pure functions of (seed, rank, step, micro, site)."""
from __future__ import annotations

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn

from swinexp.amp import AmpPolicy
from swinexp.engine.step import make_train_step
from swinexp.models.layers import KeyedDropout
from swinexp.models.randomness import RandomSites, draw, keep_elements, philox_key
from swinexp.optim import adamw
from swinexp.registry import MODELS

N = 40_000  # samples per branch for the statistics: the keep rate's standard error is below 0.0025
KEY = philox_key(seed=7, rank=0)


def _kept(scales: np.ndarray) -> np.ndarray:
    return (scales > 0).astype(np.float64)


def _corr(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.corrcoef(a, b)[0, 1])


def _bound(n: int) -> float:
    return 5.0 / np.sqrt(n)  # 5 standard errors of a correlation of independent draws


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5])
def test_keep_rate_is_one_minus_p_and_kept_branches_scale_by_its_inverse(p: float) -> None:
    scales, _ = draw(RandomSites((0.0, p), ()), KEY, step=3, micro=0, batch=N)
    assert np.all(scales[0] == 1.0)  # p = 0: never dropped, never scaled
    kept = scales[1] > 0
    assert set(np.unique(scales[1])) == {np.float32(0.0), np.float32(1.0) / np.float32(1.0 - p)}
    sigma = np.sqrt(p * (1 - p) / N)
    assert abs(kept.mean() - (1 - p)) < 5 * sigma
    assert abs(scales[1].mean() - 1.0) < 5 * sigma / (1 - p)  # expectation preserved, as timm's drop_path


def test_branches_blocks_steps_micro_batches_and_ranks_draw_independently() -> None:
    sites = RandomSites((0.5,) * 6, ())  # three blocks, two branches each
    base, _ = draw(sites, KEY, step=10, micro=0, batch=N)
    pairs = {"attention vs MLP branch of a block": (base[0], base[1]),
             "block 0 vs block 2": (base[0], base[4]),
             "step 10 vs 11": (base[0], draw(sites, KEY, 11, 0, N)[0][0]),
             "micro-batch 0 vs 1": (base[0], draw(sites, KEY, 10, 1, N)[0][0]),
             "rank 0 vs 1": (base[0], draw(sites, philox_key(7, 1), 10, 0, N)[0][0]),
             "seed 7 vs 8": (base[0], draw(sites, philox_key(8, 0), 10, 0, N)[0][0])}
    for name, (a, b) in pairs.items():
        assert not np.array_equal(a, b), name
        assert abs(_corr(_kept(a), _kept(b))) < _bound(N), name
    # every branch row pairwise, and the same sample across all six rows (no whole-block drops)
    kept = _kept(base)
    corr = np.corrcoef(kept)
    assert np.all(np.abs(corr[~np.eye(6, dtype=bool)]) < _bound(N))
    assert abs(kept.all(axis=0).mean() - 0.5**6) < 5 * np.sqrt(0.5**6 / N)


def test_draws_repeat_from_their_counters_alone() -> None:
    sites = RandomSites((0.0, 0.2, 0.2), (0.0, 0.1))
    first = draw(sites, KEY, step=5, micro=1, batch=16)
    draw(sites, KEY, step=6, micro=0, batch=16)  # other draws in between change nothing
    again = draw(sites, philox_key(7, 0), step=5, micro=1, batch=16)
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a, b)
    # a branch's draws do not depend on how many sites follow it
    longer = draw(RandomSites((0.0, 0.2, 0.2, 0.4), ()), KEY, step=5, micro=1, batch=16)[0]
    np.testing.assert_array_equal(longer[:3], first[0])
    assert np.all(first[1][0] == 0) and np.all(first[1][1] != 0)  # keys only where dropout is on


def test_hashed_dropout_keeps_one_minus_p_scales_and_repeats() -> None:
    ms.set_context(mode=ms.PYNATIVE_MODE)
    p, shape = 0.3, (50, 40, 20)  # 40,000 elements
    key_a, key_b = (Tensor(k) for k in draw(RandomSites((), (p, p)), KEY, 0, 0, 1)[1])
    a = keep_elements(shape, key_a, p).asnumpy().reshape(-1)
    assert abs(a.mean() - (1 - p)) < 5 * np.sqrt(p * (1 - p) / a.size)
    np.testing.assert_array_equal(keep_elements(shape, key_a, p).asnumpy().reshape(-1), a)
    b = keep_elements(shape, key_b, p).asnumpy().reshape(-1)
    assert abs(_corr(a, b)) < _bound(a.size)  # two sites' masks are independent
    assert abs(_corr(a[:-1], a[1:])) < _bound(a.size)  # so are neighbouring elements
    cell = KeyedDropout(p)
    cell.set_train(True)
    out = cell(Tensor(np.ones(shape, np.float32)), key_a).asnumpy().reshape(-1)
    np.testing.assert_allclose(out, a / (1 - p), rtol=1e-6)
    cell.set_train(False)
    assert np.all(cell(Tensor(np.ones(shape, np.float32)), key_a).asnumpy() == 1.0)


def _micro(**overrides: object) -> nn.Cell:
    ms.set_seed(0)
    return MODELS.build({"name": "swin_micro", "img_size": 32, "num_classes": 10, "drop_path_rate": 0.5,
                         **overrides})


def test_each_branch_uses_its_own_row_and_eval_ignores_the_draws() -> None:
    ms.set_context(mode=ms.PYNATIVE_MODE)
    model = _micro()
    model.set_train(True)
    sites = model.random_sites
    assert sites.drop_path_rates == (0.0, 0.0, 0.5 / 3, 0.5 / 3, 1.0 / 3, 1.0 / 3, 0.5, 0.5)  # linear, per branch
    x = Tensor(np.random.default_rng(0).normal(size=(2, 3, 32, 32)).astype(np.float32))
    keys = Tensor(np.zeros((len(sites.dropout_rates), 2), np.int64))
    plain = model(x).asnumpy()
    ones = np.ones((8, 2), np.float32)
    np.testing.assert_array_equal(model(x, Tensor(ones), keys).asnumpy(), plain)  # all kept at scale 1

    def dropped(row: int) -> np.ndarray:
        scales = ones.copy()
        scales[row, 0] = 0.0  # sample 0 loses one branch
        return model(x, Tensor(scales), keys).asnumpy()

    attention, mlp = dropped(6), dropped(7)  # the last block's two branches
    for out in (attention, mlp):
        assert not np.allclose(out[0], plain[0]) and np.array_equal(out[1], plain[1])  # per sample
    assert not np.allclose(attention[0], mlp[0])  # two rows, two different branches
    model.set_train(False)
    np.testing.assert_array_equal(model(x, Tensor(np.zeros((8, 2), np.float32)), keys).asnumpy(), plain)


def test_every_formulation_draws_the_same_masks() -> None:
    """The index-rewrite ablation changes the computation only: same sites, so same draws in every job."""
    formulations = [{"qkv": "fused", "patch_merging": "slice", "rel_pos_bias": "gather", "custom_bprop": False},
                    {"qkv": "split", "patch_merging": "reshape", "rel_pos_bias": "onehot", "custom_bprop": True},
                    {"qkv": "fused_split", "permute": "mint"}]
    sites = {_micro(**f).random_sites for f in formulations}
    assert len(sites) == 1


def _steps(seed: int, jit: bool, accumulation_steps: int = 1) -> tuple[list[float], list[np.ndarray]]:
    model = _micro()
    model.set_train(True)
    step = make_train_step(model, adamw(model, 1e-3), AmpPolicy("O0"), None, jit,
                           accumulation_steps=accumulation_steps, seed=seed)
    rng = np.random.default_rng(1)
    images = Tensor(rng.normal(size=(4, 3, 32, 32)).astype(np.float32))
    targets = Tensor(np.eye(10, dtype=np.float32)[rng.integers(0, 10, 4)])
    losses = [step(images, targets).loss for _ in range(4)]
    return losses, [p.asnumpy() for p in model.trainable_params()]


def test_train_step_with_the_same_seed_repeats_to_the_bit_and_another_seed_does_not() -> None:
    # eagerly, to keep it quick: graph mode is what test_train and test_resume run, through run.py
    ms.set_context(mode=ms.PYNATIVE_MODE)
    losses, weights = _steps(seed=3, jit=False, accumulation_steps=2)
    again, weights_again = _steps(seed=3, jit=False, accumulation_steps=2)
    assert losses == again
    assert all(np.array_equal(a, b) for a, b in zip(weights, weights_again))
    other, _ = _steps(seed=4, jit=False, accumulation_steps=2)
    assert other[0] != losses[0]  # same weights and batch: only the drop masks differ
