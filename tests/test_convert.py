"""Name/shape conversion between the official, timm and swinexp layouts: exact, strict, and qkv-switch aware."""
from __future__ import annotations

import numpy as np
import pytest

from swinexp.models import create_model
from swinexp.models.convert import (
    check_matches,
    detect_layout,
    fuse_qkv,
    match_qkv,
    num_classes_of,
    split_qkv,
    to_mindspore,
    to_timm,
)


def random_state() -> dict[str, np.ndarray]:
    """swin_micro's parameter names and shapes (2 stages, 10 classes, fused qkv) with distinct random values."""
    model = create_model("swin_micro", num_classes=10, qkv="fused")
    rng = np.random.default_rng(0)
    return {p.name: rng.standard_normal(p.shape).astype(np.float32) for p in model.get_parameters()}


def torch_names(state: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """LayerNorm gamma/beta back to PyTorch's weight/bias, spelled out here rather than with the code under test."""
    return {k.replace(".gamma", ".weight").replace(".beta", ".bias"): v for k, v in state.items()}


@pytest.fixture(scope="module")
def fused() -> dict[str, np.ndarray]:
    return random_state()


@pytest.fixture(scope="module")
def official(fused: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """What microsoft/Swin-Transformer's state_dict() holds for swin_micro, buffers included."""
    out = torch_names(fused)
    out["layers.0.blocks.0.attn.relative_position_index"] = np.zeros((16, 16), np.int64)
    out["layers.0.blocks.1.attn_mask"] = np.zeros((4, 16, 16), np.float32)
    return out


@pytest.fixture(scope="module")
def timm(fused: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """timm >= 0.9: stage 0's patch merging opens stage 1, the classifier is head.fc."""
    out = {}
    for key, value in torch_names(fused).items():
        out[key.replace("layers.0.downsample.", "layers.1.downsample.").replace("head.", "head.fc.")] = value
    return out


def expected_of(state: dict[str, np.ndarray]) -> dict[str, tuple[int, ...]]:
    return {k: v.shape for k, v in state.items()}


def test_detect_layout(fused: dict, official: dict, timm: dict) -> None:
    assert detect_layout(official) == "official"
    assert detect_layout(timm) == "timm"
    assert detect_layout(fused) == "mindspore"
    assert detect_layout(["head.fc.weight", "norm.weight"]) == "timm"  # one stage: only the head tells


@pytest.mark.parametrize("layout", ["official", "timm"])
@pytest.mark.parametrize("qkv", ["fused", "split", "fused_split"])
def test_pytorch_layouts_convert_to_every_qkv_variant(request: pytest.FixtureRequest, fused: dict, layout: str,
                                                      qkv: str) -> None:
    target = split_qkv(fused) if qkv == "split" else fused
    out = to_mindspore(request.getfixturevalue(layout), target.keys())
    check_matches(out, expected_of(target))
    assert all(np.array_equal(out[k], v) for k, v in target.items())
    if layout == "timm":  # the stage shift maps back to the official stage
        assert np.array_equal(out["layers.0.downsample.reduction.weight"],
                              request.getfixturevalue("timm")["layers.1.downsample.reduction.weight"])


def test_split_rows_are_q_then_k_then_v(fused: dict) -> None:
    out = to_mindspore(torch_names(fused), split_qkv(fused).keys())
    w, b = fused["layers.1.blocks.0.attn.qkv.weight"], fused["layers.1.blocks.0.attn.qkv.bias"]  # (3*64, 64), (192,)
    np.testing.assert_array_equal(out["layers.1.blocks.0.attn.q.weight"], w[:64])
    np.testing.assert_array_equal(out["layers.1.blocks.0.attn.k.weight"], w[64:128])
    np.testing.assert_array_equal(out["layers.1.blocks.0.attn.v.bias"], b[128:])


@pytest.mark.parametrize("qkv", ["fused", "split"])
def test_to_timm_gives_timm_names_and_round_trips_exactly(fused: dict, timm: dict, qkv: str) -> None:
    state = split_qkv(fused) if qkv == "split" else fused
    exported = to_timm(state)
    assert list(exported) == list(timm)  # same names in the same order, whatever the switch
    assert all(np.array_equal(exported[k], v) for k, v in timm.items())
    back = to_mindspore(exported, state.keys())
    assert list(back) == list(state) and all(np.array_equal(back[k], v) for k, v in state.items())


def test_unmatched_missing_and_misshaped_keys_are_named(fused: dict, official: dict) -> None:
    expected = expected_of(fused)
    extra = {**official, "layers.0.blocks.0.attn.logit_scale": np.ones(2, np.float32)}
    with pytest.raises(ValueError, match=r"1 unexpected keys .*layers.0.blocks.0.attn.logit_scale"):
        check_matches(to_mindspore(extra, expected), expected)
    short = {k: v for k, v in official.items() if k != "layers.1.blocks.1.mlp.fc2.bias"}
    with pytest.raises(ValueError, match=r"1 missing keys, e.g. \['layers.1.blocks.1.mlp.fc2.bias'\]"):
        check_matches(to_mindspore(short, expected), expected)
    transposed = {**official, "layers.0.blocks.0.mlp.fc1.weight": official["layers.0.blocks.0.mlp.fc1.weight"].T}
    with pytest.raises(ValueError, match=r"layers.0.blocks.0.mlp.fc1.weight: file \(32, 128\) vs model \(128, 32\)"):
        check_matches(to_mindspore(transposed, expected), expected)


def test_fuse_refuses_incomplete_triples() -> None:
    parts = {f"a.attn.{p}.weight": np.full((2, 2), i, np.float32) for i, p in enumerate("qkv")}
    np.testing.assert_array_equal(fuse_qkv(parts)["a.attn.qkv.weight"][:, 0], [0, 0, 1, 1, 2, 2])
    with pytest.raises(ValueError, match=r"a.attn.k.weight"):
        fuse_qkv({k: v for k, v in parts.items() if ".k." not in k})
    with pytest.raises(ValueError, match="without a q entry"):
        fuse_qkv({k: v for k, v in parts.items() if ".q." not in k})
    with pytest.raises(ValueError, match="not a multiple of 3"):
        split_qkv({"a.attn.qkv.bias": np.zeros(4, np.float32)})


def test_match_qkv_follows_the_target_names_with_prefixes() -> None:
    # optimizer moments carry the parameter name behind a prefix; they split and fuse the same way
    fused_m = {"adam_m.x.attn.qkv.weight": np.arange(6, dtype=np.float32).reshape(6, 1), "global_step": np.ones(1)}
    split_m = match_qkv(fused_m, ["adam_m.x.attn.q.weight", "adam_m.x.attn.k.weight", "adam_m.x.attn.v.weight"])
    assert sorted(split_m) == ["adam_m.x.attn.k.weight", "adam_m.x.attn.q.weight", "adam_m.x.attn.v.weight",
                               "global_step"]
    np.testing.assert_array_equal(split_m["adam_m.x.attn.v.weight"][:, 0], [4, 5])
    back = match_qkv(split_m, ["adam_m.x.attn.qkv.weight"])
    np.testing.assert_array_equal(back["adam_m.x.attn.qkv.weight"], fused_m["adam_m.x.attn.qkv.weight"])
    assert match_qkv(fused_m, ["norm.gamma"]).keys() == fused_m.keys()


def test_num_classes_of(fused: dict, timm: dict) -> None:
    assert num_classes_of(fused) == num_classes_of(timm) == 10
    assert num_classes_of({k: v for k, v in fused.items() if not k.startswith("head.")}) == 0
