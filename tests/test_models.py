"""Swin port: official parameter names, window helpers, the SW-MSA mask, and switch equivalence."""
from __future__ import annotations

import inspect
import itertools
from typing import Callable

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor
from mindspore.nn import Cell
from omegaconf import OmegaConf

from swinexp.models import MODELS, SWIN_SIZES, SwinTransformer, fused_cpu
from swinexp.models.convert import fuse_qkv, split_qkv
from swinexp.models.factory import create_model, model_defaults
from swinexp.models.kernels import AddBroadcast, ExactGELU, LastAxisLayerNorm, LastAxisSoftmax, Permute
from swinexp.models.layers import (
    DropPath,
    Linear,
    PatchMatMul,
    TokenWindows,
    relative_position_index,
    roll_hw,
    shifted_window_mask,
    window_partition,
    window_reverse,
)
from swinexp.models.pretrained import LOAD_DEFAULTS
from swinexp.models.randomness import draw, philox_key
from swinexp.models.swin import SwinTransformerBlock, WindowAttention, merge_2x2_reshape, merge_2x2_slice
from swinexp.registry import ConfigError
from tests.conftest import CONF_DIR

# (qkv, patch_merging, rel_pos_bias, custom_bprop, permute); the first is the official formulation with autodiff
# gradients; mint.permute with each qkv mode, so every permutation site (embedding, windows, heads, fused qkv, bias,
# merging) runs on that kernel at least once
SWITCHES = [(*combination, "transpose") for combination in itertools.product(
    ("fused", "split", "fused_split"), ("slice", "reshape"), ("gather", "onehot"), (False, True))]
SWITCHES += [("fused", "reshape", "gather", False, "mint"), ("split", "reshape", "onehot", True, "mint"),
             ("fused_split", "slice", "gather", True, "mint")]
# row Gathers for the permutations that keep the first and last axis, ops.transpose for the others (fused qkv)
SWITCHES += [("split", "reshape", "gather", True, "gather"), ("fused", "reshape", "onehot", False, "gather"),
             ("fused_split", "reshape", "gather", True, "gather")]


@pytest.fixture(scope="module", autouse=True)
def pynative_cpu() -> None:
    ms.set_device("CPU")
    ms.set_context(mode=ms.PYNATIVE_MODE)


def micro(**overrides: object) -> SwinTransformer:
    """swin_micro in eval mode without stochastic depth, so outputs are deterministic."""
    model = MODELS.get("swin_micro")(**{"drop_path_rate": 0.0, "num_classes": 10, **overrides})
    model.set_train(False)
    return model


def state_of(model: SwinTransformer) -> dict[str, np.ndarray]:
    return {p.name: p.asnumpy() for p in model.get_parameters()}


def load_state(model: SwinTransformer, state: dict[str, np.ndarray]) -> None:
    names = {p.name for p in model.get_parameters()}
    assert names == set(state), f"name mismatch: {sorted(names ^ set(state))[:5]}"
    for p in model.get_parameters():
        p.set_data(Tensor(state[p.name]))


def outputs_and_grads(model: SwinTransformer, x: Tensor) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """Logits, d(sum logits^2)/d(image) and d(...)/d(every parameter), by parameter name."""
    params = model.trainable_params()

    def loss(images: Tensor) -> tuple[Tensor, Tensor]:
        logits = model(images)
        return (logits**2).sum(), logits

    (_, logits), (gx, gp) = ms.value_and_grad(loss, grad_position=0, weights=params, has_aux=True)(x)
    return logits.asnumpy(), gx.asnumpy(), {p.name: g.asnumpy() for p, g in zip(params, gp)}


