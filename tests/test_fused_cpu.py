"""model.kernels=fused_cpu: the C++ GELU, LayerNorm backward and softmax backward against float64, independent of
the cores, the library's build (once per cache, atomic, errors that name the fix) and where the plan refuses it.
tests/test_models.py and tests/test_golden.py check the model built with them against the official function."""
from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Callable

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor
from omegaconf import DictConfig

from swinexp.build import resolve
from swinexp.models import fused_cpu
from swinexp.models.kernels import ExactGELU
from swinexp.registry import ConfigError
from tests.conftest import ROOT

pytestmark = pytest.mark.skipif(fused_cpu.compiler() is None, reason="no C++ compiler to build the fused kernels")

# erf's range in fp32 and beyond (|x| > 10: Phi is 0 or 1 in fp32), and normal draws where most activations lie
POINTS = np.concatenate([np.linspace(-12, 12, 48001), np.random.default_rng(0).standard_normal(20000) * 3])


def gelu_and_derivative_float64(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    x = x.astype(np.float64)
    cdf = 0.5 * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))
    pdf = np.exp(-x * x / 2) / math.sqrt(2 * math.pi)
    return x * cdf, cdf + x * pdf


@pytest.mark.parametrize("mode", [ms.PYNATIVE_MODE, ms.GRAPH_MODE], ids=["pynative", "graph"])
def test_fused_gelu_and_its_gradient_are_the_exact_gelu(mode: int) -> None:
    """Forward and derivative within 1e-6 relative (+1e-7) of float64 erf everywhere: the tolerance the MindSpore
    forward meets (test_models), and that its derivative (1 + erf rounded next to 1) misses by 6x in the left tail."""
    ms.set_context(mode=mode)
    x = POINTS.astype(np.float32)
    gelu = ExactGELU(fused=True)
    want_y, want_dy = gelu_and_derivative_float64(x)
    np.testing.assert_allclose(gelu(Tensor(x)).asnumpy(), want_y, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(ms.grad(gelu)(Tensor(x)).asnumpy(), want_dy, rtol=1e-6, atol=1e-7)


def test_fused_gelu_scales_the_incoming_gradient() -> None:
    ms.set_context(mode=ms.PYNATIVE_MODE)
    x = POINTS[:5000].astype(np.float32)
    dout = np.random.default_rng(1).standard_normal(x.shape).astype(np.float32)
    gelu = ExactGELU(fused=True)
    got = ms.grad(lambda t: (gelu(t) * Tensor(dout)).sum())(Tensor(x)).asnumpy()
    np.testing.assert_allclose(got, dout * gelu_and_derivative_float64(x)[1], rtol=1e-5, atol=1e-6)


def test_fp16_inputs_take_mindsporess_kernels() -> None:
    """The kernels compute float32 only; an fp16 policy's GELU keeps its dtype through MindSpore's kernels."""
    ms.set_context(mode=ms.PYNATIVE_MODE)
    x = Tensor(POINTS[:1000].astype(np.float16))
    fused, plain = ExactGELU(custom_bprop=True, fused=True)(x), ExactGELU(custom_bprop=True)(x)
    assert fused.dtype == ms.float16
    np.testing.assert_array_equal(fused.asnumpy(), plain.asnumpy())


def layer_norm_grads_float64(x: np.ndarray, gamma: np.ndarray, dy: np.ndarray, eps: float = 1e-5) -> list[np.ndarray]:
    x, gamma, dy = (a.astype(np.float64) for a in (x, gamma, dy))
    inv_std = 1 / np.sqrt(x.var(-1, keepdims=True) + eps)
    x_hat = (x - x.mean(-1, keepdims=True)) * inv_std
    g = dy * gamma
    dx = (g - g.mean(-1, keepdims=True) - x_hat * (g * x_hat).mean(-1, keepdims=True)) * inv_std
    return [dx, (dy * x_hat).sum(0), dy.sum(0)]


def test_fused_layer_norm_against_float64() -> None:
    """y, its row statistics, and dx, dgamma and dbeta of swin_tiny's stage-0 shape (rows summed in blocks) against
    float64; rows far from zero (the variance is taken around the mean, not as E[x^2] - mean^2)."""
    ms.set_context(mode=ms.PYNATIVE_MODE)
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((12544, 96)) * 3 + 1).astype(np.float32)
    x[:100] += 1000
    gamma, beta = rng.standard_normal(96).astype(np.float32), rng.standard_normal(96).astype(np.float32)
    dy = rng.standard_normal(x.shape).astype(np.float32)
    norm = fused_cpu.FusedLayerNormFn(1e-5)
    y, mean, inv_std = (t.asnumpy() for t in norm(Tensor(x), Tensor(gamma), Tensor(beta)))
    x64 = x.astype(np.float64)
    want_inv_std = 1 / np.sqrt(x64.var(-1, keepdims=True) + 1e-5)
    want_y = (x64 - x64.mean(-1, keepdims=True)) * want_inv_std * gamma + beta
    def error(got: np.ndarray, want: np.ndarray) -> float:  # of the largest value
        return float(np.abs(got - want).max() / np.abs(want).max())

    assert error(mean, x64.mean(-1, keepdims=True)) <= 1e-7 and error(inv_std, want_inv_std) <= 3e-7
    # MindSpore's LayerNorm kernel: 2.6e-6 with the offset rows, 1.4e-7 without (torch's: 9.0e-6 and 1.3e-7)
    assert error(y, want_y) <= 3e-6 and error(y[100:], want_y[100:]) <= 3e-7
    got = ms.grad(lambda *a: (norm(*a)[0] * Tensor(dy)).sum(), grad_position=(0, 1, 2))(
        Tensor(x), Tensor(gamma), Tensor(beta))
    for name, g, want in zip(("dx", "dgamma", "dbeta"), got, layer_norm_grads_float64(x, gamma, dy)):
        assert np.abs(g.asnumpy() - want).max() <= 2e-6 * np.abs(want).max(), name


