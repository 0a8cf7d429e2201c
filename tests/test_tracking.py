"""Trackers read back from real stores: sqlite in tmp_path, and a real `mlflow server` for the offline fallback."""
from __future__ import annotations

import logging
import pickle
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hydra import compose as compose_cfg
from hydra import initialize_config_dir
from hydra.core.utils import JobReturn, JobStatus
from mlflow.tracking import MlflowClient
from omegaconf import open_dict

from swinexp.app.sweep_callback import SweepCallback, screening_epoch
from swinexp.registry import ConfigError
from swinexp.tracking import MlflowTracker, NullTracker, flatten, resolve_uri
from tests import servers
from tests.conftest import CONF_DIR, ROOT, SMOKE


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


# --- reopening a run (exact resume) -------------------------------------------------------------------------------

def test_sweep_callback_leaves_a_failed_single_run_alone() -> None:
    """Hydra calls on_job_end in single runs too, where hydra.job.num is unset (it warned MissingMandatoryValue)."""
    with initialize_config_dir(version_base="1.3", config_dir=str(CONF_DIR)):
        config = compose_cfg("config", overrides=SMOKE, return_hydra_config=True)
    callback = SweepCallback()
    callback.on_job_end(config, JobReturn(overrides=["trainer.epochs=0"], status=JobStatus.FAILED,
                                          _return_value=RuntimeError("boom")))
    assert not callback.failed and callback.tracker is None


def test_a_job_failure_seen_in_the_jobs_process_reaches_the_sweeps(tmp_path: Path) -> None:
    """submitit runs on_job_end in the job's process, on a pickled copy of the callback: its line must reach the
    sweep's process, which alone writes the parent run."""
    with initialize_config_dir(version_base="1.3", config_dir=str(CONF_DIR)):
        config = compose_cfg("config", overrides=[*SMOKE, f"hydra.sweep.dir={tmp_path}"], return_hydra_config=True)
    with open_dict(config):
        config.hydra.job.num = 4
    (tmp_path / "4").mkdir()  # the job's dir, made by Hydra when the job started
    in_job = pickle.loads(pickle.dumps(SweepCallback(keys=("amp",))))
    in_job.on_job_end(config, JobReturn(overrides=["amp=o3", "seed=1"], status=JobStatus.FAILED,
                                        _return_value=ConfigError("no fp16 on CPU")))
    in_sweep = SweepCallback(sweep_dir=tmp_path)
    in_sweep._collect_failures()
    assert in_sweep.failed == {4: "#4 amp=o3: ConfigError: no fp16 on CPU"}  # named by what the sweep varies


def test_a_sweep_is_compared_at_its_screening_epoch() -> None:
    with initialize_config_dir(version_base="1.3", config_dir=str(CONF_DIR)):
        screen = compose_cfg("config", overrides=["sweep=amp_ablation", "trainer.epochs=300"])
        plain = compose_cfg("config", overrides=["trainer.epochs=7"])
    assert screening_epoch(screen, ["amp"]) == 10  # trainer.stop_after_epoch of the named sweep
    assert screening_epoch(plain, ["amp"]) == 7
    assert screening_epoch(plain, ["trainer.epochs"]) is None  # jobs end at different epochs: the report picks


def test_null_tracker_reopens_nothing() -> None:
    tracker = NullTracker()
    assert tracker.start("x", {}, run_id="0" * 32) is None and tracker.logged_steps("val/top1") == set()