def official_state_dict_names(depths: tuple[int, ...], ape: bool) -> list[str]:
    """The PyTorch state-dict keys of microsoft/Swin-Transformer, minus buffers, with LayerNorm renamed."""
    ln = ("gamma", "beta")
    names = ["absolute_pos_embed"] if ape else []
    names += ["patch_embed.proj.weight", "patch_embed.proj.bias", *(f"patch_embed.norm.{n}" for n in ln)]
    for i, depth in enumerate(depths):
        for j in range(depth):
            p = f"layers.{i}.blocks.{j}"
            names += [f"{p}.norm1.{n}" for n in ln]
            names += [f"{p}.attn.relative_position_bias_table", f"{p}.attn.qkv.weight", f"{p}.attn.qkv.bias"]
            names += [f"{p}.attn.proj.weight", f"{p}.attn.proj.bias", *(f"{p}.norm2.{n}" for n in ln)]
            names += [f"{p}.mlp.fc1.weight", f"{p}.mlp.fc1.bias", f"{p}.mlp.fc2.weight", f"{p}.mlp.fc2.bias"]
        if i < len(depths) - 1:
            names += [f"layers.{i}.downsample.reduction.weight", *(f"layers.{i}.downsample.norm.{n}" for n in ln)]
    return names + ["norm.gamma", "norm.beta", "head.weight", "head.bias"]


def test_parameter_names_match_official_state_dict_in_order() -> None:
    model = micro(qkv="fused", ape=True)
    assert [p.name for p in model.trainable_params()] == official_state_dict_names((2, 2), ape=True)
    # constants (relative_position_index, attn_mask, one-hot) are plain Tensors: not parameters, not checkpointed
    assert list(model.parameters_dict()) == [p.name for p in model.trainable_params()]


def test_split_qkv_names() -> None:
    names = [p.name for p in micro(qkv="split").trainable_params()]
    assert "layers.0.blocks.1.attn.q.weight" in names and "layers.0.blocks.1.attn.v.bias" in names
    assert not any(".qkv." in n for n in names)
    onehot = micro(rel_pos_bias="onehot")
    assert len(onehot.parameters_dict()) == len(onehot.trainable_params())


def test_forward_shape() -> None:
    x = Tensor(np.random.default_rng(0).standard_normal((2, 3, 64, 64)).astype(np.float32))
    assert micro(num_classes=7)(x).shape == (2, 7)
    features = micro(num_classes=0)
    assert features(x).shape == (2, features.num_features)


def test_train_mode_with_stochastic_depth_and_dropout_draws_runs() -> None:
    model = MODELS.get("swin_micro")(num_classes=5, drop_path_rate=0.3, drop_rate=0.1, attn_drop_rate=0.1)
    model.set_train(True)
    sites = model.random_sites
    scales, keys = draw(sites, philox_key(0, 0), step=0, micro=0, batch=2)
    out = model(Tensor(np.ones((2, 3, 64, 64), np.float32)), Tensor(scales), Tensor(keys)).asnumpy()
    assert out.shape == (2, 5) and np.isfinite(out).all()


def test_drop_path_scales_whole_samples_and_is_identity_in_eval_or_without_draws() -> None:
    cell = DropPath(0.5)
    x = Tensor(np.ones((4, 3, 2), np.float32))
    scale = Tensor(np.array([0.0, 2.0, 2.0, 0.0], np.float32))
    cell.set_train(True)
    out = cell(x, scale).asnumpy()
    np.testing.assert_array_equal(out, np.broadcast_to(np.array([0.0, 2.0, 2.0, 0.0])[:, None, None], out.shape))
    np.testing.assert_array_equal(cell(x).asnumpy(), x.asnumpy())
    cell.set_train(False)
    np.testing.assert_array_equal(cell(x, scale).asnumpy(), x.asnumpy())


def test_window_partition_round_trip() -> None:
    x = np.random.default_rng(0).standard_normal((2, 8, 12, 3)).astype(np.float32)
    windows = window_partition(Tensor(x), 4).asnumpy()
    assert windows.shape == (2 * 2 * 3, 4, 4, 3)
    np.testing.assert_array_equal(windows[1], x[0, 0:4, 4:8])  # row-major over the window grid
    np.testing.assert_array_equal(windows[3], x[0, 4:8, 0:4])
    np.testing.assert_array_equal(window_reverse(Tensor(windows), 4, 8, 12).asnumpy(), x)


@pytest.mark.parametrize("shift", [-2, 3])
def test_roll_matches_torch_roll(shift: int) -> None:
    x = np.arange(2 * 6 * 6 * 2, dtype=np.float32).reshape(2, 6, 6, 2)
    np.testing.assert_array_equal(roll_hw(Tensor(x), shift).asnumpy(), np.roll(x, (shift, shift), (1, 2)))


