"""Sweeps through the real CLI (`-m`), into a real `mlflow server` on 127.0.0.1 started by the test."""
from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Callable

import pytest
import yaml
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser
from mlflow.tracking import MlflowClient
from omegaconf import DictConfig

from tests import servers
from tests.conftest import ROOT, SMOKE

pytestmark = pytest.mark.slow

# The jobs each named sweep must expand to (as `key=value` overrides).
def _seed_major(arms: list[str], seeds: range = range(3)) -> list[list[str]]:
    """A named sweep's jobs: every arm on each of its `seeds` paired seeds, seed-major (the default seeds=3)."""
    return [[f"seed={s}", arm] for s in seeds for arm in arms]


EXPECTED_JOBS = {
    "accumulation": _seed_major([f"trainer.accumulation_steps={n}" for n in (1, 2, 4)]),
    "amp_ablation": _seed_major(["amp=o0", "amp=o2", "amp=o1_manual"]),
    "finetune_ablation": _seed_major([f"optimizer.layer_decay={d}" for d in (1.0, 0.9, 0.75)]),
    "index_rewrites": _seed_major([f"model/rewrites={r}" for r in ("official", "qkv_split", "qkv_fused_split",
                                                                   "merge_reshape", "bias_onehot", "all")]),
    "pipeline_ablation": _seed_major(["data.pipeline=exact", "data.pipeline=native"]),
    "seeds": [[f"seed={s}"] for s in range(5)],
}


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with servers.mlflow_server(tmp_path_factory.mktemp("mlflow_server")) as url:
        yield url


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "run.py"), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=900)


def _smoke(data_root: Path) -> list[str]:
    kept = [o for o in SMOKE if not o.startswith(("tracking=", "amp="))]
    return [*kept, f"data.root={data_root}", "trainer.epochs=2"]


def test_every_sweep_file_is_known() -> None:
    assert sorted(p.stem for p in (ROOT / "sweeps").glob("*.yaml")) == sorted(EXPECTED_JOBS)


def _jobs_of(*args: str, cwd: Path) -> list[list[str]]:
    """The jobs (as `key=value` overrides) the sweeper makes of the named sweep's params, as Hydra resolves them."""
    out = _run(*args, "--cfg", "all", "--resolve", cwd=cwd)
    assert out.returncode == 0, out.stderr
    hydra_cfg = yaml.safe_load(out.stdout)["hydra"]
    assert hydra_cfg["mode"] == "MULTIRUN"
    params = [f"{k}={v}" for k, v in hydra_cfg["sweeper"]["params"].items()]
    (jobs,) = BasicSweeper.split_arguments(OverridesParser.create().parse_overrides(params), max_batch_size=None)
    return [list(job) for job in jobs]


def test_seeds_sets_how_many_paired_seeds_each_arm_of_a_named_sweep_runs(tmp_path: Path) -> None:
    assert _jobs_of("sweep=amp_ablation", "seeds=2", cwd=tmp_path) == _seed_major(
        ["amp=o0", "amp=o2", "amp=o1_manual"], range(2))
    assert _jobs_of("sweep=accumulation", "seeds=1", cwd=tmp_path) == _seed_major(
        [f"trainer.accumulation_steps={n}" for n in (1, 2, 4)], range(1))


@pytest.mark.parametrize("sweep", sorted(EXPECTED_JOBS))
def test_named_sweep_expands_to_jobs_that_compose(sweep: str, tmp_path: Path,
                                                  compose: Callable[..., DictConfig]) -> None:
    jobs = _jobs_of(f"sweep={sweep}", cwd=tmp_path)
    assert jobs == EXPECTED_JOBS[sweep]
    for job in jobs:
        cfg = compose(f"sweep={sweep}", *job, smoke=False)  # every job composes (the options exist)
        if sweep == "accumulation":  # the total batch stays at 64
            assert cfg.data.batch_size * cfg.trainer.accumulation_steps == 64


