"""The MLflow tracker (`tracking=mlflow`): runs driven through `MlflowClient` with an explicit run id, so no global
"active run" can leak from one job into the next.

With `on_unreachable: warn`, a tracking server that cannot be reached (at start, or when it stops answering
mid-run) is replaced by a local offline store, `fallback_uri`; `python -m swinexp.tracking sync` (see
`swinexp.tracking.sync`) replays that store into the server later.
"""
from __future__ import annotations

import json
import logging
import os
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from swinexp.registry import TRACKERS, ConfigError
from swinexp.tracking import store_lock
from swinexp.tracking.dataset import DatasetRecord

if TYPE_CHECKING:
    from swinexp.tracking.system import SystemMetrics

from swinexp.tracking.protocol import CONTINUES_RUN, FAILURE_TAG, SYNCED_TO, Tracker

log = logging.getLogger("swinexp")

T = TypeVar("T")
MAX_PARAM_CHARS = 6000  # MLflow's limit on one param value
ON_UNREACHABLE = ("error", "warn")
LOG_CHECKPOINTS = ("best", "last", "both", "none")  # tracking.log_checkpoints: which checkpoint files end a run
OFFLINE_STORE = "sqlite:///mlflow-offline.db"  # fallback_uri null: beside mlflow.db, in the starting directory

def resolve_uri(uri: str | None, cwd: Path) -> str:
    """Absolute tracking URI: None -> `sqlite:///<cwd>/mlflow.db` (MLflow 3's default); relative paths -> absolute.

    Resolving once matters: a relative URI re-read from another working directory scatters runs across stores.
    """
    if uri is None or uri == "":
        return f"sqlite:///{(cwd / 'mlflow.db').resolve()}"
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        return f"sqlite:///{(cwd / uri[len('sqlite:///'):]).resolve()}"
    if "://" not in uri:  # a plain folder: MLflow's file store
        return (cwd / uri).resolve().as_uri()
    return uri


def local_artifact_root(uri: str) -> str | None:
    """Keep a local store's artifacts next to it, whatever the working directory of the job."""
    if uri.startswith("sqlite:///"):
        return (Path(uri[len("sqlite:///"):]).parent / "mlruns").as_uri()
    return None


def check_reachable(uri: str, timeout_s: float = 5.0) -> None:
    """Fail in seconds on an unreachable server, instead of after MLflow's minutes of retries."""
    if not uri.startswith(("http://", "https://")):
        return
    try:
        urllib.request.urlopen(f"{uri.rstrip('/')}/health", timeout=timeout_s).close()
    except (urllib.error.URLError, OSError) as err:
        raise ConfigError(
            f"cannot reach the MLflow tracking server tracking.uri='{uri}' ({err}); start it "
            f"(mlflow server --host 127.0.0.1 --port ...), fix the URI, run with tracking=none, or set "
            "tracking.on_unreachable=warn to log to a local offline store and sync it later"
        ) from err


def is_reachable(uri: str) -> bool:
    """False only for a server that does not answer its health check; local stores count as reachable."""
    try:
        check_reachable(uri)
    except ConfigError:
        return False
    return True


def open_experiment(client: Any, name: str, uri: str) -> str:
    """The id of experiment `name` in the store of `client`, created (artifacts beside a local store) if missing, and
    tagged as model training: MLflow 3's UI then opens it on its runs, not on GenAI traces."""
    from mlflow.exceptions import MlflowException

    from swinexp.tracking.ui import EXPERIMENT_KIND_TAG, TRAINING_KIND

    found = client.get_experiment_by_name(name)
    if found is not None:
        if EXPERIMENT_KIND_TAG not in found.tags:  # made before swinexp tagged its experiments, or by hand
            client.set_experiment_tag(found.experiment_id, EXPERIMENT_KIND_TAG, TRAINING_KIND)
        return found.experiment_id
    try:
        return client.create_experiment(name, artifact_location=local_artifact_root(uri),
                                        tags={EXPERIMENT_KIND_TAG: TRAINING_KIND})
    except MlflowException:  # created meanwhile by another job
        return client.get_experiment_by_name(name).experiment_id


def find_run(client: Any, run_id: str | None) -> Any:
    """The run `run_id` of `client`'s store, or None if the store has no such run (other errors propagate)."""
    from mlflow.exceptions import MlflowException

    if not run_id:
        return None
    try:
        return client.get_run(run_id)
    except MlflowException as err:
        if err.error_code == "RESOURCE_DOES_NOT_EXIST":
            return None
        raise


def sync_command(fallback_uri: str, uri: str, experiment: str) -> str:
    """The command that replays the offline store into the server."""
    return f"python -m swinexp.tracking sync --from {fallback_uri} --to {uri} --experiment {experiment}"


