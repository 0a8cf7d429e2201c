"""`python run.py` as a user runs it: a subprocess, a real MLflow sqlite store, real checkpoints."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from mlflow.tracking import MlflowClient
from omegaconf import OmegaConf

from swinexp.build import resolve
from swinexp.data import AUGMENTS, DATASETS, build_loaders
from swinexp.engine import checkpoint
from swinexp.engine.evaluate import evaluate
from swinexp.registry import MODELS
from tests.conftest import ROOT, SMOKE

pytestmark = pytest.mark.slow


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "run.py"), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=600)


def test_help_lists_the_config_groups(tmp_path: Path) -> None:
    out = _run("--help", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    groups = dict(line.split(": ", 1) for line in out.stdout.splitlines() if ": " in line and "=" not in line)
    for group, options in {"model": "swin_micro swin_tiny", "data": "imagefolder synthetic",
                           "data/augment": "light none", "amp": "o0 o1_manual", "optimizer": "adamw",
                           "scheduler": "warmup_cosine", "trainer": "default smoke", "hardware": "cpu cpu2 ascend8",
                           "tracking": "mlflow none", "sweep": "amp_ablation"}.items():
        listed = groups.get(group, "").split(", ")
        assert all(option in listed for option in options.split()), (group, listed)


def test_cfg_job_prints_the_composed_config(tmp_path: Path) -> None:
    out = _run("--cfg", "job", "model=swin_tiny", cwd=tmp_path)
    cfg = OmegaConf.create(out.stdout)
    assert cfg.model.name == "swin_tiny" and cfg.model.depths == [2, 2, 6, 2]
    assert "num_classes: ${oc.select:data.num_classes,1000}" in out.stdout  # the model follows the data


def test_config_error_is_one_clear_line_and_nonzero(tmp_path: Path) -> None:
    out = _run("tracking=none", "+model.embed_dims=8", cwd=tmp_path)
    assert out.returncode != 0
    assert "ConfigError: model.embed_dims is not a parameter of model 'swin_micro'" in out.stderr
    assert "Traceback" not in out.stderr


def test_run_logs_to_mlflow_and_writes_loadable_checkpoints(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path}/store/mlflow.db"
    run_dir = tmp_path / "run"
    smoke = [o for o in SMOKE if not o.startswith("tracking=")]
    args = [*smoke, f"data.root={tmp_path / 'data'}", "trainer.limit_val_batches=null", "tracking=mlflow",
            f"tracking.uri={uri}", "tracking.experiment=cli", f"hydra.run.dir={run_dir}"]
    out = _run(*args, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "epoch 2/2" in out.stderr + out.stdout
    assert "side effect nodes were eliminated" not in out.stderr  # MindSpore's analyzer, at the eval step compile

    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("cli").experiment_id])
    assert run.info.status == "FINISHED"
    assert run.info.run_name.startswith("model=swin_micro data=synthetic")
    params = run.data.params
    assert params["model.name"] == "swin_micro" and params["model.embed_dim"] == "32"
    assert params["data.batch_size"] == "8" and params["trainer.epochs"] == "2" and params["seed"] == "42"
    assert params["model.img_size"] == "32"  # interpolations are logged resolved
    assert run.data.tags["choice.model"] == "swin_micro" and "tracking.experiment=cli" in run.data.tags["overrides"]
    history = client.get_metric_history(run.info.run_id, "val/top1")
    assert [m.step for m in history] == [1, 2]
    for key in ("train/loss", "val/loss", "val/top5", "lr", "epoch_time_s", "train/images_per_s"):
        assert [m.step for m in client.get_metric_history(run.info.run_id, key)] == [1, 2], key
    assert {a.path for a in client.list_artifacts(run.info.run_id)} == {"config.yaml", "overrides.yaml", "classes.txt",
                                                                        "checkpoints"}

    # The last checkpoint, loaded into a fresh model built from the saved config, reproduces the logged val/top1.
    cfg = OmegaConf.load(run_dir / "config.yaml")
    model = MODELS.build(resolve(cfg).section("model"))
    meta = checkpoint.load(run_dir / "checkpoints" / "last.ckpt", model)
    assert meta["epoch"] == 2 and meta["mlflow_run_id"] == run.info.run_id
    data_cfg = {k: v for k, v in resolve(cfg).section("data").items() if k != "augment"}
    spec = DATASETS.build(data_cfg)
    _, val = build_loaders(spec, AUGMENTS.build({"name": "none"}, img_size=spec.img_size), seed=0)
    assert evaluate(model, val.epoch(0))["val/top1"] == pytest.approx(history[-1].value, abs=1e-4)
    assert np.isfinite(run.data.metrics["train/loss"])


@pytest.mark.parametrize(("args", "sweeper"), [
    (["sweep=amp_ablation"], "grid_sweeper.ContinuingBasicSweeper"),
    (["-cd", str(ROOT / "conf"), "amp=o2"], "grid_sweeper.ContinuingBasicSweeper"),
    (["hparams_search=swin_lr_wd"], "optuna_sweeper.OptunaSweeper"),  # the search's own sweeper, not the grid's
    (["hydra/sweeper=basic"], "basic_sweeper.BasicSweeper"),
])
def test_the_command_chooses_the_continuing_grid_sweeper_unless_a_search_or_sweeper_is_named(
        args: list[str], sweeper: str, tmp_path: Path) -> None:
    out = _run(*args, "--cfg", "hydra", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert OmegaConf.create(out.stdout).hydra.sweeper._target_.endswith(sweeper)
