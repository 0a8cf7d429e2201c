"""Facts about the machine a benchmark runs on: CPU, cores, load, and host memory (with a guard against OOM)."""
from __future__ import annotations

import datetime
import os
import platform
import sys
import time
from pathlib import Path

import mindspore as ms

__all__ = ["MemoryGuard", "NotEnoughMemory", "available_gb", "cpu_model", "describe", "load_average", "rss_gb"]


class NotEnoughMemory(RuntimeError):
    """The next compiled graph would not fit in host memory; the message says how to split the run."""


def cpu_model() -> str:
    """The `model name` line of /proc/cpuinfo (platform.processor() is often empty on Linux)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _meminfo_gb(key: str) -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith(f"{key}:"):
                return int(line.split()[1]) / 2**20  # kB -> GiB
    except OSError:
        pass
    return float("nan")


def available_gb() -> float:
    """MemAvailable in GiB (nan where /proc is missing)."""
    return _meminfo_gb("MemAvailable")


def rss_gb() -> float:
    """Resident memory of this process in GiB."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return float("nan")


def load_average() -> float:
    """1-minute load average: runnable processes of the whole machine (others' jobs included)."""
    return os.getloadavg()[0]


def describe() -> str:
    """One line for table titles: MindSpore, CPU, cores, memory, date."""
    return (f"MindSpore {ms.__version__} ({ms.get_context('device_target')}), {cpu_model()}, {os.cpu_count()} cores, "
            f"{_meminfo_gb('MemTotal'):.0f} GiB, {datetime.date.today()}")


class MemoryGuard:
    """Refuses to compile one more train step when the last ones show it would not fit in host memory.

    In MindSpore 2.10 graph mode on CPU a compiled train step keeps its buffers for the life of the process
    (swin_tiny at batch 4: ~6 GiB), so variants compiled side by side add up. On a shared host other jobs come and
    go, so the guard first waits up to `wait_s` for memory, then fails with advice rather than meet the OOM killer.
    """

    def __init__(self, wait_s: float = 600.0, poll_s: float = 10.0) -> None:
        self.largest_gb = 0.0  # the most one compiled variant added to this process
        self.start_available_gb = available_gb()
        self.wait_s, self.poll_s = wait_s, poll_s
        self._before = rss_gb()

    def _fits(self) -> bool:
        return not self.largest_gb or available_gb() >= 1.1 * self.largest_gb

    def before_compile(self, name: str, compiled: int) -> None:
        """Raise NotEnoughMemory if `name` would likely not fit; `compiled` variants are already resident."""
        deadline = time.monotonic() + self.wait_s
        if not self._fits():
            print(f"{name}: waiting up to {self.wait_s:.0f} s for {1.1 * self.largest_gb:.1f} GiB of free memory",
                  file=sys.stderr, flush=True)
        while not self._fits() and time.monotonic() < deadline:
            time.sleep(self.poll_s)
        self._before = rss_gb()
        free = available_gb()
        if not self._fits():
            # as many as fit now (others' jobs may have taken memory since the start), at least reference + one
            per_process = max(2, min(compiled, int(self.start_available_gb // self.largest_gb)))
            raise NotEnoughMemory(
                f"not enough memory to compile '{name}': each compiled train step kept up to {self.largest_gb:.1f} "
                f"GiB, {compiled} are resident and {free:.1f} GiB are available. Rerun with --max-resident "
                f"{per_process} (variants per process, each group with the baseline), fewer --variants, or a smaller "
                "--batch")

    def after_compile(self) -> None:
        self.largest_gb = max(self.largest_gb, rss_gb() - self._before)
