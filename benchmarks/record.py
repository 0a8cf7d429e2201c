"""Log one benchmark invocation as an MLflow run: its settings, every figure, and each table as an artifact."""
from __future__ import annotations

import os
import platform
import re
import tempfile
from dataclasses import asdict
from pathlib import Path

import mindspore as ms

from benchmarks.host import cpu_model
from benchmarks.options import Options
from benchmarks.table import BenchResult
from swinexp.tracking import MlflowTracker, resolve_uri
from swinexp.tracking.source import git_commit

__all__ = ["EXPERIMENT", "BenchRecorder", "metric_name"]

EXPERIMENT = "swinexp-bench"
_NOT_IN_METRIC_NAMES = re.compile(r"[^A-Za-z0-9_\-./ ]")  # MLflow's allowed characters


def metric_name(key: str) -> str:
    """`step/qkv=split/median_ms` -> `step/qkv_split/median_ms`."""
    return _NOT_IN_METRIC_NAMES.sub("_", key)


class BenchRecorder:
    """One run in experiment `swinexp-bench`; each sub-benchmark is logged as soon as it finishes, so a run cut
    short keeps what was measured (and ends FAILED or KILLED).

    Args:
        uri: Tracking store; None means ./mlflow.db, as training uses.
        names: The sub-benchmarks of this invocation (the run's name).
        opts: Logged as params.
        command: The command line, logged as a tag.
    """

    def __init__(self, uri: str | None, names: list[str], opts: Options, command: str) -> None:
        self.tracker = MlflowTracker(resolve_uri(uri, Path.cwd()), EXPERIMENT)
        tags = {"command": command, "mindspore": ms.__version__, "cpu": cpu_model(), "cores": str(os.cpu_count()),
                "host": platform.node()}
        if commit := git_commit():
            tags["git_commit"] = commit
        self.run_id = self.tracker.start(f"bench {' '.join(names)}"[:250], tags)
        self.tracker.log_params({key: value for key, value in asdict(opts).items() if value not in (None, (), "")})

    def log(self, result: BenchResult) -> None:
        """The result's figures as metrics (step 0) and its table as `bench_<name>.md`."""
        self.tracker.log_metrics({metric_name(k): v for k, v in result.metrics.items()}, step=0)
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / f"bench_{result.name}.md"
            path.write_text(result.table.markdown() + "\n")
            self.tracker.log_artifact(path)

    def close(self, status: str = "FINISHED") -> None:
        self.tracker.close(status)
