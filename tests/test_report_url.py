"""`python -m swinexp.report` names the MLflow UI page where a server's sweep runs are."""
from __future__ import annotations

from swinexp.report import runs_page_url


def test_runs_page_url_points_at_the_experiments_runs_tab_of_a_server() -> None:
    # MLflow 3's UI routes with a hash: /#/experiments/<id>/runs is the Model training runs table
    assert runs_page_url("http://127.0.0.1:5000/", "7") == "http://127.0.0.1:5000/#/experiments/7/runs"
    assert runs_page_url("https://mlflow.example.org", "0") == "https://mlflow.example.org/#/experiments/0/runs"
    assert runs_page_url("sqlite:////tmp/mlflow.db", "7") is None  # no server: the README says where to click
