"""AMP policies on swin_micro: which cells compute in which dtype, a few finite steps, the reports, bad configs."""
from __future__ import annotations

from typing import Callable

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn
from omegaconf import DictConfig, OmegaConf

from swinexp.amp import AmpPolicy, precision
from swinexp.amp.report import compute_cells, compute_dtypes, drift_report, dtype_table, fp32_outputs
from swinexp.build import build_experiment, check_amp_on_hardware, resolve
from swinexp.config import HardwareCfg
from swinexp.engine.step import make_train_step
from swinexp.optim import adamw
from swinexp.registry import AMP_POLICIES, MODELS, ConfigError
from swinexp.runtime.chips import CHIPS
from tests.conftest import CONF_DIR

BLOCK = "layers.0.blocks.0"
# (policy, {cell path: expected compute dtype}): the contract for each level
EXPECTED = {
    "o0": {f"{BLOCK}.norm1": "float32", f"{BLOCK}.mlp.fc1": "float32", f"{BLOCK}.attn.softmax": "float32"},
    "o1": {f"{BLOCK}.norm1": "float32", f"{BLOCK}.mlp.fc1": "float16", f"{BLOCK}.attn.softmax": "float32",
           f"{BLOCK}.mlp.act": "float32", "patch_embed.proj": "float16", "head": "float16"},
    "o1_manual": {f"{BLOCK}.norm1": "float32", f"{BLOCK}.mlp.act": "float32", f"{BLOCK}.attn.softmax": "float32",
                  "patch_embed.proj": "float32", f"{BLOCK}.mlp.fc1": "float16", f"{BLOCK}.attn.qkv": "float16",
                  "head": "float16"},
    "o2": {f"{BLOCK}.norm1": "float32", "norm": "float32", f"{BLOCK}.mlp.fc1": "float16",
           f"{BLOCK}.attn.softmax": "float16", f"{BLOCK}.mlp.act": "float16"},
    "o3": {f"{BLOCK}.norm1": "float16", "norm": "float16", f"{BLOCK}.mlp.fc1": "float16",
           f"{BLOCK}.attn.softmax": "float16"},
}


CPU_FORMULATION = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "model" / "formulation" / "cpu.yaml"))


def _micro(img_size: int = 32) -> nn.Cell:
    """swin_micro in the formulation a CPU run trains (separate q/k/v, hand-written backward passes)."""
    return MODELS.build({"name": "swin_micro", "img_size": img_size, "num_classes": 10, "depths": [1, 1],
                         "drop_path_rate": 0.0, **CPU_FORMULATION})


def _batch(n: int = 2) -> tuple[Tensor, Tensor]:
    rng = np.random.default_rng(0)
    images = Tensor(rng.normal(size=(n, 3, 32, 32)).astype(np.float32))
    return images, Tensor(np.eye(10, dtype=np.float32)[rng.integers(0, 10, n)])


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_named_cells_compute_in_the_policy_dtype(name: str) -> None:
    policy = AMP_POLICIES.build({"name": name})
    dtypes = compute_dtypes(policy.apply(_micro()), policy)
    assert {path: dtypes[path] for path in EXPECTED[name]} == EXPECTED[name]


@pytest.mark.parametrize("name,path,expected", [
    ("o1_manual", f"{BLOCK}.norm1", np.float32), ("o1_manual", f"{BLOCK}.mlp.act", np.float32),
    ("o1_manual", f"{BLOCK}.attn.softmax", np.float32), ("o1_manual", f"{BLOCK}.mlp.fc1", np.float16),
    ("o3", f"{BLOCK}.norm1", np.float16), ("o2", f"{BLOCK}.norm1", np.float32),
])
def test_cells_really_cast_their_inputs(name: str, path: str, expected: type) -> None:
    """Not only flags: a cell fed the *other* dtype returns its own compute dtype."""
    policy = AMP_POLICIES.build({"name": name})
    cell = compute_cells(policy.apply(_micro()))[path]
    other = np.float16 if expected is np.float32 else np.float32
    x = Tensor(np.random.default_rng(0).normal(size=(2, 16, 32)).astype(other))  # (B, L, C) tokens of stage 0
    assert cell(x).asnumpy().dtype == expected


def test_o1_manual_wrappers_cast_outputs_back_to_float16() -> None:
    policy = AMP_POLICIES.build({"name": "o1_manual"})
    net = policy.apply(_micro())
    wrapped_norm = net._backbone.layers[0].blocks[0].norm1  # the wrapper MindSpore puts around a fp32 cell
    assert wrapped_norm(Tensor(np.ones((2, 16, 32), np.float32))).dtype == ms.float16
    assert net(_batch()[0]).asnumpy().dtype == np.float32  # the loss sees fp32 logits


