"""System metrics for runs made with `MlflowClient.create_run`, which MLflow's own switch
(`MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING`) ignores: MLflow's `SystemMetricsMonitor` started on the run id.

Logged under `system/` with step = sample number: MLflow's CPU utilization, system memory, disk and network (and
NVIDIA/AMD GPU when their libraries are there), plus this process's resident memory, off the CPU backend the
accelerator memory MindSpore's allocator reports, and where npu-smi is on PATH the job's Ascend cards
(`system/npu_<id>_*`, npu_monitor.py). On the CPU backend MindSpore's `memory_allocated()` is always 0
(it has no device pool there), so no device metric is logged rather than a misleading 0.
"""
from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from typing import Any

import psutil
from mlflow.system_metrics.metrics.base_metrics_monitor import BaseMetricsMonitor
from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

from swinexp.tracking.npu_monitor import npu_monitor

log = logging.getLogger("swinexp")

MB = 1e6


def mindspore_device_memory() -> dict[str, float]:
    """MindSpore's allocator counters in bytes; empty on the CPU backend or where MindSpore is not loaded."""
    ms = sys.modules.get("mindspore")  # never import it here: `python -m swinexp.tracking ...` runs without it
    if ms is None or ms.get_context("device_target") == "CPU":
        return {}
    import mindspore.runtime as rt

    return {"device_memory_allocated_megabytes": rt.memory_allocated() / MB,
            "device_memory_reserved_megabytes": rt.memory_reserved() / MB,
            "device_max_memory_allocated_megabytes": rt.max_memory_allocated() / MB}


class ProcessMonitor(BaseMetricsMonitor):
    """This process's resident memory, and the accelerator memory of `read_device` (mean over the samples)."""

    def __init__(self, read_device: Callable[[], dict[str, float]] = mindspore_device_memory) -> None:
        super().__init__()
        self._process, self._read_device = psutil.Process(os.getpid()), read_device

    def collect_metrics(self) -> None:
        self._metrics["process_memory_rss_megabytes"].append(self._process.memory_info().rss / MB)
        for key, value in self._read_device().items():
            self._metrics[key].append(value)

    def aggregate_metrics(self) -> dict[str, float]:
        return {k: round(sum(v) / len(v), 1) for k, v in self._metrics.items() if v}


class SystemMetrics:
    """MLflow's monitor on one run, in a daemon thread, sampling every `interval_s` seconds.

    `stop()` always leaves at least one sample in the run (a run shorter than the interval would otherwise have
    none). Failures are logged, never raised: system metrics must not stop a training run.
    """

    def __init__(self, run_id: str, uri: str, interval_s: float, resume: bool,
                 read_device: Callable[[], dict[str, float]] = mindspore_device_memory) -> None:
        self._monitor: Any = None
        try:
            monitor = SystemMetricsMonitor(run_id, sampling_interval=interval_s, resume_logging=resume,
                                           tracking_uri=uri)
            monitor.monitors.append(ProcessMonitor(read_device))
            if (cards := npu_monitor()) is not None:
                monitor.monitors.append(cards)
            self._first_step = monitor._logging_step  # MLflow's next step number: 0, or after a resumed run's last
            monitor.start()
            self._monitor = monitor
        except Exception as err:  # noqa: BLE001 - an optional side channel
            log.warning("system metrics are not logged for run %s: %s", run_id, err)

    def stop(self) -> None:
        monitor, self._monitor = self._monitor, None
        if monitor is None:
            return
        try:
            monitor.finish()
            if monitor._logging_step == self._first_step:  # finished before the first interval was over
                monitor.collect_metrics()
                monitor.publish_metrics(monitor.aggregate_metrics())
                monitor.mlflow_logger.flush()
        except Exception as err:  # noqa: BLE001 - never fail the run for a metrics sample
            log.warning("the last system metrics sample was not logged: %s", err)
