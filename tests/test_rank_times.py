"""Per-rank step times and stragglers (engine/rank_times.py): the rule on written interval files, and real 2-worker
CPU runs (`hardware=cpu2`) whose rank 1 is slowed on purpose (tests/fixtures/slow_rank.py) or not."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from swinexp.build import check_trainer
from swinexp.config import TrainerCfg
from swinexp.engine.rank_times import STRAGGLER_TAG, StepClock, StragglerWatch, rank_file
from swinexp.registry import ConfigError
from tests.conftest import ROOT, SMOKE
from tests.servers import free_port


class Tags:
    """A tracker that keeps only the tags it is given."""

    def __init__(self) -> None:
        self.tags: dict[str, str] = {}

    def set_tags(self, tags: dict[str, str]) -> None:
        self.tags.update(tags)


def _write(run_dir: Path, rank: int, *lines: tuple[int, int, float, float]) -> None:
    path = rank_file(run_dir, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as out:
        out.writelines(f"{e}\t{s}\t{wall}\t{wait}\n" for e, s, wall, wait in lines)


def test_a_rank_that_waits_least_keeps_the_whole_step(tmp_path: Path) -> None:
    """Synchronous steps: every rank's wall time is the same; what a rank waited beyond the least-waiting rank was
    spent waiting for others, and comes off its step time."""
    for rank, wait in enumerate((350.0, 50.0, 340.0)):  # rank 1's host took 300 ms more per step
        _write(tmp_path, rank, (0, 1, 500.0, wait), (0, 2, 500.0, wait))
    watch = StragglerWatch(tmp_path, 3, factor=1.5, patience=3, tracker=Tags())
    assert watch.end_epoch() == {"rank/step_ms_0": 200.0, "rank/step_ms_1": 500.0, "rank/step_ms_2": 210.0}
    assert watch.end_epoch() == {}  # an epoch with no interval logs nothing


def test_a_straggler_is_flagged_after_patience_read_points_in_a_row(tmp_path: Path,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    tags = Tags()
    watch = StragglerWatch(tmp_path, 2, factor=1.5, patience=3, tracker=tags)
    slow, even = (400.0, 100.0), (100.0, 100.0)  # (rank 0's, rank 1's) wait of a 500 ms step
    for step, waits in enumerate([slow, slow, even, slow, slow], start=1):  # an even step resets the count
        for rank, wait in enumerate(waits):
            _write(tmp_path, rank, (0, step, 500.0, wait))
        watch.poll()
    assert watch.flagged == [] and tags.tags == {} and not caplog.records
    _write(tmp_path, 0, (0, 6, 500.0, 400.0))
    watch.poll()
    assert watch.flagged == [] and not caplog.records  # rank 1's line for step 6 is not there yet: not judged
    _write(tmp_path, 1, (0, 6, 500.0, 100.0))
    with open(rank_file(tmp_path, 1), "a") as out:
        out.write("0\t7\t500")  # a line still being written is left for the next poll
    watch.poll()
    assert watch.flagged == [1] and tags.tags == {STRAGGLER_TAG: "1"}
    (record,) = caplog.records
    assert "rank 1 is a straggler: 500.0 ms per step against the other ranks' median 200.0 ms" in record.getMessage()
    assert "3 read points in a row" in record.getMessage() and "optimizer step 6" in record.getMessage()


def test_the_step_clock_counts_what_the_host_waited_and_skips_compiles(tmp_path: Path) -> None:
    path = tmp_path / "rank_times" / "rank1.tsv"
    clock = StepClock(path)
    with clock.waiting():
        pass
    clock.exclude()
    clock.mark(0, 2, optimizer_steps=2)  # compiled: no line
    clock.mark(0, 3, optimizer_steps=0)  # no optimizer step (accumulating): no line
    with clock.waiting():
        time.sleep(0.05)
    clock.mark(0, 5, optimizer_steps=2)
    ((epoch, step, wall, wait),) = [line.split("\t") for line in path.read_text().splitlines()]
    assert (epoch, step) == ("0", "5") and 25 <= float(wait) <= float(wall) < 1000  # per optimizer step, in ms
    StepClock(path)
    assert path.read_text() == ""  # a new launch (a resume) starts the file again


def test_straggler_settings_are_checked_before_launch() -> None:
    with pytest.raises(ConfigError, match=r"trainer.straggler_factor=1.0 must be > 1"):
        check_trainer(TrainerCfg(epochs=1, straggler_factor=1.0))
    with pytest.raises(ConfigError, match=r"trainer.straggler_patience=0 must be >= 1"):
        check_trainer(TrainerCfg(epochs=1, straggler_patience=0))


@dataclass(frozen=True)
class Cpu2Run:
    run_dir: Path
    client: MlflowClient
    run_id: str


def _cpu2(tmp_path: Path, slow_rank: str | None) -> Cpu2Run:
    """A real 2-worker run: 5 optimizer steps per epoch, read at each; a stand-in npu-smi on PATH, cards 3 and 6."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "ASCEND_RT_VISIBLE_DEVICES": "3,6",
           "PATH": f"{ROOT / 'tests' / 'fixtures' / 'npu_smi'}:{os.environ['PATH']}"}
    if slow_rank:
        env["SWINEXP_TEST_SLOW_RANK"] = slow_rank
    smoke = [o for o in SMOKE if not o.startswith(("hardware=", "tracking="))]
    out = subprocess.run([sys.executable, str(ROOT / "run.py"), *smoke, "hardware=cpu2",
                          f"hardware.master_port={free_port()}", f"data.root={tmp_path / 'data'}",
                          "trainer.limit_train_batches=5", "trainer.log_every_n_steps=1",
                          "trainer.straggler_patience=2", "imports=[tests.fixtures.slow_rank]", "tracking=mlflow",
                          f"tracking.uri={uri}", "tracking.system_metrics_interval_s=1",
                          f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    client = MlflowClient(uri)
    (found,) = client.search_runs([client.get_experiment_by_name("swinexp").experiment_id])
    return Cpu2Run(tmp_path / "run", client, found.info.run_id)


@pytest.fixture(scope="module")
def slowed(tmp_path_factory: pytest.TempPathFactory) -> Cpu2Run:
    return _cpu2(tmp_path_factory.mktemp("slowed"), slow_rank="1:400")


@pytest.mark.slow
def test_each_ranks_step_time_reaches_rank_0s_run(slowed: Cpu2Run) -> None:
    for rank in (0, 1):
        history = slowed.client.get_metric_history(slowed.run_id, f"rank/step_ms_{rank}")
        assert [m.step for m in history] == [1, 2]  # one median per epoch, at the epoch's step
    rank0, rank1 = (slowed.client.get_run(slowed.run_id).data.metrics[f"rank/step_ms_{r}"] for r in (0, 1))
    assert rank1 > rank0 + 300  # rank 1 kept its 400 ms host sleep per step; rank 0 shed what it waited for it


@pytest.mark.slow
def test_a_rank_slowed_on_purpose_is_flagged(slowed: Cpu2Run) -> None:
    assert slowed.client.get_run(slowed.run_id).data.tags[STRAGGLER_TAG] == "1"
    log = (slowed.run_dir / "msrun" / "worker_0.log").read_text()
    assert log.count("rank 1 is a straggler") == 1 and "rank 0 is a straggler" not in log


@pytest.mark.slow
def test_rank_0_samples_the_cards_of_both_workers(slowed: Cpu2Run) -> None:
    cards = {k.split("_")[1] for k in slowed.client.get_run(slowed.run_id).data.metrics if k.startswith("system/npu_")}
    assert cards == {"3", "6"}  # msrun's workers 0 and 1 drive visible devices 0 and 1: physical cards 3 and 6


@pytest.mark.slow
def test_ranks_at_the_same_pace_are_not_flagged(tmp_path: Path) -> None:
    even = _cpu2(tmp_path, slow_rank=None)
    run = even.client.get_run(even.run_id)
    assert STRAGGLER_TAG not in run.data.tags
    assert {"rank/step_ms_0", "rank/step_ms_1"} <= run.data.metrics.keys()
    assert "straggler" not in (even.run_dir / "msrun" / "worker_0.log").read_text()
