"""Kill, stop and resume real training processes: the resumed run ends exactly where an uninterrupted one does."""
from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import mindspore as ms
import numpy as np
import pytest
from mlflow.tracking import MlflowClient
from omegaconf import OmegaConf

from swinexp.engine import checkpoint
from swinexp.engine.resume import RUN_ID_FILE, Progress
from tests.conftest import ROOT, SMOKE

pytestmark = pytest.mark.slow

EPOCHS = 2
# 20 optimizer steps per epoch, a checkpoint every 4; swin_micro's default stochastic depth (0.1) is on: its masks
# are drawn from (seed, rank, optimizer step, micro-batch, branch), so the resumed run draws the same ones
TRAIN = [o for o in SMOKE if o != "tracking=none"] + [
    "data.num_train=160", "trainer.limit_train_batches=null", f"trainer.epochs={EPOCHS}",
    "trainer.checkpoint.every_n_steps=4", "trainer.checkpoint.keep_last=2", "trainer.deterministic=true"]
SERIES = ("train/loss", "train/grad_norm", "lr", "val/loss", "val/top1", "val/top5")


def _command(run_dir: Path, data_root: Path, db: Path, *extra: str) -> list[str]:
    return [sys.executable, str(ROOT / "run.py"), *TRAIN, f"data.root={data_root}", "tracking=mlflow",
            f"tracking.uri=sqlite:///{db}", f"hydra.run.dir={run_dir}", *extra]


