"""A checkpoint that cannot be written (disk full, file size limit) stops the run clearly and keeps the last one."""
from __future__ import annotations

import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from swinexp.engine import checkpoint
from swinexp.engine.resume import PROGRESS_KEY, RUN_ID_FILE, Progress
from tests.conftest import ROOT, SMOKE

pytestmark = pytest.mark.slow


def _train(run_dir: Path, db: Path, epochs: int, max_file_bytes: int | None = None) -> subprocess.CompletedProcess:
    def limit_file_size() -> None:  # what a full disk looks like to the writer: write() fails with an errno
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # else the kernel kills the process instead of failing write()
        resource.setrlimit(resource.RLIMIT_FSIZE, (max_file_bytes, max_file_bytes))

    overrides = [o for o in SMOKE if o != "tracking=none"] + [
        f"data.root={run_dir.parent / 'data'}", "tracking=mlflow", f"tracking.uri=sqlite:///{db}",
        f"trainer.epochs={epochs}", "scheduler.warmup_epochs=0", "model.drop_path_rate=0", f"hydra.run.dir={run_dir}"]
    return subprocess.run([sys.executable, str(ROOT / "run.py"), *overrides], cwd=run_dir.parent,
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
