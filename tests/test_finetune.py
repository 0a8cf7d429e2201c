"""Fine-tuning as Swin users do it (issue 56): position tables resized like the official loader and like timm, a
22k head mapped to 1k, layer-wise LR decay equal to timm's, freezing, and the presets, from the real config.

The references are the real ones where they are importable: torch's F.interpolate, timm's checkpoint_filter_fn and
param_groups_layer_decay, and the official utils.py `load_pretrained` resize (re-implemented below with torch, line
for line). Tolerances: resized tensors 1e-12 against torch in float64 (the same formula). In float32 swinexp is the
exact value rounded once, and torch's vectorised float32 bicubic is itself up to ~1e-6 relative from it (measured:
3.3e-6 at |v| = 3.4): ours must be within torch's own error of torch (timm's filter, float32 inside: 1e-6 times the
largest magnitude). Logits 1e-4 relative L2.
"""
from __future__ import annotations

import fnmatch
import io
import os
import re
import tarfile
from pathlib import Path
from typing import Any, Callable

import mindspore as ms
import numpy as np
import pytest
import tomllib
from hydra import compose as compose_cfg
from hydra import initialize_config_dir
from mindspore import Tensor
from mlflow.tracking import MlflowClient
from omegaconf import DictConfig, OmegaConf
from PIL import Image

from swinexp.amp import AmpPolicy
from swinexp.build import build_eval_transform, build_model, resolve
from swinexp.config import read
from swinexp.data.transforms import EvalTransform
from swinexp.engine.step import make_train_step
from swinexp.models import create_model
from swinexp.models.convert import to_mindspore
from swinexp.models.pretrained import (
    MAP_22K_TO_1K,
    load_weights,
    map22kto1k,
    model_state,
    write_ckpt,
    write_safetensors,
)
from swinexp.models.resize import bicubic_resize, resize_positions
from swinexp.optim import param_groups
from swinexp.registry import OPTIMIZERS, ConfigError
from tests.conftest import CONF_DIR, ROOT, SMOKE

# SWINEXP_CIFAR10_TARS (.ci/run sets it), else ../shared beside the checkout
CIFAR_TAR = Path(os.environ.get("SWINEXP_CIFAR10_TARS") or ROOT.parent / "shared" / "datasets" / "cifar10")
# a narrow Swin with the official 4 stages: 224 px / window 7 (maps 56-28-14-7) and 384 px / window 12 (96-48-24-12)
NARROW = dict(embed_dim=16, depths=(1, 1, 2, 1), num_heads=(1, 2, 4, 8), num_classes=10)


