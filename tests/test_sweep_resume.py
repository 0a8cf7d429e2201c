"""A sweep whose own process died continues when its command is rerun: finished jobs are kept as they are,
interrupted ones continue from their checkpoints (ending bit-identical to an uninterrupted sweep's), missing ones
start, all under the one MLflow parent; a second command on a running sweep, and a rerun that would change the
sweep's results, are refused. Through the real CLI (`-m`)."""
from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import mindspore as ms
import numpy as np
import pytest
from mlflow.tracking import MlflowClient

from swinexp.app.sweep_identity import identity_of
from swinexp.app.sweep_record import SweepRecord, differences
from swinexp.engine import checkpoint
from swinexp.engine.resume import RUN_ID_FILE
from tests.conftest import ROOT, SMOKE

SWEEP = "optimizer.lr=1e-3,2e-3,3e-3,4e-3"  # 4 arms: the report has a row for each job
# 12 steps an epoch, a checkpoint every 2: a job stopped at its first checkpoint has most of its work left
TRAIN = [o for o in SMOKE if o != "tracking=none"] + [
    "trainer.limit_train_batches=12", "trainer.checkpoint.every_n_steps=2", "trainer.deterministic=true",
    "tracking=mlflow"]
FIRST_CHECKPOINT = "step-00000002.ckpt"
SERIES = ("train/loss", "train/grad_norm", "lr", "val/loss", "val/top1", "val/top5", "val/top1_best")


def _command(data_root: Path, db: Path, *extra: str) -> list[str]:
    return [sys.executable, str(ROOT / "run.py"), "-m", SWEEP, *TRAIN, f"data.root={data_root}",
            f"tracking.uri=sqlite:///{db}", *extra]


def _run(command: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=900)


def _sweep_dir(cwd: Path) -> Path:
    (found,) = (cwd / "multirun").iterdir()
    return found


def _wait(done: Callable[[], bool], proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + 600
    while not done() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert proc.poll() is None and done(), log.read_text()[-3000:]


def _files(job_dir: Path) -> dict[str, tuple[int, bytes]]:
    """Every file of a run dir: its mtime and its bytes."""
    return {str(p.relative_to(job_dir)): (p.stat().st_mtime_ns, p.read_bytes()) for p in job_dir.rglob("*")
            if p.is_file()}


def _tensors(job_dir: Path) -> dict[str, np.ndarray]:
    values = checkpoint.read(job_dir / "checkpoints" / "last.ckpt")
    return {k: v.asnumpy() for k, v in values.items() if isinstance(v, ms.Parameter | ms.Tensor)}


def _assert_same_as(reference: Path, job_dir: Path) -> None:
    want, got = _tensors(reference), _tensors(job_dir)
    assert got.keys() == want.keys()
    different = [k for k in got if not np.array_equal(got[k], want[k])]
    assert not different, f"{job_dir.name}: {len(different)} tensors differ from the uninterrupted sweep's"
    metrics = {p: json.loads((p / "metrics.json").read_text()) for p in (reference, job_dir)}
    assert {k: metrics[job_dir][k] for k in SERIES} == {k: metrics[reference][k] for k in SERIES}


def _run_ids(sweep_dir: Path) -> dict[int, str]:
    return {int(p.parent.name): p.read_text().strip() for p in sweep_dir.glob(f"*/{RUN_ID_FILE}")}


def _assert_one_parent_with_its_four_jobs(db: Path, sweep_dir: Path, run_ids: dict[int, str]) -> None:
    """One parent, FINISHED, with the 4 jobs as children, each job (of `run_ids`) still in the MLflow run it had."""
    client = MlflowClient(f"sqlite:///{db}")
    runs = client.search_runs([client.get_experiment_by_name("swinexp").experiment_id])
    (parent,) = [r for r in runs if r.data.tags.get("sweep.role") == "parent"]
    children = {int(r.data.tags["sweep.job"]): r for r in runs if r is not parent}
    assert parent.info.status == "FINISHED" and "sweep.failed_jobs" not in parent.data.tags
    assert sorted(children) == [0, 1, 2, 3] and len(runs) == 5
    assert {n: children[n].info.run_id for n in run_ids} == run_ids
    for child in children.values():
        assert child.info.status == "FINISHED" and child.data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert [m.step for m in client.get_metric_history(child.info.run_id, "val/top1")] == [1, 2]  # logged once
    with (sweep_dir / "report" / "report.csv").open() as f:
        assert len(list(csv.DictReader(f))) == 4  # the report covers every job, whichever command ran it


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory, synthetic_root: Path) -> Path:
    cwd = tmp_path_factory.mktemp("uninterrupted")
    out = _run(_command(synthetic_root, cwd / "mlflow.db", "hydra.launcher.max_parallel=2"), cwd)
    assert out.returncode == 0, out.stderr[-3000:]
    return _sweep_dir(cwd)


