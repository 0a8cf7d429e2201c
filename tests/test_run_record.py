"""What an MLflow run holds beyond params and epoch metrics (issue 17): system metrics, source tags, the dataset as
run inputs, per-step metrics, the checkpoint as an artifact; read back from a real sqlite store."""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Callable

import pytest
from mlflow.tracking import MlflowClient
from omegaconf import DictConfig

from swinexp.app.job import log_checkpoint_artifacts, run
from swinexp.app.job_info import JobInfo
from swinexp.build import build_experiment, resolve
from swinexp.tracking import MlflowTracker
from swinexp.tracking.dataset import file_list_digest
from swinexp.tracking.system import SystemMetrics
from tests.conftest import TrainedRun

MLFLOW = ["tracking=mlflow", "tracking.system_metrics_interval_s=0.2", "tracking.log_every_n_steps=2"]
STEP_KEYS = ("step/train/loss", "step/train/loss_scale", "step/train/overflow")


def _only_run(uri: str, experiment: str = "swinexp"):
    client = MlflowClient(uri)
    (found,) = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    return client, client.get_run(found.info.run_id)


def test_run_holds_system_metrics_source_tags_inputs_steps_and_checkpoint(
        trained_run: TrainedRun, compose: Callable[..., DictConfig], tmp_path: Path) -> None:
    client, mlrun = _only_run(trained_run.uri)
    run_id, tags = mlrun.info.run_id, mlrun.data.tags

    assert mlrun.info.run_name == "model=swin_micro data=synthetic data.num_train=96 data.num_val=40 " \
        "data.img_size=32 data.batch_size=8 data/augment=none trainer=smoke hardware=cpu amp=o0 data.root=" + \
        str(compose().data.root)  # tracking=, tracking.* and hydra.* are left out of the name
    assert tags["mlflow.source.type"] == "LOCAL" and tags["mlflow.source.name"] and tags["mlflow.user"]
    assert tags["mlflow.source.git.commit"] == tags["git_commit"] and len(tags["git_commit"]) == 40
    assert tags["swinexp.run_dir"] == str(trained_run.run_dir.resolve())
    assert tags["swinexp.malloc"] == "system"  # a CPU run refuses anything else (runtime/allocator.py)

    system = {k for k in mlrun.data.metrics if k.startswith("system/")}
    assert {"system/cpu_utilization_percentage", "system/system_memory_usage_megabytes",
            "system/process_memory_rss_megabytes"} <= system
    assert not any("device_memory" in k for k in system)  # the CPU backend has no device pool to report
    assert client.get_metric_history(run_id, "system/process_memory_rss_megabytes")[0].value > 10  # MB

    # smoke: 3 optimizer steps per epoch, 2 epochs, logged at step = optimizer step; epoch curves stay at 1, 2
    for key in STEP_KEYS:
        assert [m.step for m in client.get_metric_history(run_id, key)] == [1, 2, 3, 4, 5, 6], key
    assert [m.step for m in client.get_metric_history(run_id, "train/loss")] == [1, 2]

    exp = build_experiment(resolve(compose()))
    inputs = {d.dataset.name: d for d in mlrun.inputs.dataset_inputs}
    assert sorted(inputs) == ["synthetic/train", "synthetic/val"]
    train = inputs["synthetic/train"]
    assert train.dataset.digest == file_list_digest(exp.data.root, exp.data.train, exp.data.num_classes)
    assert inputs["synthetic/val"].dataset.digest != train.dataset.digest
    assert {t.key: t.value for t in train.tags}["mlflow.data.context"] == "training"
    assert '"num_classes": 10' in train.dataset.profile

    artifacts = {a.path for a in client.list_artifacts(run_id)}
    assert {"config.yaml", "classes.txt", "checkpoints"} <= artifacts
    assert {a.path for a in client.list_artifacts(run_id, "checkpoints")} == {"checkpoints/best.ckpt",
                                                                                "checkpoints/last.ckpt"}
    back = Path(client.download_artifacts(run_id, "checkpoints/last.ckpt", str(tmp_path / "back")))
    assert back.read_bytes() == (trained_run.run_dir / "checkpoints" / "last.ckpt").read_bytes()


