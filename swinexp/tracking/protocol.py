"""The tracker protocol the training loop talks to, the null tracker, and the tags runs share across stores."""
from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from swinexp.registry import TRACKERS
from swinexp.tracking.dataset import DatasetRecord

if TYPE_CHECKING:
    pass

log = logging.getLogger("swinexp")


# Tags the offline store and sync use to tie runs together across stores.
CONTINUES_RUN = "swinexp.continues_run"  # a fallback run holding the rest of this (server) run, after it went down
SYNCED_TO = "swinexp.synced_to"          # set on a fallback run once replayed: the id of its copy in the target
SYNCED_FROM = "swinexp.synced_from"      # set on the copy: the id of the fallback run it was replayed from
FAILURE_TAG = "swinexp.failure"          # why a run ended FAILED: "<exception type>: <message>"
FAILED_JOBS_TAG = "sweep.failed_jobs"    # on a sweep's parent run: one line per failed job, its number and reason
STOPPED_TAG = "stopped_after_epoch"      # on a run trainer.stop_after_epoch=N ended early (a screen), value N;
                                         # removed when a continuation reaches trainer.epochs


class Tracker(Protocol):
    run_id: str | None
    log_checkpoints: str  # best | last | both | none: the checkpoint files run() logs as artifacts at the end

    def start(self, run_name: str, tags: Mapping[str, str], run_id: str | None = None) -> str | None: ...
    def logged_steps(self, key: str) -> set[int]: ...
    def log_params(self, params: Mapping[str, Any]) -> None: ...
    def set_tags(self, tags: Mapping[str, str | None]) -> None: ...
    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None: ...
    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None: ...
    def set_status(self, status: str) -> None: ...  # RUNNING, FAILED, ... while the run stays open
    def close(self, status: str = "FINISHED", reason: str | None = None) -> None: ...
    # called every optimizer step; the tracker keeps every n-th and skips steps a resumed run already holds
    def log_step_metrics(self, metrics: Mapping[str, float], step: int) -> None: ...
    def log_dataset(self, record: DatasetRecord) -> None: ...


class NullTracker:
    """Logs nothing: for quick runs and tests that do not look at a store."""

    run_id: str | None = None
    log_checkpoints = "none"

    def start(self, run_name: str, tags: Mapping[str, str], run_id: str | None = None) -> str | None:
        return None

    def logged_steps(self, key: str) -> set[int]:
        return set()

    def log_params(self, params: Mapping[str, Any]) -> None:
        pass

    def set_tags(self, tags: Mapping[str, str | None]) -> None:
        pass

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        pass

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        pass

    def set_status(self, status: str) -> None:
        pass

    def close(self, status: str = "FINISHED", reason: str | None = None) -> None:
        pass

    def log_step_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        pass

    def log_dataset(self, record: DatasetRecord) -> None:
        pass


@TRACKERS.register("none")
def none() -> Tracker:
    """No tracking."""
    return NullTracker()


def open_tracker(tracking: Mapping[str, Any], shared_dir: str | None = None) -> Tracker:
    """The tracker of a `tracking` config section (MLflow or none); with hardware.shared_dir set and no tracking.uri,
    the store is `<shared_dir>/mlflow.db`, which every node and every rerun finds."""
    tracking = dict(tracking)
    if shared_dir and "uri" in tracking and tracking["uri"] is None:
        tracking["uri"] = f"sqlite:///{Path(shared_dir).resolve() / 'mlflow.db'}"
    return TRACKERS.build(tracking)


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """{'a': {'b': 1}, 'c': [1, 2]} -> {'a.b': 1, 'c': [1, 2]}: the dotted keys Hydra overrides use."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten(value, f"{name}."))
        else:
            out[name] = value
    return out
