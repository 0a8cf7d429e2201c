"""The jitted train step: overflow skip, gradient accumulation, clipping, EMA."""
from __future__ import annotations

import logging
from typing import Callable

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn

from swinexp.amp import AmpPolicy
from swinexp.engine.step import (
    StepOutput,
    TrainStep,
    clip_by_global_norm,
    global_norm,
    log_softmax,
    make_train_step,
    soft_target_cross_entropy,
)
from swinexp.optim import adamw
from swinexp.registry import AMP_POLICIES, MODELS, ConfigError


def _dense() -> nn.Cell:
    net = nn.Dense(4, 3)
    net.weight.set_data(Tensor(np.random.default_rng(1).normal(size=(3, 4)).astype(np.float32)))
    return net


def _batch(n: int, seed: int = 0, size: tuple[int, ...] = (4,), classes: int = 3) -> tuple[Tensor, Tensor]:
    rng = np.random.default_rng(seed)
    return (Tensor(rng.normal(size=(n, *size)).astype(np.float32)),
            Tensor(np.eye(classes, dtype=np.float32)[rng.integers(0, classes, n)]))


def _weights(net: nn.Cell) -> list[np.ndarray]:
    return [p.asnumpy().copy() for p in net.trainable_params()]


def _step_count(optimizer: nn.Optimizer) -> int:
    return int(optimizer.global_step.asnumpy().reshape(-1)[0])


def test_the_loss_is_timms_soft_target_cross_entropy_with_its_gradient_for_large_and_fp16_logits() -> None:
    """The loss's own log-softmax (step.py: not MindSpore's LogSoftmax kernel) against float64 numpy, at logits that
    overflow a naive exp and in fp16; the gradient must be softmax * sum(targets) - targets over the batch size."""
    rng = np.random.default_rng(0)
    logits = (rng.standard_normal((4, 7)) * [[1.0], [30.0], [1e3], [1e4]]).astype(np.float32)
    targets = rng.dirichlet(np.ones(7), 4).astype(np.float32)
    wide = logits.astype(np.float64)
    log_p = wide - wide.max(-1, keepdims=True)
    log_p -= np.log(np.exp(log_p).sum(-1, keepdims=True))
    expected = float(-(targets * log_p).sum(-1).mean())
    expected_grad = (np.exp(log_p) * targets.sum(-1, keepdims=True) - targets) / len(targets)
    loss, grad = ms.value_and_grad(soft_target_cross_entropy)(Tensor(logits), Tensor(targets))
    np.testing.assert_allclose(float(loss.asnumpy()), expected, rtol=1e-6)
    np.testing.assert_allclose(grad.asnumpy(), expected_grad, atol=1e-7)
    half = soft_target_cross_entropy(Tensor(logits[:2].astype(np.float16)), Tensor(targets[:2]))
    assert half.dtype == ms.float32 and np.isfinite(float(half.asnumpy()))


def test_the_loss_and_its_gradient_repeat_to_the_bit_while_the_kernels_tune_their_parallel_split() -> None:
    """MindSpore's CPU kernels time several parallel splits over their first ~15 calls; the loss must not change
    with the split (MindSpore's Log did, in the last bit, at some batch sizes, 20 among them). A shape no other
    test uses, so the kernels are new here."""
    rng = np.random.default_rng(1)
    logits = Tensor(rng.standard_normal((20, 13)).astype(np.float32))
    targets = Tensor(rng.dirichlet(np.ones(13), 20).astype(np.float32))
    loss_grad = ms.grad(soft_target_cross_entropy)
    results = {(log_softmax(logits).asnumpy().tobytes(), loss_grad(logits, targets).asnumpy().tobytes())
               for _ in range(24)}
    assert len(results) == 1


def test_fp16_overflow_is_skipped_and_halves_the_scale() -> None:
    policy = AMP_POLICIES.build({"name": "o3", "init_scale": 2.0**40})  # 2^40 x dlogits overflows fp16 (max 65504)
    net = policy.apply(_dense())
    optimizer = nn.SGD(net.trainable_params(), learning_rate=0.1)
    step = make_train_step(net, optimizer, policy, clip_grad=None, jit=True)
    before = _weights(net)
    out = step(*_batch(8))
    assert out.updated and out.overflow and np.isfinite(out.loss) and out.loss_scale == 2.0**40
    assert all(np.array_equal(a, b) for a, b in zip(before, _weights(net)))  # weights unchanged
    assert float(step.scaler.scale_value.asnumpy()) == 2.0**39
    assert _step_count(optimizer) == 1  # no update, but the LR schedule moves on (as the official loop)