def rel(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def close(ours: np.ndarray, ref: np.ndarray, tol: float = 1e-6) -> bool:
    """Equal within float32 rounding: |ours - ref| <= tol x max(1, |ref|)."""
    return float(np.abs(ours - ref).max()) <= tol * max(1.0, float(np.abs(ref).max()))


def _torch() -> Any:
    return pytest.importorskip("torch")


def official_resize(state: dict[str, Any], model_state: dict[str, Any]) -> dict[str, Any]:
    """microsoft/Swin-Transformer utils.py load_pretrained's resize, on torch tensors: the copy the parity tool uses."""
    from swinexp.parity.reference import official_resize as reference_resize

    return reference_resize(state, model_state)


def _timm_swin(img_size: int, window_size: int, seed: int = 0) -> Any:
    """timm's SwinTransformer at NARROW widths; its bias tables drawn with std 1 so that they move the logits."""
    torch = _torch()
    swin = pytest.importorskip("timm.models.swin_transformer")
    torch.manual_seed(seed)
    model = swin.SwinTransformer(img_size=img_size, window_size=window_size, **NARROW).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("relative_position_bias_table"):
                p.copy_(torch.randn_like(p))
    return model


def _numpy(state: dict[str, Any]) -> dict[str, np.ndarray]:
    return {k: v.detach().numpy() for k, v in state.items()}


def _cifar_images(count: int, size: int) -> np.ndarray:
    """The first `count` CIFAR-10 test JPEGs, resized to `size` by the eval transform: (count, 3, size, size)."""
    if not (CIFAR_TAR / "test.tar").is_file():
        pytest.skip(f"CIFAR-10 tars not found under {CIFAR_TAR}: set SWINEXP_CIFAR10_TARS to the folder holding "
                    "train.tar and test.tar")
    images = []
    with tarfile.open(CIFAR_TAR / "test.tar") as tar:
        for member in tar:
            if member.isfile() and member.name.endswith(".jpg"):
                images.append(Image.open(io.BytesIO(tar.extractfile(member).read())).convert("RGB"))
            if len(images) == count:
                break
    return np.stack([EvalTransform(size, crop_pct=1.0)(img) for img in images])


# --- the numbers: bicubic, the official loader's resize, timm's filter -----------------------------------------


@pytest.mark.parametrize("align_corners", [False, True])
@pytest.mark.parametrize("src,dst", [(13, 23), (7, 15), (23, 13), (3, 5), (13, 13)])
def test_bicubic_equals_torch_interpolate(src: int, dst: int, align_corners: bool) -> None:
    torch = _torch()
    grid = np.random.default_rng(src * dst).standard_normal((3, src, src))

    def interpolate(x: np.ndarray) -> np.ndarray:
        return torch.nn.functional.interpolate(torch.from_numpy(x)[None], size=(dst, dst), mode="bicubic",
                                               align_corners=align_corners)[0].numpy()

    exact, ours = interpolate(grid), bicubic_resize(grid, (dst, dst), align_corners)
    assert ours.dtype == np.float64 and np.abs(ours - exact).max() <= 1e-12  # the same function
    single = grid.astype(np.float32)
    torch32, ours32 = interpolate(single), bicubic_resize(single, (dst, dst), align_corners)
    exact32 = interpolate(single.astype(np.float64))
    # float32: ours is the exact value rounded once; torch's is within its own kernel's rounding of it
    ulp = np.spacing(np.float32(np.abs(exact32).max()))
    assert ours32.dtype == np.float32 and np.abs(ours32 - exact32).max() <= ulp
    assert np.abs(ours32 - torch32).max() <= np.abs(torch32 - exact32).max() + ulp


def test_official_resize_equals_the_official_loader_on_a_checkpoint() -> None:
    torch = _torch()
    small, large = _timm_swin(224, 7), _timm_swin(384, 12, seed=1)
    state = _numpy(small.state_dict())
    state["absolute_pos_embed"] = np.random.default_rng(0).standard_normal((1, 56 * 56, 16)).astype(np.float32)
    state = {k: v.astype(np.float64) for k, v in state.items()}  # torch float32 rounds: see the bicubic test
    target = {**{k: tuple(v.shape) for k, v in large.state_dict().items()}, "absolute_pos_embed": (1, 96 * 96, 16)}
    ours, resized = resize_positions(state, target, "official")
    ref = official_resize({k: torch.from_numpy(v) for k, v in state.items()},
                          {k: torch.zeros(s) for k, s in target.items()})
    tables = [k for k in state if k.endswith("relative_position_bias_table")]
    assert len(resized) == len(tables) + 1 and all(line.endswith("official") for line in resized)
    for k in [*tables, "absolute_pos_embed"]:
        assert ours[k].shape == target[k] and np.abs(ours[k] - ref[k].numpy()).max() <= 1e-12, k
    assert np.abs(ours[tables[0]] - resize_positions(state, target, "timm")[0][tables[0]]).max() > 1e-2


def test_timm_resize_equals_timm_checkpoint_filter_fn_on_a_checkpoint() -> None:
    torch = _torch()
    from timm.models.swin_transformer import checkpoint_filter_fn

    small, large = _timm_swin(224, 7), _timm_swin(384, 12, seed=1)
    state = _numpy(small.state_dict())
    ref = _numpy(checkpoint_filter_fn({k: torch.from_numpy(v) for k, v in state.items()}, large))
    ours, resized = resize_positions(state, {k: tuple(v.shape) for k, v in large.state_dict().items()}, "timm")
    tables = [k for k in state if k.endswith("relative_position_bias_table")]
    assert len(resized) == len(tables) == 5
    for k in tables:
        assert ours[k].shape == ref[k].shape == (23 * 23, state[k].shape[1])
        assert close(ours[k], ref[k]), k
    assert all(np.array_equal(ours[k], ref[k]) for k in state if k not in tables)


@pytest.mark.parametrize("source,resize,formulation", [
    ("safetensors", "timm", {}),
    ("pth", "official", {"qkv": "split", "patch_merging": "reshape", "rel_pos_bias": "onehot"}),
    ("ckpt", "official", {"qkv": "fused_split", "rel_pos_bias": "gather", "permute": "gather",
                          "patch_embed": "matmul"}),
])
def test_384_window_12_model_from_224_window_7_weights_gives_the_reference_logits(
        tmp_path: Path, source: str, resize: str, formulation: dict[str, str]) -> None:
    """swinexp's 384/window-12 model loaded from a 224/window-7 file (each format), against timm's 384 model loaded
    by timm's filter (resize=timm) or the official loader's resize (official), on real images."""
    torch = _torch()
    from timm.models.swin_transformer import checkpoint_filter_fn

    small, large = _timm_swin(224, 7), _timm_swin(384, 12, seed=1)
    state = small.state_dict()
    if resize == "timm":
        large.load_state_dict(checkpoint_filter_fn(state, large))
    else:
        large.load_state_dict(official_resize(state, large.state_dict()))
    path = tmp_path / f"w224.{source}"
    if source == "safetensors":
        write_safetensors(_numpy(state), path)
    elif source == "pth":  # the official layout: merging closes a stage, head.*, with the index buffers it saves
        official = {re.sub(r"layers\.(\d+)\.downsample", lambda m: f"layers.{int(m.group(1)) - 1}.downsample",
                           k).replace("head.fc.", "head."): v for k, v in state.items()}
        official.update({k.replace("bias_table", "index"): torch.zeros(49, 49, dtype=torch.long)
                         for k in official if k.endswith("relative_position_bias_table")})
        torch.save({"model": official, "epoch": 299}, path)
    else:
        at_224 = create_model("swin_micro", img_size=224, window_size=7, drop_path_rate=0.0, **NARROW)
        load_weights(at_224, _numpy(state), "timm")
        write_ckpt(model_state(at_224), path)
    ms.set_context(mode=ms.PYNATIVE_MODE)
    model = create_model("swin_micro", img_size=384, window_size=12, drop_path_rate=0.0, pretrained=str(path),
                         pretrained_resize=resize, **NARROW, **formulation)
    model.set_train(False)
    assert model.pretrained_report.head == "loaded" and len(model.pretrained_report.resized) == 5
    images = _cifar_images(4, 384)
    with torch.no_grad():
        expected = large(torch.from_numpy(images)).numpy()
    assert rel(model(Tensor(images)).asnumpy(), expected) <= 1e-4


# --- 22k -> 1k, head_init, strictness ----------------------------------------------------------------------------


def test_map22kto1k_is_the_official_file() -> None:
    rows = map22kto1k()
    assert rows.shape == (1000,) and len(set(rows.tolist())) == 1000 and rows.max() < 21841
    assert rows[:3].tolist() == [359, 368, 460] and rows[-2:].tolist() == [21369, 21817]  # its first and last lines
    assert "microsoft/Swin-Transformer" in MAP_22K_TO_1K.read_text().splitlines()[0]


def test_a_22k_head_loads_into_a_1k_model_through_the_official_map(tmp_path: Path) -> None:
    at_22k = create_model("swin_micro", num_classes=21841, img_size=32, depths=[1, 1])
    state = model_state(at_22k)
    state["head.weight"] = np.repeat(np.arange(21841, dtype=np.float32)[:, None], 64, axis=1)  # row i holds i
    state["head.bias"] = np.arange(21841, dtype=np.float32)
    path = write_ckpt(state, tmp_path / "in22k.ckpt")
    model = create_model("swin_micro", num_classes=1000, img_size=32, depths=[1, 1], pretrained=str(path))
    head = model_state(model)
    assert model.pretrained_report.head == "map22kto1k" and not model.pretrained_report.missing
    np.testing.assert_array_equal(head["head.bias"], map22kto1k())
    np.testing.assert_array_equal(head["head.weight"], np.repeat(map22kto1k()[:, None], 64, axis=1))
    assert np.array_equal(head["norm.gamma"], state["norm.gamma"])  # and the backbone as it was
    for head_init in ("reset", "zeros"):
        other = create_model("swin_micro", num_classes=1000, img_size=32, depths=[1, 1], pretrained=str(path),
                             head_init=head_init)
        weight = model_state(other)["head.weight"]
        assert other.pretrained_report.head == head_init and other.pretrained_report.missing
        assert not weight.any() if head_init == "zeros" else 0 < np.abs(weight).max() < 1
    tenfold = create_model("swin_micro", num_classes=10, img_size=32, depths=[1, 1], pretrained=str(path))
    assert tenfold.pretrained_report.head == "dropped"


def test_loading_stays_strict_for_everything_but_positions_and_head(tmp_path: Path) -> None:
    path = write_ckpt(model_state(create_model("swin_micro", img_size=32, window_size=4)), tmp_path / "w.ckpt")
    with pytest.raises(ConfigError, match=r"set model.pretrained_resize=official or timm"):
        create_model("swin_micro", img_size=64, window_size=8, pretrained=str(path), pretrained_resize="none")
    with pytest.raises(ConfigError, match=r"does not fit this model: .*shape mismatches.*num_heads"):
        create_model("swin_micro", img_size=64, window_size=8, num_heads=[1, 4], pretrained=str(path))
    with pytest.raises(ConfigError, match=r"model.pretrained_resize='bicubic' is not one of: official, timm, none"):
        create_model("swin_micro", pretrained_resize="bicubic")
    with pytest.raises(ConfigError, match=r"model.head_init='random' is not one of: auto, reset, zeros"):
        create_model("swin_micro", head_init="random")


# --- layer decay, freezing -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("layer_decay,head_lr_scale", [(0.9, 1.0), (0.75, 10.0)])
def test_layer_decay_groups_equal_timm_param_groups_layer_decay_for_swin_tiny(layer_decay: float,
                                                                             head_lr_scale: float) -> None:
    _torch()
    import timm
    from timm.optim import param_groups_layer_decay

    reference = timm.create_model("swin_tiny_patch4_window7_224", pretrained=False)
    ref_scale, ref_decay = {}, {}
    for group in param_groups_layer_decay(reference, 0.05, reference.no_weight_decay(), layer_decay=layer_decay):
        names = [n for n, p in reference.named_parameters() if any(p is q for q in group["params"])]
        ref_scale.update(dict.fromkeys(names, group["lr_scale"]))
        ref_decay.update(dict.fromkeys(names, group["weight_decay"]))
    model = create_model("swin_tiny", qkv="fused")
    timm_names = list(ref_scale)  # converted as weights are: each entry carries its timm index
    index = {k: int(v[0]) for k, v in to_mindspore({n: np.array([i]) for i, n in enumerate(timm_names)},
                                                   [p.name for p in model.get_parameters()]).items()}
    ours = {p.name: (g["lr_scale"], g["weight_decay"]) for g in param_groups(model, 0.05, layer_decay, head_lr_scale)
            for p in g["params"]}
    assert ours.keys() == index.keys()
    for name, (scale, decay) in ours.items():
        timm_name = timm_names[index[name]]
        expected = ref_scale[timm_name] * (head_lr_scale if name.startswith("head.") else 1.0)
        assert scale == pytest.approx(expected, rel=1e-12) and decay == ref_decay[timm_name], name
    assert len({s for s, _ in ours.values()}) == 14  # 12 blocks, the stem and the head: not flat


@pytest.mark.parametrize("kernel,clip,accumulation", [("mindspore", None, 1), ("fused_cpu", 0.01, 2)])
def test_the_per_group_lr_reaches_the_update(kernel: str, clip: float | None, accumulation: int) -> None:
    """AdamW's first step moves each element by its LR (m / sqrt(v) = sign(g)), whatever clip or accumulation do
    to the gradient: the movement per parameter is its effective LR (a flat LR would move all alike)."""
    ms.set_context(mode=ms.GRAPH_MODE)
    model = create_model("swin_micro", num_classes=4, img_size=32, depths=[1, 1], drop_path_rate=0.0)
    lr = 1e-3
    optimizer = OPTIMIZERS.build({"name": "adamw", "lr": lr, "weight_decay": 0.0, "layer_decay": 0.5, "eps": 1e-12,
                                  "head_lr_scale": 2.0, "kernel": kernel}, model=model)  # eps: clipped grads are tiny
    before = [p.asnumpy().copy() for p in optimizer.parameters]
    step = make_train_step(model, optimizer, AmpPolicy("O0"), clip, jit=True, accumulation_steps=accumulation)
    rng = np.random.default_rng(0)
    for _ in range(accumulation):
        step(Tensor(rng.standard_normal((2, 3, 32, 32)).astype(np.float32)), Tensor(np.eye(4, dtype=np.float32)[:2]))
    moved = np.array([np.median(np.abs(p.asnumpy() - b)) for p, b in zip(optimizer.parameters, before)])
    np.testing.assert_allclose(moved, lr * optimizer.lr_scales, rtol=0.02)
    assert sorted(set(optimizer.lr_scales.tolist())) == [0.125, 0.25, 0.5, 2.0]  # stem, block 0, block 1, head


def test_freeze_keeps_the_prefixes_out_of_training() -> None:
    ms.set_context(mode=ms.GRAPH_MODE)
    model = create_model("swin_micro", num_classes=4, img_size=32, depths=[1, 1], freeze=["patch_embed", "layers.0"])
    frozen = set(model.frozen)
    assert frozen and all(n.startswith(("patch_embed.", "layers.0.")) for n in frozen)
    assert "layers.0.downsample.reduction.weight" in frozen  # the merging that ends stage 0 belongs to it
    optimizer = OPTIMIZERS.build({"name": "adamw", "lr": 1e-3, "layer_decay": 0.9}, model=model)
    assert {p.name for p in optimizer.parameters} == {p.name for p in model.get_parameters()} - frozen
    before = {k: v.copy() for k, v in model_state(model).items()}  # asnumpy() may share the parameter's memory
    step = make_train_step(model, optimizer, AmpPolicy("O0"), None, jit=True)
    images = np.random.default_rng(0).standard_normal((2, 3, 32, 32)).astype(np.float32)
    step(Tensor(images), Tensor(np.eye(4, dtype=np.float32)[:2]))
    after = model_state(model)
    assert all(np.array_equal(after[n], before[n]) for n in frozen)
    assert all(not np.array_equal(after[n], before[n]) for n in after.keys() - frozen)
    with pytest.raises(ConfigError, match=r"'layer.0' names no parameter .* layers.0, layers.1"):
        create_model("swin_micro", freeze=["layer.0"])


# --- presets, sweep, packaging ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("preset,model,img,window,crop,mode,drop", [
    ("swin_base_384_ft", "swin_base_384", 384, 12, 1.0, "squash", 0.5),  # TEST.CROP False
    ("swin_22kto1k_ft", "swin_base", 224, 7, 0.875, "center", 0.2)])