def test_fused_softmax_gradient_against_float64() -> None:
    """The attention's shape (windows x heads, 49 x 49): dx = y * (dy - sum(y * dy)) per row."""
    ms.set_context(mode=ms.PYNATIVE_MODE)
    rng = np.random.default_rng(4)
    x = (rng.standard_normal((8, 3, 49, 49)) * 4).astype(np.float32)
    dy = rng.standard_normal(x.shape).astype(np.float32)
    softmax = fused_cpu.FusedSoftmaxFn()
    got = ms.grad(lambda t: (softmax(t) * Tensor(dy)).sum())(Tensor(x)).asnumpy()
    x64 = x.astype(np.float64)
    y = np.exp(x64 - x64.max(-1, keepdims=True))
    y /= y.sum(-1, keepdims=True)
    want = y * (dy - (y * dy).sum(-1, keepdims=True))
    assert np.abs(got - want).max() <= 1e-6 * np.abs(want).max()


def test_results_do_not_depend_on_the_cores() -> None:
    """One core or all, bit for bit: every element is computed by the same expression (the chunks only split the
    work), and LayerNorm's gamma/beta gradients and the global norm add fixed blocks in a fixed order."""
    script = ("import sys, numpy as np, mindspore as ms; from mindspore import Tensor\n"
              "from swinexp.models.kernels import ExactGELU\nfrom swinexp.models.fused_cpu import FusedLayerNormFn\n"
              "rng = np.random.default_rng(2)\n"
              "x = Tensor(rng.standard_normal((3136, 96)).astype(np.float32))\n"
              "gamma, beta = (Tensor(rng.standard_normal(96).astype(np.float32)) for _ in range(2))\n"
              "norm = FusedLayerNormFn(1e-5)\n"
              "grads = ms.grad(lambda *a: (norm(*a)[0] ** 2).sum(), grad_position=(0, 1, 2))(x, gamma, beta)\n"
              "from swinexp.models.fused_cpu import GlobalNorm\n"
              "norm_all = GlobalNorm()(Tensor(np.float32(0.5)), x, gamma, *grads)\n"
              "for t in (ExactGELU(fused=True)(x), *grads, norm_all):\n"
              "    sys.stdout.buffer.write(t.asnumpy().tobytes())")
    outputs = []
    for cores in ({0}, set(range(os.cpu_count() or 1))):
        outputs.append(subprocess.run([sys.executable, "-c", script], capture_output=True, check=True, cwd=ROOT,
                                      preexec_fn=lambda cores=cores: os.sched_setaffinity(0, cores)).stdout)
    assert len(outputs[0]) == 4 * (2 * 3136 * 96 + 2 * 96 + 1) and outputs[0] == outputs[1]


