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


def _watch_searches(page: Any) -> set[Any]:
    """The page's run searches in flight (the UI polls other endpoints all the time: the network is never idle)."""
    pending: set[Any] = set()
    page.on("request", lambda r: pending.add(r) if "/runs/search" in r.url else None)
    page.on("requestfinished", lambda r: pending.discard(r))
    page.on("requestfailed", lambda r: pending.discard(r))
    return pending


def _settled(page: Any, searches: set[Any], seconds: float = 3.0) -> None:
    """Wait until no run search is in flight and the listed runs and chart legends stayed the same for `seconds`."""
    seen, since = None, time.monotonic()
    deadline = since + 60
    while time.monotonic() - since < seconds:
        assert time.monotonic() < deadline, "the runs page did not settle in 60 s"
        now = (bool(searches), page.locator('a[href*="/runs/"]').all_inner_texts(),
               page.get_by_text(re.compile(r"\(val/top1\)$")).all_inner_texts())
        if now != seen or searches:
            seen, since = now, time.monotonic()
        time.sleep(0.25)


def test_the_link_a_sweep_prints_opens_one_val_top1_line_per_arm_with_its_band(tmp_path: Path, browser: Any) -> None:
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    smoke = [o for o in SMOKE if not o.startswith(("tracking=", "amp="))]
    # 2 arms x 2 seeds on the default (isolated) launcher: every job in its own process, as a user's sweep runs
    sweep = subprocess.run(
        [sys.executable, str(ROOT / "run.py"), "-m", "amp=o0,o2", "seed=0,1", *smoke,
         f"data.root={tmp_path / 'data'}", "tracking=mlflow", f"tracking.uri={uri}",
         f"hydra.sweep.dir={tmp_path / 'multirun'}"], cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert sweep.returncode == 0, sweep.stderr[-3000:]
    link = re.search(r"^compare in MLflow: (http://127\.0\.0\.1:5000/\S+)$", sweep.stdout, re.M)
    command = re.search(r"^  first serve the store: (mlflow ui .+)$", sweep.stdout, re.M)
    assert link and command, sweep.stdout[-3000:]
    assert command.group(1) == f"mlflow ui --backend-store-uri {uri} --port 5000"
    assert "| amp=o2 (seeds: 2) | " in sweep.stdout  # the table, at the sweep's end

    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("swinexp").experiment_id])
    (parent,) = [r for r in runs if r.data.tags.get("sweep.role") == "parent"]
    jobs = {r.info.run_name: r.info.run_id for r in runs if r is not parent}
    assert sorted(jobs) == ["amp=o0 seed=0", "amp=o0 seed=1", "amp=o2 seed=0", "amp=o2 seed=1"]
    arms = sorted({r.data.tags["sweep.arm"] for r in runs if r is not parent})
    assert arms == ["amp=o0", "amp=o2"]  # on a CPU each policy computes what it is named
    assert not any(key.startswith("system/") for key in parent.data.metrics)  # no charts of the sweep process

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    print(f"screenshots: {ARTIFACTS}")
    clicks = 0

    def click(target: Any) -> None:
        nonlocal clicks
        target.click()
        clicks += 1

    port = servers.free_port()
    with servers.serving(_printed_ui_on(command.group(1), port), port, tmp_path / "ui.log") as base:
        page = browser.new_page(viewport={"width": 1600, "height": 1000})
        searches = _watch_searches(page)
        page.goto(link.group(1).replace(f"http://127.0.0.1:{PRINTED_PORT}", base))
        # the four jobs are listed, one group per arm
        for name, run_id in jobs.items():
            page.locator(f'a[href$="/runs/{run_id}"]', has_text=name).first.wait_for(state="visible",
                                                                                      timeout=60_000)
        for arm in arms:
            page.get_by_text(f"Group: {arm}", exact=True).first.wait_for(state="visible", timeout=60_000)
        # the chart view shows val/top1 with a legend entry per arm, drawn: a line and a min-max band each
        legend = {arm: page.get_by_text(f"{arm} (val/top1)", exact=True) for arm in arms}
        for entry in legend.values():
            entry.first.wait_for(state="visible", timeout=60_000)
        page.get_by_text("val/top1", exact=True).first.wait_for(state="visible", timeout=60_000)
        bands = page.locator("g.trace.scatter path.js-fill")
        bands.nth(len(arms) - 1).wait_for(state="visible", timeout=60_000)
        # settled, the parent is still not listed (it waits in the collapsed "Additional runs"), no job has a line
        # of its own, and each arm has exactly one band
        _settled(page, searches)
        assert page.locator(f'a[href$="/runs/{parent.info.run_id}"]').count() == 0
        assert page.get_by_text(f"{parent.info.run_name} (val/top1)", exact=True).count() == 0
        assert all(page.get_by_text(f"{name} (val/top1)", exact=True).count() == 0 for name in jobs)
        assert sum(bands.nth(i).is_visible() for i in range(bands.count())) == len(arms)
        page.screenshot(path=str(ARTIFACTS / "1-printed-link.png"))
        print(f"clicks from the printed link to one val/top1 line per arm with its band: {clicks} (counted: "
              "each click this test makes goes through click())")

        # one click enlarges the chart, with every legend entry in view
        click(page.locator('[data-component-id="fullscreen_button_chartcard"]').first)
        deadline = time.monotonic() + 30
        while min(entry.count() for entry in legend.values()) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)  # the enlarged chart's legend is a second copy of the card's
        for entry in legend.values():
            entry.nth(1).wait_for(state="visible", timeout=30_000)
        page.screenshot(path=str(ARTIFACTS / "2-chart-enlarged.png"))
        print(f"clicks to the enlarged chart: {clicks}")

        # the report page the sweep wrote, without a server: per arm its mean, its band over the seeds and each
        # seed's line, and its paired difference to amp=o0 with the interval; unticking an arm hides it everywhere
        report = browser.new_page(viewport={"width": 1000, "height": 1100})
        report.goto((tmp_path / "multirun" / "report" / "report.html").as_uri())
        o2 = report.locator('g[data-arm="amp=o2"]')
        assert o2.count() == 3  # in the val/top1, the train/loss and the paired-difference chart
        assert all(o2.nth(i).locator("polygon.band").count() == 1 for i in range(3))  # a band in each
        assert o2.first.locator("g[data-job]").count() == 2 and o2.first.is_visible()  # seed 0 and 1
        report.locator('input[data-arm="amp=o2"]').uncheck()
        clicks += 1  # uncheck() is a click on the box
        assert not any(o2.nth(i).is_visible() for i in range(3))
        assert report.locator('g[data-arm="amp=o0"]').first.is_visible()
        report.screenshot(path=str(ARTIFACTS / "3-report-html.png"), full_page=True)
    print(f"clicks this test made in all: {clicks}")
