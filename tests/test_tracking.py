from __future__ import annotations

from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from swinexp.registry import ConfigError
from swinexp.tracking import MlflowTracker, flatten, resolve_uri


def test_flatten_gives_dotted_keys_and_keeps_lists() -> None:
    assert flatten({"model": {"name": "swin", "depths": [2, 2]}, "seed": 1}) == {
        "model.name": "swin", "model.depths": [2, 2], "seed": 1}


def test_uris_are_made_absolute_once(tmp_path: Path) -> None:
    assert resolve_uri(None, tmp_path) == f"sqlite:///{tmp_path}/mlflow.db"
    assert resolve_uri("sqlite:///runs/x.db", tmp_path) == f"sqlite:///{tmp_path}/runs/x.db"
    assert resolve_uri("sqlite:////abs/x.db", tmp_path) == "sqlite:////abs/x.db"
    assert resolve_uri("mlruns", tmp_path) == (tmp_path / "mlruns").as_uri()
    assert resolve_uri("http://127.0.0.1:5000", tmp_path) == "http://127.0.0.1:5000"


def test_tracker_writes_a_run_that_reads_back(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    tracker = MlflowTracker(uri, "exp")
    run_id = tracker.start("model=swin_tiny", {"overrides": "model=swin_tiny"})
    tracker.log_params({f"p{i}": i for i in range(150)})  # more than one MLflow batch
    tracker.log_metrics({"val/top1": 10.0}, step=1)
    tracker.log_metrics({"val/top1": 20.0}, step=2)
    (tmp_path / "config.yaml").write_text("seed: 1\n")
    tracker.log_artifact(tmp_path / "config.yaml")
    tracker.close("FAILED")

    client = MlflowClient(uri)
    run = client.get_run(run_id)
    assert run.info.run_name == "model=swin_tiny" and run.info.status == "FAILED"
    assert len(run.data.params) == 150 and run.data.params["p149"] == "149"
    assert [(m.step, m.value) for m in client.get_metric_history(run_id, "val/top1")] == [(1, 10.0), (2, 20.0)]
    assert [a.path for a in client.list_artifacts(run_id)] == ["config.yaml"]
    assert (tmp_path / "mlruns").is_dir()  # artifacts live beside the store, not in the working directory


def test_unreachable_server_fails_before_training_with_advice() -> None:
    with pytest.raises(ConfigError, match=r"cannot reach the MLflow tracking server.*tracking=none"):
        MlflowTracker("http://127.0.0.1:9", "exp")  # port 9 (discard): nothing listens
