"""A finished sweep opened from the link it prints, in a real browser: MLflow 3.17's UI (`mlflow ui`, started and
stopped here) in Debian's Chromium driven by Playwright. The screenshots are kept under test-artifacts/sweep_ui/
(or $SWINEXP_TEST_ARTIFACTS/sweep_ui/); the test prints where.
"""
from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mlflow.tracking import MlflowClient

from tests import servers
from tests.conftest import ROOT, SMOKE

pytestmark = pytest.mark.slow

ARTIFACTS = Path(os.environ.get("SWINEXP_TEST_ARTIFACTS", ROOT / "test-artifacts")) / "sweep_ui"
PRINTED_PORT = 5000  # the port of the `mlflow ui` command the sweep prints (swinexp.tracking.ui.UI_PORT)


@pytest.fixture
def browser() -> Iterator[Any]:
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is in the test extra: "
                                   "pip install -e '.[test]'")
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("no chromium on PATH; .ci/run installs Debian's (apt-get install chromium): Playwright's own "
                    "browser download cannot reach its host here")
    with sync_api.sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox"])  # CI runs as root
        try:
            yield launched
        finally:
            launched.close()


def _printed_ui_on(command: str, port: int) -> list[str]:
    """The printed `mlflow ui ...` command's arguments, moved to `port`."""
    args = shlex.split(command.replace(f"--port {PRINTED_PORT}", f"--port {port}"))
    assert args[0] == "mlflow"
    return args


def test_the_link_a_sweep_prints_opens_its_jobs_and_their_val_top1_chart(tmp_path: Path, browser: Any) -> None:
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    smoke = [o for o in SMOKE if not o.startswith(("tracking=", "amp="))]
    # launcher basic: the three jobs share one process, the cheapest real sweep
    sweep = subprocess.run(
        [sys.executable, str(ROOT / "run.py"), "-m", "amp=o0,o2,o1_manual", "hydra/launcher=basic", *smoke,
         f"data.root={tmp_path / 'data'}", "tracking=mlflow", f"tracking.uri={uri}",
         f"hydra.sweep.dir={tmp_path / 'multirun'}"], cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert sweep.returncode == 0, sweep.stderr[-3000:]
    link = re.search(r"^compare in MLflow: (http://127\.0\.0\.1:5000/\S+)$", sweep.stdout, re.M)
    command = re.search(r"^  first serve the store: (mlflow ui .+)$", sweep.stdout, re.M)
    assert link and command, sweep.stdout[-3000:]
    assert command.group(1) == f"mlflow ui --backend-store-uri {uri} --port 5000"
    assert "| amp=o1_manual | " in sweep.stdout  # the table, at the sweep's end

    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("swinexp").experiment_id])
    (parent,) = [r for r in runs if r.data.tags.get("sweep.role") == "parent"]
    jobs = {r.info.run_name: r.info.run_id for r in runs if r is not parent}
    assert sorted(jobs) == ["amp=o0", "amp=o1_manual", "amp=o2"]
    assert not any(key.startswith("system/") for key in parent.data.metrics)  # no charts of the sweep process

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    print(f"screenshots: {ARTIFACTS}")
    port = servers.free_port()
    with servers.serving(_printed_ui_on(command.group(1), port), port, tmp_path / "ui.log") as base:
        page = browser.new_page(viewport={"width": 1600, "height": 1000})
        page.goto(link.group(1).replace(f"http://127.0.0.1:{PRINTED_PORT}", base))
        clicks = 0
        # the three jobs are listed, the parent is not (it waits in the collapsed "Additional runs")
        for name, run_id in jobs.items():
            page.locator(f'a[href$="/runs/{run_id}"]', has_text=name).first.wait_for(state="visible",
                                                                                      timeout=60_000)
        assert page.locator(f'a[href$="/runs/{parent.info.run_id}"]').count() == 0
        # the chart view shows val/top1, and its legend holds the three jobs and not the parent
        legend = {name: page.get_by_text(f"{name} (val/top1)", exact=True) for name in jobs}
        for entry in legend.values():
            entry.first.wait_for(state="attached", timeout=60_000)
        assert page.get_by_text(f"{parent.info.run_name} (val/top1)", exact=True).count() == 0
        assert page.get_by_text("val/top1", exact=True).first.is_visible()
        # ... and its curves are drawn (plotly traces; the charts' search leaves only this chart on the page)
        page.locator("g.trace.scatter").nth(len(jobs) - 1).wait_for(state="attached", timeout=60_000)
        page.screenshot(path=str(ARTIFACTS / "1-printed-link.png"))
        print(f"clicks from the printed link to the overlaid val/top1 curves of the 3 jobs: {clicks}")

        # one click enlarges the chart, with every legend entry in view
        page.locator('[data-component-id="fullscreen_button_chartcard"]').first.click()
        deadline = time.monotonic() + 30
        while min(entry.count() for entry in legend.values()) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)  # the enlarged chart's legend is a second copy of the card's
        assert min(entry.count() for entry in legend.values()) >= 2
        page.screenshot(path=str(ARTIFACTS / "2-chart-enlarged.png"))

        # the report page the sweep wrote, without a server: a line per job, hidden by unticking the job
        report = browser.new_page(viewport={"width": 1000, "height": 1100})
        report.goto((tmp_path / "multirun" / "report" / "report.html").as_uri())
        lines = report.locator('g[data-job="amp=o2"]')
        assert lines.count() == 2 and lines.first.is_visible()  # in the val/top1 and the train/loss chart
        report.locator('input[data-job="amp=o2"]').uncheck()
        assert not lines.first.is_visible() and not lines.last.is_visible()
        assert report.locator('g[data-job="amp=o0"]').first.is_visible()
        report.screenshot(path=str(ARTIFACTS / "3-report-html.png"), full_page=True)