def test_presets_hold_the_official_finetune_recipe_and_dry_run_on_ascend8(
        compose: Callable[..., DictConfig], tmp_path: Path, preset: str, model: str, img: int, window: int,
        crop: float, mode: str, drop: float) -> None:
    from swinexp.app.dry_run import dry_run

    root = tmp_path / "in1k"
    for split in ("train", "val"):
        for c in ("n01", "n02"):
            (root / split / c).mkdir(parents=True)
            Image.new("RGB", (40, 40)).save(root / split / c / "0.JPEG")
    plan = read(compose(f"experiment={preset}", "hardware=ascend8", f"data.root={root}", "data.num_classes=2",
                        "model.pretrained=w224.pth", smoke=False))
    assert (plan.get("model.name"), plan.get("model.img_size"), plan.get("model.window_size"),
            plan.get("data.crop_pct"), plan.get("data.crop_mode"), plan.get("model.drop_path_rate")) == (
        model, img, window, crop, mode, drop)
    assert build_eval_transform(plan).crop_mode == mode  # what evaluate and predict read back from a saved run
    assert (plan.get("optimizer.lr"), plan.get("optimizer.weight_decay"), plan.trainer.epochs,
            plan.trainer.clip_grad, plan.trainer.lr_batch_size) == (2e-5, 1e-8, 30, 5.0, 512)
    assert plan.get("scheduler") == {"name": "warmup_cosine", "warmup_epochs": 5, "warmup_lr": 2e-8, "min_lr": 2e-7}
    text = dry_run(resolve(plan, backend=False), [], tmp_path / "run")
    assert "64 per device x 8 devices x 2 accumulation = 1024" in text
    assert f"model: {model}, {img} px, 2 classes, drop_path_rate {drop}" in text
    assert "adamw_swin, lr 2e-05 quoted at total batch 512, weight_decay 1e-08" in text


