"""Resuming with other config group choices than the checkpoint's is refused with the override that restores them."""
from __future__ import annotations

import logging
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from swinexp.engine import checkpoint
from swinexp.engine.resume import PROGRESS_KEY, Progress, check_compatible
from swinexp.registry import ConfigError
from tests.conftest import ROOT, SMOKE, TrainedRun

SAVED = {"model": "swin_micro", "amp": "o1_manual", "data": "synthetic", "experiment": None,
         "model/formulation@hardware.model.formulation": "cpu", "tracking": "mlflow", "hydra/launcher": "isolated"}
CONFIG = {"model": {"name": "swin_micro"}, "amp": {"name": "o1_manual"}}


def test_a_forgotten_group_choice_is_refused_with_the_override_that_restores_it() -> None:
    current = {**SAVED, "amp": "o0", "tracking": "none", "hydra/launcher": "basic"}  # tracking/hydra may change
    with pytest.raises(ConfigError) as err:
        check_compatible(CONFIG, {**CONFIG, "amp": {"name": "o0"}}, SAVED, current)
    message = str(err.value)
    assert "other config group choices (amp: o1_manual -> o0)" in message
    assert "rerun with `amp=o1_manual`" in message and "trainer.resume_force=true" in message


def test_added_and_removed_groups_restore_with_plus_and_tilde() -> None:
    current = {**SAVED, "experiment": "cifar10_micro", "model/rewrites": "all"}
    saved = {**SAVED, "data/augment": "light"}
    with pytest.raises(ConfigError, match=r"rerun with `\+data/augment=light ~experiment ~model/rewrites`"):
        check_compatible(CONFIG, CONFIG, saved, current)


def test_resume_force_continues_with_a_warning_but_never_into_another_model(caplog: pytest.LogCaptureFixture) -> None:
    current = {**SAVED, "amp": "o0"}
    with caplog.at_level(logging.WARNING, logger="swinexp"):
        check_compatible(CONFIG, CONFIG, SAVED, current, force=True)
    assert "trainer.resume_force=true" in caplog.text and "amp: o1_manual -> o0" in caplog.text
    with pytest.raises(ConfigError, match="written for another model"):
        check_compatible(CONFIG, {**CONFIG, "model": {"name": "swin_tiny"}}, SAVED, current, force=True)


def test_a_checkpoint_without_saved_choices_is_compared_by_config_only() -> None:
    check_compatible(CONFIG, CONFIG, {}, {**SAVED, "amp": "o0"})  # an older checkpoint: no refusal
    with pytest.raises(ConfigError, match="written for another model"):
        check_compatible(CONFIG, {**CONFIG, "model": {"name": "swin_tiny"}}, {}, SAVED)


def test_the_checkpoint_saves_the_runs_group_choices(trained_run: TrainedRun) -> None:
    meta = checkpoint.read_meta(checkpoint.read(trained_run.run_dir / "checkpoints" / "last.ckpt"))
    assert Progress.from_json(meta[PROGRESS_KEY]).choices == trained_run.choices
    assert trained_run.choices["amp"] == "o0"


@pytest.mark.slow
def test_run_py_refuses_to_resume_with_another_amp(trained_run: TrainedRun, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    shutil.copytree(trained_run.run_dir, run_dir)
    smoke = [o for o in SMOKE if not o.startswith("amp=")]
    command = [sys.executable, str(ROOT / "run.py"), *smoke, f"data.root={tmp_path / 'data'}", "amp=o1_manual",
               f"hydra.run.dir={run_dir}"]
    out = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert out.returncode != 0
    assert "other config group choices (amp: o0 -> o1_manual)" in out.stderr, out.stderr[-3000:]
    assert "rerun with `amp=o0`" in out.stderr
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == sorted(
        p.name for p in (trained_run.run_dir / "checkpoints").iterdir())  # nothing was trained
