"""A checkpoint that cannot be written (disk full, file size limit) stops the run clearly and keeps the last one; one
killed mid-write leaves a temporary file that the resume removes."""
from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from swinexp.engine import checkpoint
from swinexp.engine.resume import PROGRESS_KEY, RUN_ID_FILE, Progress
from tests.conftest import ROOT, SMOKE

pytestmark = pytest.mark.slow


def _overrides(run_dir: Path, db: Path, epochs: int) -> list[str]:
    return [o for o in SMOKE if o != "tracking=none"] + [
        f"data.root={run_dir.parent / 'data'}", "tracking=mlflow", f"tracking.uri=sqlite:///{db}",
        f"trainer.epochs={epochs}", "scheduler.warmup_epochs=0", "model.drop_path_rate=0", f"hydra.run.dir={run_dir}"]


def _train(run_dir: Path, db: Path, epochs: int, max_file_bytes: int | None = None) -> subprocess.CompletedProcess:
    def limit_file_size() -> None:  # what a full disk looks like to the writer: write() fails with an errno
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # else the kernel kills the process instead of failing write()
        resource.setrlimit(resource.RLIMIT_FSIZE, (max_file_bytes, max_file_bytes))

    return subprocess.run([sys.executable, str(ROOT / "run.py"), *_overrides(run_dir, db, epochs)], cwd=run_dir.parent,
                          capture_output=True, text=True, timeout=600, check=False,
                          preexec_fn=limit_file_size if max_file_bytes else None)


def test_an_unwritable_checkpoint_stops_with_one_line_and_keeps_the_previous(tmp_path: Path) -> None:
    run_dir, db = tmp_path / "run", tmp_path / "mlflow.db"
    first = _train(run_dir, db, epochs=1)
    assert first.returncode == 0, first.stderr[-3000:]
    kept = run_dir / "checkpoints" / "step-00000003.ckpt"
    limit = (db.stat().st_size + kept.stat().st_size) // 2
    assert db.stat().st_size < limit - 200_000  # the limit stops checkpoints, not the MLflow store's writes

    second = _train(run_dir, db, epochs=2, max_file_bytes=limit)
    assert second.returncode != 0
    last_line = second.stderr.strip().splitlines()[-1]
    assert last_line.startswith(f"CheckpointWriteError: cannot write checkpoint "
                                f"'{run_dir / 'checkpoints' / 'step-00000006.ckpt'}': File too large (errno 27); "
                                "the previous checkpoint is kept intact"), second.stderr[-3000:]
    assert "Traceback" not in second.stderr

    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["best.ckpt", "last.ckpt",
                                                                            "step-00000003.ckpt"]  # no partial file
    values = checkpoint.read(run_dir / "checkpoints" / "last.ckpt")  # CRC-checked: intact
    assert Progress.from_json(checkpoint.read_meta(values)[PROGRESS_KEY]).epoch == 1

    client = MlflowClient(f"sqlite:///{db}")
    run = client.get_run((run_dir / RUN_ID_FILE).read_text().strip())
    assert run.info.status == "FAILED"
    assert run.data.tags["swinexp.failure"].startswith("CheckpointWriteError: cannot write checkpoint")
    assert "File too large" in run.data.tags["swinexp.failure"]
    assert [m.step for m in client.get_metric_history(run.info.run_id, "val/top1")] == [1]


def test_a_write_sigkilled_midway_leaves_a_tmp_file_that_the_resume_removes(tmp_path: Path) -> None:
    run_dir, db, phases = tmp_path / "run", tmp_path / "mlflow.db", tmp_path / "phases.txt"
    # parked at the second checkpoint: its file written under the temporary name, not yet renamed into place
    killed = subprocess.Popen([sys.executable, str(ROOT / "run.py"), *_overrides(run_dir, db, epochs=2),
                               f"debug.phase_file={phases}", "debug.park_at=checkpoint:2"], cwd=tmp_path,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 600
        while not (phases.is_file() and "parked" in phases.read_text()) and time.monotonic() < deadline:
            assert killed.poll() is None, "training ended before it parked at its second checkpoint"
            time.sleep(0.2)
    finally:
        os.kill(killed.pid, signal.SIGKILL)
        killed.wait(timeout=60)
    partial = run_dir / "checkpoints" / f".step-00000006.tmp-{killed.pid}.ckpt"
    assert partial.is_file() and partial.stat().st_size > 100_000  # a whole checkpoint's bytes, never renamed

    resumed = _train(run_dir, db, epochs=2)  # the same command again: trainer.resume=auto
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    printed = resumed.stdout + resumed.stderr
    assert f"removed '{partial}', a checkpoint write that a killed run left unfinished" in printed
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["best.ckpt", "last.ckpt",
                                                                            "step-00000003.ckpt", "step-00000006.ckpt"]
    progress = Progress.from_json(checkpoint.read_meta(checkpoint.read(run_dir / "checkpoints" / "last.ckpt"))[
        PROGRESS_KEY])
    assert progress.epoch == 2