@pytest.mark.parametrize("shift", [0, 2])
def test_token_windows_by_row_gathers_are_roll_and_partition_with_their_gradient(shift: int) -> None:
    """The gather path (one permutation) against roll_hw + window_partition with ops.transpose, both directions."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 8 * 8, 3)).astype(np.float32)
    upstream = rng.standard_normal((2 * 4, 16, 3)).astype(np.float32)
    expected = window_partition(Tensor(np.roll(x.reshape(2, 8, 8, 3), (-shift, -shift), (1, 2))), 4).asnumpy()
    by_rows, by_axes = TokenWindows(8, 4, shift, "gather"), TokenWindows(8, 4, shift, "transpose")
    assert by_rows.rows is not None and by_axes.rows is None
    for windows in (by_rows, by_axes):
        out = windows.split(Tensor(x))
        np.testing.assert_array_equal(out.asnumpy(), expected.reshape(8, 16, 3))
        np.testing.assert_array_equal(windows.merge(out).asnumpy(), x)
    grads = [ms.grad(lambda t, w=w: (w.split(t) * Tensor(upstream)).sum())(Tensor(x)).asnumpy()
             for w in (by_rows, by_axes)]
    np.testing.assert_array_equal(grads[0], grads[1])
    back = [ms.grad(lambda t, w=w: (w.merge(t) * Tensor(x)).sum())(Tensor(upstream)).asnumpy()
            for w in (by_rows, by_axes)]
    np.testing.assert_array_equal(back[0], back[1])


def test_relative_position_index() -> None:
    ws = 3
    index = relative_position_index(ws)
    assert index.shape == (9, 9) and index.min() == 0 and index.max() == (2 * ws - 1) ** 2 - 1
    centre = (ws - 1) * (2 * ws - 1) + (ws - 1)  # offset (0, 0)
    assert (np.diag(index) == centre).all()
    assert index[0, 8] == 0 and index[8, 0] == (2 * ws - 1) ** 2 - 1  # offsets (-2, -2) and (2, 2)
    assert index[1, 0] == centre + 1 and index[3, 0] == centre + (2 * ws - 1)  # (0, +1) and (+1, 0)


def test_shifted_window_mask_blocks_cross_region_attention() -> None:
    # 8x8 map, window 4, shift 2: after rolling by -2, rows/cols 4-5 and 6-7 came from different places
    mask = shifted_window_mask(8, 8, 4, 2)
    assert mask.shape == (4, 16, 16)
    assert (mask[0] == 0).all()  # top-left window: one region
    rows, cols = np.divmod(np.arange(16), 4)  # window-local (row, col) of each token
    bottom_right = (rows >= 2) * 2 + (cols >= 2)  # four 2x2 regions
    top_right = cols >= 2  # two 4x2 regions
    for window, region in ((3, bottom_right), (1, top_right), (2, rows >= 2)):
        expected = np.where(region[:, None] == region[None, :], 0.0, -100.0)
        np.testing.assert_array_equal(mask[window], expected)


def test_blocks_shift_on_odd_blocks_and_shrink_small_windows() -> None:
    model = micro(img_size=32, window_size=4)  # stage maps 8x8 and 4x4
    b0, b1 = model.layers[0].blocks
    assert (b0.shift_size, b1.shift_size) == (0, 2) and b0.attn_mask is None
    np.testing.assert_array_equal(b1.attn_mask.asnumpy()[0, :, 0], shifted_window_mask(8, 8, 4, 2))
    assert all(b.shift_size == 0 and b.attn_mask is None for b in model.layers[1].blocks)  # 4x4 map <= window
    tiny_windows = micro(img_size=16)  # stage 1 is a 2x2 map: the window shrinks to 2 (official rule)
    assert tiny_windows.layers[1].blocks[1].window_size == 2
    assert tiny_windows(Tensor(np.ones((1, 3, 16, 16), np.float32))).shape == (1, 10)


def test_patch_merging_slice_backward_runs_and_matches_reshape() -> None:
    # the official 4-D strided slice x[:, 0::2, 0::2] crashes in StridedSliceGrad on MindSpore 2.10 CPU
    b, h, w, c = 3, 6, 10, 4
    rng = np.random.default_rng(0)
    x = rng.standard_normal((b, h * w, c)).astype(np.float32)
    weight = Tensor(rng.standard_normal((b, h * w // 4, 4 * c)).astype(np.float32))
    grid = x.reshape(b, h, w, c)
    official = np.concatenate([grid[:, 0::2, 0::2], grid[:, 1::2, 0::2], grid[:, 0::2, 1::2], grid[:, 1::2, 1::2]], -1)
    results = {}
    for merge in (merge_2x2_slice, merge_2x2_reshape):
        out = merge(Tensor(x), h, w).asnumpy()
        np.testing.assert_array_equal(out, official.reshape(b, -1, 4 * c))
        results[merge.__name__] = ms.grad(lambda t, merge=merge: (merge(t, h, w) * weight).sum())(Tensor(x)).asnumpy()
    expected = np.zeros_like(grid)  # the gradient routes each output channel block back to its pixel
    for k, (dh, dw) in enumerate(((0, 0), (1, 0), (0, 1), (1, 1))):
        expected[:, dh::2, dw::2] = weight.asnumpy().reshape(b, h // 2, w // 2, 4 * c)[..., k * c : (k + 1) * c]
    for grad in results.values():
        np.testing.assert_array_equal(grad, expected.reshape(b, h * w, c))


class _AddBias(ms.nn.Cell):
    """x + b with b a parameter of x's trailing shape, plain (`add=None`) or through `AddBroadcast`."""

    def __init__(self, shape: tuple[int, ...], add: ms.nn.Cell | None) -> None:
        super().__init__()
        self.b = ms.Parameter(Tensor(np.random.default_rng(1).standard_normal(shape).astype(np.float32)), name="b")
        self.add = add

    def construct(self, x: Tensor) -> Tensor:
        return x + self.b if self.add is None else self.add(x, self.b)


