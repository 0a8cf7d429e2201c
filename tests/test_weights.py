"""Weight files: import/export CLI round trip, `model.pretrained` loading into any variant, head dropping, errors."""
from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Callable

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor
from omegaconf import DictConfig
from safetensors.numpy import load_file

from swinexp.build import resolve
from swinexp.engine import checkpoint
from swinexp.models import MODELS, SwinTransformer, create_model
from swinexp.models.convert import fuse_qkv, to_timm
from swinexp.models.pretrained import assign, load_weights, model_state, read_weights, write_safetensors
from swinexp.models.weights import main
from swinexp.optim import adamw
from swinexp.registry import ConfigError

IMAGES = Tensor(np.random.default_rng(1).standard_normal((2, 3, 64, 64)).astype(np.float32))


@pytest.fixture(scope="module", autouse=True)
def pynative_cpu() -> None:
    ms.set_device("CPU")
    ms.set_context(mode=ms.PYNATIVE_MODE)


def micro(**overrides: object) -> SwinTransformer:
    """swin_micro in eval mode (no stochastic depth), 10 classes unless overridden."""
    model = create_model("swin_micro", **{"num_classes": 10, "drop_path_rate": 0.0, **overrides})
    model.set_train(False)
    return model


@pytest.fixture(scope="module")
def reference() -> SwinTransformer:
    """A split-qkv swin_micro whose every parameter is random (LayerNorm and biases are not 1s and 0s)."""
    model = micro(qkv="split")
    rng = np.random.default_rng(0)
    assign(model, {p.name: rng.standard_normal(p.shape).astype(np.float32) * 0.1 for p in model.get_parameters()})
    return model