def test_sweep_logs_a_parent_and_named_children_to_a_server(mlflow_server: str, tmp_path: Path) -> None:
    out = _run("-m", "amp=o0,o2", *_smoke(tmp_path / "data"), "tracking=mlflow", f"tracking.uri={mlflow_server}",
               "tracking.experiment=sweep", f"hydra.sweep.dir={tmp_path / 'multirun'}", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]

    client = MlflowClient(mlflow_server)
    runs = client.search_runs([client.get_experiment_by_name("sweep").experiment_id])
    (parent,) = [r for r in runs if r.data.tags.get("sweep.role") == "parent"]
    children = sorted((r for r in runs if r is not parent), key=lambda r: int(r.data.tags["sweep.job"]))
    assert parent.info.run_name == "sweep amp=o0,o2" and parent.info.status == "FINISHED"
    assert parent.data.params["sweep.definition"] == "amp=o0,o2"
    assert [c.info.run_name for c in children] == ["amp=o0", "amp=o2"]
    for child in children:
        assert child.info.status == "FINISHED"
        assert child.data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert child.data.tags["sweep.id"] == parent.info.run_id and child.data.tags["sweep.keys"] == "amp"
        assert [m.step for m in client.get_metric_history(child.info.run_id, "val/top1")] == [1, 2]
    assert children[1].data.params["amp.name"] == "o2"
    # tracking.log_checkpoints=best (the default): each job's best checkpoint is on the server, byte for byte,
    # and system metrics reached it from the job's own process
    for num, child in enumerate(children):
        assert [a.path for a in client.list_artifacts(child.info.run_id, "checkpoints")] == ["checkpoints/best.ckpt"]
        got = client.download_artifacts(child.info.run_id, "checkpoints/best.ckpt", str(tmp_path / f"back{num}"))
        assert Path(got).read_bytes() == (tmp_path / "multirun" / str(num) / "checkpoints" / "best.ckpt").read_bytes()
        assert "system/cpu_utilization_percentage" in child.data.metrics
        assert child.data.tags["swinexp.run_dir"] == str(tmp_path / "multirun" / str(num))
    # hydra/launcher=isolated (the default): each job ran in a process of its own, as a single run in its subdir
    assert len({c.data.tags["pid"] for c in children}) == 2
    for num in (0, 1):
        job_hydra = yaml.safe_load((tmp_path / "multirun" / str(num) / ".hydra" / "hydra.yaml").read_text())["hydra"]
        assert job_hydra["mode"] == "RUN" and job_hydra["run"]["dir"] == str(tmp_path / "multirun" / str(num))


@pytest.mark.parametrize("launcher", ["isolated", "basic"])
def test_failing_job_is_recorded_and_the_sweep_goes_on(launcher: str, tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    out = _run("-m", "trainer.epochs=0,2", f"hydra/launcher={launcher}",
               *[o for o in _smoke(tmp_path / "data") if o != "trainer.epochs=2"],
               "tracking=mlflow", f"tracking.uri={uri}", f"hydra.sweep.dir={tmp_path / 'multirun'}", cwd=tmp_path)
    assert out.returncode != 0
    assert "trainer.epochs=0 must be >= 1" in out.stderr, out.stderr[-3000:]

    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("swinexp").experiment_id])
    status = {r.info.run_name: r.info.status for r in runs}
    assert status == {"sweep trainer.epochs=0,2": "FAILED", "trainer.epochs=0": "FAILED",
                      "trainer.epochs=2": "FINISHED"}
    (parent,) = [r for r in runs if r.data.tags.get("sweep.role") == "parent"]
    assert "#0 trainer.epochs=0" in parent.data.tags["sweep.failed_jobs"]
    assert "1 sweep job(s) failed" in out.stderr
    # the sweep still ends with its report, which lists the failed job under the table
    assert "| trainer.epochs=2 | " in out.stdout and "Failed jobs:\n- #0 trainer.epochs=0" in out.stdout, out.stdout


def test_deterministic_jobs_share_one_process_on_the_basic_launcher(tmp_path: Path) -> None:
    # MindSpore takes set_deterministic once per process: the second job must neither crash nor silently differ
    out = _run("-m", "seed=1,2", "trainer.deterministic=true", "hydra/launcher=basic", "tracking=none",
               *[o for o in _smoke(tmp_path / "data") if o != "trainer.epochs=2"], "trainer.epochs=1",
               f"hydra.sweep.dir={tmp_path / 'multirun'}", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert all((tmp_path / "multirun" / str(num) / "metrics.json").is_file() for num in (0, 1))
    code = ("from swinexp.runtime.hardware import set_deterministic\n"
            "set_deterministic(True)\nset_deterministic(False)\n")
    refused = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert refused.returncode != 0
    assert "ConfigError: trainer.deterministic=false, but an earlier job in this process" in refused.stderr


def test_sigterm_stops_the_sweep_and_marks_parent_and_job_killed(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    command = [sys.executable, str(ROOT / "run.py"), "-m", "seed=1,2",
               *[o for o in _smoke(tmp_path / "data") if o != "trainer.epochs=2"], "trainer.epochs=50",
               "trainer.checkpoint.every_n_steps=2", "tracking=mlflow", f"tracking.uri={uri}",
               f"hydra.sweep.dir={tmp_path / 'multirun'}"]
    log = tmp_path / "sweep.log"  # a file, not a pipe: an unread pipe fills and blocks the sweep
    proc = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=log.open("w"))
    first = tmp_path / "multirun" / "0" / "checkpoints" / "step-00000002.ckpt"
    deadline = time.monotonic() + 600
    while not first.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert proc.poll() is None and first.exists(), log.read_text()[-3000:]
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=300)
    stderr = log.read_text()
    assert proc.returncode != 0

    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("swinexp").experiment_id])
    assert {r.info.run_name: r.info.status for r in runs} == {"sweep seed=1,2": "KILLED", "seed=1": "KILLED"}, stderr
    assert not (tmp_path / "multirun" / "1").exists()  # the sweep stopped: the second job never started


