"""Optuna searches (`hparams_search=swin_lr_wd`, hydra/sweeper=swinexp_optuna): the search space in Hydra's override
syntax, a trial's report-and-prune check against a real journal storage, and (slow) a micro search through the real
CLI that prunes, is killed, and is finished by the same command."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from mlflow.tracking import MlflowClient
from omegaconf import OmegaConf
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import TrialState

from hydra_plugins.swinexp_optuna.optuna_sweeper import OptunaSweeper, search_space
from swinexp.tracking.study import PRUNED_ATTR, STUDY_ENV, TRIAL_ENV, StudyTrial, continued_parent_run, open_storage
from tests.conftest import ROOT, SMOKE


def test_search_space_keeps_hydra_override_syntax_and_the_command_line_wins() -> None:
    params = {"optimizer.lr": "tag(log, interval(1.0e-5, 1.0e-2))", "optimizer.weight_decay": "interval(0.0, 0.1)",
              "data.batch_size": "choice(8, 16)"}
    space, fixed = search_space(params, ["data.batch_size=range(8, 33, 8)", "trainer.epochs=3",
                                         "+model.drop=interval(1, 4)", "amp=choice(o0,o2)", "seed=range(0.5,2.0,0.5)"])
    assert space == {"optimizer.lr": FloatDistribution(1e-5, 1e-2, log=True),
                     "optimizer.weight_decay": FloatDistribution(0.0, 0.1),
                     "data.batch_size": IntDistribution(8, 32, step=8),   # range's stop is exclusive
                     "+model.drop": FloatDistribution(1.0, 4.0),           # Hydra's intervals are floats
                     "amp": CategoricalDistribution(["o0", "o2"]),
                     "seed": FloatDistribution(0.5, 1.5, step=0.5)}
    assert fixed == ["trainer.epochs=3"]


def _study(tmp_path: Path, storage: str = "journal") -> tuple[str, optuna.Study]:
    url = str(tmp_path / "s.optuna.journal") if storage == "journal" else f"sqlite:///{tmp_path}/optuna.db"
    study = optuna.create_study(study_name="s", storage=open_storage(url), direction="maximize")
    done = study.ask()
    done.report(50.0, step=1)
    study.tell(done, 50.0)
    return url, study


@pytest.mark.parametrize("storage", ["journal", "sqlite"])  # sqlite: SQLAlchemy 2 (MLflow's) with Optuna 5
def test_a_trial_below_the_median_is_pruned_and_says_so_in_the_study(tmp_path: Path, storage: str) -> None:
    url, study = _study(tmp_path, storage)
    weak, strong = study.ask(), study.ask()
    pruner = {"name": "median", "n_startup_trials": 1, "n_warmup_steps": 1}
    hydra_job = OmegaConf.create({"job": {"env_set": {
        STUDY_ENV: json.dumps({"storage": url, "study_name": "s", "pruner": pruner}), TRIAL_ENV: str(weak.number)}}})
    check = StudyTrial.of(hydra_job.job.env_set).pruning("val/top1", tmp_path / "run", last_epoch=2)
    assert check(1, {"val/top1": 10.0}) is True and check.tags()["optuna.state"] == "PRUNED"
    strong_check = StudyTrial(url, "s", pruner, strong.number).pruning("val/top1", tmp_path / "run2", last_epoch=2)
    assert strong_check(1, {"val/top1": 60.0}) is False and strong_check.tags()["optuna.state"] == "COMPLETE"
    finishing = StudyTrial(url, "s", pruner, study.ask().number).pruning("val/top1", tmp_path / "run3", last_epoch=1)
    assert finishing(1, {"val/top1": 10.0}) is False  # as weak, but at its last epoch: complete, not pruned
    trials = optuna.load_study(study_name="s", storage=open_storage(url)).trials  # what the sweeper reads back
    assert trials[weak.number].user_attrs[PRUNED_ATTR] == 1 and trials[weak.number].intermediate_values == {1: 10.0}
    assert PRUNED_ATTR not in trials[strong.number].user_attrs
    assert trials[strong.number].user_attrs["run_dir"] == str((tmp_path / "run2").resolve())


def test_a_job_outside_a_search_has_no_trial() -> None:
    assert StudyTrial.of({}) is None


def test_a_continued_search_finds_its_parent_run_in_the_study(tmp_path: Path) -> None:
    config = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path / "s")}, "sweeper": {
        "_target_": "hydra_plugins.swinexp_optuna.optuna_sweeper.OptunaSweeper", "study_name": "s",
        "storage": None}}})
    assert continued_parent_run(config.hydra.sweeper, tmp_path / "s") is None  # no journal yet: a new search
    _, study = _study(tmp_path)
    assert continued_parent_run(config.hydra.sweeper, tmp_path / "s") is None  # a study without a parent run
    study.set_user_attr("mlflow_parent_run_id", "abc")
    assert continued_parent_run(config.hydra.sweeper, tmp_path / "s") == "abc"
    config.hydra.sweeper.study_name = "other"
    assert continued_parent_run(config.hydra.sweeper, tmp_path / "s") is None


def test_a_rerun_tells_what_the_killed_jobs_left_and_runs_only_the_unfinished_trials_again(tmp_path: Path) -> None:
    url, study = _study(tmp_path)  # trial 0 complete
    pruned, finished, interrupted = study.ask(), study.ask(), study.ask()  # RUNNING when the sweep was killed
    pruned.set_user_attr(PRUNED_ATTR, 1)
    (tmp_path / str(finished.number)).mkdir()  # its job ended after the kill, and left its result in its run dir
    (tmp_path / str(finished.number) / "metrics.json").write_text(json.dumps({"val/top1": 42.0}))
    sweeper = OptunaSweeper("s", url, "maximize", 4, 2, {"name": "tpe"}, {"name": "none"}, None)
    sweeper.config = OmegaConf.create({"optimized_metric": "val/top1"})
    assert sweeper._leftover(study, sweep_dir=tmp_path) == [interrupted.number]
    trials = optuna.load_study(study_name="s", storage=open_storage(url)).trials
    assert [t.state for t in trials] == [TrialState.COMPLETE, TrialState.PRUNED, TrialState.COMPLETE,
                                         TrialState.RUNNING]
    assert trials[finished.number].value == 42.0


def _search(tmp_path: Path) -> list[str]:
    """8 trials, 2 at a time, of the preset (TPE), shrunk, with a pruner that keeps only the top quarter at epoch 1
    once 2 trials finished. So that trials differ at epoch 1 (after 3 steps): 200 val images, and LRs that move the
    weights (below 1e-4 every trial still predicts what the shared initial weights do, and ties with the others)."""
    smoke = [o for o in SMOKE if not o.startswith("tracking=")]
    return [sys.executable, str(ROOT / "run.py"), "-m", "hparams_search=swin_lr_wd", *smoke,
            f"data.root={tmp_path / 'data'}", "data.num_val=200", "trainer.limit_val_batches=null",
            "optimizer.lr=tag(log,interval(1e-3,3e-2))",
            "hydra.sweeper.n_trials=8", "hydra.sweeper.n_jobs=2", "hydra.launcher.max_parallel=2",
            "hydra.sweeper.pruner.name=percentile", "++hydra.sweeper.pruner.percentile=25",
            "hydra.sweeper.pruner.n_startup_trials=2", "hydra.sweeper.pruner.n_warmup_steps=1",
            "hydra.sweeper.pruner.interval_steps=1", "tracking=mlflow", f"tracking.uri=sqlite:///{tmp_path}/mlflow.db",
            f"hydra.sweep.dir={tmp_path / 'multirun'}"]


@pytest.mark.slow
def test_a_killed_pruned_search_is_finished_by_the_same_command_with_each_trial_run_once(tmp_path: Path) -> None:
    sweep_dir, log, started = tmp_path / "multirun", tmp_path / "sweep.log", time.monotonic()
    proc = subprocess.Popen(_search(tmp_path), cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=log.open("w"))
    second_round = sweep_dir / "2" / "launcher.json"  # trials 0 and 1 are told; 2 and 3 are starting
    deadline = time.monotonic() + 600
    while not second_round.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert proc.poll() is None and second_round.exists(), log.read_text()[-3000:]
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=300)
    assert proc.returncode != 0
    storage = open_storage(str(sweep_dir) + ".optuna.journal")
    killed = optuna.load_study(study_name="swin_lr_wd", storage=storage).trials
    assert [t.state for t in killed] == [TrialState.COMPLETE] * 2 + [TrialState.RUNNING] * 2
    finished_first = {n: (sweep_dir / str(n) / "metrics.json").stat().st_mtime_ns for n in (0, 1)}

    killed_after, started = time.monotonic() - started, time.monotonic()
    out = subprocess.run(_search(tmp_path), cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "2 of 8 trials done, 2 to continue (2, 3)" in out.stdout + out.stderr
    trials = optuna.load_study(study_name="swin_lr_wd", storage=storage).trials
    states = [t.state for t in trials]
    assert len(trials) == 8 and set(states) <= {TrialState.COMPLETE, TrialState.PRUNED}
    assert len({tuple(t.params.values()) for t in trials}) == 8  # the rerun's sampler did not repeat the first's
    pruned = [t.number for t in trials if t.state == TrialState.PRUNED]
    assert pruned, [t.intermediate_values for t in trials]
    # the trials the first command finished were not run again
    assert {n: (sweep_dir / str(n) / "metrics.json").stat().st_mtime_ns for n in (0, 1)} == finished_first

    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    runs = client.search_runs([client.get_experiment_by_name("swinexp").experiment_id])
    (parent,) = [r for r in runs if r.data.tags.get("sweep.role") == "parent"]  # the second command continued it
    children = sorted((r for r in runs if r is not parent), key=lambda r: int(r.data.tags["optuna.trial"]))
    assert [int(c.data.tags["optuna.trial"]) for c in children] == list(range(8))  # one MLflow run per trial
    assert parent.info.status == "FINISHED" and parent.data.tags["sweep.keys"] == "optimizer.lr,optimizer.weight_decay"
    for child, trial in zip(children, trials):
        assert child.data.tags["mlflow.parentRunId"] == parent.info.run_id and child.info.status == "FINISHED"
        assert child.data.tags["sweep.job"] == str(trial.number) == child.data.tags["swinexp.run_dir"].split("/")[-1]
        assert child.info.run_name.startswith("optimizer.lr=")
        assert float(child.data.params["optimizer.lr"]) == pytest.approx(trial.params["optimizer.lr"])
        assert 0.0 <= float(child.data.params["optimizer.weight_decay"]) <= 0.1
        steps = [m.step for m in client.get_metric_history(child.info.run_id, "val/top1")]
        if trial.state == TrialState.PRUNED:  # a screen: stopped after epoch 1 of the 2-epoch schedule
            assert child.data.tags["optuna.state"] == "PRUNED" and child.data.tags["stopped_after_epoch"] == "1"
            assert steps == [1]
        else:
            assert child.data.tags["optuna.state"] == "COMPLETE" and steps == [1, 2]  # each epoch logged once
            assert child.data.metrics["val/top1"] == pytest.approx(trial.value)
    best = max((t for t in trials if t.state == TrialState.COMPLETE), key=lambda t: t.value)
    tags = parent.data.tags
    assert tags["best.job"] == str(best.number) and float(tags["best.objective"]) == pytest.approx(best.value)
    assert float(tags["best.optimizer.lr"]) == pytest.approx(best.params["optimizer.lr"])
    artifacts = {a.path for a in client.list_artifacts(parent.info.run_id, "optuna")}
    assert artifacts == {f"optuna/{name}" for name in ("trials.csv", "optimization_history.png",
                                                       "intermediate_values.png", "param_importances.png")}
    print(f"micro search: {len(trials)} trials, {len(pruned)} pruned {pruned}, trials 2 and 3 continued; "
          f"val/top1 at epoch 1: {[t.intermediate_values.get(1) for t in trials]}; "
          f"killed after {killed_after:.0f} s, the rerun took {time.monotonic() - started:.0f} s")