@pytest.mark.parametrize("jit", [False, True], ids=["pynative", "graph"])
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_a_few_steps_stay_finite(name: str, jit: bool) -> None:
    """Each policy trains, eagerly and compiled, with the hand-written backward passes (custom_bprop) on."""
    policy = AMP_POLICIES.build({"name": name})
    model = _micro()
    assert any(getattr(cell, "bias_fn", None) is not None for _, cell in model.cells_and_names())  # custom_bprop
    net = policy.apply(model)
    step = make_train_step(net, adamw(net, 1e-3), policy, clip_grad=5.0, jit=jit)
    images, targets = _batch()
    outs = [step(images, targets) for _ in range(2)]
    assert all(np.isfinite(o.loss) and np.isfinite(o.grad_norm) and not o.overflow for o in outs)
    assert outs[1].loss < outs[0].loss  # it trains: the same batch twice
    assert outs[0].loss_scale == (1.0 if name == "o0" else 65536.0)


def test_function_cells_are_one_instance_per_kind_in_a_model_and_none_across_models() -> None:
    """The compiler parses each cell instance, so a model shares its parameterless function cells; but AMP marks
    dtypes on cells, so another model (built before or after) keeps its own."""
    first, second = _micro(), _micro()
    blocks = (first.layers[0].blocks[0], first.layers[1].blocks[0])
    assert blocks[0].attn.qkv.fn is blocks[1].mlp.fc2.fn and blocks[0].norm1.fn is blocks[1].norm2.fn
    assert blocks[0].attn.reorder is blocks[1].attn.reorder
    assert blocks[0].attn.bias_softmax is blocks[1].attn.bias_softmax
    assert second.layers[0].blocks[0].attn.qkv.fn is not blocks[0].attn.qkv.fn

    o3 = AMP_POLICIES.build({"name": "o3"})
    dtypes = compute_dtypes(o3.apply(first), o3)
    assert dtypes[f"{BLOCK}.attn.qkv.fn"] == "float16"
    assert dtypes["layers.1.blocks.0.mlp.fc2.fn"] == "float16"  # the same cell, listed under every layer calling it
    o0 = AMP_POLICIES.build({"name": "o0"})
    assert set(compute_dtypes(second, o0).values()) == {"float32"}
    assert second(_batch()[0]).dtype == ms.float32  # the fused fp32 kernels would refuse fp16 inputs


def test_a_function_cell_is_shared_only_among_owners_of_one_class() -> None:
    """o1_manual keeps Conv2d (the matmul patch embedding's class) in fp32 and the Dense layers in fp16: their bias
    adds are different instances, each in its owner's dtype."""
    policy = AMP_POLICIES.build({"name": "o1_manual"})
    dtypes = compute_dtypes(policy.apply(_micro()), policy)
    assert dtypes["patch_embed.proj.bias_fn"] == "float32"
    assert dtypes[f"{BLOCK}.attn.qkv.fn"] == "float16"


def test_dtype_table_lists_every_cell_once() -> None:
    policy = AMP_POLICIES.build({"name": "o1_manual"})
    net = policy.apply(_micro())
    text = dtype_table(net, precision.resolve(policy, CHIPS["cpu"]))
    assert text.startswith("amp policy o1_manual (low precision: float16)") and f"{BLOCK}.mlp.act" in text
    rows = [line.split() for line in text.splitlines()[3:-2]]
    assert len(rows) == len(compute_cells(net)) and all(r[-1] in ("float16", "float32") for r in rows)


@pytest.mark.parametrize("mode", [ms.GRAPH_MODE, ms.PYNATIVE_MODE], ids=["graph", "pynative"])
def test_drift_is_zero_for_o0_and_small_but_nonzero_for_o3(mode: int) -> None:
    # graph is what a run uses: there a sub-cell called again after the cast reran its fp32 graph (drift 0 for O3)
    previous = ms.get_context("mode")
    ms.set_context(mode=mode)
    try:
        _drift_bounds_hold()
        assert ms.get_context("mode") == mode  # the report puts back the mode it found
    finally:
        ms.set_context(mode=previous)


