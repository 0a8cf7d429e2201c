"""Log one benchmark invocation as an MLflow run: its settings, every figure, and each table as an artifact."""
from __future__ import annotations

import os
import platform
import re
import tempfile
from dataclasses import asdict
from pathlib import Path

import mindspore as ms

from swinexp.bench.host import cpu_model
from swinexp.bench.options import Options
from swinexp.bench.table import BenchResult
from swinexp.tracking import MlflowTracker, resolve_uri
from swinexp.train import git_commit

__all__ = ["EXPERIMENT", "log_results", "metric_name"]

EXPERIMENT = "swinexp-bench"
_NOT_IN_METRIC_NAMES = re.compile(r"[^A-Za-z0-9_\-./ ]")  # MLflow's allowed characters


def metric_name(key: str) -> str:
    """`step/qkv=split/median_ms` -> `step/qkv_split/median_ms`."""
    return _NOT_IN_METRIC_NAMES.sub("_", key)


def log_results(results: list[BenchResult], opts: Options, command: str, uri: str | None) -> str:
    """One run in experiment `swinexp-bench` of the store at `uri` (None: ./mlflow.db, as training uses).

    Returns:
        The run id.
    """
    tracker = MlflowTracker(resolve_uri(uri, Path.cwd()), EXPERIMENT)
    tags = {"command": command, "mindspore": ms.__version__, "cpu": cpu_model(), "cores": str(os.cpu_count()),
            "host": platform.node()}
    if commit := git_commit():
        tags["git_commit"] = commit
    run_id = tracker.start(f"bench {' '.join(r.name for r in results)}"[:250], tags)
    try:
        tracker.log_params({key: value for key, value in asdict(opts).items() if value not in (None, (), "")})
        tracker.log_metrics({metric_name(k): v for r in results for k, v in r.metrics.items()}, step=0)
        with tempfile.TemporaryDirectory() as tmp:
            for result in results:
                path = Path(tmp) / f"bench_{result.name}.md"
                path.write_text(result.table.markdown() + "\n")
                tracker.log_artifact(path)
    except BaseException:
        tracker.close("FAILED")
        raise
    tracker.close()
    return run_id