def test_resumed_run_logs_no_step_twice_and_continues_system_steps(trained_run: TrainedRun, tmp_path: Path,
                                                                   compose: Callable[..., DictConfig]) -> None:
    db = Path(trained_run.uri[len("sqlite:///"):])
    run_dir, uri = tmp_path / "run", f"sqlite:///{tmp_path}/mlflow.db"  # a copy: the shared run stays as it was
    shutil.copytree(trained_run.run_dir, run_dir)
    shutil.copy(db, tmp_path / "mlflow.db")
    client, first = _only_run(uri)
    system_steps = [m.step for m in client.get_metric_history(first.info.run_id, "system/cpu_utilization_percentage")]
    # as if the run died after epoch 1's checkpoint, having logged epoch 2's steps: the rerun trains epoch 2 again
    run(compose(*MLFLOW, f"tracking.uri={uri}", "tracking.log_every_n_steps=1", "tracking.log_checkpoints=none",
                f"trainer.resume={run_dir / 'checkpoints' / 'step-00000003.ckpt'}"),
        JobInfo(run_dir=run_dir, choices=trained_run.choices))
    client, again = _only_run(uri)
    assert again.info.run_id == first.info.run_id and again.info.status == "FINISHED"
    for key in STEP_KEYS:
        assert [m.step for m in client.get_metric_history(again.info.run_id, key)] == [1, 2, 3, 4, 5, 6], key
    resumed = [m.step for m in client.get_metric_history(again.info.run_id, "system/cpu_utilization_percentage")]
    assert resumed[:len(system_steps)] == system_steps and min(resumed[len(system_steps):]) > max(system_steps)


def test_every_nth_step_is_logged(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    tracker = MlflowTracker(uri, "exp", log_every_n_steps=2)
    run_id = tracker.start("job", {})
    for step in range(1, 8):
        tracker.log_step_metrics({"step/train/loss": 1.0 / step}, step)
    tracker.close()
    assert [m.step for m in MlflowClient(uri).get_metric_history(run_id, "step/train/loss")] == [2, 4, 6]


def test_system_metrics_report_the_accelerator_memory_the_reader_gives(tmp_path: Path) -> None:
    """On GPU/Ascend the reader is MindSpore's allocator; here a fixed reading stands in for the device."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    tracker = MlflowTracker(uri, "exp")
    run_id = tracker.start("job", {})
    monitor = SystemMetrics(run_id, uri, interval_s=60, resume=False,
                            read_device=lambda: {"device_memory_allocated_megabytes": 512.0})
    monitor.stop()  # before the first 60 s interval: still one sample
    tracker.close()
    history = MlflowClient(uri).get_metric_history(run_id, "system/device_memory_allocated_megabytes")
    assert [(m.step, m.value) for m in history] == [(0, 512.0)]


@pytest.mark.parametrize("key,value,error", [
    ("log_checkpoints", "all", "tracking.log_checkpoints='all' is not valid; choose one of: best, last, both, none"),
    ("log_every_n_steps", -1, "tracking.log_every_n_steps=-1 must be >= 0"),
    ("system_metrics_interval_s", 0, "tracking.system_metrics_interval_s=0 must be > 0")])
def test_tracking_settings_are_checked_with_the_fix(tmp_path: Path, key: str, value: object, error: str) -> None:
    from swinexp.registry import ConfigError

    with pytest.raises(ConfigError, match=error.replace("(", r"\(").replace(".", r"\.")):
        MlflowTracker(f"sqlite:///{tmp_path}/mlflow.db", "exp", **{key: value})


@pytest.mark.parametrize("policy,finished,logged", [
    ("best", True, {"best.ckpt"}), ("last", True, {"last.ckpt"}), ("both", True, {"best.ckpt", "last.ckpt"}),
    ("none", False, set()), ("best", False, {"best.ckpt", "last.ckpt"})])  # a stopped run keeps what resumes it
def test_log_checkpoints_picks_the_files(tmp_path: Path, policy: str, finished: bool, logged: set[str]) -> None:
    run_dir, uri = tmp_path / "run", f"sqlite:///{tmp_path}/mlflow.db"
    (run_dir / "checkpoints").mkdir(parents=True)
    for name in ("best.ckpt", "last.ckpt", "step-00000003.ckpt"):
        (run_dir / "checkpoints" / name).write_bytes(name.encode())
    (run_dir / "config.yaml").write_text("seed: 1\n")
    tracker = MlflowTracker(uri, "exp", log_checkpoints=policy)
    run_id = tracker.start("job", {})
    log_checkpoint_artifacts(tracker, run_dir, finished)
    tracker.close()
    client = MlflowClient(uri)
    assert {Path(a.path).name for a in client.list_artifacts(run_id, "checkpoints")} == logged
    assert ("config.yaml" in {a.path for a in client.list_artifacts(run_id)}) == bool(logged)
