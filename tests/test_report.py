from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from mlflow.entities import Metric
from mlflow.tracking import MlflowClient
from PIL import Image
from scipy import stats

from swinexp.tracking.report import best_trial, main, sweep_report


def _child(client: MlflowClient, exp: str, parent: str, job: int, name: str, top1: list[float],
           status: str = "FINISHED") -> None:
    run = client.create_run(exp, run_name=name, tags={"sweep.id": parent, "sweep.job": str(job),
                                                      "mlflow.parentRunId": parent})
    metrics = [Metric("val/top1", v, 0, step) for step, v in enumerate(top1, start=1)]
    metrics += [Metric("epoch_time_s", 2.0 + job, 0, step) for step in range(1, len(top1) + 1)]
    client.log_batch(run.info.run_id, metrics=metrics)
    client.set_terminated(run.info.run_id, status)


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
        "report/report.md", "report/report.csv", "report/curves.png", "report/report.html"}


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


def test_sweep_report_lists_failed_jobs_writes_a_self_contained_page_and_shares_the_sweeps_view(
        tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    exp = client.create_experiment("e")
    parent = client.create_run(exp, run_name="sweep amp=o0,o2,o3", tags={
        "sweep.role": "parent", "sweep.failed_jobs": "#2 amp=o3: ConfigError: no fp16 on CPU"}).info.run_id
    _child(client, exp, parent, 0, "amp=o0", [10.0, 20.0, 30.0])
    _child(client, exp, parent, 1, "amp=o2", [11.0, 21.0])  # a shorter screen: epoch None takes the common last

    report = sweep_report(uri, "e", parent, out=tmp_path / "out", ui_port=5001)
    assert "| amp=o0 | 20.00 |" in report.table and "| amp=o2 | 21.00 |" in report.table  # epoch 2
    assert "Failed jobs:\n- #2 amp=o3: ConfigError: no fp16 on CPU" in report.text
    assert f"written to {tmp_path / 'out'}/ (open report.html) and to the parent run's artifacts, report/: " \
           f"http://127.0.0.1:5001/#/experiments/{exp}/runs/{parent}" in report.text
    serve = f"mlflow ui --backend-store-uri {uri} --port 5001"
    assert f"compare in MLflow: {report.url}\n  first serve the store: {serve}" in report.text
    assert report.url == (f"http://127.0.0.1:5001/#/experiments/{exp}/runs?viewStateShareKey={parent}"
                          "&compareRunsMode=CHART&workflowType=machine_learning")
    # the shared view the link opens: the sweep's jobs grouped by arm, the chart view filtered on the metric
    state = json.loads(client.get_experiment(exp).tags[f"mlflow.sharedViewState.{parent}"])
    assert state["searchFilter"] == f"tags.`sweep.id` = '{parent}'" and state["chartsSearchFilter"] == "val/top1"
    assert state["groupBy"]["groupByKeys"] == [{"mode": "tag", "groupByData": "sweep.arm"}]
    assert state["useGroupedValuesInCharts"]  # a line per arm, its mean with the min-max band
    arms = {r.info.run_name: r.data.tags["sweep.arm"] for r in client.search_runs([exp], "tags.`sweep.arm` != ''")}
    assert arms == {"amp=o0": "amp=o0", "amp=o2": "amp=o2"}  # the parent has none: it is no arm

    page = (tmp_path / "out" / "report.html").read_text()
    assert "<td>amp=o2</td><td>21.00</td>" in page and "#2 amp=o3: ConfigError: no fp16 on CPU" in page
    # val/top1 and amp=o2's difference to amp=o0; train/loss was not logged here: a note instead of its chart
    assert page.count("<svg") == 2 and "No train/loss was logged" in page
    assert page.count('<g data-job="amp=o0">') == 1  # inside its arm's group
    assert page.count("<circle") == 5 + 2  # a point per logged epoch, and per epoch of the difference (1, 2)
    assert "<title>amp=o2: epoch 2, val/top1 21</title>" in page  # hover text
    assert not re.search(r"(src|href)=\"https?:", page)  # self-contained: opens offline
    downloaded = client.download_artifacts(parent, "report/report.html", str(tmp_path / "back"))
    assert Path(downloaded).read_text() == page


def test_best_trial_names_a_searchs_best_job_its_values_and_objective() -> None:
    tags = {"best.job": "3", "best.optimizer.lr": "0.001", "best.objective": "41.5", "best.metric": "val/top1",
            "sweep.role": "parent"}
    assert best_trial(tags, "val/top5") == "best trial: job #3 optimizer.lr=0.001: val/top1 41.5\n"
    assert best_trial({"sweep.role": "parent"}, "val/top1") == ""  # a grid has no best trial


def test_report_opens_with_paired_verdicts_leaves_out_failed_seeds_and_logs_gaps_to_mlflow(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    exp = client.create_experiment("e")
    parent = client.create_run(exp, run_name="sweep amp=o0,o2,o1 seed=1,2,3", tags={
        "sweep.role": "parent", "sweep.failed_jobs": "#8 amp=o1 seed=3: RuntimeError: out of memory"}).info.run_id
    for job, (name, top1, status) in enumerate([
            ("amp=o0 seed=1", [10.0, 20.0, 30.0], "FINISHED"), ("amp=o0 seed=2", [12.0, 24.0, 28.0], "FINISHED"),
            ("amp=o0 seed=3", [11.0, 22.0, 29.0], "FINISHED"),
            ("amp=o2 seed=1", [13.0, 23.0, 33.0], "FINISHED"),
            ("amp=o2 seed=2", [15.0, 27.0, 99.0], "FAILED"),  # its epoch 3 must not count
            ("amp=o2 seed=3", [14.0, 25.0, 32.1], "FINISHED"),
            ("amp=o1 seed=1", [10.0, 20.0, 30.2], "FINISHED"), ("amp=o1 seed=2", [12.0, 24.0, 28.0], "FINISHED")]):
        _child(client, exp, parent, job, name, top1, status)  # amp=o1 seed=3 failed before it logged a run

    for _ in range(2):  # a second report logs nothing twice
        report = sweep_report(uri, "e", parent, epoch=3, out=tmp_path / "out")
    # o2 − o0 on seeds 1 and 3: +3.0, +3.1 -> mean 3.05, sd 0.0707, t(0.975, 1) = 12.706: ± 0.635
    (o2,) = [line for line in report.verdicts.splitlines() if line.startswith("| amp=o2 − amp=o0 |")]
    assert o2.startswith("| amp=o2 − amp=o0 | 2 (1, 3) | +3.05 | [+2.41, +3.69] | ") and o2.endswith(" | real |")
    # o1 − o0 on seeds 1 and 2: +0.2, 0.0 -> ± 1.27 (unpaired, Welch over all its seeds: ± 7.04);
    # n=3 would do: 4.303 · 0.1414/√3 = 0.351 ≤ 0.5 − 0.1
    assert ("| amp=o1 − amp=o0 | 2 (1, 2) | +0.10 | [-1.17, +1.37] | [-6.94, +7.14] | undecided: ~3 paired seeds "
            "would resolve a gap of +0.10 at this noise (sd 0.14) |") in report.verdicts
    assert "Left out (never averaged in): seed 2: amp=o2 FAILED; seed 3: amp=o1 no run" in report.verdicts
    md = (tmp_path / "out" / "report.md").read_text()
    assert md.index("## Verdicts: val/top1 at epoch 3, each arm against amp=o0") < md.index("| run |")
    assert "\nMethod: per arm, the difference to the baseline on each seed both ran (paired" in md
    assert report.text.index(report.verdicts) < report.text.index(report.table)
    page = (tmp_path / "out" / "report.html").read_text()
    assert page.index("<td>amp=o2 − amp=o0</td><td>2 (1, 3)</td><td>+3.05</td>") < page.index("<td>amp=o0 (seeds")

    runs = {r.info.run_name: r for r in client.search_runs([exp], f"tags.`sweep.id` = '{parent}'")}
    assert runs["amp=o2 seed=3"].data.metrics["val/top1_at3"] == 32.1
    assert runs["amp=o2 seed=2"].data.metrics["val/top1_at3"] == 99.0  # its value, though the verdict left it out
    assert len(client.get_metric_history(runs["amp=o0 seed=1"].info.run_id, "val/top1_at3")) == 1
    logged = client.get_run(parent).data
    assert logged.metrics["gap/o2-o0_at3"] == pytest.approx(3.05)
    assert (logged.metrics["gap/o2-o0_at3_lo"], logged.metrics["gap/o2-o0_at3_hi"]) == pytest.approx(
        (2.4147, 3.6853), abs=1e-4)
    assert logged.metrics["gap/o1-o0_at3_lo"] < 0 < logged.metrics["gap/o1-o0_at3_hi"]
    assert logged.tags["verdict/o2-o0_at3"] == "real (gap +3.05 [+2.41, +3.69], paired seeds 2 (1, 3))"
    assert logged.tags["verdict/o1-o0_at3"].startswith("undecided: ~3 paired seeds")
    assert len(client.get_metric_history(parent, "gap/o2-o0_at3")) == 1

    other = main(["--tracking-uri", uri, "--experiment", "e", "--sweep", parent, "--epoch", "3", "--baseline",
                  "amp=o2", "--out", str(tmp_path / "out2")])
    assert "| run |" in other  # the baseline changes the verdicts only
    with pytest.raises(SystemExit, match="baseline 'amp=o9' is not an arm of this sweep; choose one of: amp=o0"):
        main(["--tracking-uri", uri, "--experiment", "e", "--sweep", parent, "--baseline", "amp=o9"])


def _pixels_near(img: Image.Image, rgb: tuple[int, int, int], tolerance: int = 3) -> int:
    return sum(1 for p in img.convert("RGB").getdata() if all(abs(a - b) <= tolerance for a, b in zip(p, rgb)))


def test_curves_draw_each_arms_mean_with_its_min_max_band_over_seeds(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    exp = client.create_experiment("e")
    parent = client.create_run(exp, run_name="sweep amp=o0,o2 seed=1,2", tags={"sweep.role": "parent"}).info.run_id
    _child(client, exp, parent, 0, "amp=o0 seed=1", [10.0, 20.0, 30.0])
    _child(client, exp, parent, 1, "amp=o0 seed=2", [16.0, 28.0, 36.0])
    _child(client, exp, parent, 2, "amp=o2 seed=1", [40.0, 50.0, 60.0])
    _child(client, exp, parent, 3, "amp=o2 seed=2", [48.0, 58.0, 66.0])
    sweep_report(uri, "e", parent, epoch=3, out=tmp_path / "out")
    with Image.open(tmp_path / "out" / "curves.png") as img:
        # each band is its arm's colour (matplotlib's tab10 blue, orange) at alpha 0.25 over white
        blue_band, orange_band = _pixels_near(img, (199, 221, 236)), _pixels_near(img, (255, 223, 195))
    assert blue_band > 2000 and orange_band > 2000, (blue_band, orange_band)


def test_the_paired_difference_to_the_baseline_is_drawn_over_epochs_with_its_interval(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    exp = client.create_experiment("e")
    parent = client.create_run(exp, run_name="sweep amp=o0,o2 seed=1,2,3", tags={"sweep.role": "parent"}).info.run_id
    o0 = {1: [10.0, 20.0, 30.0], 2: [16.0, 28.0, 36.0], 3: [12.0, 25.0, 31.0]}
    o2 = {1: [14.0, 26.0, 35.0], 2: [19.0, 31.0, 42.0], 3: [17.0, 29.0, 37.0]}  # 3 to 6 points above o0, per seed
    for job, (name, top1) in enumerate((f"amp={arm} seed={seed}", values[seed]) for arm, values in
                                       (("o0", o0), ("o2", o2)) for seed in (1, 2, 3)):
        _child(client, exp, parent, job, name, top1)
    sweep_report(uri, "e", parent, epoch=3, out=tmp_path / "out")

    page = (tmp_path / "out" / "report.html").read_text()
    for epoch in (1, 2, 3):  # the page's interval at each epoch is SciPy's paired t interval of the differences
        diffs = [o2[seed][epoch - 1] - o0[seed][epoch - 1] for seed in (1, 2, 3)]
        lo, hi = stats.t.interval(0.95, 2, loc=np.mean(diffs), scale=stats.sem(diffs))
        assert (f"amp=o2: epoch {epoch}, paired difference {np.mean(diffs):+.3g}, 95% interval [{lo:+.3g}, "
                f"{hi:+.3g}]") in page
    assert "<h2>val/top1: paired difference to amp=o0</h2>" in page
    with Image.open(tmp_path / "out" / "curves.png") as img:
        width, height = img.size
        top, below = img.crop((0, 0, width, height // 2)), img.crop((0, height // 2, width, height))
        orange = (255, 223, 195)  # amp=o2's colour at alpha 0.25 over white: its band above, its interval below
        assert _pixels_near(top, (199, 221, 236)) > 2000 and _pixels_near(top, orange) > 2000
        assert _pixels_near(below, orange) > 2000 and _pixels_near(below, (199, 221, 236)) == 0  # o0 is the base


def test_arms_that_computed_another_amp_than_their_name_are_labelled_by_what_they_computed(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    exp = client.create_experiment("e")
    parent = client.create_run(exp, run_name="sweep amp=o0,o1_manual seed=1,2",
                               tags={"sweep.role": "parent"}).info.run_id
    o0 = "o0 (fp32 except Cube inputs: fp16 on ascend910)"  # what amp=o0 computes on a first-generation 910
    for job, (name, top1) in enumerate([("amp=o0 seed=1", [10.0, 20.0]), ("amp=o0 seed=2", [12.0, 21.0]),
                                        ("amp=o1_manual seed=1", [11.0, 22.0]),
                                        ("amp=o1_manual seed=2", [13.0, 23.0])]):
        _child(client, exp, parent, job, name, top1)
        run_id = client.search_runs([exp], f"attributes.run_name = '{name}'")[0].info.run_id
        client.set_tag(run_id, "amp.effective", o0 if name.startswith("amp=o0") else "o1_manual")  # o1: as named

    report = sweep_report(uri, "e", parent, epoch=2, out=tmp_path / "out")
    label = f"amp={o0}"
    assert f"each arm against {label}" in report.verdicts
    assert f"| amp=o1_manual − {label} | 2 (1, 2) | +2.00 |" in report.verdicts
    assert f"| {label} (seeds: 2) | 20.50 ± 0.71 |" in report.table and "| amp=o1_manual (seeds: 2) |" in report.table
    page = (tmp_path / "out" / "report.html").read_text()
    assert f"<td>amp=o1_manual − {label}</td>" in page and f'data-job="{label} seed=1"' in page
    assert f"# sweep amp=o0,o1_manual seed=1,2\n\n## Verdicts: val/top1 at epoch 2, each arm against {label}" in (
        tmp_path / "out" / "report.md").read_text()
    # MLflow groups the jobs by the same names; the gap's metric keeps the arms' values (stable names)
    arms = {r.info.run_name: r.data.tags.get("sweep.arm") for r in client.search_runs([exp])}
    assert arms == {"amp=o0 seed=1": label, "amp=o0 seed=2": label, "amp=o1_manual seed=1": "amp=o1_manual",
                    "amp=o1_manual seed=2": "amp=o1_manual", "sweep amp=o0,o1_manual seed=1,2": None}
    assert "gap/o1_manual-o0_at2" in client.get_run(parent).data.metrics
