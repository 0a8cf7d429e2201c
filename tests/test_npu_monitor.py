"""The job's Ascend cards in MLflow's system metrics, with a stand-in `npu-smi` on PATH (tests/fixtures/npu_smi/: the
documented output of a 910 and a 910B server, a malformed answer, and one that never comes)."""
from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import pytest
from hydra import compose as compose_cfg
from hydra import initialize_config_dir
from mlflow.tracking import MlflowClient

from swinexp.runtime import npu_smi
from tests.conftest import CONF_DIR, SMOKE

FAKE = Path(__file__).parent / "fixtures" / "npu_smi"
SERIES = ("hbm_used_mb", "hbm_total_mb", "aicore_util_pct", "aicpu_util_pct", "power_w", "temp_c", "health")


@pytest.fixture
def fake_npu_smi(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """npu-smi on PATH is the stand-in; returns the file its calls are logged to."""
    monkeypatch.setenv("PATH", f"{FAKE}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_NPU_SMI_LOG", str(tmp_path / "npu-smi-calls.txt"))
    for name in ("MS_ROLE", "MS_WORKER_NUM", "DEVICE_ID"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path / "npu-smi-calls.txt"


def _train(tmp_path: Path, synthetic_root: Path, *extra: str) -> tuple[MlflowClient, str]:
    from swinexp.app.job import run
    from swinexp.app.job_info import JobInfo

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    overrides = [*SMOKE, f"data.root={synthetic_root}", "tracking=mlflow", f"tracking.uri={uri}",
                 "tracking.system_metrics_interval_s=0.5", *extra]
    with initialize_config_dir(version_base="1.3", config_dir=str(CONF_DIR)):
        cfg = compose_cfg("config", overrides=overrides)
    run(cfg, JobInfo(run_dir=tmp_path / "run", overrides=[*overrides, "hydra.run.dir=x"], choices={}))
    client = MlflowClient(uri)
    (found,) = client.search_runs([client.get_experiment_by_name("swinexp").experiment_id])
    return client, found.info.run_id


def test_the_documented_910_and_910b_tables_parse_to_their_cards() -> None:
    for model, hbm_total, name in (("910", 32768, "910A"), ("910b", 65536, "910B3")):
        cards = npu_smi.parse_info((FAKE / f"info_{model}.txt").read_text())
        assert sorted(cards) == list(range(8))  # the process table below the cards adds none
        assert {c.name for c in cards.values()} == {name} and {c.hbm_total_mb for c in cards.values()} == {hbm_total}
    b = npu_smi.parse_info((FAKE / "info_910b.txt").read_text())[6]
    assert (b.health, b.power_w, b.temp_c, b.aicore_pct, b.hbm_used_mb) == ("Alarm", 96.5, 47.0, 30.0, 9100.0)
    a = npu_smi.parse_info((FAKE / "info_910.txt").read_text())[5]  # HBM, not the 910's DDR Memory-Usage column
    assert (a.health, a.power_w, a.temp_c, a.aicore_pct, a.hbm_used_mb) == ("Warning", 75.1, 43.0, 50.0, 3500.0)
    usages = npu_smi.parse_usages((FAKE / "usages_910b.txt").read_text().replace("{aicpu}", "7"))
    assert usages["Aicpu Usage Rate(%)"] == 7 and usages["HBM Capacity(MB)"] == 65536
    with pytest.raises(npu_smi.NpuSmiError, match="no card table"):
        npu_smi.parse_info("dcmi model initialized failed, because the device is used. ret is -8020\n")


def test_the_job_cards_are_the_visible_devices_it_uses() -> None:
    assert npu_smi.job_cards(environ={}) == [0]
    assert npu_smi.job_cards(environ={"ASCEND_RT_VISIBLE_DEVICES": "3,6", "DEVICE_ID": "1"}) == [6]
    worker = {"MS_ROLE": "MS_WORKER", "MS_WORKER_NUM": "2", "ASCEND_RT_VISIBLE_DEVICES": "4,5,6,7"}
    assert npu_smi.job_cards(environ=worker) == [4, 5]  # msrun's local worker k is device k of the visible list
    assert npu_smi.job_cards(4, environ={"ASCEND_RT_VISIBLE_DEVICES": "2,3,4,5,6,7"}) == [2, 3, 4, 5]


@pytest.mark.parametrize("model", ["910", "910b"])
def test_a_run_logs_one_series_per_quantity_of_its_own_card(model: str, fake_npu_smi: Path, tmp_path: Path,
                                                            synthetic_root: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_NPU_SMI", model)
    monkeypatch.setenv("ASCEND_RT_VISIBLE_DEVICES", "3,6")
    monkeypatch.setenv("DEVICE_ID", "1")  # this process drives the second visible card: physical card 6
    client, run_id = _train(tmp_path, synthetic_root)

    metrics = client.get_run(run_id).data.metrics
    assert sorted(k for k in metrics if k.startswith("system/npu_")) == sorted(f"system/npu_6_{s}" for s in SERIES)
    expected = npu_smi.parse_info((FAKE / f"info_{model}.txt").read_text())[6]
    assert metrics["system/npu_6_hbm_used_mb"] == expected.hbm_used_mb
    assert metrics["system/npu_6_hbm_total_mb"] == expected.hbm_total_mb
    assert metrics["system/npu_6_aicore_util_pct"] == expected.aicore_pct
    assert metrics["system/npu_6_aicpu_util_pct"] == 3 * 6 + 1  # the stand-in's per-card AI CPU rate
    assert metrics["system/npu_6_power_w"] == expected.power_w and metrics["system/npu_6_temp_c"] == expected.temp_c
    assert metrics["system/npu_6_health"] == npu_smi.HEALTH[expected.health]
    asked = set(fake_npu_smi.read_text().splitlines())
    assert asked == {"info", "info -t usages -i 6"}  # no other card was queried


@pytest.mark.parametrize("model", ["malformed", "hang"])
def test_a_broken_npu_smi_costs_one_warning_and_never_the_run(model: str, fake_npu_smi: Path, tmp_path: Path,
                                                              synthetic_root: Path, monkeypatch: pytest.MonkeyPatch,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("FAKE_NPU_SMI", model)
    monkeypatch.setattr(npu_smi, "TIMEOUT_S", 1.0)
    start = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="swinexp"):
        client, run_id = _train(tmp_path, synthetic_root)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and "val/top1" in run.data.metrics
    assert not any(k.startswith("system/npu_") for k in run.data.metrics)
    assert any(k.startswith("system/cpu") for k in run.data.metrics)  # MLflow's own monitors went on sampling
    warnings = [r.getMessage() for r in caplog.records if "system/npu_" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert ("did not answer within 1 s" if model == "hang" else "no card table") in warnings[0]
    assert fake_npu_smi.read_text().splitlines() == ["info"]  # not asked again after the failure
    if model == "hang":
        assert time.monotonic() - start < 120


def test_without_npu_smi_nothing_is_sampled_or_said(tmp_path: Path, synthetic_root: Path,
                                                    monkeypatch: pytest.MonkeyPatch,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    assert not npu_smi.available()
    with caplog.at_level(logging.DEBUG, logger="swinexp"):
        client, run_id = _train(tmp_path, synthetic_root)
    assert not any(k.startswith("system/npu_") for k in client.get_run(run_id).data.metrics)
    assert not [r for r in caplog.records if "npu" in r.getMessage().lower()]


def test_the_dry_run_says_whether_and_which_cards_it_samples(fake_npu_smi: Path, compose,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from swinexp.app.dry_run import card_metrics
    from swinexp.build import resolve

    monkeypatch.setenv("ASCEND_RT_VISIBLE_DEVICES", "2,3,4,5")
    line = card_metrics(resolve(compose("tracking=mlflow", "hardware=cpu2"), backend=False))
    assert line.startswith("Ascend card metrics: npu-smi every 10 s for card(s) 2, 3 as system/npu_<id>_")
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    assert card_metrics(resolve(compose("tracking=mlflow"), backend=False)) == (
        "Ascend card metrics: not sampled (no npu-smi on PATH)")
    assert "off" in card_metrics(resolve(compose("tracking=none"), backend=False))
