"""Replay an offline store (`tracking.fallback_uri`) into a tracking server, losing nothing and duplicating nothing.

Every run is copied with its experiment name, run name, tags, params, every metric value (step and timestamp; system
metrics too), dataset inputs (MLflow's Datasets panel, with their context), status, end time and artifacts
(checkpoints, a sweep's report). A sweep's links follow the replayed parent: a job's `mlflow.parentRunId` and
`sweep.id` name the parent's copy, and the experiment's tags (its kind, the sweep's shared view of the UI) are
copied with the parent's id replaced by its copy's. A continuation run (tag `swinexp.continues_run`, written when
the server went down mid-run) is merged into the server run it continues. Each replayed run gets
`swinexp.synced_to=<target id>` in the offline store, right after its copy is created, and a later sync completes
that copy incrementally: values already in the target (same key, step, timestamp and value), params already set and
artifacts of the same path and size are skipped, so syncing twice, or again after an interrupted sync, adds nothing
twice.
"""
from __future__ import annotations

import math
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from swinexp.registry import ConfigError
from swinexp.tracking import CONTINUES_RUN, SYNCED_FROM, SYNCED_TO, check_reachable, find_run, open_experiment

PARENT_TAG = "mlflow.parentRunId"
RUN_ID_TAGS = (PARENT_TAG, "sweep.id")  # tags whose value is another run's id: mapped to that run's copy
NOT_COPIED_TAGS = {"mlflow.runName", SYNCED_TO}  # the name is set on creation
BATCH = 1000  # MLflow's limit on metrics per log_batch call
TERMINAL = {"FINISHED", "FAILED", "KILLED"}


@dataclass(frozen=True)
class SyncResult:
    """What replaying one offline run changed in the target."""

    experiment: str
    run_name: str
    source_id: str
    target_id: str
    action: str          # "created", "merged into", "completed" or "up to date"
    params: int
    metric_values: int
    artifacts: int
    status: str
    inputs: int = 0      # dataset inputs added
    conflicts: tuple[str, ...] = ()  # params the target already holds with another value (kept as they are)

    def summary(self) -> str:
        line = (f"{self.action}: {self.experiment}/'{self.run_name}' {self.source_id} -> {self.target_id}: "
                f"+{self.params} params, +{self.metric_values} metric values, +{self.inputs} dataset inputs, "
                f"+{self.artifacts} artifacts, "
                f"status {self.status}")
        return line + (f"; params kept with the target's value: {', '.join(self.conflicts)}" if self.conflicts else "")


def sync(source_uri: str, target_uri: str, experiment: str | None = None) -> list[SyncResult]:
    """Replay every run of `source_uri` (or of its experiment `experiment`) into `target_uri`.

    Args:
        source_uri: The offline store, e.g. sqlite:////abs/mlflow-offline.db.
        target_uri: The store to replay into, e.g. http://127.0.0.1:5000.
        experiment: Only this experiment; None means all.

    Returns:
        One SyncResult per run, parents before their children.

    Raises:
        ConfigError: The target does not answer, or `experiment` is not in the source.
    """
    from mlflow.tracking import MlflowClient

    if source_uri.startswith("sqlite:///") and not Path(source_uri[len("sqlite:///"):]).is_file():
        raise ConfigError(f"--from {source_uri}: no such offline store; give the tracking.fallback_uri the run "
                          "logged to (default sqlite:///<directory it started from>/mlflow-offline.db)")
    check_reachable(target_uri)
    source, target = MlflowClient(tracking_uri=source_uri), MlflowClient(tracking_uri=target_uri)
    if experiment is None:
        experiments = source.search_experiments()
    elif (found := source.get_experiment_by_name(experiment)) is not None:
        experiments = [found]
    else:
        names = ", ".join(e.name for e in source.search_experiments())
        raise ConfigError(f"--experiment {experiment}: not in the offline store {source_uri}; it holds: {names}")
    results: list[SyncResult] = []
    copies: dict[str, str] = {}  # source run id -> target run id, for the parent links
    for exp in experiments:
        runs = _parents_first(list(_all_runs(source, exp.experiment_id)))
        if not runs:
            continue
        target_exp = open_experiment(target, exp.name, target_uri)
        copies.update({r.info.run_id: r.data.tags[SYNCED_TO] for r in runs if SYNCED_TO in r.data.tags})
        for run in runs:
            results.append(_sync_run(source, target, run, exp.name, target_exp, copies))
        _copy_experiment_tags(exp, target, target_exp, copies)
    return results


def _remap(text: str, copies: dict[str, str]) -> str:
    for src_id, dst_id in copies.items():
        text = text.replace(src_id, dst_id)
    return text


def _copy_experiment_tags(exp: Any, target: Any, target_exp: str, copies: dict[str, str]) -> None:
    """The experiment's tags (its kind, a sweep's shared UI view `mlflow.sharedViewState.<parent id>` with the
    parent's id in its filter), with every replayed run's id replaced by its copy's."""
    have = target.get_experiment(target_exp).tags
    for key, value in exp.tags.items():
        key, value = _remap(key, copies), _remap(value, copies)
        if have.get(key) != value:
            target.set_experiment_tag(target_exp, key, value)


def _all_runs(client: Any, experiment_id: str) -> Iterator[Any]:
    token = None
    while True:
        page = client.search_runs([experiment_id], max_results=1000, page_token=token)
        yield from page
        token = page.token
        if not token:
            return