def test_finetune_preset_trains_micro_from_a_smaller_checkpoint_and_logs_it(tmp_path: Path,
                                                                             synthetic_root: Path) -> None:
    """experiment=swin_base_384_ft shrunk to the micro model: weights of a 32 px / window-4 run loaded at
    64 px / window 8, layer decay and a frozen stem, 2 optimizer steps on CPU, the start logged to MLflow."""
    from swinexp.app.job import run
    from swinexp.app.job_info import JobInfo

    at_32 = create_model("swin_micro", num_classes=10, img_size=32, window_size=4)
    ckpt = write_ckpt(model_state(at_32), tmp_path / "micro32.ckpt")
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    overrides = ["experiment=swin_base_384_ft", *[o for o in SMOKE if not o.startswith(("data.img_size", "data/aug"))],
                 f"data.root={synthetic_root}", "data.img_size=64", "model.window_size=8", f"model.pretrained={ckpt}",
                 "optimizer.layer_decay=0.9", "model.freeze=[patch_embed]", "trainer.epochs=1",
                 "trainer.limit_train_batches=4", "trainer.limit_val_batches=1", "data.batch_size=4",
                 "tracking=mlflow", f"tracking.uri={uri}", "tracking.experiment=ft"]
    with initialize_config_dir(version_base="1.3", config_dir=str(CONF_DIR)):
        cfg = compose_cfg("config", overrides=overrides)
    assert cfg.trainer.accumulation_steps == 2 and cfg.data.augment.name == "swin"  # the preset's, kept
    metrics = run(cfg, JobInfo(run_dir=tmp_path / "run", overrides=overrides))
    assert np.isfinite(metrics["train/loss"])
    client = MlflowClient(uri)
    (logged,) = client.search_runs([client.get_experiment_by_name("ft").experiment_id])
    params = logged.data.params
    assert params["pretrained.head"] == "loaded" and params["model.frozen_tensors"] == "4"
    assert params["pretrained.resized"].count("(49, ") == 4 and "-> (225, " in params["pretrained.resized"]
    lrs = {k: float(v) for k, v in params.items() if k.startswith("lr_group.")}
    # micro: blocks 1-4, the head 5 (the stem, layer 0, is frozen); decay and no_decay groups share their layer's LR
    assert {k.split(".")[1] for k in lrs} == {f"layer_{i}" for i in range(1, 6)}
    for i in range(1, 6):
        assert lrs[f"lr_group.layer_{i}.decay"] == pytest.approx(lrs["lr_group.layer_5.decay"] * 0.9 ** (5 - i))
    assert [m.step for m in client.get_metric_history(logged.info.run_id, "train/loss")], "it trained"