def _train(run_dir: Path, data_root: Path, db: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(_command(run_dir, data_root, db, *extra), capture_output=True, text=True, timeout=900,
                          cwd=run_dir.parent)


def _start_and_signal(run_dir: Path, data_root: Path, db: Path, signum: int) -> tuple[int, str]:
    """Start training, wait for its first checkpoint, send `signum`; return the exit status and stderr."""
    log = run_dir.parent / f"signal-{signum}.log"  # a file, not a pipe: an unread pipe fills and blocks the child
    proc = subprocess.Popen(_command(run_dir, data_root, db), stdout=subprocess.DEVNULL, stderr=log.open("w"),
                            cwd=run_dir.parent)
    first = run_dir / "checkpoints" / "step-00000004.ckpt"
    deadline = time.monotonic() + 600
    while not first.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None, f"training ended before its first checkpoint: {log.read_text()[-3000:]}"
    assert first.exists(), f"no checkpoint after 600 s: {log.read_text()[-3000:]}"
    proc.send_signal(signum)
    proc.wait(timeout=300)
    return proc.returncode, log.read_text()


def _state(run_dir: Path) -> dict[str, np.ndarray]:
    values = checkpoint.read(run_dir / "checkpoints" / "last.ckpt")
    return {k: v.asnumpy() for k, v in values.items() if isinstance(v, ms.Parameter | ms.Tensor)}


def _metrics(db: Path, run_id: str) -> dict[str, list[tuple[int, float]]]:
    client = MlflowClient(f"sqlite:///{db}")
    return {key: sorted((m.step, m.value) for m in client.get_metric_history(run_id, key)) for key in SERIES}


def _run_id(run_dir: Path) -> str:
    return (run_dir / RUN_ID_FILE).read_text().strip()


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("reference")
    out = _train(root / "run", root / "data", root / "mlflow.db")
    assert out.returncode == 0, out.stderr[-3000:]
    assert OmegaConf.load(root / "run" / "config.yaml").model.drop_path_rate > 0  # stochastic depth is on
    return root / "run", root / "mlflow.db"


def _assert_same_as(reference: tuple[Path, Path], run_dir: Path, db: Path) -> None:
    ref_dir, ref_db = reference
    ref_state, state = _state(ref_dir), _state(run_dir)
    assert state.keys() == ref_state.keys()
    different = [k for k in state if not np.array_equal(state[k], ref_state[k])]
    assert not different, f"{len(different)} tensors differ from the uninterrupted run, e.g. {different[:3]}"
    got, want = _metrics(db, _run_id(run_dir)), _metrics(ref_db, _run_id(ref_dir))
    for key in SERIES:
        assert [step for step, _ in got[key]] == list(range(1, EPOCHS + 1)), key  # one value per epoch
        np.testing.assert_array_equal([v for _, v in got[key]], [v for _, v in want[key]], err_msg=key)


def test_sigkill_then_rerun_resumes_in_the_same_mlflow_run(uninterrupted: tuple[Path, Path],
                                                          tmp_path: Path) -> None:
    run_dir, db = tmp_path / "run", tmp_path / "mlflow.db"
    status, _ = _start_and_signal(run_dir, tmp_path / "data", db, signal.SIGKILL)
    assert status == -signal.SIGKILL
    run_id = _run_id(run_dir)
    assert MlflowClient(f"sqlite:///{db}").get_run(run_id).info.status == "RUNNING"  # died without a word

    out = _train(run_dir, tmp_path / "data", db)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "resumed from" in out.stdout + out.stderr
    assert _run_id(run_dir) == run_id
    runs = MlflowClient(f"sqlite:///{db}").search_runs([MlflowClient(f"sqlite:///{db}").get_experiment_by_name(
        "swinexp").experiment_id])
    assert [r.info.run_id for r in runs] == [run_id] and runs[0].info.status == "FINISHED"
    _assert_same_as(uninterrupted, run_dir, db)
    assert len(list((run_dir / "checkpoints").glob("step-*.ckpt"))) == 2  # keep_last


def test_sigterm_checkpoints_mid_epoch_marks_killed_and_resumes(uninterrupted: tuple[Path, Path],
                                                               tmp_path: Path) -> None:
    run_dir, db = tmp_path / "run", tmp_path / "mlflow.db"
    status, stderr = _start_and_signal(run_dir, tmp_path / "data", db, signal.SIGTERM)
    assert status != 0 and "SIGTERM" in stderr, stderr[-3000:]
    assert MlflowClient(f"sqlite:///{db}").get_run(_run_id(run_dir)).info.status == "KILLED"
    # mid-epoch 1 there is no best.ckpt yet: the stopped run carries last.ckpt, what continues it elsewhere
    artifacts = MlflowClient(f"sqlite:///{db}").list_artifacts(_run_id(run_dir), "checkpoints")
    assert [a.path for a in artifacts] == ["checkpoints/last.ckpt"]
    saved = Progress.from_json(checkpoint.read_meta(checkpoint.read(run_dir / "checkpoints" / "last.ckpt"))["progress"])
    assert saved.epoch == 0 and 4 <= saved.batches_done < 20  # stopped inside the first epoch, after step 4

    out = _train(run_dir, tmp_path / "data", db)
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"epoch 1, {saved.batches_done} batches done" in out.stdout + out.stderr
    _assert_same_as(uninterrupted, run_dir, db)


def test_screen_stops_after_epoch_then_continues_bit_identical_in_the_same_run(uninterrupted: tuple[Path, Path],
                                                                               tmp_path: Path) -> None:
    run_dir, db = tmp_path / "run", tmp_path / "mlflow.db"
    data_root = uninterrupted[0].parent / "data"  # the reference's images: the same files, generated once
    out = _train(run_dir, data_root, db, "trainer.stop_after_epoch=1")
    assert out.returncode == 0, out.stderr[-3000:]
    client = MlflowClient(f"sqlite:///{db}")
    screen = client.get_run(_run_id(run_dir))
    assert screen.info.status == "FINISHED" and screen.data.tags["stopped_after_epoch"] == "1"
    assert screen.data.params["trainer.epochs"] == str(EPOCHS)  # the full schedule, not the stop
    assert "trainer.stop_after_epoch" not in screen.data.params  # a continuation changes it: the tag says it
    assert [m.step for m in client.get_metric_history(screen.info.run_id, "val/top1")] == [1]
    ref_lr = _metrics(uninterrupted[1], _run_id(uninterrupted[0]))["lr"]
    assert client.get_metric_history(screen.info.run_id, "lr")[0].value == ref_lr[0][1]  # epoch 1 of the full LR

    out = _train(run_dir, data_root, db, "trainer.stop_after_epoch=null")
    assert out.returncode == 0, out.stderr[-3000:]
    logged = out.stdout + out.stderr
    assert "resumed from" in logged and "settings that differ" not in logged, logged[-3000:]
    runs = client.search_runs([client.get_experiment_by_name("swinexp").experiment_id])
    assert [r.info.run_id for r in runs] == [screen.info.run_id] and runs[0].info.status == "FINISHED"
    assert "stopped_after_epoch" not in runs[0].data.tags  # it ran to trainer.epochs: no longer a screen
    _assert_same_as(uninterrupted, run_dir, db)  # weights, optimizer state, every metric once per epoch
