"""A sweep's design before it runs: arms × paired seeds, the time estimate and the noise memory from the store."""
from __future__ import annotations

import math
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.entities import Metric
from mlflow.tracking import MlflowClient
from scipy import stats

from swinexp.app.sweep_design import design_of, history_lines
from swinexp.tracking.noise import seed_noise
from tests.conftest import ROOT

CHOICES = {"experiment": "cifar10_micro", "model": "swin_micro", "data": "cifar10_folder"}
# an earlier sweep's val/top1 at epoch 2, arm -> seed -> value
EARLIER = {"amp=o0": {"0": 30.0, "1": 32.0, "2": 31.0}, "amp=o2": {"0": 30.5, "1": 32.1, "2": 31.6}}


def test_design_names_arms_and_paired_seeds_in_either_order_of_the_keys() -> None:
    named = design_of([["seed=0", "amp=o0"], ["seed=0", "amp=o2"], ["seed=1", "amp=o0"], ["seed=1", "amp=o2"]])
    typed = design_of([["amp=o0", "seed=0"], ["amp=o0", "seed=1"], ["amp=o2", "seed=0"], ["amp=o2", "seed=1"]])
    assert named == typed  # `sweep=amp_ablation seeds=2` and `-m amp=o0,o2 seed=0,1` are one design
    assert named.line() == "2 arms (amp=o0, amp=o2) x 2 paired seeds (0, 1) = 4 jobs"
    unpaired = design_of([["amp=o0", "seed=0"], ["amp=o2", "seed=1"]])
    assert not unpaired.paired and "not the same in every arm (unpaired)" in unpaired.line()
    assert design_of([["amp=o0"], ["amp=o2"]]).line() == "2 arms (amp=o0, amp=o2), one run each (the config's seed) " \
                                                         "= 2 jobs"


def _earlier_sweep(client: MlflowClient, exp: str, seconds: float, choices: dict[str, str] = CHOICES) -> None:
    parent = client.create_run(exp, run_name="sweep", tags={"sweep.role": "parent"}).info.run_id
    job = 0
    for seed in ("0", "1", "2"):
        for arm, values in EARLIER.items():
            tags = {"sweep.id": parent, "sweep.job": str(job), **{f"choice.{g}": v for g, v in choices.items()}}
            run = client.create_run(exp, run_name=f"{arm} seed={seed}", tags=tags, start_time=1_000_000)
            client.log_param(run.info.run_id, "trainer.epochs", "2")
            client.log_batch(run.info.run_id, metrics=[Metric("val/top1", values[seed] - 5, 0, 1),
                                                       Metric("val/top1", values[seed], 0, 2)])
            client.set_terminated(run.info.run_id, "FINISHED", end_time=1_000_000 + int(seconds * 1000))
            job += 1
    client.set_terminated(parent, "FINISHED")


def test_noise_memory_pools_the_seed_spread_and_the_paired_spread_of_earlier_sweeps(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    exp = client.create_experiment("swinexp")
    _earlier_sweep(client, exp, seconds=60.0)
    other = client.create_run(exp, run_name="amp=o0 seed=0", tags={"choice.experiment": "in1k"})  # another preset
    client.set_terminated(other.info.run_id, "FINISHED")

    runs = client.search_runs([exp], "tags.`choice.experiment` = 'cifar10_micro'")
    noise = seed_noise(client, runs, "val/top1", 2)
    within = [list(v.values()) for v in EARLIER.values()]
    sd = math.sqrt(sum(statistics.variance(v) for v in within) / 2)  # equal sizes: the mean of the variances
    diffs = [EARLIER["amp=o2"][s] - EARLIER["amp=o0"][s] for s in "012"]
    assert noise.sd == pytest.approx(sd) and noise.paired_sd == pytest.approx(statistics.stdev(diffs))
    assert (noise.sweeps, noise.runs) == (1, 6)

    design = design_of([[f"seed={s}", f"amp={a}"] for s in "012" for a in ("o0", "o2", "o1_manual")])
    lines = history_lines({"uri": uri, "experiment": "swinexp"}, tmp_path, CHOICES, design, 2, 2, "val/top1", 1)
    what = "experiment=cifar10_micro model=swin_micro data=cifar10_folder"
    assert lines[0] == (f"estimated wall time: ~9 min (9 jobs, 1 at a time, ~60 s each: 30 s per epoch x 2 epochs, "
                        f"the median of 6 earlier runs of {what})")
    assert f"gaps below ~{1.96 * math.sqrt(2) * sd:.1f} points cannot be told from noise" in lines[2]
    paired3 = stats.t.ppf(0.975, 2) * statistics.stdev(diffs) / math.sqrt(3)
    assert lines[3] == f"  3 paired seeds (this sweep) resolve gaps of ~{paired3:.1f} points (95% interval " \
                       f"±{paired3:.1f})"
    assert lines[4].startswith("  6 paired seeds resolve")


def test_no_earlier_runs_says_so_and_creates_no_store(tmp_path: Path) -> None:
    design = design_of([["amp=o0", "seed=0"], ["amp=o2", "seed=0"]])
    lines = history_lines({"uri": None, "experiment": "swinexp"}, tmp_path, CHOICES, design, 10, 10, "val/top1", 1)
    assert lines == [f"no earlier runs of experiment=cifar10_micro model=swin_micro data=cifar10_folder in sqlite:///"
                     f"{tmp_path}/mlflow.db: no time estimate, and the seed noise is unknown until this sweep's "
                     "report measures it"]
    assert not (tmp_path / "mlflow.db").exists()


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "run.py"), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=600)