class MlflowTracker:
    """One MLflow run per job, addressed by run id; optionally falling back to an offline store.

    `run_id` is the run's identity, the id a resume passes back to `start`. After a mid-run switch to the
    offline store it stays the server run's id while values go to a continuation run in the offline store,
    tagged `swinexp.continues_run=<run_id>`, which `sync` merges back into that run.

    Args:
        uri: Absolute tracking URI (see resolve_uri).
        experiment: Experiment name, created if missing.
        on_unreachable: "error": an unreachable server raises ConfigError. "warn": log a warning and use
            `fallback_uri` instead, at start or when the server stops answering mid-run.
        fallback_uri: Absolute URI of the offline store; None means `sqlite:///<cwd>/mlflow-offline.db`.
        log_every_n_steps: `log_step_metrics` keeps optimizer steps divisible by this; 0 keeps none.
        log_checkpoints: best | last | both | none (see Tracker.log_checkpoints).
        system_metrics_interval_s: Seconds between system metric samples; None logs no system metrics.
    """

    def __init__(self, uri: str, experiment: str, on_unreachable: str = "error",
                 fallback_uri: str | None = None, log_every_n_steps: int = 0, log_checkpoints: str = "none",
                 system_metrics_interval_s: float | None = None) -> None:
        if on_unreachable not in ON_UNREACHABLE:
            raise ConfigError(f"tracking.on_unreachable='{on_unreachable}' is not valid; choose one of: "
                              f"{', '.join(ON_UNREACHABLE)} (warn: log to tracking.fallback_uri and sync later)")
        if log_checkpoints not in LOG_CHECKPOINTS:
            raise ConfigError(f"tracking.log_checkpoints='{log_checkpoints}' is not valid; choose one of: "
                              f"{', '.join(LOG_CHECKPOINTS)} (best: checkpoints/best.ckpt and config.yaml)")
        if log_every_n_steps < 0:
            raise ConfigError(f"tracking.log_every_n_steps={log_every_n_steps} must be >= 0 (0: epoch metrics only)")
        if system_metrics_interval_s is not None and system_metrics_interval_s <= 0:
            raise ConfigError(f"tracking.system_metrics_interval_s={system_metrics_interval_s} must be > 0 seconds, "
                              "or null to log no system metrics")
        self.log_every_n_steps, self.log_checkpoints = log_every_n_steps, log_checkpoints
        self.system_metrics_interval_s = system_metrics_interval_s
        self._system: SystemMetrics | None = None
        self._resumed_steps: int = 0  # log_step_metrics skips optimizer steps up to this (a reopened run has them)
        logging.getLogger("alembic").setLevel(logging.WARNING)
        self.server_uri, self.experiment, self.on_unreachable = uri, experiment, on_unreachable
        self.fallback_uri = fallback_uri or resolve_uri(OFFLINE_STORE, Path(os.getcwd()))
        self.offline = False
        self.run_id: str | None = None
        self._store_run_id: str | None = None  # where values go now: run_id, or its continuation offline
        self._run_name, self._tags, self._params = "", {}, {}  # copied into a continuation run on a switch
        try:
            self._open(uri)
        except ConfigError as err:
            if on_unreachable == "error":
                raise
            self._fall_back(err.__cause__ or err)  # the connection error itself, not the advice around it

    def _open(self, uri: str) -> None:
        from mlflow.tracking import MlflowClient

        check_reachable(uri)
        try:
            with store_lock.opening(uri):  # a new sqlite store is migrated by one process at a time
                self.uri, self.client = uri, MlflowClient(tracking_uri=uri)
                self.experiment_id = store_lock.retry_locked(
                    lambda: open_experiment(self.client, self.experiment, uri))
        except Exception as err:  # noqa: BLE001 - any connection/store failure gets the same advice
            raise ConfigError(
                f"cannot reach the MLflow tracking store tracking.uri='{uri}' ({type(err).__name__}: {err}); "
                "start the server, fix the URI, or run with tracking=none"
            ) from err

    def _fall_back(self, reason: Exception) -> None:
        """Switch to the offline store; a run already open continues there as a continuation run."""
        command = sync_command(self.fallback_uri, self.server_uri, self.experiment)
        if self._store_run_id is None:
            log.warning("tracking.uri='%s' is unreachable (%s). tracking.on_unreachable=warn: this run is logged to "
                        "the offline store %s instead. When the server is back, replay it with: %s",
                        self.server_uri, reason, self.fallback_uri, command)
        else:
            log.warning("the tracking server tracking.uri='%s' stopped answering during run %s (%s). "
                        "tracking.on_unreachable=warn: the rest of the run goes to the offline store %s, tagged "
                        "%s=%s. When the server is back, merge it into the run with: %s", self.server_uri,
                        self.run_id, reason, self.fallback_uri, CONTINUES_RUN, self.run_id, command)
        try:
            self._open(self.fallback_uri)
        except ConfigError as err:
            raise ConfigError(f"the offline store tracking.fallback_uri='{self.fallback_uri}' cannot be opened "
                              f"either ({err}); point tracking.fallback_uri at a writable sqlite:/// path") from err
        self.offline = True
        if self._store_run_id is not None:
            self._store_run_id = self._continuation(self.run_id)
            self.log_params(self._params)

    def _continuation(self, run_id: str) -> str:
        """A run in the offline store for the rest of server run `run_id`; sync merges it into that run."""
        run = self.client.create_run(self.experiment_id, run_name=self._run_name,
                                     tags={**self._tags, CONTINUES_RUN: run_id})
        return run.info.run_id

    def _call(self, store_call: Callable[[], T]) -> T:
        """Run a store call; with on_unreachable=warn a server that stopped answering is replaced by the fallback.

        A failure while the server still answers its health check is a real error and propagates.
        """
        try:
            return store_lock.retry_locked(store_call)  # sqlite: another process may be writing right now
        except ConfigError:
            raise
        except Exception as err:  # noqa: BLE001 - MLflow wraps connection failures in several exception types
            if self.on_unreachable == "error" or self.offline or is_reachable(self.server_uri):
                raise
            self._fall_back(err)
            return store_call()

    def start(self, run_name: str, tags: Mapping[str, str], run_id: str | None = None) -> str | None:
        """Create a run, or reopen run `run_id` (status back to RUNNING, same id) to continue logging into it.

        Raises:
            ConfigError: `run_id` is not in the store (with what to do about it).
        """
        self._run_name, self._tags = run_name, dict(tags)
        if run_id is None:
            self.run_id = self._store_run_id = self._call(
                lambda: self.client.create_run(self.experiment_id, run_name=run_name, tags=self._tags).info.run_id)
            self._resumed_steps = 0
        else:
            self.run_id = run_id
            self._store_run_id = self._call(lambda: self._reopen(run_id))
            self._resumed_steps = -1  # read from the store at the first log_step_metrics
        if self.system_metrics_interval_s is not None:
            from swinexp.tracking.system import SystemMetrics

            self._system = SystemMetrics(self._store_run_id, self.uri, self.system_metrics_interval_s,
                                         resume=run_id is not None)
        return self.run_id

    def _reopen(self, run_id: str) -> str:
        from mlflow.entities import RunStatus, RunTag

        if find_run(self.client, run_id) is None:
            if self.offline and self.on_unreachable == "warn":
                return self._continuation(run_id)  # the run lives on the server we cannot reach
            self.run_id = run_id = self._synced_copy(run_id)
        self.client.update_run(run_id, status=RunStatus.to_string(RunStatus.RUNNING))
        self.client.log_batch(run_id, tags=[RunTag(k, str(v)) for k, v in self._tags.items()])
        return run_id

    def _synced_copy(self, run_id: str) -> str:
        """The id, in this store, of offline run `run_id` once synced here; ConfigError if there is none."""
        from mlflow.tracking import MlflowClient

        offline = None
        if self.fallback_uri != self.uri and _store_exists(self.fallback_uri):
            offline = find_run(MlflowClient(tracking_uri=self.fallback_uri), run_id)
        if offline is not None and SYNCED_TO in offline.data.tags:
            log.info("run %s was logged offline and synced; continuing its copy %s", run_id,
                     offline.data.tags[SYNCED_TO])
            return offline.data.tags[SYNCED_TO]
        if offline is not None:
            raise ConfigError(
                f"run {run_id} is in the offline store {self.fallback_uri}, not yet in tracking.uri='{self.uri}'; "
                f"replay it first with `{sync_command(self.fallback_uri, self.uri, self.experiment)}`, then resume "
                "again (the run continues in its synced copy)"
            )
        raise ConfigError(
            f"cannot reopen run {run_id}: it does not exist in tracking.uri='{self.uri}'; resume with the "
            "tracking.uri (and tracking.fallback_uri) the run was logged to, or start a new run"
        )

    def logged_steps(self, key: str) -> set[int]:
        """The steps at which metric `key` already has a value in the current run (in the store in use)."""
        if self._store_run_id is None:
            return set()
        return self._call(lambda: {m.step for m in self.client.get_metric_history(self._store_run_id, key)})

    def log_params(self, params: Mapping[str, Any]) -> None:
        from mlflow.entities import Param

        self._params.update(params)
        items = [Param(k, str(v)[:MAX_PARAM_CHARS]) for k, v in params.items()]
        for i in range(0, len(items), 100):  # MLflow accepts at most 100 params per batch
            batch = items[i:i + 100]
            self._call(lambda batch=batch: self.client.log_batch(self._store_run_id, params=batch))

    def set_tags(self, tags: Mapping[str, str | None]) -> None:
        """Set tags on the open run; a None value removes that tag if the run has it."""
        from mlflow.entities import RunTag

        self._tags = {**{k: v for k, v in self._tags.items() if k not in tags},
                      **{k: v for k, v in tags.items() if v is not None}}
        batch = [RunTag(k, str(v)[:MAX_PARAM_CHARS]) for k, v in tags.items() if v is not None]
        if batch:
            self._call(lambda: self.client.log_batch(self._store_run_id, tags=batch))
        removed = [k for k, v in tags.items() if v is None]
        if removed:
            present = self._call(lambda: self.client.get_run(self._store_run_id)).data.tags
            for key in (k for k in removed if k in present):
                self._call(lambda key=key: self.client.delete_tag(self._store_run_id, key))

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(k, float(v), now, step) for k, v in metrics.items()]
        self._call(lambda: self.client.log_batch(self._store_run_id, metrics=batch))

    def log_step_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        """Log at every `log_every_n_steps`-th optimizer step, except steps the (reopened) run already holds."""
        if not self.log_every_n_steps or step % self.log_every_n_steps:
            return
        if self._resumed_steps < 0:
            self._resumed_steps = max(self.logged_steps(next(iter(metrics))), default=0)
        if step > self._resumed_steps:
            self.log_metrics(metrics, step)

    def log_dataset(self, record: DatasetRecord) -> None:
        """The split as a run input (MLflow's Datasets panel), tagged with its context (training/validation)."""
        from mlflow.entities import Dataset, DatasetInput, InputTag

        dataset = Dataset(record.name, record.digest, "local", json.dumps({"uri": record.source}),
                          profile=record.profile())
        entry = DatasetInput(dataset, [InputTag("mlflow.data.context", record.context)])
        self._call(lambda: self.client.log_inputs(self._store_run_id, datasets=[entry]))

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        self._call(lambda: self.client.log_artifact(self._store_run_id, str(path), artifact_path))

    def set_status(self, status: str) -> None:
        self._call(lambda: self.client.update_run(self._store_run_id, status=status))

    def close(self, status: str = "FINISHED", reason: str | None = None) -> None:
        if self._system is not None:  # before the run ends: the monitor's last sample goes into a RUNNING run
            self._system.stop()
            self._system = None
        if self._store_run_id is not None:
            if reason:
                self._call(lambda: self.client.set_tag(self._store_run_id, FAILURE_TAG, reason[:5000]))
            self._call(lambda: self.client.set_terminated(self._store_run_id, status))
            if self.offline:
                log.warning("run %s was logged to the offline store %s; replay it into the server with: %s",
                            self.run_id, self.fallback_uri,
                            sync_command(self.fallback_uri, self.server_uri, self.experiment))
        self.run_id = self._store_run_id = None


