"""Experiment trackers (`conf/tracking`): a small protocol the training loop talks to, and its MLflow store.

The loop never imports mlflow; runs are driven through `MlflowClient` with an explicit run id, so no global
"active run" can leak from one job into the next.
"""
from __future__ import annotations

import logging
import os
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Mapping, Protocol

from swinexp.registry import TRACKERS, ConfigError

MAX_PARAM_CHARS = 6000  # MLflow's limit on one param value


class Tracker(Protocol):
    run_id: str | None

    def start(self, run_name: str, tags: Mapping[str, str]) -> str | None: ...
    def log_params(self, params: Mapping[str, Any]) -> None: ...
    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None: ...
    def log_artifact(self, path: Path) -> None: ...
    def close(self, status: str = "FINISHED") -> None: ...


class NullTracker:
    """Logs nothing: for quick runs and tests that do not look at a store."""

    run_id: str | None = None

    def start(self, run_name: str, tags: Mapping[str, str]) -> str | None:
        return None

    def log_params(self, params: Mapping[str, Any]) -> None:
        pass

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        pass

    def log_artifact(self, path: Path) -> None:
        pass

    def close(self, status: str = "FINISHED") -> None:
        pass


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


def _local_artifact_root(uri: str) -> str | None:
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
            f"(mlflow server --host 127.0.0.1 --port ...), fix the URI, or run with tracking=none"
        ) from err


class MlflowTracker:
    """One MLflow run per job, addressed by run id."""

    def __init__(self, uri: str, experiment: str) -> None:
        from mlflow.tracking import MlflowClient

        logging.getLogger("alembic").setLevel(logging.WARNING)
        self.uri, self.experiment = uri, experiment
        check_reachable(uri)
        self.client = MlflowClient(tracking_uri=uri)
        self.run_id: str | None = None
        try:
            found = self.client.get_experiment_by_name(experiment)
            self.experiment_id = found.experiment_id if found else self._create_experiment()
        except Exception as err:  # noqa: BLE001 - any connection/store failure gets the same advice
            raise ConfigError(
                f"cannot reach the MLflow tracking store tracking.uri='{uri}' ({type(err).__name__}: {err}); "
                "start the server, fix the URI, or run with tracking=none"
            ) from err

    def _create_experiment(self) -> str:
        from mlflow.exceptions import MlflowException

        try:
            return self.client.create_experiment(self.experiment, artifact_location=_local_artifact_root(self.uri))
        except MlflowException:  # created meanwhile by another job
            return self.client.get_experiment_by_name(self.experiment).experiment_id

    def start(self, run_name: str, tags: Mapping[str, str]) -> str | None:
        run = self.client.create_run(self.experiment_id, run_name=run_name, tags=dict(tags))
        self.run_id = run.info.run_id
        return self.run_id

    def log_params(self, params: Mapping[str, Any]) -> None:
        from mlflow.entities import Param

        items = [Param(k, str(v)[:MAX_PARAM_CHARS]) for k, v in params.items()]
        for i in range(0, len(items), 100):  # MLflow accepts at most 100 params per batch
            self.client.log_batch(self.run_id, params=items[i:i + 100])

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, float(v), now, step) for k, v in metrics.items()])

    def log_artifact(self, path: Path) -> None:
        self.client.log_artifact(self.run_id, str(path))

    def close(self, status: str = "FINISHED") -> None:
        if self.run_id is not None:
            self.client.set_terminated(self.run_id, status)
            self.run_id = None


@TRACKERS.register("mlflow")
def mlflow(uri: str | None = None, experiment: str = "swinexp") -> Tracker:
    """MLflow tracking; `uri` None means `sqlite:///mlflow.db` in the directory the command was started from."""
    return MlflowTracker(resolve_uri(uri, Path(os.getcwd())), experiment)


@TRACKERS.register("none")
def none() -> Tracker:
    """No tracking."""
    return NullTracker()


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