def _linear(custom_bprop: bool) -> Linear:
    cell = Linear(8, 6, custom_bprop=custom_bprop)
    cell.bias.set_data(Tensor(np.random.default_rng(2).standard_normal(6).astype(np.float32)))  # not the zero init
    return cell


def _layer_norm(custom_bprop: bool) -> LastAxisLayerNorm:
    cell = LastAxisLayerNorm(16, custom_bprop)
    rng = np.random.default_rng(3)  # not the ones/zeros init, so a swapped gamma/beta gradient shows
    cell.gamma.set_data(Tensor(rng.standard_normal(16).astype(np.float32)))
    cell.beta.set_data(Tensor(rng.standard_normal(16).astype(np.float32)))
    return cell


@pytest.mark.parametrize("make,shape", [
    (lambda custom: ExactGELU(custom), (3, 5, 16)),
    (_layer_norm, (3, 5, 16)),
    (lambda custom: LastAxisSoftmax(custom), (2, 3, 9, 9)),
    (_linear, (2, 5, 8)),
    (lambda custom: _AddBias((3, 9, 9), AddBroadcast() if custom else None), (4, 2, 3, 9, 9)),
], ids=["gelu", "layer_norm", "softmax", "linear", "add_broadcast"])
def test_custom_bprop_cells_match_autodiff(make: Callable[[bool], ms.nn.Cell], shape: tuple[int, ...]) -> None:
    """Each hand-written backward gives autodiff's input and parameter gradients, after the same forward."""
    rng = np.random.default_rng(0)
    x = Tensor(rng.standard_normal(shape).astype(np.float32) * 2)
    native, custom = make(False), make(True)
    load_state(custom, state_of(native))
    upstream = None
    results = []
    for cell in (native, custom):
        out = cell(x)
        if upstream is None:
            upstream = Tensor(rng.standard_normal(out.shape).astype(np.float32))  # d loss / d out, shared
        params = cell.trainable_params()
        grads = ms.grad(lambda t, cell=cell, dy=upstream: (cell(t) * dy).sum(), 0, params or None)(x)
        gx, gp = grads if params else (grads, ())
        results.append([out.asnumpy(), gx.asnumpy(), *(g.asnumpy() for g in gp)])
    for ref, got in zip(*results):
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6 * np.abs(ref).max())


