"""The MLflow UI addresses a sweep's report prints (see swinexp.tracking.ui for what the UI keeps in its URL)."""
from __future__ import annotations

from swinexp.tracking.ui import run_url, runs_view_url, ui_base


def test_a_server_is_its_own_ui_and_a_local_store_needs_the_printed_mlflow_ui_command() -> None:
    assert ui_base("http://mlflow.example.org:5000/") == ("http://mlflow.example.org:5000", None)
    assert ui_base("sqlite:////tmp/m.db", 5001) == ("http://127.0.0.1:5001",
                                                     "mlflow ui --backend-store-uri sqlite:////tmp/m.db --port 5001")


def test_runs_view_url_opens_the_shared_view_in_chart_mode_and_model_training() -> None:
    # MLflow 3's UI routes with a hash: /#/experiments/<id>/runs is the Training runs page
    assert runs_view_url("http://127.0.0.1:5000/", "7", "abc") == (
        "http://127.0.0.1:5000/#/experiments/7/runs?viewStateShareKey=abc&compareRunsMode=CHART"
        "&workflowType=machine_learning")
    assert run_url("https://m.org", "0", "r1") == "https://m.org/#/experiments/0/runs/r1"