def _store_exists(uri: str) -> bool:
    """Whether a store is there to look into; opening a missing sqlite file would create it."""
    return not uri.startswith("sqlite:///") or Path(uri[len("sqlite:///"):]).is_file()


@TRACKERS.register("mlflow")
def mlflow(uri: str | None = None, experiment: str = "swinexp", on_unreachable: str = "error",
           fallback_uri: str | None = None, log_every_n_steps: int = 50, log_checkpoints: str = "best",
           system_metrics: bool = True, system_metrics_interval_s: float = 10.0) -> Tracker:
    """MLflow tracking; `uri` None means `sqlite:///mlflow.db` in the directory the command was started from.

    Args:
        uri: Tracking URI: a server (http://host:port), sqlite:///path.db, or a folder.
        experiment: Experiment name.
        on_unreachable: "error" (fail in seconds) or "warn" (log to `fallback_uri`, replay later with sync).
        fallback_uri: Offline store for on_unreachable=warn; None means `sqlite:///mlflow-offline.db` in the
            directory the command was started from.
        log_every_n_steps: Also log step/train/loss, step/train/loss_scale, step/train/overflow every N optimizer
            steps (step = optimizer step); 0 = epoch metrics only.
        log_checkpoints: Checkpoint logged with config.yaml as artifacts when the run ends: best | last | both | none.
        system_metrics: Sample CPU, memory, disk, network (and accelerator memory) into system/*.
        system_metrics_interval_s: Seconds between samples.
    """
    cwd = Path(os.getcwd())
    return MlflowTracker(resolve_uri(uri, cwd), experiment, on_unreachable,
                         resolve_uri(fallback_uri or OFFLINE_STORE, cwd), log_every_n_steps, log_checkpoints,
                         system_metrics_interval_s if system_metrics else None)


