from __future__ import annotations

from pathlib import Path

import pytest
from mlflow.entities import Metric
from mlflow.tracking import MlflowClient
from PIL import Image

from swinexp.report import main


def _child(client: MlflowClient, exp: str, parent: str, job: int, name: str, top1: list[float]) -> None:
    run = client.create_run(exp, run_name=name, tags={"sweep.id": parent, "sweep.job": str(job),
                                                      "mlflow.parentRunId": parent})
    metrics = [Metric("val/top1", v, 0, step) for step, v in enumerate(top1, start=1)]
    metrics += [Metric("epoch_time_s", 2.0 + job, 0, step) for step in range(1, len(top1) + 1)]
    client.log_batch(run.info.run_id, metrics=metrics)
    client.set_terminated(run.info.run_id)


def test_report_reads_epoch_values_groups_seeds_and_plots(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    exp = client.create_experiment("e")
    parent = client.create_run(exp, run_name="sweep amp=o0,o2 seed=1,2", tags={"sweep.role": "parent"}).info.run_id
    _child(client, exp, parent, 0, "amp=o0 seed=1", [10.0, 20.0, 30.0])
    _child(client, exp, parent, 1, "amp=o0 seed=2", [12.0, 24.0, 28.0])
    _child(client, exp, parent, 2, "amp=o2 seed=1", [5.0, 15.0, 25.0])
    _child(client, exp, parent, 3, "amp=o2 seed=2", [7.0, 17.0, 27.0])

    table = main(["--tracking-uri", uri, "--experiment", "e", "--epoch", "2", "--out", str(tmp_path / "out")])
    lines = {line.split(" | ")[0].lstrip("| "): line for line in table.splitlines()[2:]}
    # epoch 2: o0 -> 20, 24 (mean 22, sample std 2.83); best 30, 28; o2 -> 15, 17 (16 ± 1.41)
    assert "| 22.00 ± 2.83 | 29.00 ± 1.41 | 29.00 ± 1.41 | 2.5 |" in lines["amp=o0 (seeds: 2)"]
    assert "| 16.00 ± 1.41 | 26.00 ± 1.41 | 26.00 ± 1.41 | 4.5 |" in lines["amp=o2 (seeds: 2)"]
    assert (tmp_path / "out" / "report.csv").read_text().count("\n") == 3
    with Image.open(tmp_path / "out" / "curves.png") as img:
        assert img.format == "PNG" and img.size[0] > 300
    assert {a.path for a in client.list_artifacts(parent, "report")} == {
        "report/report.md", "report/report.csv", "report/curves.png"}


def test_report_latest_picks_the_newest_sweep(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    exp = client.create_experiment("swinexp")
    old = client.create_run(exp, run_name="sweep old", tags={"sweep.role": "parent"}, start_time=1000).info.run_id
    new = client.create_run(exp, run_name="sweep new", tags={"sweep.role": "parent"}, start_time=2000).info.run_id
    _child(client, exp, old, 0, "lr=1", [1.0])
    _child(client, exp, new, 0, "lr=2", [2.0, 3.0])
    table = main(["--tracking-uri", uri, "--epoch", "2", "--out", str(tmp_path / "out")])
    assert "| lr=2 | 3.00 | 3.00 | 3.00 |" in table and "lr=1" not in table


def test_report_marks_screens_and_warns_about_runs_without_the_epoch(tmp_path: Path, capsys) -> None:
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    exp = client.create_experiment("swinexp")
    parent = client.create_run(exp, run_name="sweep amp=o0,o2", tags={"sweep.role": "parent"}).info.run_id
    _child(client, exp, parent, 0, "amp=o0", [10.0, 20.0, 30.0])
    _child(client, exp, parent, 1, "amp=o2", [11.0])  # a screen stopped after epoch 1
    client.set_tag(client.search_runs([exp], "attributes.run_name = 'amp=o2'")[0].info.run_id,
                   "stopped_after_epoch", "1")
    table = main(["--tracking-uri", uri, "--epoch", "3", "--out", str(tmp_path / "out")])
    out, err = capsys.readouterr()
    assert "| amp=o2 | — | 11.00 | 11.00 | 3.0 | — | screen @1 |" in table
    assert "| amp=o0 | 30.00 | 30.00 | 30.00 | 2.0 | — | FINISHED |" in table
    assert "amp=o2 (screen @1): no val/top1 at epoch 3, its last is at epoch 1" in err and "amp=o0" not in err
    assert "screens (stopped early; continue with trainer.stop_after_epoch=null): amp=o2" in out
    assert "finished (all trainer.epochs): amp=o0" in out


def test_report_without_a_store_names_tracking_uri_and_creates_nothing(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="--tracking-uri"):
        main(["--out", str(tmp_path / "out")])  # the cwd (tmp_path, see conftest) holds no mlflow.db
    assert not (tmp_path / "mlflow.db").exists()