@pytest.mark.parametrize("axes", [(0, 2, 1, 3), (0, 1, 3, 2, 4, 5), (0, 3, 1, 2, 4), (2, 0, 3, 1, 4), (0, 2, 1)])
def test_gather_permutation_is_the_transpose_with_the_transposed_gradient(axes: tuple[int, ...]) -> None:
    """Row Gathers when the first and last axes stay (the last three fall back to ops.transpose); both exact."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 3, 4, 5, 6, 7)[: len(axes)]).astype(np.float32)
    upstream = rng.standard_normal(x.transpose(axes).shape).astype(np.float32)
    reorder = Permute("gather")
    out = reorder(Tensor(x), axes)
    grad = ms.grad(lambda t: (reorder(t, axes) * Tensor(upstream)).sum())(Tensor(x))
    np.testing.assert_array_equal(out.asnumpy(), x.transpose(axes))
    np.testing.assert_array_equal(grad.asnumpy(), upstream.transpose(np.argsort(axes)))


def test_exact_gelu_is_torchs_erf_formula() -> None:
    """Forward of the custom GELU is x * 0.5 * (1 + erf(x / sqrt 2)), not the tanh approximation."""
    import math

    x = np.linspace(-6, 6, 97).astype(np.float32)
    expected = np.array([v * 0.5 * (1 + math.erf(v / math.sqrt(2))) for v in x.astype(np.float64)])
    np.testing.assert_allclose(ExactGELU(custom_bprop=True)(Tensor(x)).asnumpy(), expected, rtol=1e-6, atol=1e-7)


def test_qkv_state_conversion_round_trip() -> None:
    state = state_of(micro(qkv="fused"))
    split = split_qkv(state)
    assert set(split) == set(state_of(micro(qkv="split")))
    w = state["layers.1.blocks.0.attn.qkv.weight"]
    np.testing.assert_array_equal(split["layers.1.blocks.0.attn.k.weight"], w[w.shape[0] // 3 : 2 * w.shape[0] // 3])
    back = fuse_qkv(split)
    assert list(back) == list(state) and all(np.array_equal(back[k], state[k]) for k in state)


@pytest.fixture(scope="module")
def official_layout() -> tuple[Tensor, dict[str, np.ndarray], tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]]:
    """The official formulation (fused qkv, slice merging, gather bias, autodiff): input, weights, outputs, grads."""
    ms.set_seed(0)
    x = Tensor(np.random.default_rng(0).standard_normal((2, 3, 64, 64)).astype(np.float32))
    model = micro(qkv="fused", patch_merging="slice", rel_pos_bias="gather", custom_bprop=False)
    return x, state_of(model), outputs_and_grads(model, x)


# every combination with the official conv embedding; the embedding as one MatMul in the official formulation and
# in the cpu one (q/k/v fused then split, hand-written backward passes, row Gathers)
EMBEDDINGS = [(*switches, "conv") for switches in SWITCHES[1:]]
EMBEDDINGS += [(*SWITCHES[0], "matmul"), (*SWITCHES[-1], "matmul")]


@pytest.mark.parametrize("qkv,merging,bias,custom_bprop,permute,patch_embed", EMBEDDINGS)
def test_switch_combination_computes_the_official_function(
    official_layout: tuple[Tensor, dict[str, np.ndarray], tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]],
    qkv: str,
    merging: str,
    bias: str,
    custom_bprop: bool,
    permute: str,
    patch_embed: str,
) -> None:
    """Loaded with the official formulation's weights, every variant gives its logits and gradients."""
    x, state, (ref_out, ref_gx, ref_gp) = official_layout
    model = micro(qkv=qkv, patch_merging=merging, rel_pos_bias=bias, custom_bprop=custom_bprop, permute=permute,
                  patch_embed=patch_embed)
    assert isinstance(model.patch_embed.proj, PatchMatMul) == (patch_embed == "matmul")
    load_state(model, split_qkv(state) if qkv == "split" else state)
    out, gx, gp = outputs_and_grads(model, x)
    gp = fuse_qkv(gp) if qkv == "split" else gp
    assert np.abs(out - ref_out).max() < 1e-5
    assert np.abs(gx - ref_gx).max() <= 1e-4 * np.abs(ref_gx).max()
    assert gp.keys() == ref_gp.keys()
    for name, ref in ref_gp.items():
        assert np.abs(gp[name] - ref).max() <= 1e-4 * np.abs(ref).max() + 1e-12, name