@pytest.fixture(scope="module")
def saved(reference: SwinTransformer, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The reference as a training checkpoint (model + AdamW state + meta), as train.fit writes it."""
    path = tmp_path_factory.mktemp("ckpt") / "last.ckpt"
    return checkpoint.save(path, reference, adamw(reference, lr=1e-3), {"epoch": 3})


def test_cli_import_export_round_trip_is_exact(reference: SwinTransformer, saved: Path, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    exported, imported, again = tmp_path / "a.safetensors", tmp_path / "b.ckpt", tmp_path / "c.safetensors"
    assert main(["export", str(saved), str(exported), "--model", "swin_micro"]) == 0
    timm = load_file(str(exported))
    assert {"layers.1.downsample.reduction.weight", "head.fc.weight", "norm.weight", "layers.0.blocks.0.attn.qkv.bias"
            } <= timm.keys()  # fmt: skip
    assert not any(k.startswith("layers.0.downsample") or k.endswith((".gamma", ".q.weight")) for k in timm)
    assert main(["import", str(exported), str(imported), "--model", "swin_micro"]) == 0
    assert "(timm layout)" in capsys.readouterr().out
    ckpt = read_weights(imported)
    assert "layers.1.blocks.0.attn.qkv.weight" in ckpt and not any(".attn.q." in k for k in ckpt)  # official names
    assert main(["export", str(imported), str(again), "--model", "swin_micro"]) == 0
    assert exported.read_bytes() == again.read_bytes()
    state = model_state(reference)
    fused = micro(qkv="fused", pretrained=str(imported))
    assert np.array_equal(fused(IMAGES).asnumpy(), reference(IMAGES).asnumpy())
    from_timm = micro(qkv="fused_split", pretrained=str(exported))  # a timm file loads directly too
    assert np.array_equal(from_timm(IMAGES).asnumpy(), reference(IMAGES).asnumpy())
    np.testing.assert_array_equal(model_state(fused)["layers.0.downsample.norm.gamma"],
                                  state["layers.0.downsample.norm.gamma"])


def test_cli_import_reports_the_tensors_it_read_and_wrote_and_takes_architecture_overrides(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    small = micro(embed_dim=16, qkv="split")  # not conf/model/swin_micro.yaml's width
    src, out = tmp_path / "small.safetensors", tmp_path / "small.ckpt"
    write_safetensors(to_timm(model_state(small)), src)
    in_file = len(load_file(str(src)))
    assert in_file < len(list(small.get_parameters()))  # the file fuses q/k/v; the split model counts them apart
    with pytest.raises(SystemExit) as failed:  # the file's width does not fit the YAML's
        main(["import", str(src), str(out), "--model", "swin_micro"])
    assert failed.value.code == 2 and "shape mismatches" in capsys.readouterr().err
    assert main(["import", str(src), str(out), "--model", "swin_micro", "--set", "embed_dim=16",
                 "--set", "qkv=split"]) == 0
    printed = capsys.readouterr().out
    assert f"read {in_file} tensors" in printed and f"wrote {in_file} tensors" in printed
    assert len(read_weights(out)) == in_file
    loaded = micro(embed_dim=16, qkv="fused", pretrained=str(out))
    np.testing.assert_array_equal(loaded(IMAGES).asnumpy(), small(IMAGES).asnumpy())


@pytest.mark.parametrize("qkv,merging,bias", [("fused", "slice", "gather"), ("fused_split", "reshape", "onehot"),
                                              ("split", "slice", "onehot")])
def test_official_state_dict_loads_into_any_variant(reference: SwinTransformer, qkv: str, merging: str,
                                                    bias: str) -> None:
    # microsoft/Swin-Transformer's state_dict(): fused qkv, weight/bias norms, buffers; built from the reference
    state = model_state(reference)
    official = {k.replace(".gamma", ".weight").replace(".beta", ".bias"): v for k, v in state.items()
                if not any(f".{p}." in k for p in "qkv")}  # fmt: skip
    for k in [k for k in state if ".attn.q." in k]:
        official[k.replace(".q.", ".qkv.")] = np.concatenate([state[k.replace(".q.", f".{p}.")] for p in "qkv"])
    official["layers.0.blocks.0.attn.relative_position_index"] = np.zeros((16, 16), np.int64)
    model = micro(qkv=qkv, patch_merging=merging, rel_pos_bias=bias)
    report = load_weights(model, official, "official.pth")
    assert report.layout == "official" and report.loaded == len(model.trainable_params()) and not report.missing
    np.testing.assert_allclose(model(IMAGES).asnumpy(), reference(IMAGES).asnumpy(), atol=1e-5)


def test_pretrained_config_key_drops_the_head_when_classes_differ(
    reference: SwinTransformer, saved: Path, compose: Callable[..., DictConfig], caplog: pytest.LogCaptureFixture
) -> None:
    cfg = compose(f"model.pretrained={saved}", "data.num_classes=4", "data.img_size=64")
    with caplog.at_level(logging.INFO, logger="swinexp"):
        model = MODELS.build(resolve(cfg).section("model"))
    assert "missing keys (freshly initialised): ['head.bias', 'head.weight']" in caplog.text
    assert "optimizer/meta entries" in caplog.text
    state, ref = fuse_qkv(model_state(model)), fuse_qkv(model_state(reference))  # either q/k/v layout
    assert state["head.weight"].shape == (4, 64) and not state["head.bias"].any()  # the fresh head
    assert state.keys() == ref.keys()
    assert all(np.array_equal(state[k], v) for k, v in ref.items() if not k.startswith("head."))


def test_pretrained_backbone_only_models_and_files(reference: SwinTransformer, saved: Path, tmp_path: Path) -> None:
    backbone = micro(num_classes=0, qkv="fused", pretrained=str(saved))
    np.testing.assert_allclose(backbone(IMAGES).asnumpy(), reference.forward_features(IMAGES).mean(1).asnumpy(),
                               atol=1e-6)
    headless = tmp_path / "features.ckpt"
    assert main(["import", str(saved), str(headless), "--model", "swin_micro", "--num-classes", "0"]) == 0
    assert not any(k.startswith("head.") for k in read_weights(headless))
    report = load_weights(micro(), read_weights(headless), headless)
    assert report.missing == ("head.bias", "head.weight") and report.unexpected == ()


def test_pretrained_errors_name_the_key_and_the_fix(saved: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"model.pretrained='.*last.ckpt' does not fit this model: .*"
                                          r"patch_embed.proj.weight: file \(32, 3, 4, 4\) vs model \(16, 3, 4, 4\)"):
        micro(embed_dim=16, num_heads=[1, 2], pretrained=str(saved))
    with pytest.raises(ConfigError, match=r"model.pretrained='nope.ckpt': weight file 'nope.ckpt' does not exist"):
        micro(pretrained="nope.ckpt")
    (tmp_path / "w.npz").write_bytes(b"")
    with pytest.raises(ConfigError, match=r"unknown suffix; use one of: .ckpt, .safetensors, .pth"):
        micro(pretrained=str(tmp_path / "w.npz"))


def test_pth_without_torch_says_how_to_install_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # makes `import torch` raise ImportError
    (tmp_path / "swin.pth").write_bytes(b"")
    with pytest.raises(SystemExit) as exit_:
        main(["import", str(tmp_path / "swin.pth"), str(tmp_path / "out.ckpt"), "--model", "swin_micro"])
    assert exit_.value.code == 2 and "pip install torch" in capsys.readouterr().err


def test_official_pth_imports_with_torch(reference: SwinTransformer, tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    state = model_state(micro(qkv="fused", pretrained=None))
    official = {k.replace(".gamma", ".weight").replace(".beta", ".bias"): torch.from_numpy(v) for k, v in state.items()}
    torch.save({"model": official, "epoch": 300}, tmp_path / "swin.pth")
    assert main(["import", str(tmp_path / "swin.pth"), str(tmp_path / "out.ckpt"), "--model", "swin_micro"]) == 0
    loaded = read_weights(tmp_path / "out.ckpt")
    assert all(np.array_equal(loaded[k], v) for k, v in state.items())


class _FakeTensor:
    """Just what the .pth reader uses of a torch.Tensor."""

    def __init__(self, value: np.ndarray) -> None:
        self.value = value

    def is_floating_point(self) -> bool:
        return self.value.dtype.kind == "f"

    def float(self) -> _FakeTensor:
        return _FakeTensor(self.value.astype(np.float32))

    def numpy(self) -> np.ndarray:
        return self.value


def test_pth_reader_uses_the_safe_loader_and_unwraps_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    official = {"norm.weight": _FakeTensor(np.ones(4, np.float16)), "layers.0.blocks.0.attn.relative_position_index":
                _FakeTensor(np.zeros((4, 4), np.int64))}  # fmt: skip

    def load(path: Path, map_location: str, weights_only: bool) -> dict:
        calls.append((map_location, weights_only))
        return {"model": official, "optimizer": {}, "epoch": 299}

    fake = type(sys)("torch")
    fake.load, fake.is_tensor = load, lambda v: isinstance(v, _FakeTensor)
    monkeypatch.setitem(sys.modules, "torch", fake)
    (tmp_path / "swin.pth").write_bytes(b"")
    state = read_weights(tmp_path / "swin.pth")
    assert calls == [("cpu", True)]
    assert state["norm.weight"].dtype == np.float32 and state.keys() == official.keys()