def _parents_first(runs: list[Any]) -> list[Any]:
    """Order runs so a parent (mlflow.parentRunId) comes before its children, oldest first otherwise."""
    by_id = {r.info.run_id: r for r in runs}

    def depth(run: Any) -> int:
        parent, seen = run.data.tags.get(PARENT_TAG), 0
        while parent in by_id and seen < len(by_id):
            parent, seen = by_id[parent].data.tags.get(PARENT_TAG), seen + 1
        return seen

    return sorted(runs, key=lambda r: (depth(r), r.info.start_time or 0))


def _sync_run(source: Any, target: Any, run: Any, experiment: str, target_exp: str,
              copies: dict[str, str]) -> SyncResult:
    from mlflow.entities import Metric, Param, RunTag

    src_id, tags = run.info.run_id, run.data.tags
    continues = tags.get(CONTINUES_RUN)
    if (copy := find_run(target, tags.get(SYNCED_TO))) is not None:
        action = "completed"
    elif (copy := find_run(target, continues)) is not None:
        action = "merged into"
    else:
        copy = target.create_run(target_exp, start_time=run.info.start_time, run_name=run.info.run_name,
                                 tags={SYNCED_FROM: src_id})
        action = "created"
    dst_id = copy.info.run_id
    if tags.get(SYNCED_TO) != dst_id:  # recorded at once: an interrupted sync resumes into this copy
        source.set_tag(src_id, SYNCED_TO, dst_id)
    copies[src_id] = dst_id

    wanted = {k: v for k, v in tags.items() if k not in NOT_COPIED_TAGS}
    if wanted.get(CONTINUES_RUN) == dst_id:
        del wanted[CONTINUES_RUN]  # merged: the copy is the run it continues
    for key in RUN_ID_TAGS:
        if key in tags:
            wanted[key] = copies.get(tags[key], tags[key])  # kept as is if never replayed here
    new_tags = [RunTag(k, v) for k, v in wanted.items() if copy.data.tags.get(k) != v]
    params = [Param(k, v) for k, v in run.data.params.items() if k not in copy.data.params]
    conflicts = tuple(k for k, v in run.data.params.items() if copy.data.params.get(k, v) != v)
    for i in range(0, max(len(new_tags), len(params)), 100):  # MLflow's limit on params and tags per batch
        target.log_batch(dst_id, params=params[i:i + 100], tags=new_tags[i:i + 100])

    metrics = []
    for key in run.data.metrics:
        present = {_identity(m) for m in target.get_metric_history(dst_id, key)} if action != "created" else set()
        metrics += [Metric(key, m.value, m.timestamp, m.step) for m in source.get_metric_history(src_id, key)
                    if _identity(m) not in present]
    for i in range(0, len(metrics), BATCH):
        target.log_batch(dst_id, metrics=metrics[i:i + BATCH])

    inputs = _copy_inputs(run, target, copy if action != "created" else None, dst_id)
    artifacts = _copy_artifacts(source, target, src_id, dst_id)
    status = run.info.status
    ends = status in TERMINAL and (copy.info.status != status or copy.info.end_time != run.info.end_time)
    if ends:
        target.set_terminated(dst_id, status, end_time=run.info.end_time)
    elif status not in TERMINAL:  # still running offline, or killed before it could close: the copy stays as is
        status = copy.info.status
    changed = action == "created" or new_tags or params or metrics or inputs or artifacts or ends
    return SyncResult(experiment, run.info.run_name, src_id, dst_id, action if changed else "up to date",
                      len(params), len(metrics), artifacts, status, inputs=inputs, conflicts=conflicts)


def _identity(metric: Any) -> tuple[str, int, int, str]:
    """A metric value as a comparable key; NaN != NaN, so values compare by their repr."""
    value = "nan" if math.isnan(metric.value) else repr(float(metric.value))
    return metric.key, metric.step, metric.timestamp, value


def _input_identity(entry: Any) -> tuple:
    d = entry.dataset
    return d.name, d.digest, d.source_type, d.source, tuple(sorted((t.key, t.value) for t in entry.tags))


def _copy_inputs(run: Any, target: Any, copy: Any | None, dst_id: str) -> int:
    """Log the run's dataset inputs (dataset and context tags) that the copy lacks; returns how many."""
    from mlflow.entities import DatasetInput

    present = {_input_identity(d) for d in copy.inputs.dataset_inputs} if copy is not None and copy.inputs else set()
    missing = [d for d in (run.inputs.dataset_inputs if run.inputs else []) if _input_identity(d) not in present]
    if missing:
        target.log_inputs(dst_id, datasets=[DatasetInput(d.dataset, d.tags) for d in missing])
    return len(missing)


def _files(client: Any, run_id: str, path: str | None = None) -> Iterator[Any]:
    for info in client.list_artifacts(run_id, path):
        if info.is_dir:
            yield from _files(client, run_id, info.path)
        else:
            yield info


def _copy_artifacts(source: Any, target: Any, src_id: str, dst_id: str) -> int:
    """Upload the source's artifact files that the target lacks (by path and size); returns how many."""
    present = {(f.path, f.file_size) for f in _files(target, dst_id)}
    missing = [f for f in _files(source, src_id) if (f.path, f.file_size) not in present]
    with tempfile.TemporaryDirectory() as tmp:
        for info in missing:
            local = source.download_artifacts(src_id, info.path, tmp)
            folder = str(Path(info.path).parent)
            target.log_artifact(dst_id, local, None if folder == "." else folder)
    return len(missing)
