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
                 "trainer.clip_grad=1.0", "trainer.accumulation_steps=2", "hardware.mode=pynative"]
    assert main([*overrides, "--steps", "1", "--locate", "--out", str(tmp_path / "out")]) == 0
    printed = capsys.readouterr().out
    assert "every stage within 0.0001" in printed and "max relative parameter difference" in printed
    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("swinexp").experiment_id])
    assert run.info.status == "FINISHED" and run.data.tags["parity"] == "true"
    assert run.data.metrics["parity/max_param_rel_diff"] < 1e-3
    assert run.data.metrics["parity/loss_rel_diff"] < 1e-5
    assert [a.path for a in client.list_artifacts(run.info.run_id)] == ["parity.txt"]
    assert "ref loss" in (tmp_path / "out" / "parity.txt").read_text()