@pytest.mark.slow
def test_a_dry_run_sweep_prints_its_design_from_the_store_and_logs_no_run(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    exp = client.create_experiment("swinexp")
    _earlier_sweep(client, exp, seconds=40.0, choices={"model": "swin_micro", "data": "synthetic"})  # the defaults
    out = _run("sweep=amp_ablation", "seeds=2", "dry_run=true", "trainer.epochs=2",
               f"tracking.uri={uri}", f"hydra.sweep.dir={tmp_path / 'multirun'}", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert ("sweep design: 3 arms (amp=o0, amp=o2, amp=o1_manual) x 2 paired seeds (0, 1) = 6 jobs; compared at "
            "epoch 2 (val/top1)\nestimated wall time: ~4 min (6 jobs, 1 at a time, ~40 s each: 20 s per epoch"
            ) in out.stdout
    assert "seed noise of val/top1 at epoch 2, from 1 earlier sweep(s)" in out.stdout
    assert len(client.search_runs([exp])) == 1 + 6  # the earlier sweep only: a dry run logs nothing


@pytest.mark.slow
def test_a_baseline_that_is_no_arm_stops_the_sweep_before_any_job(tmp_path: Path) -> None:
    out = _run("sweep=amp_ablation", "seeds=1", "sweep.baseline=o5", "tracking=none",
               f"hydra.sweep.dir={tmp_path / 'multirun'}", cwd=tmp_path)
    assert out.returncode == 2
    assert ("ConfigError: sweep.baseline: baseline 'o5' is not an arm of this sweep; choose one of: amp=o0, amp=o2, "
            "amp=o1_manual") in out.stderr
    assert not any((tmp_path / "multirun").glob("*/"))  # no job started


def test_seeds_without_a_named_sweep_is_refused_with_both_fixes(tmp_path: Path) -> None:
    out = _run("-m", "amp=o0,o2", "seeds=3", cwd=tmp_path)
    assert out.returncode == 1 and out.stderr.strip() == (
        "ConfigError: seeds=3 sets how many paired seeds each arm of a named sweep runs (e.g. python run.py "
        "sweep=amp_ablation seeds=3); for your own -m sweep list the seeds, e.g. seed=0,1,2")
    assert not (tmp_path / "multirun").exists()


def test_paired_differences_that_never_varied_are_said_so_not_as_a_zero_width(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    exp = client.create_experiment("swinexp")
    _earlier_sweep(client, exp, seconds=60.0)
    runs = client.search_runs([exp], "tags.`sweep.id` != ''")
    for run in runs:  # amp=o2 exactly 0.5 above amp=o0 on every seed
        seed = run.info.run_name.split("seed=")[1]
        value = EARLIER["amp=o0"][seed] + (0.5 if run.info.run_name.startswith("amp=o2") else 0)
        client.log_metric(run.info.run_id, "val/top1_at2", value, step=2)
    design = design_of([[f"seed={s}", f"amp={a}"] for s in "012" for a in ("o0", "o2")])
    lines = history_lines({"uri": uri, "experiment": "swinexp"}, tmp_path, CHOICES, design, 2, 2, "val/top1", 1)
    assert lines[1].endswith(", 0.00 for the paired difference of two arms")
    assert lines[-1].startswith("  the paired differences there were the same on every seed: 2 paired seeds")
    assert not any("resolve gaps of ~0.0" in line for line in lines)
