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


@pytest.mark.slow
def test_three_sigkills_lose_and_duplicate_nothing() -> None:
    result = chaos.run(Options(kills=3, seed=0))
    figures = {k.removeprefix("chaos/"): v for k, v in result.metrics.items()}
    assert figures["kills"] == 3 and sum(figures[f"kills_{p}"] for p in phases.PHASES) == 3
    assert figures["mlflow_runs"] == 2 and figures["chaos_run_finished"] == 1  # every resume reopened its run
    assert figures["tensors"] > 100 and figures["tensors_differing"] == 0 and figures["bytes_lost"] == 0
    assert figures["metric_points"] >= 14 * 5  # every epoch metric of the 5 epochs
    assert figures["metric_points_lost"] == 0 and figures["metric_points_duplicated"] == 0
    assert figures["metric_values_changed"] == 0