@pytest.mark.skipif(fused_cpu.compiler() is None, reason="no C++ compiler to build the fused kernels")
@pytest.mark.parametrize("mode", [ms.PYNATIVE_MODE, ms.GRAPH_MODE], ids=["pynative", "graph"])
@pytest.mark.parametrize("formulation", [SWITCHES[0], SWITCHES[-1]], ids=["official", "cpu"])
def test_fused_cpu_kernels_compute_the_official_function(
    official_layout: tuple[Tensor, dict[str, np.ndarray], tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]],
    formulation: tuple, mode: int,
) -> None:
    """model.kernels=fused_cpu swaps GELU, LayerNorm and the attention's bias add + softmax for the C++ kernels
    (shifted blocks' masks included); logits and gradients stay the official ones."""
    x, state, (ref_out, ref_gx, ref_gp) = official_layout
    qkv, merging, bias, custom_bprop, permute = formulation
    model = micro(qkv=qkv, patch_merging=merging, rel_pos_bias=bias, custom_bprop=custom_bprop, permute=permute,
                  patch_embed="matmul", kernels="fused_cpu")
    kinds = {ExactGELU: fused_cpu.FusedGeluFn, LastAxisLayerNorm: fused_cpu.FusedLayerNormFn,
             LastAxisSoftmax: fused_cpu.FusedSoftmaxFn}
    cells = [(cell, kinds[type(cell)]) for _, cell in model.cells_and_names() if type(cell) in kinds]

    def fused(cell: Cell) -> Cell | None:  # LayerNorm's computation is a shared cell of its own
        return cell.fn.fused if isinstance(cell, LastAxisLayerNorm) else cell.fused

    assert {type(cell) for cell, _ in cells} == set(kinds) and all(isinstance(fused(c), f) for c, f in cells)
    attention = [cell for _, cell in model.cells_and_names() if isinstance(cell, WindowAttention)]
    assert attention and all(isinstance(cell.bias_softmax, fused_cpu.FusedBiasSoftmaxFn) for cell in attention)
    assert any(block.attn_mask is not None for _, block in model.cells_and_names()
               if isinstance(block, SwinTransformerBlock))
    load_state(model, state)
    ms.set_context(mode=mode)
    try:
        out, gx, gp = outputs_and_grads(model, x)
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)
    assert np.abs(out - ref_out).max() < 1e-5
    assert np.abs(gx - ref_gx).max() <= 1e-4 * np.abs(ref_gx).max()
    for name, ref in ref_gp.items():
        assert np.abs(gp[name] - ref).max() <= 1e-4 * np.abs(ref).max() + 1e-12, name


