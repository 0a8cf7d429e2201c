"""export / predict / evaluate from a trained run's directory: built from its own config.yaml, real JPEGs."""
from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import mindspore as ms
import numpy as np
import pytest
from mindspore import nn
from mlflow.tracking import MlflowClient
from omegaconf import OmegaConf

from swinexp.serve import evaluate, export, predict
from swinexp.serve.saved_run import load_model, open_run
from tests.conftest import ROOT, TrainedRun

EAGER = ["hardware.mode=pynative"]  # no graph compile for a few batches


def _val_dir(trained_run: TrainedRun) -> Path:
    return Path(OmegaConf.load(trained_run.run_dir / "config.yaml").data.root) / "val"


def test_exported_mindir_reloads_with_graphcell_and_gives_the_models_logits(
        trained_run: TrainedRun, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert export.main([str(trained_run.run_dir), "--format", "mindir", "--out", str(tmp_path / "swin"),
                        "--batch-size", "2"]) == 0
    path = tmp_path / "swin.mindir"
    assert f"-> {path}: swin_micro, input (2, 3, 32, 32) float32" in capsys.readouterr().out
    images = ms.Tensor(np.random.default_rng(0).normal(size=(2, 3, 32, 32)).astype(np.float32))
    served = nn.GraphCell(ms.load(str(path)))(images).asnumpy()
    model = load_model(open_run(trained_run.run_dir))
    assert served.shape == (2, 10)
    np.testing.assert_allclose(served, model(images).asnumpy(), rtol=1e-5, atol=1e-5)


def test_evaluate_reruns_the_validation_pass_the_run_logged(trained_run: TrainedRun,
                                                            capsys: pytest.CaptureFixture) -> None:
    assert evaluate.main([str(trained_run.run_dir), "--checkpoint", "last", *EAGER]) == 0
    metrics = json.loads(capsys.readouterr().out.splitlines()[-1])
    client = MlflowClient(trained_run.uri)
    (run,) = client.search_runs([client.get_experiment_by_name("swinexp").experiment_id])
    logged = {key: client.get_metric_history(run.info.run_id, key)[-1].value for key in metrics}  # epoch 2
    assert metrics["val/top1"] == logged["val/top1"] and metrics["val/loss"] == pytest.approx(logged["val/loss"])


def test_evaluate_takes_overrides_of_the_saved_config(trained_run: TrainedRun, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture) -> None:
    """data.root elsewhere: the synthetic set is drawn there again (the same images), and scores the same."""
    args = [str(trained_run.run_dir), "--checkpoint", "last", *EAGER]
    assert evaluate.main(args) == 0
    here = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert evaluate.main([*args, f"data.root={tmp_path / 'elsewhere'}"]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1]) == pytest.approx(here)
    assert len(list((tmp_path / "elsewhere" / "val").rglob("*.jpg"))) == 40  # read from there
    with pytest.raises(SystemExit) as stop:
        evaluate.main([*args, "trainer.no_such_key=1"])
    assert stop.value.code == 2 and "no_such_key" in capsys.readouterr().err


def test_predict_writes_topk_with_class_names_and_agrees_with_evaluate(trained_run: TrainedRun, tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "preds.csv"
    assert predict.main([str(trained_run.run_dir), str(_val_dir(trained_run)), "--topk", "3", "--out", str(out),
                         "--checkpoint", "last", *EAGER]) == 0
    assert f"40 images -> {out} (top-3" in capsys.readouterr().out
    rows = list(csv.DictReader(out.open()))
    classes = (trained_run.run_dir / "classes.txt").read_text().splitlines()
    assert len(rows) == 40 and list(rows[0]) == ["image", "class_1", "prob_1", "class_2", "prob_2", "class_3",
                                                 "prob_3"]
    for row in rows:
        probs = [float(row[f"prob_{r}"]) for r in (1, 2, 3)]
        assert probs == sorted(probs, reverse=True) and 0 < sum(probs) <= 1 + 1e-6
        assert {row[f"class_{r}"] for r in (1, 2, 3)} <= set(classes)
    top1 = 100 * np.mean([row["class_1"] == Path(row["image"]).parent.name for row in rows])

    assert evaluate.main([str(trained_run.run_dir), "--checkpoint", "last", "trainer.limit_val_batches=null",
                          *EAGER]) == 0
    whole_val = json.loads(capsys.readouterr().out.splitlines()[-1])
    # two paths to the same numbers (PIL batches of 32 here, MindSpore's pipeline in batches of 8 there): at most
    # one image may flip where float sums in other batch shapes break a near tie
    assert abs(top1 - whole_val["val/top1"]) <= 100 / 40


@pytest.mark.slow
def test_the_three_tools_run_as_modules(trained_run: TrainedRun, tmp_path: Path) -> None:
    def tool(*args: str) -> str:
        out = subprocess.run([sys.executable, "-m", *args], cwd=tmp_path, capture_output=True, text=True,
                             timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert out.returncode == 0, out.stderr[-3000:]
        return out.stdout

    ckpt = trained_run.run_dir / "checkpoints" / "best.ckpt"
    # a checkpoint file finds its run dir's config
    assert "val/top1" in tool("swinexp.serve.evaluate", str(ckpt), *EAGER)
    assert (tmp_path / "preds.csv").is_file() is False
    tool("swinexp.serve.predict", str(ckpt), str(_val_dir(trained_run)), "--topk", "5", "--out", "preds.csv", *EAGER)
    assert len((tmp_path / "preds.csv").read_text().splitlines()) == 41
