"""Sweeps beyond one process at a time: parallel isolated jobs on disjoint devices, submitit, SLURM nodes.

Optuna searches (also parallel) are tested in test_search.py.

The slow tests run the real CLI (`python run.py -m ...`) with the real Hydra plugins into real MLflow sqlite stores
(two jobs writing at once, as they do in a parallel sweep).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import pytest
import yaml
from hydra import compose as compose_cfg
from hydra import initialize_config_dir
from mlflow.tracking import MlflowClient
from omegaconf import DictConfig

from swinexp.app.dry_run import dry_run_report
from swinexp.build import resolve
from swinexp.registry import ConfigError
from swinexp.runtime.devices import HCCS_GROUPS_910, DevicePool, Slot, devices_per_job, hccs_groups
from swinexp.runtime.slurm import expand_nodelist
from tests.conftest import CONF_DIR, ROOT, SMOKE


def _run(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "run.py"), *args], check=False, cwd=cwd, capture_output=True,
                          text=True, timeout=900, env=env)


def _smoke(data_root: Path) -> list[str]:
    """SMOKE with one epoch (so a constant LR: warm-up needs two) and tracking left to the test."""
    return [o for o in SMOKE if not o.startswith("tracking=")] + [f"data.root={data_root}", "trainer.epochs=1",
                                                                    "scheduler=constant"]


def _runs(uri: str, experiment: str = "swinexp") -> tuple[object, list]:
    """(parent run, child runs by job number) of the only sweep in `experiment`."""
    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    (parent,) = [r for r in runs if r.data.tags.get("sweep.role") == "parent"]
    children = sorted((r for r in runs if r is not parent), key=lambda r: int(r.data.tags["sweep.job"]))
    return parent, children


def test_nodelist_expands_ranges_lists_and_padding() -> None:
    assert expand_nodelist("node[01-02]") == ["node01", "node02"]
    assert expand_nodelist("cn[8-10,12],login1") == ["cn8", "cn9", "cn10", "cn12", "login1"]
    assert expand_nodelist("r[1-2]-n[08-09]") == ["r1-n08", "r1-n09", "r2-n08", "r2-n09"]


def test_a_job_needing_more_devices_than_it_may_have_is_refused_with_the_numbers() -> None:
    assert devices_per_job("CPU", 1, None, [0, 1, 2, 3], max_parallel=2) == 2  # an equal share of the cores
    assert devices_per_job("Ascend", 8, None, list(range(8)), max_parallel=1) == 8  # hardware.num_devices cards
    with pytest.raises(ConfigError, match=r"needs 4 Ascend card\(s\).*this host has 2: \[0, 1\]"):
        devices_per_job("Ascend", 4, None, [0, 1], max_parallel=1)
    with pytest.raises(ConfigError, match="hardware.num_devices=8 starts 8 workers.*devices_per_job=1"):
        devices_per_job("Ascend", 8, 1, list(range(8)), max_parallel=8)


def test_device_pool_hands_out_disjoint_sets_and_takes_them_back() -> None:
    pool = DevicePool("Ascend", [4, 5, 6, 7])
    first, second = pool.take(2), pool.take(2)
    assert first == Slot("Ascend", (4, 5)) and second == Slot("Ascend", (6, 7)) and pool.take(1) is None
    assert first.env() == {"ASCEND_RT_VISIBLE_DEVICES": "4,5"}
    assert Slot("GPU", (1,)).env() == {"CUDA_VISIBLE_DEVICES": "1"}
    assert Slot("CPU", (2, 3)).env() == {"OMP_NUM_THREADS": "2"}
    pool.give(second)
    assert pool.take(2) == second


def test_on_a_910_two_and_four_card_jobs_stay_inside_one_hccs_group() -> None:
    groups = hccs_groups("Ascend", "ascend910")
    assert groups == HCCS_GROUPS_910 == hccs_groups("Ascend", None)  # a chip not given may be a 910
    assert hccs_groups("Ascend", "ascend910b") is None and hccs_groups("GPU", None) is None
    pool = DevicePool("Ascend", range(8))
    one = pool.take(1, groups)
    pair = pool.take(2, groups)  # 1-2 (group {0-3} is the fullest that holds two), not 1-3 nor 3-4
    four = pool.take(4, groups)  # the whole free group {4-7}
    assert (one.devices, pair.devices, four.devices) == ((0,), (1, 2), (4, 5, 6, 7))
    assert pool.take(2, groups) is None and pool.free == [3]  # card 3 alone is free: no pair across the groups
    pool.give(four)
    assert pool.take(4, groups).devices == (4, 5, 6, 7)
    partial = DevicePool("Ascend", range(6))
    assert partial.take(2, groups).devices == (4, 5) and partial.take(4, groups).devices == (0, 1, 2, 3)  # packed
    crossing = DevicePool("Ascend", [2, 3, 4, 5])
    assert crossing.take(4, groups) is None and crossing.take(4).devices == (2, 3, 4, 5)  # a 910B: any four

    assert devices_per_job("Ascend", 4, None, range(8), max_parallel=2, groups=groups) == 4
    with pytest.raises(ConfigError, match=r"takes 3 cards, but its cards talk over HCCS in groups \{0-3\}, \{4-7\}: "
                                          r"a job uses 1, 2, 4, 8 cards"):
        devices_per_job("Ascend", 3, None, range(8), max_parallel=2, groups=groups)
    with pytest.raises(ConfigError, match=r"a job of 4 Ascend 910 cards must stay inside one HCCS group \{0-3\}, "
                                          r"\{4-7\}, but the cards to share out, \[2, 3, 4, 5\], hold no 4 in one"):
        devices_per_job("Ascend", 4, None, [2, 3, 4, 5], max_parallel=1, groups=groups)
    assert devices_per_job("Ascend", 4, None, [2, 3, 4, 5], max_parallel=1) == 4  # a 910B takes them


@pytest.mark.slow
def test_a_parallel_sweep_on_910_cards_gives_each_2_card_job_a_pair_inside_one_hccs_group(tmp_path: Path) -> None:
    out = _run("-m", "hardware=ascend", "hardware.num_devices=2", "seed=1,2", "dry_run=true", "tracking=none",
               "hydra.launcher.max_parallel=2", "hydra.launcher.devices=[3,4,5,6]",
               f"hydra.sweep.dir={tmp_path / 'multirun'}", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    records = [json.loads((tmp_path / "multirun" / str(n) / "launcher.json").read_text()) for n in (0, 1)]
    # [3, 4] and [5, 6] would each cross the {0-3}/{4-7} boundary: the second job waits for [4, 5] instead
    assert [r["devices"] for r in records] == [[4, 5], [4, 5]]
    assert records[0]["end"] <= records[1]["start"]


def test_multinode_dry_run_in_slurm_prints_each_nodes_msrun_command(
        compose: Callable[..., DictConfig], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SLURM_JOB_NODELIST", "ascend[07-08]")
    monkeypatch.setenv("SLURM_NODEID", "1")
    plan = resolve(compose("hardware=ascend8x2"), backend=False)
    hw = plan.hardware
    assert (hw.node_rank, hw.master_addr) == (1, "ascend07")  # from SLURM: not given on the command line
    report = dry_run_report(plan, ["hardware=ascend8x2"], tmp_path)
    node0, node1 = [line for line in report.splitlines() if line.strip().startswith("starts:")]
    for rank, line in enumerate((node0, node1)):
        assert f"--worker_num=16 --local_worker_num=8 --master_addr=ascend07 --master_port=8118 --node_rank={rank}" \
            in line
        # the package's own entry, whatever sys.argv[0] is (another launcher's, or a wheel without run.py)
        assert line.endswith(f"{ROOT / 'swinexp' / '__main__.py'} hardware=ascend8x2 hydra.run.dir={tmp_path}")
    assert "node 1 (this node)" in report and "SLURM_NODEID=1" in report
    given = compose("hardware=ascend8x2", "hardware.node_rank=0", "hardware.master_addr=10.0.0.1")
    assert (given.hardware.node_rank, given.hardware.master_addr) == (0, "10.0.0.1")  # the command line wins


@pytest.mark.slow
def test_parallel_jobs_overlap_on_disjoint_cores_and_get_the_config_dir(tmp_path: Path) -> None:
    # a user's own config dir with an experiment: every job must find it (-cd), not only the sweep process
    (tmp_path / "my_conf" / "experiment").mkdir(parents=True)
    (tmp_path / "my_conf" / "experiment" / "mine.yaml").write_text("# @package _global_\ntrainer:\n  epochs: 1\n")
    # and an option on hydra.searchpath
    (tmp_path / "searched" / "optimizer").mkdir(parents=True)
    (tmp_path / "searched" / "optimizer" / "adamw_slow.yaml").write_text("defaults: [adamw]\nlr: 1.0e-4\n")
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    out = _run("-m", "-cd", "my_conf", f"hydra.searchpath=[file://{tmp_path / 'searched'}]", "experiment=mine",
               "optimizer=adamw_slow", "seed=1,2", *_smoke(tmp_path / "data"), "tracking=mlflow",
               f"tracking.uri={uri}", "hydra.launcher.max_parallel=2", f"hydra.sweep.dir={tmp_path / 'multirun'}",
               cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]

    parent, children = _runs(uri)
    assert parent.info.run_name == "sweep seed=1,2" and parent.info.status == "FINISHED"
    assert [c.info.run_name for c in children] == ["seed=1", "seed=2"]
    for num, child in enumerate(children):
        assert child.info.status == "FINISHED" and child.data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert child.data.tags["choice.experiment"] == "mine" and child.data.params["optimizer.lr"] == "0.0001"
        job_dir = tmp_path / "multirun" / str(num)
        assert "val/top1" in json.loads((job_dir / "metrics.json").read_text())
        assert (job_dir / "job.out").is_file() and (job_dir / "run.log").is_file()  # each job logs in its dir
        env_set = yaml.safe_load((job_dir / ".hydra" / "hydra.yaml").read_text())["hydra"]["job"]["env_set"]
        assert env_set["SWINEXP_SWEEP_PARENT_RUN_ID"] == parent.info.run_id  # the parent id is in the job's config
    # both ran at once: each process started before the other ended, on cores of its own (not MLflow's run times:
    # those start after the imports, and a job sharing its core with other work can import longer than the other runs)
    records = [json.loads((tmp_path / "multirun" / str(n) / "launcher.json").read_text()) for n in (0, 1)]
    assert [r["cpu_affinity"] for r in records] == [r["devices"] for r in records] == [[0], [1]]
    assert max(r["start"] for r in records) < min(r["end"] for r in records)


@pytest.mark.slow
def test_a_job_asking_for_more_devices_than_the_host_has_fails_before_it_starts(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    out = _run("-m", "seed=1", *_smoke(tmp_path / "data"), "tracking=mlflow", f"tracking.uri={uri}",
               "hydra.launcher.max_parallel=2", "hydra.launcher.devices=[0,1]", "hydra.launcher.devices_per_job=3",
               f"hydra.sweep.dir={tmp_path / 'multirun'}", cwd=tmp_path)
    assert out.returncode != 0
    assert "the job needs 3 CPU core(s)" in out.stderr and "this host has 2: [0, 1]" in out.stderr, out.stderr[-3000:]
    parent, children = _runs(uri)
    assert parent.info.status == "FAILED" and children == []
    assert not (tmp_path / "multirun" / "0").exists()  # no process was started


@pytest.mark.slow
def test_submitit_local_sweep_lands_as_one_parent_and_two_children(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    out = _run("-m", "hydra/launcher=submitit_local", "seed=1,2", *_smoke(tmp_path / "data"), "tracking=mlflow",
               f"tracking.uri={uri}", f"hydra.sweep.dir={tmp_path / 'multirun'}", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    parent, children = _runs(uri)
    assert parent.info.run_name == "sweep seed=1,2" and parent.info.status == "FINISHED"
    assert [c.info.run_name for c in children] == ["seed=1", "seed=2"]
    for child in children:
        assert child.info.status == "FINISHED" and child.data.tags["mlflow.parentRunId"] == parent.info.run_id
    assert len({c.data.tags["pid"] for c in children}) == 2  # submitit ran each job in a process of its own
    assert list((tmp_path / "multirun" / ".submitit").iterdir())


@pytest.mark.slow
def test_a_failed_submitit_job_marks_the_parent_is_reported_and_fails_the_command(tmp_path: Path) -> None:
    # submitit runs each job, and Hydra's on_job_end for it, in a process of its own: the sweep's process learns of
    # the failure from the job's dir (job_failed.json), before the report is made and the parent closed
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    smoke = [o for o in _smoke(tmp_path / "data") if o != "trainer.epochs=1"]
    # the job processes import swinexp by name: this checkout's, not another the environment may have installed
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    out = _run("-m", "hydra/launcher=submitit_local", "trainer.epochs=0,1", *smoke, "tracking=mlflow",
               f"tracking.uri={uri}", f"hydra.sweep.dir={tmp_path / 'multirun'}", cwd=tmp_path, env=env)
    assert out.returncode != 0  # after the other job finished:
    parent, children = _runs(uri)
    assert [(c.info.run_name, c.info.status) for c in children] == [("trainer.epochs=0", "FAILED"),
                                                                     ("trainer.epochs=1", "FINISHED")]
    assert parent.info.status == "FAILED"
    (failed,) = parent.data.tags["sweep.failed_jobs"].splitlines()
    assert failed.startswith("#0 trainer.epochs=0: ConfigError:") and "trainer.epochs=0 must be >= 1" in failed
    assert "1 sweep job(s) failed" in out.stderr and failed in out.stderr
    # the report, printed and logged to the parent, lists it under its table
    assert f"Failed jobs:\n- {failed}" in out.stdout, out.stdout[-3000:]
    report = MlflowClient(uri).download_artifacts(parent.info.run_id, "report/report.md", str(tmp_path / "back"))
    assert "| trainer.epochs=1 |" in Path(report).read_text() and failed in Path(report).read_text()


@pytest.mark.slow
def test_sigterm_stops_every_running_job_and_marks_them_and_the_parent_killed(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    smoke = [o for o in _smoke(tmp_path / "data") if o != "trainer.epochs=1"]
    command = [sys.executable, str(ROOT / "run.py"), "-m", "seed=1,2", *smoke, "trainer.epochs=50",
               "trainer.checkpoint.every_n_steps=2", "tracking=mlflow", f"tracking.uri={uri}",
               "hydra.launcher.max_parallel=2", f"hydra.sweep.dir={tmp_path / 'multirun'}"]
    log = tmp_path / "sweep.log"  # a file, not a pipe: an unread pipe fills and blocks the sweep
    proc = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=log.open("w"))
    def both_checkpointed() -> bool:  # any step checkpoint: older ones are pruned (trainer.checkpoint.keep_last)
        return all(any((tmp_path / "multirun" / str(n) / "checkpoints").glob("step-*.ckpt")) for n in (0, 1))

    deadline = time.monotonic() + 600
    while not both_checkpointed() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert proc.poll() is None and both_checkpointed(), log.read_text()[-3000:]
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=300)
    assert proc.returncode != 0

    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("swinexp").experiment_id])
    assert {r.info.run_name: r.info.status for r in runs} == {
        "sweep seed=1,2": "KILLED", "seed=1": "KILLED", "seed=2": "KILLED"}, log.read_text()[-3000:]
    (parent,) = [r for r in runs if r.data.tags.get("sweep.role") == "parent"]
    assert "#0: stopped while running" in parent.data.tags["sweep.failed_jobs"]
    assert "#1: stopped while running" in parent.data.tags["sweep.failed_jobs"]


@pytest.mark.parametrize("preset,gres", [("slurm_ascend", "npu:8"), ("slurm_gpu", "gpu:8")])
def test_slurm_presets_are_submitit_slurm_launchers_with_the_cluster_keys(preset: str, gres: str) -> None:
    with initialize_config_dir(version_base="1.3", config_dir=str(CONF_DIR)):
        cfg = compose_cfg("config", overrides=[f"hydra/launcher={preset}", "hydra.launcher.partition=p"],
                          return_hydra_config=True)
    launcher = cfg.hydra.launcher
    assert launcher._target_ == "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher"
    assert (launcher.partition, launcher.gres, launcher.tasks_per_node) == ("p", gres, 1)
    assert launcher.array_parallelism > 0 and launcher.timeout_min > 0 and launcher.cpus_per_task > 0