def test_named_sweep_screens_and_its_documented_command_continues_a_child(tmp_path: Path) -> None:
    uri, sweep_dir = f"sqlite:///{tmp_path}/mlflow.db", tmp_path / "multirun"
    # amp=o0 and seeds=1 on the command line replace the sweep's three values and seeds: one job; stopped after
    # epoch 1 of 2
    out = _run("sweep=amp_ablation", "amp=o0", "seeds=1", *_smoke(tmp_path / "data"), "trainer.stop_after_epoch=1",
               "tracking=mlflow", f"tracking.uri={uri}", f"hydra.sweep.dir={sweep_dir}", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    # the job did not sweep again: one job dir, beside the sweep's report
    assert sorted(p.name for p in sweep_dir.iterdir() if p.is_dir()) == ["0", "report"]
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("swinexp").experiment_id
    (child,) = client.search_runs([experiment], "tags.`sweep.job` = '0'")
    assert child.info.status == "FINISHED" and child.data.tags["stopped_after_epoch"] == "1"
    (parent,) = client.search_runs([experiment], "tags.`sweep.role` = 'parent'")
    assert parent.info.run_name == "sweep seed=0"  # the seeds the named sweep resolved to, as values
    assert [m.step for m in client.get_metric_history(child.info.run_id, "val/top1")] == [1]

    # the command the sweep files give: the job's overrides + stop null, hydra.mode=RUN, its run dir
    job_dir = sweep_dir / "0"
    overrides = [str(o) for o in yaml.safe_load((job_dir / "overrides.yaml").read_text())]
    assert "sweep=amp_ablation" in overrides and "amp=o0" in overrides
    out = _run(*overrides, "trainer.stop_after_epoch=null", "hydra.mode=RUN", f"hydra.run.dir={job_dir}",
               cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    runs = client.search_runs([experiment])
    assert len(runs) == 2  # the parent and the one child, continued in place
    continued = client.get_run(child.info.run_id)
    assert continued.info.status == "FINISHED" and "stopped_after_epoch" not in continued.data.tags
    assert [m.step for m in client.get_metric_history(child.info.run_id, "val/top1")] == [1, 2]


def test_paired_sweep_logs_each_jobs_screening_value_and_the_parents_gaps(tmp_path: Path) -> None:
    # 2 arms x 2 seeds on one process (basic launcher: the cheapest real sweep); epoch 1 is the screening epoch
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    out = _run("-m", "optimizer.lr=1e-3,3e-3", "seed=1,2", "hydra/launcher=basic", "trainer.epochs=1",
               *[o for o in _smoke(tmp_path / "data") if o != "trainer.epochs=2"], "amp=o0", "tracking=mlflow",
               f"tracking.uri={uri}", f"hydra.sweep.dir={tmp_path / 'multirun'}", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]

    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("swinexp").experiment_id])
    (parent,) = [r for r in runs if r.data.tags.get("sweep.role") == "parent"]
    jobs = {r.info.run_name: r for r in runs if r is not parent}
    assert sorted(jobs) == ["optimizer.lr=0.001 seed=1", "optimizer.lr=0.001 seed=2", "optimizer.lr=0.003 seed=1",
                            "optimizer.lr=0.003 seed=2"]
    for job in jobs.values():  # the value at the screening epoch, under its own name
        assert job.data.metrics["val/top1_at1"] == client.get_metric_history(job.info.run_id, "val/top1")[0].value
    gap = {k: v for k, v in parent.data.metrics.items() if k.startswith("gap/")}
    assert sorted(gap) == ["gap/0.003-0.001_at1", "gap/0.003-0.001_at1_hi", "gap/0.003-0.001_at1_lo"]
    top1 = {name: job.data.metrics["val/top1_at1"] for name, job in jobs.items()}
    paired = [top1[f"optimizer.lr=0.003 seed={s}"] - top1[f"optimizer.lr=0.001 seed={s}"] for s in (1, 2)]
    assert gap["gap/0.003-0.001_at1"] == pytest.approx(sum(paired) / 2)
    assert gap["gap/0.003-0.001_at1_lo"] <= gap["gap/0.003-0.001_at1"] <= gap["gap/0.003-0.001_at1_hi"]
    assert parent.data.tags["verdict/0.003-0.001_at1"].split(" (gap ")[0].split(":")[0] in (
        "real", "equal within ±0.5", "undecided")
    # the report the sweep printed opens with the verdict, before the runs' table
    assert out.stdout.index("## Verdicts: val/top1 at epoch 1, each arm against optimizer.lr=0.001") \
        < out.stdout.index("| run |"), out.stdout
    assert "| optimizer.lr=0.003 − optimizer.lr=0.001 | 2 (1, 2) | " in out.stdout