@pytest.mark.parametrize("kernel", ["mindspore", "fused_cpu"])
def test_an_overflow_skipped_step_still_advances_the_lr_schedule(kernel: str) -> None:
    # scale 2^40 overflows fp16; the factor 2^30 brings the next step down to 2^10, which does not
    policy = AMP_POLICIES.build({"name": "o3", "init_scale": 2.0**40, "scale_factor": 2**30})
    net = policy.apply(_dense())
    lrs = np.array([0.1, 0.01, 0.001], np.float32)
    optimizer = adamw(net, Tensor(lrs), weight_decay=0.0, kernel=kernel)
    step = make_train_step(net, optimizer, policy, clip_grad=None, jit=True)
    before = _weights(net)
    assert step(*_batch(8)).overflow
    assert all(np.array_equal(a, b) for a, b in zip(before, _weights(net)))
    assert _step_count(optimizer) == 1 and int(optimizer.update_steps.asnumpy()[0]) == 0
    assert not step(*_batch(8)).overflow
    assert _step_count(optimizer) == 2 and int(optimizer.update_steps.asnumpy()[0]) == 1
    # AdamW's first update (bias correction t=1, as torch's: GradScaler skipped optimizer.step()) is lr * sign(g):
    # every weight moved by the schedule's value at step 1, 0.01 (not step 0's 0.1; t=2 would give 0.0074)
    for a, b in zip(before, _weights(net)):
        np.testing.assert_allclose(np.abs(b - a), lrs[1], rtol=1e-3)


def test_clean_steps_grow_the_scale_after_the_window() -> None:
    policy = AMP_POLICIES.build({"name": "o2", "init_scale": 4, "scale_window": 2})
    net = policy.apply(_dense())
    step = make_train_step(net, nn.SGD(net.trainable_params(), learning_rate=0.1), policy, None, jit=True)
    scales = [step(*_batch(8)).loss_scale for _ in range(3)]
    assert scales == [4.0, 4.0, 8.0]


def _swin_micro() -> nn.Cell:
    return MODELS.build({"name": "swin_micro", "img_size": 32, "num_classes": 10, "depths": [1, 1],
                         "drop_path_rate": 0.0})


def _mlp() -> nn.Cell:
    return nn.SequentialCell([nn.Dense(4, 8), nn.LayerNorm((8,)), nn.GELU(), nn.Dense(8, 3)])


def _sgd_after_one_update(make_net: Callable[[], nn.Cell], batches: list[tuple[Tensor, Tensor]],
                          jit: bool) -> tuple[list[np.ndarray], int, list[StepOutput]]:
    """Train a fresh net with fixed weights and SGD lr 1 (the update is the gradient, so weights compare grads)."""
    net = make_net()
    for i, p in enumerate(net.trainable_params()):  # identical weights in every call
        p.set_data(Tensor(np.random.default_rng(i).normal(0, 0.05, p.shape).astype(np.float32)))
    optimizer = nn.SGD(net.trainable_params(), learning_rate=1.0)
    step = make_train_step(net, optimizer, AmpPolicy("O0"), None, jit, accumulation_steps=len(batches))
    outs = [step(*b) for b in batches]
    return _weights(net), _step_count(optimizer), outs


@pytest.mark.parametrize("make_net,size,classes,jit", [(_swin_micro, (3, 32, 32), 10, False), (_mlp, (4,), 3, True)],
                         ids=["swin_micro-pynative", "mlp-jit"])
def test_four_micro_batches_equal_one_batch_of_four_times_the_size(make_net: Callable[[], nn.Cell],
                                                                    size: tuple[int, ...], classes: int,
                                                                    jit: bool) -> None:
    images, targets = _batch(8, size=size, classes=classes)
    whole, whole_steps, whole_out = _sgd_after_one_update(make_net, [(images, targets)], jit)
    micro = [(images[i:i + 2], targets[i:i + 2]) for i in range(0, 8, 2)]
    accumulated, micro_steps, micro_out = _sgd_after_one_update(make_net, micro, jit)
    assert whole_steps == micro_steps == 1  # one optimizer step for the four micro-batches
    assert [o.updated for o in micro_out] == [False, False, False, True]
    assert micro_out[-1].grad_norm == pytest.approx(whole_out[0].grad_norm, rel=1e-5)
    for a, b in zip(accumulated, whole):
        np.testing.assert_allclose(a, b, atol=1e-5)


