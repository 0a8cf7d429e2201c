"""msrun under fire (real msrun, hardware=cpu2): a SIGKILLed worker or launcher leaves no process behind, and the
rerun resumes to exactly what an uninterrupted 2-worker run gives."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import mindspore as ms
import numpy as np
import pytest
from mlflow.tracking import MlflowClient

from swinexp.engine import checkpoint
from swinexp.engine.resume import RUN_ID_FILE
from swinexp.runtime.watchdog import launched_processes
from tests.conftest import ROOT, SMOKE
from tests.servers import free_port

pytestmark = pytest.mark.slow


def _command(run_dir: Path, tmp: Path) -> list[str]:
    smoke = [o for o in SMOKE if not o.startswith(("hardware=", "tracking="))]
    return [sys.executable, str(ROOT / "run.py"), *smoke, "hardware=cpu2", f"hardware.master_port={free_port()}",
            f"data.root={tmp / 'data'}", "trainer.deterministic=true", "model.drop_path_rate=0",
            "tracking=mlflow", f"tracking.uri=sqlite:///{tmp / 'mlflow.db'}",
            f"hydra.run.dir={run_dir}"]


def _start(run_dir: Path, tmp: Path, name: str) -> tuple[subprocess.Popen, Path]:
    log = tmp / f"{name}.log"  # a file, not a pipe: nobody reads it while the job runs
    return subprocess.Popen(_command(run_dir, tmp), cwd=tmp, stdout=log.open("w"), stderr=subprocess.STDOUT), log


def _wait_for(condition, what: str, proc: subprocess.Popen, log: Path, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert proc.poll() is None, f"ended before {what}: {log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"no {what} after {timeout} s: {log.read_text()[-3000:]}"
        time.sleep(0.2)


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _workers(launcher: int) -> dict[int, int]:
    """node id -> pid of the live msrun workers of `launcher` (not their own child processes)."""
    workers = {pid: env for pid, env in launched_processes(launcher).items()
               if env.get("MS_ROLE") == "MS_WORKER" and "MS_NODE_ID" in env and "hydra.run.dir=" in env["cmdline"]}
    return {int(env["MS_NODE_ID"]): pid for pid, env in workers.items() if _parent(pid) not in workers}


def _no_process_left(launcher: int, timeout: float = 30) -> dict:
    deadline = time.monotonic() + timeout
    while (left := launched_processes(launcher)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def _tensors(run_dir: Path) -> dict[str, np.ndarray]:
    values = checkpoint.read(run_dir / "checkpoints" / "last.ckpt")
    return {k: v.asnumpy() for k, v in values.items() if isinstance(v, (ms.Parameter, ms.Tensor))}


def test_killed_worker_or_launcher_leaves_nothing_and_the_rerun_resumes_exactly(tmp_path: Path) -> None:
    reference = subprocess.run(_command(tmp_path / "reference", tmp_path), cwd=tmp_path, capture_output=True,
                               text=True, timeout=900, check=False)
    assert reference.returncode == 0, reference.stdout[-3000:] + reference.stderr[-3000:]
    run_dir = tmp_path / "run"

    # 1. SIGKILL worker 1 in epoch 2: the launcher fails with that worker's story, and nothing is left running.
    # (No mid-epoch checkpoints: while rank 0 writes one, rank 1 waits in an all-reduce that times out on a
    # heavily loaded host.)
    proc, log = _start(run_dir, tmp_path, "worker-killed")
    _wait_for(lambda: (run_dir / "checkpoints" / "step-00000003.ckpt").exists(), "epoch 1 checkpoint", proc, log)
    os.kill(_workers(proc.pid)[1], signal.SIGKILL)
    assert proc.wait(timeout=120) != 0
    out = log.read_text()
    assert "worker 1 was killed by SIGKILL" in out and "----- worker_1.log" in out, out[-3000:]
    assert _no_process_left(proc.pid) == {}

    # 2. SIGKILL the launcher itself while its workers train: they go down with it
    proc, log = _start(run_dir, tmp_path, "launcher-killed")
    _wait_for(lambda: len(_workers(proc.pid)) == 2, "two workers", proc, log)
    launcher = proc.pid
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert _no_process_left(launcher) == {}, "workers outlived their SIGKILLed launcher"

    # 3. the same command again resumes to the uninterrupted result: weights, optimizer state, every metric
    proc, log = _start(run_dir, tmp_path, "resumed")
    assert proc.wait(timeout=900) == 0, log.read_text()[-3000:]
    want, got = _tensors(tmp_path / "reference"), _tensors(run_dir)
    assert got.keys() == want.keys()
    assert [k for k in want if not np.array_equal(want[k], got[k])] == []
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    for key in ("train/loss", "val/loss", "val/top1"):
        ref = [(m.step, m.value) for m in client.get_metric_history(
            (tmp_path / "reference" / RUN_ID_FILE).read_text().strip(), key)]
        res = [(m.step, m.value) for m in client.get_metric_history((run_dir / RUN_ID_FILE).read_text().strip(), key)]
        assert sorted(res) == sorted(ref) and [s for s, _ in ref] == [1, 2], key
