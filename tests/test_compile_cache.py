"""hardware.compile_cache: a job of an already compiled configuration loads its graphs and trains bit for bit as a cold
compile does; the cache directory is keyed by what shapes the graphs, and a shared directory is never written to."""
from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import mindspore as ms
import numpy as np
import pytest

from swinexp.build import resolve
from swinexp.engine import checkpoint
from swinexp.engine.resume import saved_run_id
from swinexp.registry import ConfigError
from swinexp.runtime import compile_cache
from tests.conftest import ROOT, SMOKE

# every figure of an epoch line except its wall time and throughput
EPOCH_LINE = re.compile(r"epoch (\d+)/\d+ +(train/loss .*?) +\d+\.\d+ s +[\d.]+ img/s")
WALL_CLOCK = ("epoch_time_s", "train/images_per_s")  # metrics that time the run: the only ones a cache may change


def _train(tmp_path: Path, data_root: Path, name: str, *extra: str,
           env: dict[str, str] | None = None) -> tuple[list[tuple[str, str]], str]:
    """Train the smoke config in a fresh process; (per-epoch figures, its output: log and MindSpore's warnings)."""
    cmd = [sys.executable, str(ROOT / "run.py"), *SMOKE, f"data.root={data_root}",
           f"hydra.run.dir={tmp_path / name}", *extra]
    done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600, cwd=tmp_path,
                          env=env)
    assert done.returncode == 0, done.stdout[-3000:]
    return EPOCH_LINE.findall(done.stdout), done.stdout