def test_a_non_finite_micro_batch_skips_the_whole_window_and_leaves_clean_buffers() -> None:
    net = _dense()
    optimizer = nn.SGD(net.trainable_params(), learning_rate=0.1)
    step = make_train_step(net, optimizer, AmpPolicy("O0"), None, jit=True, accumulation_steps=2)
    before = _weights(net)
    bad = Tensor(np.full((4, 4), np.inf, np.float32))
    step(bad, _batch(4)[1])
    out = step(*_batch(4))  # finite, but the window had an overflow
    assert out.overflow and _step_count(optimizer) == 1  # skipped: no update, the LR schedule moves on
    assert all(np.array_equal(a, b) for a, b in zip(before, _weights(net)))
    assert all(np.all(buf.asnumpy() == 0) for buf in step.accum)  # cleared by subtraction, still finite
    step(*_batch(4, seed=1))
    assert not step(*_batch(4, seed=2)).overflow and _step_count(optimizer) == 2  # the next window trains
    assert not all(np.array_equal(a, b) for a, b in zip(before, _weights(net)))


def test_clipping_bounds_the_unscaled_gradient_norm() -> None:
    policy = AMP_POLICIES.build({"name": "o2"})  # scaled by 2^16: clipping must see the unscaled gradient
    net = policy.apply(_dense())
    step = make_train_step(net, nn.SGD(net.trainable_params(), learning_rate=1.0), policy, clip_grad=1e-3, jit=True)
    before = _weights(net)
    out = step(*_batch(8))
    moved = np.sqrt(sum(np.sum((a - b) ** 2) for a, b in zip(_weights(net), before)))
    assert out.grad_norm > 1e-2 and not out.overflow  # logged before clipping, unscaled
    assert moved == pytest.approx(1e-3, rel=1e-3)  # SGD lr 1: the step is the clipped gradient


def _adamw_run(kernel: str, clip_grad: float | None, jit: bool) -> tuple[list[np.ndarray], list[tuple[float, ...]]]:
    # 2^40 overflows fp16; the factor 2^28 takes the next window to 2^12, which does not, and two clean windows later
    # back to 2^40: windows 1 and 4 are skipped
    policy = AMP_POLICIES.build({"name": "o2", "init_scale": 2.0**40, "scale_factor": 2**28, "scale_window": 2})
    net = policy.apply(_mlp())
    for i, p in enumerate(net.trainable_params()):
        p.set_data(Tensor(np.random.default_rng(i).normal(0, 0.5, p.shape).astype(np.float32)))
    optimizer = adamw(net, Tensor(np.linspace(1e-2, 1e-3, 4, dtype=np.float32)), weight_decay=0.05, kernel=kernel)
    step = make_train_step(net, optimizer, policy, clip_grad, jit=jit, accumulation_steps=2)
    outs = [step(*_batch(4, seed=i)) for i in range(8)]
    return _weights(net), [(o.loss, o.grad_norm, o.overflow, o.loss_scale) for o in outs if o.updated]


@pytest.mark.parametrize("jit", [True, False], ids=["graph", "pynative"])
@pytest.mark.parametrize("clip_grad", [None, 0.5], ids=["no-clip", "clip"])
def test_the_fused_cpu_update_trains_as_the_mindspore_kernels(clip_grad: float | None, jit: bool) -> None:
    """optimizer.kernel=fused_cpu takes the whole update as one C++ call (the unscale and clip applied as it reads
    the gradients, the overflow skip as its `apply` input, the norm another call): the same run as MindSpore's
    per-parameter kernels behind a branch, loss scaling with skipped windows, gradient accumulation, decayed and
    undecayed parameters and (active) clipping included."""
    ours, our_steps = _adamw_run("fused_cpu", clip_grad, jit)
    theirs, their_steps = _adamw_run("mindspore", clip_grad, jit)
    assert [s[2] for s in our_steps] == [s[2] for s in their_steps] == [True, False, False, True]
    assert [s[3] for s in our_steps] == [s[3] for s in their_steps] == [2.0**40, 2.0**12, 2.0**12, 2.0**40]
    for a, b in zip(our_steps, their_steps):
        np.testing.assert_allclose(a[:1], b[:1], rtol=1e-5)  # the loss; an overflowed window's norm is not finite
    for a, b in zip(our_steps[1:3], their_steps[1:3]):
        np.testing.assert_allclose(a, b, rtol=1e-5)
    if clip_grad is not None:
        assert all(s[1] > clip_grad for s in our_steps[1:3])  # every update was clipped
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_clip_by_global_norm_leaves_small_gradients_alone() -> None:
    grads = (Tensor(np.array([3.0, 0.0], np.float32)), Tensor(np.array([[4.0]], np.float32)))
    norm = global_norm(grads)
    assert float(norm) == pytest.approx(5.0)
    assert float(global_norm(clip_by_global_norm(grads, norm, 1.0))) == pytest.approx(1.0, rel=1e-5)
    assert float(global_norm(clip_by_global_norm(grads, norm, 10.0))) == pytest.approx(5.0)


