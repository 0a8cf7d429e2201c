"""`python -m swinexp.parity`: its message without torch (CI) and, where torch + timm are installed, a real run."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

import swinexp.parity
from swinexp.parity.__main__ import main
from tests.conftest import SMOKE


def test_without_torch_the_tool_says_how_to_install_the_reference(monkeypatch: pytest.MonkeyPatch,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch raises ImportError, installed or not
    monkeypatch.delitem(sys.modules, "swinexp.parity.compare", raising=False)
    monkeypatch.delitem(sys.modules, "swinexp.parity.reference", raising=False)
    for name in ("compare", "reference"):  # `from swinexp.parity import compare` would reuse the attribute
        monkeypatch.delattr(swinexp.parity, name, raising=False)
    with pytest.raises(SystemExit) as exited:
        main(["tracking=none"])
    assert exited.value.code == 2
    assert "pip install -e '.[reference]'" in capsys.readouterr().err


@pytest.mark.slow
def test_parity_on_micro_agrees_and_logs_an_mlflow_run(synthetic_root: Path, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("timm", reason="the reference extra (torch + timm) is not installed")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    overrides = [*SMOKE, f"data.root={synthetic_root}", "tracking=mlflow", f"tracking.uri={uri}",
                 "trainer.clip_grad=1.0", "trainer.accumulation_steps=2", "hardware.mode=pynative",
                 "trainer.ema.decay=0.9"]
    assert main([*overrides, "--steps", "2", "--locate", "--out", str(tmp_path / "out")]) == 0
    printed = capsys.readouterr().out
    assert "every stage within 0.0001" in printed and "max relative parameter difference" in printed
    assert "EMA weights (timm ModelEmaV3 on the reference): max relative difference" in printed
    assert "weights and EMA weights within 0.0001" in printed
    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("swinexp").experiment_id])
    assert run.info.status == "FINISHED" and run.data.tags["parity"] == "true"
    assert run.data.metrics["parity/max_param_rel_diff"] < 1e-3
    assert run.data.metrics["parity/max_ema_rel_diff"] < 1e-3  # measured 5.5e-5, as the weights (qkv biases)
    assert run.data.metrics["parity/loss_rel_diff"] < 1e-5
    assert [a.path for a in client.list_artifacts(run.info.run_id)] == ["parity.txt"]
    assert "ref loss" in (tmp_path / "out" / "parity.txt").read_text()


def test_the_reference_ema_follows_swinexps_rule_on_every_step_skipped_or_not() -> None:
    """ModelEmaV3 as the reference drives it: ema = d * ema + (1 - d) * weights from the initial weights, after
    every optimizer step (no warmup, no first-step copy), a GradScaler-skipped one too, as main.py."""
    torch = pytest.importorskip("torch", reason="the reference extra (torch + timm) is not installed")
    pytest.importorskip("timm", reason="the reference extra (torch + timm) is not installed")
    import numpy as np

    from swinexp.parity import reference

    arch = dict(img_size=32, patch_size=4, in_chans=3, num_classes=4, embed_dim=8, depths=(1,), num_heads=(2,),
                window_size=4, mlp_ratio=2.0, qkv_bias=True)
    torch.manual_seed(0)
    model = reference.timm_swin(arch)
    recipe = reference.Recipe(base_lr=1e-2, warmup_lr=1e-2, min_lr=1e-2, weight_decay=0.05, betas=(0.9, 0.999),
                              eps=1e-8, total_steps=3, warmup_steps=0, ema_decay=0.6, amp_dtype="float16",
                              init_scale=2.0**100, scale_factor=2.0**100)  # step 1 overflows fp16, then scale 1
    trainer = reference.ReferenceTrainer(model, recipe)
    rng = np.random.default_rng(0)
    expected = reference.numpy_state(model)
    skipped = []
    for _ in range(3):
        images = rng.normal(size=(2, 3, 32, 32)).astype(np.float32)
        targets = np.eye(4, dtype=np.float32)[rng.integers(0, 4, 2)]
        skipped.append(trainer.step([(images, targets)]).skipped)
        weights = reference.numpy_state(model)
        expected = {k: 0.6 * expected[k] + 0.4 * weights[k] for k in expected}
    assert skipped[0] and not skipped[-1]
    ema = trainer.ema_state()
    assert ema.keys() == expected.keys()
    assert max(float(np.abs(ema[k] - v).max()) for k, v in expected.items()) < 1e-6
    assert max(float(np.abs(ema[k] - weights[k]).max()) for k in ema) > 1e-3  # not a copy of the weights


def test_a_failed_check_exits_non_zero(synthetic_root: Path, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("timm", reason="the reference extra (torch + timm) is not installed")
    overrides = [*SMOKE, f"data.root={synthetic_root}", "hardware.mode=pynative"]
    # float noise alone is beyond a 1e-12 tolerance: the tool must say FAILED and exit 1, for a script to see it
    assert main([*overrides, "--steps", "1", "--tol", "1e-12", "--out", str(tmp_path / "out")]) == 1
    assert "FAILED: parameters beyond 1e-12" in capsys.readouterr().out


def _window_2_checkpoint(path: Path) -> Path:
    """A trained-looking swin_micro file at window 2 (32 px, 10 classes): the SMOKE model has window 4."""
    import numpy as np

    from swinexp.models.pretrained import model_state, write_ckpt
    from swinexp.registry import MODELS

    small = MODELS.build({"name": "swin_micro", "img_size": 32, "window_size": 2, "num_classes": 10,
                          "drop_path_rate": 0.0})
    rng = np.random.default_rng(0)
    state = {k: v + rng.normal(0, 0.05, v.shape).astype(v.dtype) for k, v in model_state(small).items()}
    return write_ckpt(state, path)  # tables of 9 rows: a window-4 model needs 49, so every one is resized


@pytest.mark.slow
@pytest.mark.parametrize("resize", ["official", "timm"])
def test_parity_checks_a_pretrained_load_of_another_window_size_against_the_reference_loader(
        resize: str, synthetic_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("timm", reason="the reference extra (torch + timm) is not installed")
    file = _window_2_checkpoint(tmp_path / "w2.ckpt")
    overrides = [*SMOKE, f"data.root={synthetic_root}", "hardware.mode=pynative", f"model.pretrained={file}",
                 f"model.pretrained_resize={resize}"]
    assert main([*overrides, "--steps", "1", "--out", str(tmp_path / "out")]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("model.pretrained="))
    loader = {"official": "the official load_pretrained resize", "timm": "timm's checkpoint_filter_fn"}[resize]
    assert f"w2.ckpt (head loaded, 4 tensors resized) vs the reference loader ({loader})" in line
    assert float(line.rsplit(" ", 1)[1]) < 1e-5


@pytest.mark.slow
def test_a_pretrained_load_unlike_the_reference_loaders_fails_the_check(
        synthetic_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("timm", reason="the reference extra (torch + timm) is not installed")
    from swinexp.parity import reference

    load = reference.reference_load
    monkeypatch.setattr(reference, "reference_load", lambda model, state, resize: load(model, state, "timm"))
    file = _window_2_checkpoint(tmp_path / "w2.ckpt")  # swinexp resizes the official way; the "reference" not
    overrides = [*SMOKE, f"data.root={synthetic_root}", "hardware.mode=pynative", f"model.pretrained={file}"]
    assert main([*overrides, "--steps", "1", "--out", str(tmp_path / "out")]) == 1
    assert "FAILED: pretrained logits beyond 0.0001" in capsys.readouterr().out
