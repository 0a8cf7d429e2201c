"""Peak resident memory of this process, as the kernel's high-water mark of its address space.

Not `getrusage(...).ru_maxrss`: Linux keeps that across exec, so a worker started from a benchmark process that
already held compiled graphs would report the parent's peak (seen here: 7.6 GiB for a 3.3 GiB timm step).
VmHWM belongs to the address space, which exec replaces. Imports nothing heavy (the timm process uses it).
"""
from __future__ import annotations

from pathlib import Path

__all__ = ["peak_rss_gb"]


def peak_rss_gb() -> float:
    """VmHWM of /proc/self/status in GiB (nan where /proc is missing)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 2**20  # kB -> GiB
    except OSError:
        pass
    return float("nan")
