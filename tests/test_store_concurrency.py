"""Many processes, one sqlite store: creating it concurrently must not race MLflow's schema migration."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tests.conftest import ROOT

PROCESSES = 4
STEPS = 5
# Each process imports everything first, says it is ready, then waits for the "go" file, so that all of them open
# the new store at once (the moment a parallel sweep's first jobs, or several terminals, do).
JOB = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    import mlflow.store.tracking.sqlalchemy_store  # the slow imports, before the barrier
    from swinexp.tracking import MlflowTracker
    uri, barrier, name = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
    (barrier / name).touch()
    while not (barrier / "go").exists():
        time.sleep(0.005)
    tracker = MlflowTracker(uri, "race")
    tracker.start(name, {"job": name})
    tracker.log_params({"job": name})
    for step in range(1, {steps} + 1):
        tracker.log_metrics({{"loss": 1.0 / step, "acc": float(step)}}, step=step)
    tracker.close()
""").replace("{steps}", str(STEPS)).replace("{{", "{").replace("}}", "}")


@pytest.mark.slow
def test_four_processes_create_one_new_store_at_once(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    procs = [subprocess.Popen([sys.executable, "-c", JOB, uri, str(barrier), f"job{i}"], cwd=tmp_path, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for i in range(PROCESSES)]
    deadline = time.monotonic() + 120
    while len(list(barrier.iterdir())) < PROCESSES and time.monotonic() < deadline:
        time.sleep(0.05)
    (barrier / "go").touch()
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    failed = [(p.returncode, out[-1500:]) for p, out in zip(procs, outputs) if p.returncode != 0]
    assert not failed, failed

    client = MlflowClient(uri)  # the store opens cleanly afterwards, fully migrated
    runs = client.search_runs([client.get_experiment_by_name("race").experiment_id])
    assert sorted(r.data.tags["job"] for r in runs) == [f"job{i}" for i in range(PROCESSES)]
    for run in runs:
        assert run.info.status == "FINISHED"
        for key in ("loss", "acc"):
            assert [m.step for m in client.get_metric_history(run.info.run_id, key)] == list(range(1, STEPS + 1))