def test_finetune_ablation_sweeps_layer_decay_with_a_screen(compose: Callable[..., DictConfig]) -> None:
    full = read(compose("sweep=finetune_ablation", "experiment=swin_base_384_ft", "data.root=/data/imagenet",
                        smoke=False))
    assert full.trainer.epochs == 30 and full.trainer.stop_after_epoch == 10
    sweep = OmegaConf.load(ROOT / "sweeps" / "finetune_ablation.yaml")
    assert sweep.hydra.sweeper.params == {"seed": "range(0,${seeds})", "optimizer.layer_decay": "1.0,0.9,0.75"}
    assert "trainer.stop_after_epoch=null hydra.mode=RUN hydra.run.dir=<sweep dir>/<job num>" in \
        (ROOT / "sweeps" / "finetune_ablation.yaml").read_text()


def test_the_22k_map_is_package_data() -> None:
    package_data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert MAP_22K_TO_1K.parent == ROOT / "swinexp" / "models"
    assert any(fnmatch.fnmatch(MAP_22K_TO_1K.name, pattern) for pattern in package_data["swinexp.models"])


def test_build_model_reads_the_finetune_keys(compose: Callable[..., DictConfig], tmp_path: Path) -> None:
    ckpt = write_ckpt(model_state(create_model("swin_micro", num_classes=10, img_size=32)), tmp_path / "w.ckpt")
    model = build_model(resolve(compose(f"model.pretrained={ckpt}", "data.img_size=64", "model.window_size=8",
                                        "model.pretrained_resize=timm", "model.freeze=[layers.0]")))
    assert len(model.pretrained_report.resized) == 4 and model.frozen
    assert all(line.endswith(" timm") for line in model.pretrained_report.resized)


def test_a_plugin_model_built_from_swin_config_keys_loads_and_freezes_after_its_build(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A user's `def my_swin(**overrides): return SwinTransformer(**overrides)` gets the weight keys of
    conf/model/base_swin.yaml applied after its build (its SwinTransformer takes no such keyword)."""
    from swinexp.models.factory import build_model as build_section
    from swinexp.models.factory import model_defaults
    from swinexp.models.swin import SwinTransformer
    from swinexp.registry import MODELS

    monkeypatch.setitem(MODELS._items, "plugin_swin", lambda **overrides: SwinTransformer(**overrides))
    source = create_model("swin_micro", num_classes=10)
    path = write_ckpt(model_state(source), tmp_path / "micro.ckpt")
    section = {**model_defaults("swin_micro"), "name": "plugin_swin", "num_classes": 10, "pretrained": str(path),
               "freeze": ["patch_embed"]}
    model = build_section(section)
    assert model.pretrained_report.head == "loaded"
    assert all(np.array_equal(model_state(model)[k], v) for k, v in model_state(source).items())
    assert model.frozen and all(name.startswith("patch_embed.") for name in model.frozen)
    assert not any(p.name.startswith("patch_embed.") for p in model.trainable_params())