def _run_record(run_dir: Path, store: str) -> tuple[dict[str, list[tuple[int, float]]], dict[str, np.ndarray]]:
    """What a run left: every metric point it logged to MLflow at full precision (wall-clock ones aside), and every
    tensor of its last checkpoint (weights and optimizer state)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(store)
    run_id = saved_run_id(run_dir)
    assert run_id, f"{run_dir} holds no MLflow run id"
    points = {key: [(m.step, m.value) for m in client.get_metric_history(run_id, key)]
              for key in client.get_run(run_id).data.metrics if key not in WALL_CLOCK}
    tensors = {k: v.asnumpy() for k, v in checkpoint.read(run_dir / "checkpoints" / "last.ckpt").items()
               if isinstance(v, (ms.Parameter, ms.Tensor))}
    return points, tensors


def _assert_bit_equal(got: tuple[dict, dict[str, np.ndarray]], want: tuple[dict, dict[str, np.ndarray]]) -> None:
    (got_points, got_tensors), (want_points, want_tensors) = got, want
    assert "step/train/loss" in want_points and len(want_points["step/train/loss"]) == 6  # 2 epochs x 3 steps
    assert got_points == want_points  # floats compared exactly: every loss, accuracy, grad norm and lr
    assert len(want_tensors) > 50 and got_tensors.keys() == want_tensors.keys()
    differing = [k for k in want_tensors if got_tensors[k].tobytes() != want_tensors[k].tobytes()]
    assert not differing, f"{len(differing)} checkpoint tensors differ, e.g. {differing[:5]}"


@pytest.mark.slow
def test_a_cached_job_trains_exactly_as_a_cold_compile(tmp_path: Path, synthetic_root: Path) -> None:
    # GLOG_v=3 (errors only) is a common way to quiet MindSpore: it also hides MindSpore's own word that it used the
    # cache, so what says the cache was used is swinexp's, read from the cache's files (compile_cache._stamps)
    env = {**os.environ, "GLOG_v": "3"}
    cache, store = tmp_path / "cache", f"sqlite:///{tmp_path / 'mlflow.db'}"
    on = ["hardware.compile_cache=true", f"hardware.compile_cache_dir={cache}", "trainer.progress_bar=true"]
    tracked = ["tracking=mlflow", f"tracking.uri={store}", "tracking.log_every_n_steps=1",
               "tracking.system_metrics=false", "tracking.log_checkpoints=none"]
    _, first_log = _train(tmp_path, synthetic_root, "first", *on, env=env)  # compiles, publishes on exit
    assert "no compiled graphs of this configuration" in first_log
    # the bars say what the host waits for, once per graph: the first epoch compiles, the second does not
    assert first_log.count("compiling the train step") >= 1 and "compiling the eval step" in first_log
    assert "epoch 2/2" in first_log and "compiling" not in first_log[first_log.index("epoch 2/2"):]
    (published,) = list(cache.iterdir())  # the private work copy is gone, the configuration's dir is there
    assert not published.name.startswith(".") and list(published.rglob("*.mindir"))
    # another seed: host-only (its draws are inputs of the step), so the same graphs; their results must be
    # those of a cold compile of that seed (MindSpore's own cache ran uninitialized weights: NaN losses)
    _, cached_log = _train(tmp_path, synthetic_root, "cached", *on, *tracked, "seed=7", env=env)
    _train(tmp_path, synthetic_root, "cold", *tracked, "seed=7", "hardware.compile_cache=false", env=env)
    assert "loading the compiled graphs" in cached_log and "compiling" not in cached_log
    assert "loading the train step from the compile cache" in cached_log
    for graph in ("the train step", "the eval step"):  # MindSpore wrote no file for them: it loaded, not compiled
        assert f"hardware.compile_cache: {graph} loaded from the cache, not compiled" in cached_log, cached_log[-3000:]
    assert "instead of loading it" not in cached_log
    _assert_bit_equal(_run_record(tmp_path / "cached", store), _run_record(tmp_path / "cold", store))
    assert [p.name for p in cache.iterdir()] == [published.name]  # the loading job wrote nothing into the cache


@pytest.mark.slow
def test_a_graph_mindspore_compiles_again_is_not_reported_as_loaded(tmp_path: Path, synthetic_root: Path) -> None:
    # the guard on the test above: a cache whose dependency hash no longer matches (another MindSpore build) is
    # one MindSpore quietly compiles anew under GLOG_v=3; swinexp must not call that a load
    env = {**os.environ, "GLOG_v": "3"}
    cache = tmp_path / "cache"
    on = ["hardware.compile_cache=true", f"hardware.compile_cache_dir={cache}"]
    _train(tmp_path, synthetic_root, "first", *on, env=env)
    (hashed,) = cache.glob("*/rank_0/graph_cache/compile_dependency.hash")
    hashed.write_text("0" * 64)
    _, log_text = _train(tmp_path, synthetic_root, "again", *on, env=env)
    assert "loading the compiled graphs" in log_text  # swinexp meant to load...
    assert "MindSpore compiled the train step instead of loading it" in log_text  # ...and says it did not
    assert "loaded from the cache, not compiled" not in log_text


@pytest.mark.slow
def test_jobs_sharing_one_process_never_write_into_the_first_jobs_cache(tmp_path: Path, synthetic_root: Path) -> None:
    # hydra/launcher=basic runs both jobs in this one process; MindSpore keeps the first job's cache directory for
    # the whole process, so the second job's graphs (another clip value) would land among the first job's, and a
    # later process of the second configuration could load them as its own
    cache = tmp_path / "cache"
    done = subprocess.run(
        [sys.executable, str(ROOT / "run.py"), "-m", *SMOKE, "hydra/launcher=basic",
         f"data.root={synthetic_root}", "hardware.compile_cache=true", f"hardware.compile_cache_dir={cache}",
         "trainer.clip_grad=null,1.0", f"hydra.sweep.dir={tmp_path / 'sweep'}"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=900, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:]
    assert "hardware.compile_cache: off for this job" in done.stdout
    (published,) = list(cache.iterdir())  # the first job's configuration, with its own graphs only
    alone = tmp_path / "alone"
    _train(tmp_path, synthetic_root, "first_alone", "hardware.compile_cache=true",
           f"hardware.compile_cache_dir={alone}")
    (expected,) = list(alone.iterdir())
    assert published.name == expected.name
    assert sorted(p.name for p in published.rglob("*.mindir")) == sorted(p.name for p in expected.rglob("*.mindir"))


@pytest.mark.slow
def test_a_resumed_run_that_skips_the_amp_report_runs_its_own_graphs(tmp_path: Path, synthetic_root: Path) -> None:
    # the first part compiles the AMP report's sub-cells before its steps; the resumed part makes no report. MindSpore
    # hands out cached graphs by their place in the process's compiles, so had the report's graphs gone into the
    # cache, the resumed train step would have run the patch embedding's graph
    on = ["hardware.compile_cache=true", f"hardware.compile_cache_dir={tmp_path / 'cache'}",
          "trainer.amp_report=true", "trainer.progress_bar=true"]
    _, first_log = _train(tmp_path, synthetic_root, "run", *on, "trainer.stop_after_epoch=1")
    assert "amp_drift.txt" in " ".join(p.name for p in (tmp_path / "run").rglob("*")), first_log[-2000:]
    resumed, resumed_log = _train(tmp_path, synthetic_root, "run", *on, "trainer.stop_after_epoch=null")
    straight, _ = _train(tmp_path, synthetic_root, "straight", "trainer.amp_report=true",
                         "hardware.compile_cache=false")
    assert "loading the train step from the compile cache" in resumed_log
    assert len(straight) == 2 and resumed[-1] == straight[-1]


def test_the_key_follows_what_shapes_the_graphs_and_ignores_host_only_keys(compose) -> None:
    key = compile_cache.cache_key(resolve(compose()))
    for host_only in ("seed=3", "data/augment=swin", "data.pipeline=native", "tracking=mlflow",
                      "trainer.label_smoothing=0.2", "trainer.checkpoint.keep_last=5"):
        assert compile_cache.cache_key(resolve(compose(host_only))) == key, host_only
    for graph in ("trainer.clip_grad=1.0", "data.batch_size=4", "amp=o2", "model.qkv=fused",
                  "optimizer.weight_decay=0.01", "trainer.accumulation_steps=2"):
        assert compile_cache.cache_key(resolve(compose(graph))) != key, graph


def test_on_by_default_and_when_off_leaves_mindspores_cache_alone(compose, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MS_COMPILER_CACHE_ENABLE", raising=False)
    monkeypatch.setattr(compile_cache, "_session", None)
    assert resolve(compose()).hardware.compile_cache
    assert compile_cache.enable(resolve(compose("hardware.compile_cache=false"))) is None
    assert "MS_COMPILER_CACHE_ENABLE" not in os.environ
    with pytest.raises(ConfigError, match="compile_cache_max_gb=0.0 must be > 0"):
        resolve(compose("hardware.compile_cache_max_gb=0"))


def test_a_process_without_an_entry_script_compiles_without_the_cache_and_says_why(
        compose, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    # `python -c` leaves argv[0] "-c", which MindSpore's cache would open as a file when the first graph compiles
    monkeypatch.setattr(ms.graph.api, "entry_script_path", str(tmp_path / "-c"))
    monkeypatch.delenv("MS_COMPILER_CACHE_ENABLE", raising=False)
    monkeypatch.setattr(compile_cache, "_session", None)
    with caplog.at_level(logging.WARNING, logger="swinexp"):
        assert compile_cache.enable(resolve(compose(f"hardware.compile_cache_dir={tmp_path}"))) is None
    assert "python run.py" in caplog.text and "hardware.compile_cache=false" in caplog.text
    assert "MS_COMPILER_CACHE_ENABLE" not in os.environ and compile_cache._session is None


def _config_dir(root: Path, name: str, size: int, age_s: float) -> Path:
    folder = root / name
    (folder / "rank_0").mkdir(parents=True)
    (folder / "rank_0" / "compile_cache_0.mindir").write_bytes(b"x" * size)
    stamp = time.time() - age_s
    os.utime(folder, (stamp, stamp))
    return folder


def test_the_cache_stays_under_its_size_dropping_what_was_used_longest_ago(tmp_path: Path) -> None:
    oldest, old, recent = (_config_dir(tmp_path, name, 400, age) for name, age in
                           (("aaaa", 3000), ("bbbb", 2000), ("cccc", 1000)))
    new = _config_dir(tmp_path, "dddd", 400, 5000)  # just published (its files may carry an old mtime)
    compile_cache._trim(tmp_path, max_bytes=1000, keep=new)
    assert sorted(p.name for p in tmp_path.iterdir()) == [recent.name, new.name]
    assert not oldest.exists() and not old.exists()


def test_copies_of_killed_processes_go_after_a_day_and_running_ones_stay(tmp_path: Path) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    day = 86400 + 60
    abandoned = _config_dir(tmp_path, f".aaaa-{dead.pid}-x1", 10, day)
    running = _config_dir(tmp_path, f".aaaa-{os.getpid()}-x2", 10, day)
    fresh = _config_dir(tmp_path, f".aaaa-{dead.pid}-x3", 10, 60)
    compile_cache._remove_abandoned(tmp_path)
    assert not abandoned.exists() and running.exists() and fresh.exists()


def test_a_job_publishes_its_graphs_once_and_never_over_another_jobs(tmp_path: Path) -> None:
    shared = tmp_path / "0123456789abcdef"
    first, second, empty = (tmp_path / name for name in (".a", ".b", ".c"))
    for private, content in ((first, b"first"), (second, b"second")):
        (private / "rank_0" / "graph_cache").mkdir(parents=True)
        (private / "rank_0" / "graph_cache" / "compile_cache_0.mindir").write_bytes(content)
    empty.mkdir()
    session = partial(compile_cache._Session, shared, held=None, cached=["the train step"])
    compile_cache._publish(session(empty, cached=[]))  # compiled nothing (failed before the first step)
    assert not shared.exists() and not empty.exists()
    compile_cache._publish(session(first))
    compile_cache._publish(session(second))  # finished later: the first job's cache stays, this copy is dropped
    assert (shared / "rank_0" / "graph_cache" / "compile_cache_0.mindir").read_bytes() == b"first"
    assert json.loads((shared / compile_cache.MANIFEST).read_text()) == ["the train step"]
    assert not first.exists() and not second.exists()


def test_only_the_step_graphs_go_through_the_cache_in_the_order_it_holds_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    held = ["the train step", "the eval step"]
    session = compile_cache._Session(tmp_path / "shared", tmp_path / "private", held)
    monkeypatch.setattr(compile_cache, "_session", session)
    monkeypatch.setenv("MS_COMPILER_CACHE_ENABLE", "0")
    with compile_cache.first_call(None):  # not a first call: the cache stays off
        assert os.environ["MS_COMPILER_CACHE_ENABLE"] == "0"
    assert compile_cache.compiling("the train step") == "loading the train step from the compile cache"
    with compile_cache.first_call("the train step"):
        assert os.environ["MS_COMPILER_CACHE_ENABLE"] == "1"
    assert os.environ["MS_COMPILER_CACHE_ENABLE"] == "0" and session.cached == ["the train step"]
    # the cache holds the eval step next: an accumulation step here would be handed the eval step's graph
    assert compile_cache.compiling("the accumulation step") == "compiling the accumulation step"
    with compile_cache.first_call("the accumulation step"):
        assert os.environ["MS_COMPILER_CACHE_ENABLE"] == "0"
    with compile_cache.first_call("the eval step"):  # and from there on nothing is taken from the cache
        assert os.environ["MS_COMPILER_CACHE_ENABLE"] == "0"
    assert session.broken