@pytest.fixture
def fresh_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    fused_cpu.library.cache_clear()
    yield tmp_path / "swinexp" / "kernels"
    fused_cpu.library.cache_clear()


def test_the_library_is_compiled_once_per_cache(fresh_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    compiles = []
    run = subprocess.run

    def counting(args: list[str], **kwargs: object) -> subprocess.CompletedProcess:
        if "-shared" in args:
            compiles.append(args)
        return run(args, **kwargs)

    monkeypatch.setattr(fused_cpu.subprocess, "run", counting)
    first = fused_cpu.library()
    fused_cpu.library.cache_clear()  # a new process
    assert fused_cpu.library() == first and len(compiles) == 1
    assert Path(first).parent.parent == fresh_cache
    assert [p.name for p in Path(first).parent.iterdir()] == ["fused_cpu.so"]  # no partial file left


def test_another_cpu_gets_a_library_of_its_own(fresh_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cluster's nodes may share a home directory: a library built for one CPU's -march=native is not another's."""
    assert "-march=" in fused_cpu.native_target(fused_cpu.compiler())  # what g++ resolved native to, here
    built = []
    for target in ("-march=skylake-avx512", "-march=znver3"):
        monkeypatch.setattr(fused_cpu, "native_target", lambda cxx, target=target: target)
        fused_cpu.library.cache_clear()
        built.append(fused_cpu.library())
    assert built[0] != built[1] and all(Path(b).exists() for b in built)


def test_no_compiler_is_refused_before_work_with_the_fix(compose: Callable[..., DictConfig],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(ConfigError, match=r"apt-get install g\+\+.*model\.kernels=mindspore optimizer\.kernel=mind"):
        resolve(compose("hardware=cpu"))
    with pytest.raises(ConfigError, match=r"^optimizer\.kernel=fused_cpu build .* optimizer\.kernel=mindspore$"):
        resolve(compose("hardware=cpu", "model.kernels=mindspore"))
    resolve(compose("hardware=cpu", "model.kernels=mindspore", "optimizer.kernel=mindspore"))  # no compiler needed


def test_a_failed_compile_shows_the_compilers_output(fresh_cache: Path, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    broken = tmp_path / "broken-cxx"
    broken.write_text("#!/bin/sh\n[ \"$1\" = --version ] && exit 0\necho 'fused_cpu.cc:1: error: no luck' >&2\n"
                      "exit 1\n")
    broken.chmod(0o755)
    monkeypatch.setenv("CXX", str(broken))
    with pytest.raises(ConfigError, match=r"(?s)no luck.*model\.kernels=mindspore"):
        fused_cpu.library()
    assert not [p for p in fresh_cache.rglob("*") if p.is_file()]  # nothing half-made is left to be loaded


def test_fused_cpu_is_refused_on_a_card(compose: Callable[..., DictConfig]) -> None:
    with pytest.raises(ConfigError, match="model.kernels=fused_cpu compute on the CPU.*device_target=Ascend"):
        resolve(compose("hardware=ascend8", "model.kernels=fused_cpu"), backend=False)
    with pytest.raises(ConfigError, match="optimizer.kernel=fused_cpu compute on the CPU.*use optimizer.kernel=mind"):
        resolve(compose("hardware=gpu", "optimizer.kernel=fused_cpu"), backend=False)


def test_hardware_cpu_updates_with_the_fused_adamw_and_the_cards_with_mindsporess(
        compose: Callable[..., DictConfig]) -> None:
    assert resolve(compose(), backend=False).section("optimizer")["kernel"] == "fused_cpu"
    for card in ("gpu", "ascend8"):
        assert resolve(compose(f"hardware={card}"), backend=False).section("optimizer")["kernel"] == "mindspore"


class _AdamWStep(ms.nn.Cell):
    """One AdamWeightDecay-style update of (w, m, v) by `update`, returning w as read before and after it."""

    def __init__(self, update: ms.ops.Primitive, w: np.ndarray) -> None:
        super().__init__()
        self.update = update
        self.w = ms.Parameter(Tensor(w), name="w")
        self.m = ms.Parameter(Tensor(np.zeros_like(w)), name="m")
        self.v = ms.Parameter(Tensor(np.zeros_like(w)), name="v")
        self.hyper = tuple(Tensor(x, ms.float32) for x in (1e-3, 0.9, 0.999, 1e-8, 0.05))

    def construct(self, g: Tensor) -> tuple[Tensor, Tensor]:
        before = self.w * 1.0
        self.update(self.w, self.m, self.v, *self.hyper, g)
        return before, self.w * 1.0


@pytest.mark.parametrize("mode", [ms.PYNATIVE_MODE, ms.GRAPH_MODE], ids=["pynative", "graph"])
def test_fused_adamw_updates_in_place_as_mindsporess_kernel(mode: int) -> None:
    """The same update as ops.AdamWeightDecay (m and v bit for bit; the parameter within float rounding, as nnacl
    computes the square root and division in double), written into the Parameters, and ordered in the graph: a read
    after the update sees it. 2**17 + 3 elements, so the update runs on every core with a ragged tail."""
    previous = ms.get_context("mode")
    ms.set_context(mode=mode)
    try:
        rng = np.random.default_rng(3)
        w = rng.standard_normal(2 ** 17 + 3).astype(np.float32)
        ours, theirs = _AdamWStep(fused_cpu.FusedAdamWUpdate(), w), _AdamWStep(ms.ops.AdamWeightDecay(), w)
        for _ in range(3):
            g = Tensor(rng.standard_normal(w.shape).astype(np.float32))
            (before, after), (their_before, their_after) = ours(g), theirs(g)
            np.testing.assert_array_equal(before.asnumpy(), their_before.asnumpy())
            assert not np.array_equal(after.asnumpy(), before.asnumpy())
            np.testing.assert_allclose(after.asnumpy(), their_after.asnumpy(), rtol=3e-7, atol=3e-7)
            np.testing.assert_array_equal(after.asnumpy(), ours.w.asnumpy())
            ours.w.set_data(Tensor(their_after.asnumpy()))  # the next step starts from the same parameter
            np.testing.assert_array_equal(ours.m.asnumpy(), theirs.m.asnumpy())
            np.testing.assert_array_equal(ours.v.asnumpy(), theirs.v.asnumpy())
    finally:
        ms.set_context(mode=previous)


def test_the_gelu_tail_polynomial_fits_erfcx() -> None:
    """fused_cpu.cc's h(u), as written in the source, against erfcx(z) / t in float64 over the whole half-line: the
    float coefficients' own error (4.9e-8) stays well below what float evaluation adds (~1.6e-7)."""
    special = pytest.importorskip("scipy.special")
    source = (ROOT / "swinexp" / "models" / "fused_cpu.cc").read_text()
    body = source[source.index("inline void normal_cdf_pdf"):source.index("float xx = x * x;")]
    numbers = [float(n) for n in re.findall(r"(-?\d\.\d+e-?\d+)f", body)]
    coefficients = numbers[::-1]  # Horner from the highest degree: the first literal is the leading coefficient
    t = np.concatenate([np.geomspace(1e-7, 1e-2, 2000), np.linspace(1e-2, 1, 20001)])
    z = 2 * (1 / t - 1)
    h = np.polynomial.polynomial.polyval(2 * t - 1, coefficients)
    assert len(coefficients) == 12
    assert np.abs(h / (special.erfcx(z) / t) - 1).max() < 6e-8


@pytest.mark.parametrize("shapes", [((8, 3, 49, 49), (3, 49, 49)), ((2, 4, 3, 49, 49), (4, 3, 49, 49))],
                         ids=["bias", "bias+mask per window"])
def test_fused_bias_softmax_and_its_gradients_against_float64(shapes: tuple) -> None:
    """softmax(x + bias) with the bias repeating over the leading blocks, as the attention adds its position bias
    (and, shifted, bias + mask per window); the gradients of x and of the bias (summed over the blocks)."""
    x_shape, bias_shape = shapes
    rng = np.random.default_rng(4)
    x = rng.standard_normal(x_shape).astype(np.float32) * 3
    bias = rng.standard_normal(bias_shape).astype(np.float32) * 2
    weights = Tensor(rng.standard_normal(x_shape).astype(np.float32))
    fn = fused_cpu.FusedBiasSoftmaxFn()

    def weighted_sum(a: Tensor, b: Tensor) -> Tensor:
        return (fn(a, b) * weights).sum()

    z = x.astype(np.float64) + bias
    z = np.exp(z - z.max(-1, keepdims=True))
    want_y = z / z.sum(-1, keepdims=True)
    w = weights.asnumpy().astype(np.float64)
    want_dx = want_y * (w - (want_y * w).sum(-1, keepdims=True))
    want_dbias = want_dx.reshape((-1, *bias_shape)).sum(0)
    dx, dbias = ms.grad(weighted_sum, grad_position=(0, 1))(Tensor(x), Tensor(bias))
    assert np.abs(fn(Tensor(x), Tensor(bias)).asnumpy() - want_y).max() <= 1e-6
    assert np.abs(dx.asnumpy() - want_dx).max() <= 1e-6 * np.abs(want_dx).max() + 1e-6
    assert np.abs(dbias.asnumpy() - want_dbias).max() <= 1e-6 * np.abs(want_dbias).max() + 1e-6


# sizes around the kernels' block (8192) and grain (32768): tensors a thread shares, and one split across threads
SIZES = ((7,), (96,), (3, 5), (8192,), (8193,), (96, 384), (2 ** 17 + 3,), (1,))


def test_global_norm_is_the_float64_norm_of_the_scaled_tensors_and_sees_non_finite_ones() -> None:
    rng = np.random.default_rng(5)
    arrays = [rng.standard_normal(shape).astype(np.float32) * 10 ** rng.uniform(-3, 3) for shape in SIZES]
    factor = np.float32(2.0 ** -7)
    want = math.sqrt(sum(float(((factor * a.astype(np.float64)) ** 2).sum()) for a in arrays))
    op = fused_cpu.GlobalNorm()
    got = op(Tensor(factor), *(Tensor(a) for a in arrays)).asnumpy()
    assert got.shape == (1,) and got[0] == pytest.approx(want, rel=1e-6)
    for bad in (np.inf, np.nan):
        arrays[4][8192] = bad  # the last element of a tensor, alone in its block
        assert not np.isfinite(op(Tensor(factor), *(Tensor(a) for a in arrays)).asnumpy()[0])
    with pytest.raises(TypeError, match="float32 tensors only.*optimizer.kernel=mindspore"):
        op(Tensor(factor), Tensor(arrays[0].astype(np.float16)))


class _AdamWAll(ms.nn.Cell):
    """AdamWUpdateAll over parameters of SIZES, returning them as read before and after it."""

    def __init__(self, weights: list[np.ndarray], decays: np.ndarray) -> None:
        super().__init__()
        self.update = fused_cpu.FusedAdamWUpdateAll(len(weights))
        def parameters(prefix: str, zeros: bool) -> ms.ParameterTuple:
            return ms.ParameterTuple([ms.Parameter(Tensor(np.zeros_like(w) if zeros else w), name=f"{prefix}{i}")
                                      for i, w in enumerate(weights)])

        self.w, self.m, self.v = parameters("w", False), parameters("m", True), parameters("v", True)
        self.decays = Tensor(decays)
        self.hyper = tuple(Tensor(x, ms.float32) for x in (1e-3, 0.9, 0.999, 1e-8, 2.0))

    def construct(self, unscale: Tensor, clip: Tensor, apply: Tensor, *grads: Tensor) -> tuple:
        before = tuple(w * 1.0 for w in self.w)
        self.update(*self.hyper, unscale, clip, apply, self.decays, *self.w, *self.m, *self.v, *grads)
        return before, tuple(w * 1.0 for w in self.w)


@pytest.mark.parametrize("mode", [ms.PYNATIVE_MODE, ms.GRAPH_MODE], ids=["pynative", "graph"])
def test_fused_adamw_over_all_parameters_is_the_per_parameter_update_of_the_scaled_gradients(mode: int) -> None:
    """AdamWUpdateAll equals AdamWUpdate per parameter given (g x unscale) x clip and decay x decay_factor, bit for
    bit, for every parameter whatever thread its elements fall to; in place, and ordered before later reads; with
    apply 0 (an overflow-skipped step) it changes nothing."""
    previous = ms.get_context("mode")
    ms.set_context(mode=mode)
    try:
        rng = np.random.default_rng(6)
        weights = [rng.standard_normal(shape).astype(np.float32) for shape in SIZES]
        decays = np.array([0.05 if len(shape) > 1 else 0.0 for shape in SIZES], np.float32)
        ours = _AdamWAll(weights, decays)
        theirs = [_AdamWStep(fused_cpu.FusedAdamWUpdate(), w) for w in weights]
        unscale, clip = np.float32(2.0 ** -10), np.float32(0.37)
        for _ in range(3):
            grads = [rng.standard_normal(w.shape).astype(np.float32) * 1000 for w in weights]
            state = [p.asnumpy().copy() for p in (*ours.w, *ours.m, *ours.v)]
            ours(Tensor(unscale), Tensor(clip), Tensor(np.float32(0)), *(Tensor(g) for g in grads))
            for kept, p in zip(state, (*ours.w, *ours.m, *ours.v)):
                np.testing.assert_array_equal(p.asnumpy(), kept)
            before, after = ours(Tensor(unscale), Tensor(clip), Tensor(np.float32(1)), *(Tensor(g) for g in grads))
            for i, (step, g) in enumerate(zip(theirs, grads)):
                step.hyper = (*step.hyper[:4], Tensor(decays[i] * np.float32(2.0)))
                their_before, their_after = step(Tensor(g * unscale * clip))
                np.testing.assert_array_equal(before[i].asnumpy(), their_before.asnumpy())
                assert not np.array_equal(after[i].asnumpy(), before[i].asnumpy())
                np.testing.assert_array_equal(after[i].asnumpy(), their_after.asnumpy())
                np.testing.assert_array_equal(ours.w[i].asnumpy(), their_after.asnumpy())
                np.testing.assert_array_equal(ours.m[i].asnumpy(), step.m.asnumpy())
                np.testing.assert_array_equal(ours.v[i].asnumpy(), step.v.asnumpy())
    finally:
        ms.set_context(mode=previous)
