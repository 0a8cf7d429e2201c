"""`python -m benchmarks chaos`: SIGKILLs at chosen phases, each followed by a resume, lose and repeat nothing."""
from __future__ import annotations

import pytest

from benchmarks import chaos
from benchmarks.options import Options
from swinexp.registry import ConfigError
from swinexp.runtime import phases


def test_park_at_names_a_phase_and_a_count() -> None:
    with pytest.raises(ConfigError, match="debug.park_at='save:2' must be <phase>:<n>"):
        phases.configure({"phase_file": "/tmp/p", "park_at": "save:2"})
    with pytest.raises(ConfigError, match="needs debug.phase_file"):
        phases.configure({"phase_file": None, "park_at": "step:1"})
    phases.configure(None)


def test_each_round_of_kills_hits_every_phase() -> None:
    import random

    plan = chaos._plan(8, random.Random(0))
    assert sorted(p for p, _ in plan[:4]) == sorted(phases.PHASES) == sorted(p for p, _ in plan[4:])
    assert all(1 <= n <= chaos.PER_EPOCH[p] for p, n in plan)


# one kill in each phase, at fixed moments, each in the process the previous kill's resume started: mid-epoch
# between two checkpoints; inside the first validation; the second checkpoint written but not renamed into place;
# an epoch's checkpoint on disk with its metrics not yet logged, which only the resume's relog of the missing epochs
# (engine/loop.py) can put back
EVERY_PHASE = [("step", 3), ("eval", 1), ("checkpoint", 2), ("mlflow", 1)]


@pytest.mark.slow
def test_a_sigkill_in_each_phase_loses_and_duplicates_nothing() -> None:
    assert sorted(phase for phase, _ in EVERY_PHASE) == sorted(phases.PHASES)
    result = chaos.run(Options(), plan=EVERY_PHASE)
    figures = {k.removeprefix("chaos/"): v for k, v in result.metrics.items()}
    assert figures["kills"] == 4 and all(figures[f"kills_{p}"] == 1 for p in phases.PHASES), figures
    assert figures["mlflow_runs"] == 2 and figures["chaos_run_finished"] == 1  # every resume reopened its run
    assert figures["tensors"] > 100 and figures["tensors_differing"] == 0 and figures["bytes_lost"] == 0
    # the MLflow history: each of the 6 epochs exactly once, every point equal to the uninterrupted run's
    assert figures["epochs"] == 6 and figures["epochs_logged_once"] == 6, figures
    assert figures["metric_points"] >= 14 * 6  # every epoch metric of the 6 epochs
    assert figures["metric_points_lost"] == 0 and figures["metric_points_duplicated"] == 0, figures
    assert figures["metric_values_changed"] == 0