@pytest.mark.parametrize(
    "overrides,message",
    [
        (dict(num_heads=(2, 5)), "model.num_heads[1]=5"),
        (dict(embed_dim=33), "model.num_heads[0]=2 does not divide the stage-0 width"),
        (dict(img_size=60), "model.img_size=60"),
        (dict(img_size=48), "Nearest valid model.img_size: 32 or 64"),  # 12x12 ok, then 6x6 vs window 4
        (dict(img_size=66), "not divisible by patch_size=4"),
        (dict(qkv="fuse"), "model.qkv='fuse' is not a known option; choose one of: fused, split, fused_split"),
        (dict(patch_merging="strided"), "model.patch_merging='strided'"),
        (dict(rel_pos_bias="table"), "choose one of: gather, onehot"),
        (dict(permute="swap"), "model.permute='swap' is not a known option; choose one of: transpose, mint, gather"),
        (dict(patch_embed="unfold"), "model.patch_embed='unfold' is not a known option; choose one of: conv, matmul"),
        (dict(kernels="avx"), "model.kernels='avx' is not a known option; choose one of: mindspore, fused_cpu"),
        (dict(depths="22"), "model.depths='22'"),
        (dict(depths=(2, 2, 2)), "model.depths=[2, 2, 2] and model.num_heads=[2, 4]"),
        (dict(drop_path_rate=1.0), "model.drop_path_rate=1.0"),
        (dict(window_size=0), "model.window_size=0"),
    ],
)
def test_invalid_config_names_the_key(overrides: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        MODELS.get("swin_micro")(**overrides)
    assert message in str(err.value)


def test_tiny_rejects_image_size_that_breaks_a_stage() -> None:
    with pytest.raises(ConfigError, match=r"model.img_size=100 .*Nearest valid model.img_size: 224"):
        MODELS.get("swin_tiny")(img_size=100)


def test_sizes_are_registered_with_their_yaml_values_in_the_signature() -> None:
    for name in SWIN_SIZES:
        builder = MODELS.get(name)
        assert builder.__name__ == name
        params = inspect.signature(builder).parameters
        assert list(params) == [*inspect.signature(SwinTransformer).parameters, *LOAD_DEFAULTS]
        assert params["pretrained"].default is None and params["pretrained_resize"].default == "official"
    tiny = inspect.signature(MODELS.get("swin_tiny")).parameters
    assert tiny["drop_path_rate"].default == 0.2
    assert (tiny["depths"].default, tiny["embed_dim"].default) == ([2, 2, 6, 2], 96)
    base_384 = inspect.signature(MODELS.get("swin_base_384")).parameters
    assert (base_384["img_size"].default, base_384["window_size"].default) == (384, 12)


def test_builder_overrides_win_and_typos_fail_through_the_registry() -> None:
    model = MODELS.build({"name": "swin_micro", "embed_dim": 16, "num_heads": [1, 2], "num_classes": 3})
    assert model.embed_dim == 16 and model.num_features == 32
    with pytest.raises(ConfigError, match="model.embed_dims"):
        MODELS.build({"name": "swin_micro", "embed_dims": 16})


def test_accepts_omegaconf_lists() -> None:
    omegaconf = pytest.importorskip("omegaconf")
    cfg = omegaconf.OmegaConf.create({"depths": [1, 1], "num_heads": [2, 4]})
    model = MODELS.get("swin_micro")(depths=cfg.depths, num_heads=cfg.num_heads)
    assert len(model.layers) == 2 and len(model.layers[0].blocks) == 1


@pytest.mark.parametrize("name", SWIN_SIZES)
def test_model_yaml_holds_only_what_differs_from_its_base(name: str) -> None:
    # the numbers of a size live in its five-line file, once; everything shared lives in base_swin.yaml
    own = set(OmegaConf.load(CONF_DIR / "model" / f"{name}.yaml")) - {"defaults", "name"}
    assert {"embed_dim", "depths", "num_heads", "drop_path_rate"} <= own
    assert own <= {"embed_dim", "depths", "num_heads", "drop_path_rate", "window_size", "img_size"}


def test_create_model_uses_the_yaml_and_lets_arguments_win() -> None:
    model = create_model("swin_micro", num_classes=3, qkv="fused", embed_dim=16, num_heads=[1, 2])
    assert model.num_classes == 3 and model.embed_dim == 16
    assert model.layers[0].blocks[0].attn.qkv_mode == "fused"
    assert model.patch_embed.img_size == 64  # not following any data: the size's own default
    assert create_model("swin_micro").num_classes == 1000
    official = create_model("swin_tiny", num_classes=0).layers[0].blocks[0].attn
    assert official.qkv_mode == "fused" and model_defaults("swin_tiny")["img_size"] == 224
    tiny = model_defaults("swin_tiny")
    assert (tiny["patch_merging"], tiny["custom_bprop"]) == ("slice", False)


def test_create_model_errors_name_the_problem() -> None:
    with pytest.raises(ConfigError, match="Did you mean 'swin_tiny'"):
        create_model("swin_tiyn")
    with pytest.raises(ConfigError, match="model.embed_dims is not a parameter"):
        create_model("swin_micro", embed_dims=16)


@pytest.mark.parametrize("qkv", ["split", "fused_split"])
def test_same_seed_gives_the_same_initial_weights_whatever_the_switches(qkv: str) -> None:
    """An ablation must change the computation only: every variant starts from the official variant's weights."""
    def state(**switches: str) -> dict[str, np.ndarray]:
        ms.set_seed(11)
        np.random.seed(11)
        return fuse_qkv({p.name: p.asnumpy() for p in micro(**switches).get_parameters()})

    official = state(qkv="fused", patch_merging="slice", rel_pos_bias="gather", custom_bprop=False)
    variant = state(qkv=qkv, patch_merging="reshape", rel_pos_bias="onehot", custom_bprop=True, patch_embed="matmul")
    assert official.keys() == variant.keys()
    for name in official:
        np.testing.assert_array_equal(official[name], variant[name], err_msg=name)
