"""Where a sweep's comparison is in MLflow's UI: the experiment's kind, a shared view of the sweep, its link.

MLflow 3.17's runs page keeps little in its URL: the search facets (`searchFilter`, `orderByKey`, `orderByAsc`,
`startTime`, `lifecycleFilter`, `modelVersionFilter`, `datasetsFilter`), the view (`compareRunsMode=TABLE|CHART`)
and the sidebar's GenAI / Model training switch (`workflowType=genai|machine_learning`).
Everything else (expanded rows, hidden runs, the charts and their search box) lives in the browser's local storage,
except through a *shared view*: `viewStateShareKey=<key>` makes the page read the experiment tag
`mlflow.sharedViewState.<key>`, a JSON object with facets and UI state (`chartsSearchFilter`, `compareRunCharts`,
`hideEmptyCharts`, ...; never `runsExpanded`, `runsHidden` or `runsPinned`). A URL holding any facet ignores the
shared view, so the sweep's filter goes into the shared view, not into the URL. Its `groupBy` (by a tag or a
param) with `useGroupedValuesInCharts` draws each group in the charts as one line, the group's mean (the
`aggregateFunction`), with its min-max band.
"""
from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlencode

EXPERIMENT_KIND_TAG = "mlflow.experimentKind"  # MLflow 3's UI opens a "custom_model_development" experiment on runs
TRAINING_KIND = "custom_model_development"
SHARED_VIEW_TAG = "mlflow.sharedViewState."
UI_PORT = 5000  # `mlflow ui`'s default
ARM_TAG = "sweep.arm"  # a job's arm: its run name without seed=, amp named as it computed (tracking/arms.py)


def sweep_filter(parent_run_id: str) -> str:
    """The runs search that lists a sweep's jobs and not its parent (which has no metrics of its own)."""
    return f"tags.`sweep.id` = '{parent_run_id}'"


def share_sweep_view(client: Any, experiment_id: str, parent_run_id: str, metric: str) -> str:
    """Store the sweep's view in the experiment: its jobs grouped into arms by their `sweep.arm` tag (the report
    sets it), the chart view filtered on `metric` with one line per arm, the mean over its seeds and their min-max
    band. Returns the view's key."""
    # The UI loads the parents of what matches, so the parent (which has no sweep.arm) is listed too: grouped, it
    # is left in the collapsed "Additional runs" ("Unassigned" in the chart, where it has no values to draw).
    group = {"aggregateFunction": "average", "groupByKeys": [{"mode": "tag", "groupByData": ARM_TAG}]}
    state = {"searchFilter": sweep_filter(parent_run_id), "orderByKey": "attributes.start_time", "orderByAsc": True,
             "groupBy": group, "useGroupedValuesInCharts": True, "chartsSearchFilter": metric,
             "hideEmptyCharts": True}
    client.set_experiment_tag(experiment_id, SHARED_VIEW_TAG + parent_run_id, json.dumps(state))
    return parent_run_id


def runs_view_url(base_url: str, experiment_id: str, share_key: str) -> str:
    """The runs page opened on a shared view, in chart mode."""
    # workflowType: the UI's GenAI / Model training switch, which the page reads from the URL before the browser's
    # stored choice (GenAI for a new user); with it on, the switch and not the experiment's kind picks the pages
    query = urlencode({"viewStateShareKey": share_key, "compareRunsMode": "CHART", "workflowType": "machine_learning"})
    return f"{base_url.rstrip('/')}/#/experiments/{experiment_id}/runs?{query}"


def run_url(base_url: str, experiment_id: str, run_id: str) -> str:
    return f"{base_url.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}"


def ui_base(tracking_uri: str, port: int = UI_PORT) -> tuple[str, str | None]:
    """(the UI's address, the command that serves it): a server is its own UI; a local store needs `mlflow ui`."""
    if tracking_uri.startswith(("http://", "https://")):
        return tracking_uri.rstrip("/"), None
    return f"http://127.0.0.1:{port}", f"mlflow ui --backend-store-uri {tracking_uri} --port {port}"