def _drift_bounds_hold() -> None:
    images = _batch(4)[0]
    for name, low, high in (("o0", 0.0, 0.0), ("o3", 1e-5, 5e-2)):
        policy = AMP_POLICIES.build({"name": name})
        model = _micro()
        reference = fp32_outputs(model, images)  # the same model, before the policy casts it
        report = drift_report(reference, policy.apply(model), policy, images)
        rows = {line.split()[0]: float(line.split()[2]) for line in report.splitlines()[3:-2]}
        assert list(rows) == ["patch_embed", "stage0.block0", "stage0.downsample", "stage1.block0", "norm", "logits"]
        assert all(low <= err <= high for err in rows.values()), report


@pytest.mark.parametrize("hardware,match", [
    (HardwareCfg(), r"amp.dtype=bfloat16.*CPU.*amp.dtype=float16"),
    (HardwareCfg(device_target="Ascend", chip="ascend910"), r"bfloat16 but hardware.chip=ascend910.*float16"),
])
def test_bfloat16_where_the_device_has_none_says_why_and_what_to_use(hardware: HardwareCfg, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        check_amp_on_hardware(AMP_POLICIES.build({"name": "o2", "dtype": "bfloat16"}), hardware)
    check_amp_on_hardware(AMP_POLICIES.build({"name": "o2", "dtype": "bfloat16"}),
                          HardwareCfg(device_target="Ascend", chip="ascend910b"))  # a 910B has bf16


@pytest.mark.parametrize("node,match", [
    ({"name": "o2", "loss_scale": "dynamc"}, r"amp.loss_scale='dynamc'.*dynamic, static, none"),
    ({"name": "o2", "init_scale": 0.5}, r"amp.init_scale=0.5 must be >= 1"),
    ({"name": "o1_manual", "fp32_cells": ["LayerNrom"]}, r"'LayerNrom'.*Did you mean 'LayerNorm'"),
    ({"name": "o3", "dtype": "float8"}, r"amp.dtype='float8'.*float16, bfloat16"),
])
def test_bad_amp_settings_name_the_key(node: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        AMP_POLICIES.build(node)


def test_loss_scale_modes_build_the_right_scaler() -> None:
    dynamic = AMP_POLICIES.build({"name": "o2"}).make_scaler()
    assert float(dynamic.scale_value.asnumpy()) == 2.0**16
    assert dynamic.scale_factor == 2 and dynamic.scale_window == 2000
    static = AMP_POLICIES.build({"name": "o2", "loss_scale": "static", "init_scale": 1024}).make_scaler()
    assert float(static.scale_value.asnumpy()) == 1024.0 and not hasattr(static, "counter")
    assert float(AmpPolicy(level="O0").make_scaler().scale_value.asnumpy()) == 1.0


def test_a_runs_amp_report_comes_from_its_one_model(compose: Callable[..., DictConfig],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    builds = []
    build = MODELS.build
    monkeypatch.setattr(MODELS, "build", lambda *a, **k: builds.append(a) or build(*a, **k))
    exp = build_experiment(resolve(compose("amp=o1_manual")), amp_report=True)
    assert len(builds) == 1  # no second fp32 model for the reference
    assert set(exp.amp_report) == {"amp_dtypes.txt", "amp_drift.txt"}
    rows = {line.split()[0]: line.split() for line in exp.amp_report["amp_drift.txt"].splitlines()[3:-2]}
    assert list(rows)[0] == "patch_embed" and list(rows)[-1] == "logits"
    assert 0.0 < float(rows["logits"][2]) < 5e-2  # fp16 drifts, a little, from the same weights in fp32
    dtypes = compute_dtypes(exp.model, exp.amp)  # the run trains the cast model
    assert dtypes[f"{BLOCK}.mlp.fc1"] == "float16" and dtypes["patch_embed.proj"] == "float32"
    assert build_experiment(resolve(compose("amp=o1_manual"))).amp_report is None  # off unless asked


@pytest.mark.parametrize("permute", ["transpose", "mint", "gather"])
def test_o1_applies_to_the_conv_patch_embedding(permute: str) -> None:
    """MindSpore's O1 rewrite failed (NameError: PermuteOpt_1) on a PatchEmbed that held a Permute cell: the official,
    GPU and Ascend formulations' conv patch embedding, so amp=o1 stopped on every card."""
    policy = AMP_POLICIES.build({"name": "o1"})
    net = policy.apply(MODELS.build({"name": "swin_micro", "img_size": 32, "num_classes": 4, "patch_embed": "conv",
                                     "permute": permute}))
    out = net(Tensor(np.zeros((1, 3, 32, 32), np.float32)))
    assert out.shape == (1, 4) and np.isfinite(out.asnumpy()).all()