def test_reopen_continues_the_same_run_and_knows_its_logged_steps(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    first = MlflowTracker(uri, "exp")
    run_id = first.start("job", {"overrides": "a=1"})
    first.log_metrics({"val/top1": 10.0}, step=1)
    first.log_metrics({"val/top1": 20.0}, step=2)
    first.close("KILLED")

    again = MlflowTracker(uri, "exp")
    assert again.start("job", {"resumed": "yes"}, run_id=run_id) == run_id == again.run_id
    client = MlflowClient(uri)
    assert client.get_run(run_id).info.status == "RUNNING"
    assert again.logged_steps("val/top1") == {1, 2} and again.logged_steps("never/logged") == set()
    again.log_metrics({"val/top1": 30.0}, step=3)
    again.close("FINISHED")

    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.tags["resumed"] == "yes"
    assert [(m.step, m.value) for m in client.get_metric_history(run_id, "val/top1")] == [(1, 10.0), (2, 20.0),
                                                                                           (3, 30.0)]
    assert len(client.search_runs([client.get_experiment_by_name("exp").experiment_id])) == 1


def test_reopening_an_unknown_run_says_what_to_do(tmp_path: Path) -> None:
    tracker = MlflowTracker(f"sqlite:///{tmp_path}/mlflow.db", "exp")
    with pytest.raises(ConfigError, match=r"cannot reopen run 0+: it does not exist in tracking.uri=.*start a new run"):
        tracker.start("job", {}, run_id="0" * 32)


def test_on_unreachable_accepts_only_error_or_warn(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"tracking.on_unreachable='ignore' is not valid; choose one of: error, warn"):
        MlflowTracker(f"sqlite:///{tmp_path}/mlflow.db", "exp", on_unreachable="ignore")


# --- offline fallback and sync into a real server ----------------------------------------------------------------

@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with servers.mlflow_server(tmp_path_factory.mktemp("mlflow_server")) as url:
        yield url


def _sync(source: str, target: str, *extra: str) -> list[str]:
    """`python -m swinexp.tracking sync` as a user runs it; returns its output lines."""
    out = subprocess.run([sys.executable, "-m", "swinexp.tracking", "sync", "--from", source, "--to", target, *extra],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.splitlines()


def _history(client: MlflowClient, run_id: str, key: str) -> list[tuple[int, float, int]]:
    return [(m.step, m.value, m.timestamp) for m in client.get_metric_history(run_id, key)]


def test_offline_runs_sync_into_a_live_server_exactly_once(mlflow_server: str, tmp_path: Path,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    dead, offline = f"http://127.0.0.1:{servers.free_port()}", f"sqlite:///{tmp_path}/mlflow-offline.db"
    with caplog.at_level(logging.WARNING, logger="swinexp"):
        parent = MlflowTracker(dead, "offline", on_unreachable="warn", fallback_uri=offline)
    assert parent.offline and parent.uri == offline
    command = f"python -m swinexp.tracking sync --from {offline} --to {dead} --experiment offline"
    assert dead in caplog.text and command in caplog.text  # the server, the fallback store, the command to run
    parent_id = parent.start("sweep lr=1,2", {"sweep.role": "parent"})
    parent.log_params({"optimizer.lr": 0.001, "model.name": "swin_micro"})
    for step in (1, 2, 3):
        parent.log_metrics({"val/top1": 10.0 * step, "train/loss_scale": float("nan")}, step=step)
    (tmp_path / "config.yaml").write_text("seed: 1\n")
    parent.log_artifact(tmp_path / "config.yaml")
    parent.close("FINISHED")
    child = MlflowTracker(dead, "offline", on_unreachable="warn", fallback_uri=offline)
    child_id = child.start("lr=1", {"mlflow.parentRunId": parent_id})
    child.log_metrics({"val/top1": 5.0}, step=1)
    child.close("FAILED")

    lines = _sync(offline, mlflow_server, "--experiment", "offline")
    assert [line.split(":")[0] for line in lines] == ["created", "created"], lines  # one line per run
    source, target = MlflowClient(offline), MlflowClient(mlflow_server)
    runs = {r.info.run_name: r for r in target.search_runs([target.get_experiment_by_name("offline").experiment_id])}
    assert sorted(runs) == ["lr=1", "sweep lr=1,2"]
    copy, child_copy = runs["sweep lr=1,2"], runs["lr=1"]
    assert copy.info.status == "FINISHED" and child_copy.info.status == "FAILED"
    assert copy.info.end_time == source.get_run(parent_id).info.end_time
    assert copy.data.params == {"optimizer.lr": "0.001", "model.name": "swin_micro"}
    assert copy.data.tags["sweep.role"] == "parent"
    assert child_copy.data.tags["mlflow.parentRunId"] == copy.info.run_id  # the link follows the replayed parent
    for key in ("val/top1", "train/loss_scale"):
        assert len(_history(target, copy.info.run_id, key)) == 3
        assert str(_history(target, copy.info.run_id, key)) == str(_history(source, parent_id, key))  # NaN too
    assert [(m.step, m.value) for m in target.get_metric_history(child_copy.info.run_id, "val/top1")] == [(1, 5.0)]
    assert [a.path for a in target.list_artifacts(copy.info.run_id)] == ["config.yaml"]
    assert Path(target.download_artifacts(copy.info.run_id, "config.yaml", str(tmp_path / "back"))).read_text() == \
        "seed: 1\n"
    assert source.get_run(parent_id).data.tags["swinexp.synced_to"] == copy.info.run_id
    assert source.get_run(child_id).data.tags["swinexp.synced_to"] == child_copy.info.run_id

    again = _sync(offline, mlflow_server)  # all experiments this time: still nothing twice
    assert [line.split(":")[0] for line in again] == ["up to date", "up to date"], again
    assert len(target.search_runs([target.get_experiment_by_name("offline").experiment_id])) == 2
    assert len(_history(target, copy.info.run_id, "val/top1")) == 3
    assert [a.path for a in target.list_artifacts(copy.info.run_id)] == ["config.yaml"]

    resumed = MlflowTracker(mlflow_server, "offline")  # a resume of the offline run continues its synced copy
    assert resumed.start("sweep lr=1,2", {}, run_id=parent_id) == copy.info.run_id
    assert resumed.logged_steps("val/top1") == {1, 2, 3}
    resumed.close()


def test_server_going_down_mid_run_continues_offline_and_merges_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # fail at once instead of MLflow's ~4 min of retries
    root, port = tmp_path / "server", servers.free_port()
    root.mkdir()
    offline = f"sqlite:///{tmp_path}/mlflow-offline.db"
    with servers.mlflow_server(root, port) as server:
        tracker = MlflowTracker(server, "midrun", on_unreachable="warn", fallback_uri=offline)
        run_id = tracker.start("job", {"overrides": "a=1"})
        tracker.log_params({"seed": 1})
        tracker.log_metrics({"val/top1": 10.0}, step=1)
    with caplog.at_level(logging.WARNING, logger="swinexp"):
        tracker.log_metrics({"val/top1": 20.0}, step=2)  # the server is gone: this goes offline, nothing is lost
    assert f"stopped answering during run {run_id}" in caplog.text and offline in caplog.text
    tracker.log_metrics({"val/top1": 30.0}, step=3)
    (tmp_path / "summary.txt").write_text("done\n")
    tracker.log_artifact(tmp_path / "summary.txt")
    assert tracker.run_id == run_id  # the run keeps its identity: a resume reopens the server run
    tracker.close("FINISHED")

    source = MlflowClient(offline)
    (rest,) = source.search_runs([source.get_experiment_by_name("midrun").experiment_id])
    assert rest.data.tags["swinexp.continues_run"] == run_id and rest.data.params == {"seed": "1"}
    assert [m.step for m in source.get_metric_history(rest.info.run_id, "val/top1")] == [2, 3]

    with servers.mlflow_server(root, port):  # the server is back, with the run's first part
        lines = _sync(offline, server)
        assert len(lines) == 1 and lines[0].startswith(f"merged into: midrun/'job' {rest.info.run_id} -> {run_id}")
        target = MlflowClient(server)
        assert len(target.search_runs([target.get_experiment_by_name("midrun").experiment_id])) == 1
        run = target.get_run(run_id)
        assert run.info.status == "FINISHED" and run.data.params == {"seed": "1"}
        assert [(m.step, m.value) for m in target.get_metric_history(run_id, "val/top1")] == [(1, 10.0), (2, 20.0),
                                                                                               (3, 30.0)]
        assert [a.path for a in target.list_artifacts(run_id)] == ["summary.txt"]
        assert [line.split(":")[0] for line in _sync(offline, server)] == ["up to date"]


@pytest.mark.slow
def test_run_py_against_a_dead_server_with_warn_trains_into_the_offline_store(tmp_path: Path) -> None:
    dead = f"http://127.0.0.1:{servers.free_port()}"
    smoke = [o for o in SMOKE if not o.startswith("tracking=")]
    out = subprocess.run([sys.executable, str(ROOT / "run.py"), *smoke, f"data.root={tmp_path / 'data'}",
                          "tracking=mlflow", f"tracking.uri={dead}", "tracking.on_unreachable=warn",
                          f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    offline = f"sqlite:///{tmp_path}/mlflow-offline.db"  # the default fallback_uri, in the starting directory
    assert f"python -m swinexp.tracking sync --from {offline} --to {dead}" in out.stdout + out.stderr

    client = MlflowClient(offline)
    (run,) = client.search_runs([client.get_experiment_by_name("swinexp").experiment_id])
    assert run.info.status == "FINISHED" and run.data.params["model.name"] == "swin_micro"
    for key in ("train/loss", "val/top1", "val/loss"):
        assert [m.step for m in client.get_metric_history(run.info.run_id, key)] == [1, 2], key
    assert {a.path for a in client.list_artifacts(run.info.run_id)} == {"config.yaml", "overrides.yaml", "classes.txt",
                                                                        "checkpoints"}


# --- a synced run is the run logged live -------------------------------------------------------------------------

def _log_sweep(uri: str, root: Path, synthetic_root: Path) -> tuple[str, str]:
    """A sweep of one real training job (dataset inputs, system metrics, checkpoints) with its report, logged to
    `uri` the way run.py -m logs it; returns (parent id, job id)."""
    from swinexp.app.job import run
    from swinexp.app.job_info import JobInfo
    from swinexp.app.sweep_callback import SweepInfo
    from swinexp.tracking.report import sweep_report

    parent = MlflowTracker(uri, "sync", system_metrics_interval_s=None)
    parent_id = parent.start("sweep optimizer.lr=1e-3", {"sweep.role": "parent", "sweep.keys": "optimizer.lr"})
    parent.log_params({"sweep.definition": "optimizer.lr=1e-3"})
    overrides = [*SMOKE, f"data.root={synthetic_root}", "tracking=mlflow", f"tracking.uri={uri}",
                 "tracking.experiment=sync", "tracking.log_every_n_steps=1", "tracking.log_checkpoints=both",
                 "tracking.system_metrics_interval_s=0.2", "optimizer.lr=1e-3"]
    with initialize_config_dir(version_base="1.3", config_dir=str(CONF_DIR)):
        cfg = compose_cfg("config", overrides=overrides)
        choices = compose_cfg("config", overrides=overrides, return_hydra_config=True).hydra.runtime.choices
    run(cfg, JobInfo(run_dir=root / "job", overrides=overrides, choices=dict(choices),
                     sweep=SweepInfo(parent_id, ("optimizer.lr",), 0)))
    sweep_report(uri, "sync", parent_id, epoch=2, out=root / "report")
    parent.close("FINISHED")
    client = MlflowClient(uri)
    (job,) = client.search_runs([client.get_experiment_by_name("sync").experiment_id],
                                f"tags.`sweep.id` = '{parent_id}'")
    return parent_id, job.info.run_id


def _artifacts(client: MlflowClient, run_id: str, path: str | None = None) -> list[str]:
    out = []
    for info in client.list_artifacts(run_id, path):
        out += _artifacts(client, run_id, info.path) if info.is_dir else [info.path]
    return sorted(out)


# values that depend on the clock or the machine's load, not on what was trained
TIMED = ("system/", "time/", "perf/")


def _same_run(target: MlflowClient, copy_id: str, live_id: str, ids: dict[str, str]) -> None:
    """Field by field: the synced copy and the live run, run ids (`ids`: id -> placeholder) put aside."""
    copy, live = target.get_run(copy_id), target.get_run(live_id)
    assert copy.info.run_name == live.info.run_name and copy.info.status == live.info.status == "FINISHED"
    where = {"tracking.uri"}  # the store each was logged to: the one thing that differs by design
    assert {k: v for k, v in copy.data.params.items() if k not in where} == \
        {k: v for k, v in live.data.params.items() if k not in where}
    assert sorted(copy.data.metrics) == sorted(live.data.metrics)
    for key in copy.data.metrics:
        ours, theirs = target.get_metric_history(copy_id, key), target.get_metric_history(live_id, key)
        if key.startswith(TIMED) or "time" in key or "per_s" in key:
            assert len(ours) > 0 and len(theirs) > 0, key
            continue
        assert [(m.step, m.value) for m in ours] == [(m.step, m.value) for m in theirs], key

    def tags(run) -> dict[str, str]:
        out = {k: ids.get(v, v) for k, v in run.data.tags.items()
               if k not in ("swinexp.synced_from", "pid", "swinexp.run_dir", "overrides")}
        return out

    assert tags(copy) == tags(live)
    assert copy.data.tags["swinexp.synced_from"] not in (copy_id, live_id)

    def inputs(run) -> list[tuple]:
        return sorted((d.dataset.name, d.dataset.digest, d.dataset.source, tuple((t.key, t.value) for t in d.tags))
                      for d in run.inputs.dataset_inputs)

    assert inputs(copy) == inputs(live)
    assert _artifacts(target, copy_id) == _artifacts(target, live_id)


@pytest.mark.slow
def test_a_synced_sweep_is_field_by_field_the_sweep_logged_live(tmp_path: Path, synthetic_root: Path) -> None:
    offline, live = f"sqlite:///{tmp_path}/offline.db", f"sqlite:///{tmp_path}/target.db"
    src_parent, src_job = _log_sweep(offline, tmp_path / "offline", synthetic_root)
    live_parent, live_job = _log_sweep(live, tmp_path / "live", synthetic_root)
    assert [line.split(":")[0] for line in _sync(offline, live)] == ["created", "created"]

    target = MlflowClient(live)
    exp = target.get_experiment_by_name("sync")
    runs = {r.info.run_id: r for r in target.search_runs([exp.experiment_id])}
    copy_parent = next(i for i, r in runs.items() if r.data.tags.get("swinexp.synced_from") == src_parent)
    copy_job = next(i for i, r in runs.items() if r.data.tags.get("swinexp.synced_from") == src_job)
    assert len(runs) == 4
    assert runs[copy_job].data.tags["mlflow.parentRunId"] == runs[copy_job].data.tags["sweep.id"] == copy_parent

    job_run = target.get_run(copy_job)
    assert {d.tags[0].value for d in job_run.inputs.dataset_inputs} == {"training", "validation"}
    assert any(k.startswith("system/") for k in job_run.data.metrics)  # system metrics came along
    assert "checkpoints/last.ckpt" in _artifacts(target, copy_job)
    assert "report/report.html" in _artifacts(target, copy_parent)
    _same_run(target, copy_job, live_job, {copy_parent: "<parent>", live_parent: "<parent>"})
    _same_run(target, copy_parent, live_parent, {})

    # the sweep's shared view of the UI, on the copy: the parent's id swapped for its copy's
    from swinexp.tracking.ui import SHARED_VIEW_TAG
    view = exp.tags[SHARED_VIEW_TAG + copy_parent]
    assert view == exp.tags[SHARED_VIEW_TAG + live_parent].replace(live_parent, copy_parent)
    assert src_parent not in view and copy_parent in view

    again = _sync(offline, live)
    assert [line.split(":")[0] for line in again] == ["up to date", "up to date"], again
    assert len(target.get_run(copy_job).inputs.dataset_inputs) == len(job_run.inputs.dataset_inputs)
