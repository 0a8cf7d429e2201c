"""Experiment trackers (`conf/tracking`): the protocol the training loop talks to (protocol.py), the MLflow tracker
(mlflow.py), replaying an offline store (sync.py) and the sweep report (report.py)."""
from swinexp.tracking.mlflow import (
    LOG_CHECKPOINTS,
    MlflowTracker,
    check_reachable,
    find_run,
    open_experiment,
    resolve_uri,
)
from swinexp.tracking.protocol import (
    CONTINUES_RUN,
    FAILED_JOBS_TAG,
    FAILURE_TAG,
    STOPPED_TAG,
    SYNCED_FROM,
    SYNCED_TO,
    NullTracker,
    Tracker,
    flatten,
    open_tracker,
)

__all__ = ["CONTINUES_RUN", "FAILED_JOBS_TAG", "FAILURE_TAG", "LOG_CHECKPOINTS", "STOPPED_TAG", "SYNCED_FROM",
           "SYNCED_TO", "MlflowTracker", "NullTracker", "Tracker", "check_reachable", "find_run", "flatten",
           "open_experiment", "open_tracker", "resolve_uri"]