@pytest.mark.slow
def test_a_killed_sweep_continues_when_its_command_is_rerun(uninterrupted: Path, tmp_path: Path,
                                                            synthetic_root: Path) -> None:
    # the isolated launcher, 2 jobs at a time: jobs 2 and 3 are stalled (SIGSTOP) at their first checkpoint, after
    # jobs 0 and 1 ended; then the sweep's process and its jobs die at once (SIGKILL to the process group)
    command, log = _command(synthetic_root, tmp_path / "mlflow.db", "hydra.launcher.max_parallel=2"), tmp_path / "1.log"
    proc = subprocess.Popen(command, cwd=tmp_path, stdout=log.open("w"), stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        _wait(lambda: (tmp_path / "multirun").is_dir() and any((tmp_path / "multirun").iterdir()), proc, log)
        sweep_dir, stalled, deadline = _sweep_dir(tmp_path), set(), time.monotonic() + 600
        while stalled != {2, 3} and proc.poll() is None and time.monotonic() < deadline:
            for num in {2, 3} - stalled:
                if (sweep_dir / str(num) / "checkpoints" / FIRST_CHECKPOINT).is_file():
                    os.kill(json.loads((sweep_dir / str(num) / "launcher.json").read_text())["pid"], signal.SIGSTOP)
                    stalled.add(num)
            time.sleep(0.02)
        assert stalled == {2, 3}, log.read_text()[-3000:]
        done = {n for n in range(4) if (sweep_dir / str(n) / "metrics.json").is_file()}
        assert done == {0, 1}, f"jobs {done} had finished (a job must be stalled before it ends)"
        # a second command on the running sweep is refused, and leaves it alone
        second = _run(command, tmp_path)
        assert second.returncode != 0 and "is being run by another command (pid" in second.stderr, second.stderr
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    assert sweep_dir.name.startswith("optimizer.lr-") and sweep_dir.name == uninterrupted.name  # named by the command
    finished, run_ids = {n: _files(sweep_dir / str(n)) for n in (0, 1)}, _run_ids(sweep_dir)
    assert sorted(run_ids) == [0, 1, 2, 3]

    out = _run(command, tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert (f"sweep {sweep_dir.relative_to(tmp_path)}: 4 jobs: 2 kept (finished earlier: #0 #1), 2 to resume from "
            "checkpoints (#2 #3), 0 to start") in out.stdout, out.stdout[-3000:]
    assert {n: _files(sweep_dir / str(n)) for n in (0, 1)} == finished  # not run again: not a file touched
    for num in (2, 3):
        assert "resumed from" in (sweep_dir / str(num) / "job.out").read_text()
        _assert_same_as(uninterrupted / str(num), sweep_dir / str(num))
    _assert_one_parent_with_its_four_jobs(tmp_path / "mlflow.db", sweep_dir, run_ids)
    assert json.loads((sweep_dir / "sweep.json").read_text())["attempts"] == 2


@pytest.mark.slow
def test_a_killed_sweep_on_the_basic_launcher_continues_when_its_command_is_rerun(
        uninterrupted: Path, tmp_path: Path, synthetic_root: Path) -> None:
    # hydra/launcher=basic runs the jobs one after another in the sweep's process: killed in job 2
    command, log = _command(synthetic_root, tmp_path / "mlflow.db", "hydra/launcher=basic"), tmp_path / "1.log"
    proc = subprocess.Popen(command, cwd=tmp_path, stdout=log.open("w"), stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        _wait(lambda: any((tmp_path / "multirun").glob(f"*/2/checkpoints/{FIRST_CHECKPOINT}")), proc, log)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    sweep_dir = _sweep_dir(tmp_path)
    assert {n for n in range(4) if (sweep_dir / str(n) / "metrics.json").is_file()} == {0, 1}
    assert not (sweep_dir / "3").exists()
    finished, run_ids = {n: _files(sweep_dir / str(n)) for n in (0, 1)}, _run_ids(sweep_dir)
    assert sorted(run_ids) == [0, 1, 2]

    out = _run(command, tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert ("4 jobs: 2 kept (finished earlier: #0 #1), 1 to resume from checkpoints (#2), 1 to start (#3)"
            in out.stdout), out.stdout[-3000:]
    assert {n: _files(sweep_dir / str(n)) for n in (0, 1)} == finished
    for num in (2, 3):
        _assert_same_as(uninterrupted / str(num), sweep_dir / str(num))
    _assert_one_parent_with_its_four_jobs(tmp_path / "mlflow.db", sweep_dir, run_ids)


def test_a_sweep_is_named_by_its_overrides_whatever_their_order_spelling_or_logging() -> None:
    sweep = identity_of(["optimizer.lr=1e-3,2e-3", "seed=1", "tracking.uri=sqlite:///a.db", "debug.park_at=x:1",
                         "trainer.stop_after_epoch=1", "sweep.fresh=true"], None)
    assert sweep == identity_of(["seed=1", "optimizer.lr=0.001,0.002"], None)
    assert sweep.dir_name == f"optimizer.lr-{sweep.digest}" and len(sweep.digest) == 8
    assert identity_of(["optimizer.lr=2e-3,1e-3", "seed=1"], None) != sweep  # other job numbers
    assert identity_of(["optimizer.lr=1e-3,2e-3", "seed=2"], None).digest != sweep.digest
    named = identity_of(["sweep=amp_ablation", "seeds=3"], {"seed": "range(0,3)", "amp": "o0,o2"})
    assert named.name == "amp_ablation"
    assert named != identity_of(["sweep=amp_ablation", "seeds=3"], {"seed": "range(0,3)", "amp": "o0,o2,o1_manual"})
    assert identity_of(["amp=o2"], {"amp": "o0,o2"}) == identity_of(["amp=o2"], None)  # the command line wins
    # seeds= counts through the seed values it gives the named sweep: the default typed out is the same sweep
    assert named == identity_of(["sweep=amp_ablation"], {"seed": "range(0,3)", "amp": "o0,o2"})
    assert named != identity_of(["sweep=amp_ablation", "seeds=2"], {"seed": "range(0,2)", "amp": "o0,o2"})


def test_the_same_overrides_numbering_the_jobs_otherwise_are_a_difference_and_new_keys_are_not() -> None:
    def record(jobs: list[list[str]], **config: object) -> SweepRecord:
        return SweepRecord(["a=1,2", "b=3,4"], [], {"trainer.epochs": 2, **config}, {"amp": "o0"}, jobs)

    saved = record([["a=1", "b=3"], ["a=1", "b=4"], ["a=2", "b=3"], ["a=2", "b=4"]])
    assert differences(saved, record(saved.jobs, **{"trainer.new_key": 1.5, "tracking.uri": "x"})) == []
    reordered = record([["a=1", "b=3"], ["a=2", "b=3"], ["a=1", "b=4"], ["a=2", "b=4"]])
    assert differences(saved, reordered) == ["job #1: it ran a=1 b=4; this command numbers a=2 b=3 #1",
                                              "job #2: it ran a=2 b=3; this command numbers a=1 b=4 #2"]
    assert differences(saved, record(saved.jobs, **{"trainer.epochs": 3})) == ["trainer.epochs: 2 -> 3"]


@pytest.mark.slow
def test_a_rerun_that_would_change_the_results_is_refused_and_fresh_starts_anew(tmp_path: Path,
                                                                              synthetic_root: Path) -> None:
    # dry runs on the basic launcher: what is refused is decided before any job runs
    user = tmp_path / "myconf" / "trainer"
    user.mkdir(parents=True)
    (user / "mine.yaml").write_text("defaults:\n  - smoke\n  - _self_\n\nepochs: 2\n")
    command = [sys.executable, str(ROOT / "run.py"), "-m", "-cd", str(tmp_path / "myconf"), "optimizer.lr=1e-3,2e-3",
               *[o for o in SMOKE if not o.startswith("trainer=")], "trainer=mine", f"data.root={synthetic_root}",
               "hydra/launcher=basic", "dry_run=true"]
    assert _run(command, tmp_path).returncode == 0
    sweep_dir = _sweep_dir(tmp_path)
    record = (sweep_dir / "sweep.json").read_text()

    (user / "mine.yaml").write_text("defaults:\n  - smoke\n  - _self_\n\nepochs: 3\n")  # the same command, now 3
    out = _run(command, tmp_path)
    assert out.returncode != 0
    assert "cannot be continued" in out.stderr and "\n  trainer.epochs: 2 -> 3\n" in out.stderr, out.stderr[-3000:]
    assert "sweep.fresh=true" in out.stderr and (sweep_dir / "sweep.json").read_text() == record
    out = _run([*command, f"hydra.sweep.dir={sweep_dir}", "optimizer.weight_decay=0.1"], tmp_path)
    assert out.returncode != 0 and "holds the sweep of another command" in out.stderr
    assert "this one gives optimizer.weight_decay=0.1" in out.stderr, out.stderr[-3000:]

    out = _run([*command, "sweep.fresh=true"], tmp_path)  # a new generation of the sweep's dir ...
    assert out.returncode == 0, out.stderr[-3000:]
    fresh = sweep_dir.with_name(sweep_dir.name + ".2")
    assert f"sweep {fresh.relative_to(tmp_path)}: 2 jobs: 0 kept, 0 to resume from checkpoints, 2 to start" \
        in out.stdout
    out = _run(command, tmp_path)  # ... which the plain command continues from then on
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"sweep {fresh.relative_to(tmp_path)}: 2 jobs" in out.stdout
    assert json.loads((fresh / "sweep.json").read_text())["attempts"] == 2


@pytest.mark.slow
def test_a_screened_sweep_rerun_with_a_later_stop_continues_every_job_in_its_run(tmp_path: Path,
                                                                                 synthetic_root: Path) -> None:
    # trainer.stop_after_epoch is not part of a sweep's identity: the same sweep, its screens continued
    command = [sys.executable, str(ROOT / "run.py"), "-m", "optimizer.lr=1e-3,2e-3", *TRAIN,
               "trainer.limit_train_batches=3", f"data.root={synthetic_root}", "hydra/launcher=basic",
               f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}"]
    assert _run([*command, "trainer.stop_after_epoch=1"], tmp_path).returncode == 0
    out = _run([*command, "trainer.stop_after_epoch=null"], tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "2 jobs: 0 kept, 2 to resume from checkpoints (#0 #1), 0 to start" in out.stdout, out.stdout[-3000:]
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("swinexp").experiment_id])
    jobs = [r for r in runs if r.data.tags.get("sweep.role") != "parent"]
    assert len(runs) == 3 and len(jobs) == 2
    for job in jobs:  # each screen continued in its own run, to the end of its schedule
        assert [m.step for m in client.get_metric_history(job.info.run_id, "val/top1")] == [1, 2]
        assert "stopped_after_epoch" not in job.data.tags