def test_global_norm_is_the_float64_norm_of_every_gradient_and_sees_non_finite_ones() -> None:
    rng = np.random.default_rng(3)
    arrays = [rng.standard_normal(shape).astype(np.float32) for shape in ((96, 3, 4, 4), (384,), (169, 3), (), (7, 5))]
    expected = np.sqrt(sum(np.sum(a.astype(np.float64) ** 2) for a in arrays))
    grads = tuple(Tensor(a) for a in arrays)
    half = tuple(Tensor(a.astype(np.float16)) for a in arrays)  # fp16 gradients are summed in fp32
    for dot in (False, True):  # ReduceSums, or the dot products the CPU step uses
        assert float(global_norm(grads, dot)) == pytest.approx(expected, rel=1e-6)
        assert float(global_norm(half, dot)) == pytest.approx(expected, rel=1e-3)
    for bad in (np.inf, -np.inf, np.nan):
        arrays[2][5, 1] = bad
        for dot in (False, True):
            assert not np.isfinite(float(global_norm(tuple(Tensor(a) for a in arrays), dot)))


def _one_ema_step() -> tuple[nn.Cell, TrainStep, list[np.ndarray], list[np.ndarray]]:
    """A step with EMA decay 0.75 after one update: net, step, the weights after it and the EMA it should hold."""
    net = _dense()
    step = make_train_step(net, nn.SGD(net.trainable_params(), learning_rate=0.5), AmpPolicy("O0"), None,
                           jit=True, ema_decay=0.75)
    w0 = _weights(net)
    step(*_batch(8))
    w1 = _weights(net)
    return net, step, w1, [0.75 * a + 0.25 * b for a, b in zip(w0, w1)]


def test_ema_follows_the_weights_per_optimizer_step_and_swaps() -> None:
    net, step, w1, expected = _one_ema_step()
    for e, x in zip(step.ema, expected):
        np.testing.assert_allclose(e.asnumpy(), x, atol=1e-6)
    step.swap_ema()
    np.testing.assert_allclose(_weights(net)[0], expected[0], atol=1e-6)
    step.swap_ema()
    np.testing.assert_array_equal(_weights(net)[0], w1[0])


def test_an_overflow_skipped_step_still_updates_the_ema_toward_the_unchanged_weights() -> None:
    net, step, w1, ema1 = _one_ema_step()
    assert step(Tensor(np.full((8, 4), np.inf, np.float32)), _batch(8)[1]).overflow
    assert all(np.array_equal(a, b) for a, b in zip(w1, _weights(net)))  # skipped: the weights stay
    for e, a, b in zip(step.ema, ema1, w1):  # as main.py's model_ema.update(model) after a skipped step
        np.testing.assert_allclose(e.asnumpy(), 0.75 * a + 0.25 * b, atol=1e-6)


def test_accumulate_on_cpu_runs_and_says_where(caplog: pytest.LogCaptureFixture) -> None:
    net = _dense()
    with caplog.at_level(logging.INFO, logger="swinexp"):
        step = make_train_step(net, nn.SGD(net.trainable_params(), learning_rate=0.1), AmpPolicy("O0"), None,
                               jit=True, accumulation_steps=2, accumulate_on="cpu")
    assert "accumulate_on=cpu" in caplog.text
    assert [step(*_batch(4, seed=s)).updated for s in range(2)] == [False, True]


def test_bad_accumulation_settings_are_config_errors() -> None:
    net = _dense()
    with pytest.raises(ConfigError, match="trainer.accumulate_on='gpu'.*device, cpu"):
        make_train_step(net, nn.SGD(net.trainable_params()), AmpPolicy("O0"), None, True, 2, "gpu")
    with pytest.raises(ConfigError, match="trainer.accumulation_steps=0 must be >= 1"):
        make_train_step(net, nn.SGD(net.trainable_params()), AmpPolicy("O0"), None, True, 0)


@pytest.mark.parametrize("jit", [True, False])
def test_the_step_says_which_graph_its_next_call_compiles(jit: bool) -> None:
    net = _dense()
    step = make_train_step(net, nn.SGD(net.trainable_params(), learning_rate=0.1), AmpPolicy("O0"), None, jit,
                           accumulation_steps=2)
    said = []
    for _ in range(4):
        said.append(step.next_compile())
        step(*_batch(4))
    compiled = ["the accumulation step", "the train step"] if jit else [None, None]
    assert said == [*compiled, None, None]  # each graph compiles once, at its first call; eager compiles nothing
