"""The job's Ascend cards in MLflow's system metrics: a monitor MLflow's `SystemMetricsMonitor` samples beside its
CPU/GPU monitors, read through `npu-smi` (swinexp/runtime/npu_smi.py, with the documents its format comes from).

One series per card and quantity, under MLflow's `system/` prefix, named by the physical card number npu-smi
and ASCEND_RT_VISIBLE_DEVICES use: `system/npu_<id>_hbm_used_mb`, `_hbm_total_mb`, `_aicore_util_pct`,
`_aicpu_util_pct`, `_power_w`, `_temp_c`, `_health` (0 OK, 1 Warning, 2 Alarm, 3 Critical, 4 UNKNOWN; the worst of
the interval). Without npu-smi on PATH there is no monitor at all; an npu-smi that fails, hangs past its timeout
or prints an unknown layout costs one warning, and the cards are not sampled again in this run.
"""
from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence

from mlflow.system_metrics.metrics.base_metrics_monitor import BaseMetricsMonitor

from swinexp.runtime import npu_smi

log = logging.getLogger("swinexp")

WORST = ("health",)  # aggregated as the maximum over the interval; every other series as the mean


class NpuMonitor(BaseMetricsMonitor):
    """Samples `cards` (physical numbers) with `run(*args) -> str` (npu-smi itself by default)."""

    def __init__(self, cards: Sequence[int], run: Callable[..., str] = npu_smi.run) -> None:
        super().__init__()
        self.cards, self._run, self.failed = list(cards), run, False

    def collect_metrics(self) -> None:
        if self.failed:
            return
        try:  # MLflow's sampling thread ends on any exception a monitor raises: none may leave here
            listed = npu_smi.parse_info(self._run("info"))
            for card in (listed[c] for c in self.cards if c in listed):
                usages = npu_smi.parse_usages(self._run("info", "-t", "usages", "-i", str(card.npu)))
                self._add(card, usages)
        except Exception as err:  # noqa: BLE001 - NpuSmiError, or a driver answering in a layout nobody documented
            self.failed = True
            log.warning("Ascend card metrics (system/npu_*) stop for this run: %s", err)

    def _add(self, card: npu_smi.Card, usages: dict[str, float]) -> None:
        values = {"hbm_used_mb": card.hbm_used_mb, "hbm_total_mb": card.hbm_total_mb,
                  "aicore_util_pct": card.aicore_pct, "aicpu_util_pct": usages.get("Aicpu Usage Rate(%)", math.nan),
                  "power_w": card.power_w, "temp_c": card.temp_c,
                  "health": npu_smi.HEALTH.get(card.health, npu_smi.HEALTH["UNKNOWN"])}
        for key, value in values.items():
            if not math.isnan(value):
                self._metrics[f"npu_{card.npu}_{key}"].append(value)

    def aggregate_metrics(self) -> dict[str, float]:
        return {k: (max(v) if k.endswith(WORST) else round(sum(v) / len(v), 1)) for k, v in self._metrics.items() if v}


def npu_monitor() -> NpuMonitor | None:
    """The monitor of this job's cards on this host, or None (quietly) where npu-smi is not on PATH."""
    if not npu_smi.available():
        return None
    return NpuMonitor(npu_smi.job_cards())


def describe(interval_s: float | None, workers: int) -> str:
    """One line for the dry run of a job of `workers` processes per node: whether, which cards and how often."""
    if interval_s is None:
        return "Ascend card metrics: off (tracking.system_metrics=false or tracking=none)"
    if not npu_smi.available():
        return "Ascend card metrics: not sampled (no npu-smi on PATH)"
    cards = ", ".join(map(str, npu_smi.job_cards(workers)))
    return (f"Ascend card metrics: npu-smi every {interval_s:g} s for card(s) {cards} as "
            "system/npu_<id>_{hbm_used_mb,hbm_total_mb,aicore_util_pct,aicpu_util_pct,power_w,temp_c,health}")
