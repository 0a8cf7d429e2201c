"""Does /dev/shm hold the loader's result queues? Checked when a Loader is built, before any worker starts.

Each Python worker process of MindSpore's GeneratorDataset sends its whole batches through a result queue in
shared memory. With dynamic segments (`max_rowsize` unset, swinexp's setting) a worker keeps up to
`queue_slots + 2` segments of one batch each, queue_slots = max(2, min(P, 4 P // workers)) for the prefetch size
P (`SamplerFn.launch` in mindspore/dataset/engine/datasets_user_defined.py, MindSpore 2.10). MindSpore checks the
space only for fixed-size segments, so a small /dev/shm (docker's default is 64 MB) fails mid-epoch with a bus
error or a lost worker, far from its cause. Here the prefetch size is lowered until the queues fit, or the build
stops naming the fix.
"""
from __future__ import annotations

import os

from swinexp.registry import ConfigError

__all__ = ["SHM_PATH", "fitting_prefetch", "free_shm", "queue_bytes", "queue_slots"]

SHM_PATH = "/dev/shm"
USABLE = 0.8  # MindSpore's own check leaves a fifth of /dev/shm to the rest of the host
MIB = 1 << 20


def queue_slots(prefetch: int, workers: int) -> int:
    """Batches one worker's result queue holds for MindSpore prefetch size `prefetch`."""
    return max(2, min(prefetch, prefetch * 4 // workers))


def queue_bytes(batch_bytes: int, workers: int, prefetch: int) -> int:
    """Shared memory all workers' queues may hold: two segments beyond the slots are being filled and read."""
    return workers * (queue_slots(prefetch, workers) + 2) * batch_bytes


def free_shm() -> int:
    """Bytes free in /dev/shm for an unprivileged writer."""
    stat = os.statvfs(SHM_PATH)
    return stat.f_bavail * stat.f_frsize


def fitting_prefetch(batch_bytes: int, workers: int, prefetch: int, free: int) -> int:
    """The largest prefetch size <= `prefetch` whose queues fit in `USABLE` of `free` bytes of /dev/shm.

    Raises:
        ConfigError: not even the shallowest queues (2 batches a worker) fit.
    """
    for size in range(prefetch, 0, -1):
        if queue_bytes(batch_bytes, workers, size) <= USABLE * free:
            return size
    need = queue_bytes(batch_bytes, workers, 1)
    raise ConfigError(
        f"{SHM_PATH} has {free / MIB:.0f} MB free, but data.num_workers={workers} worker processes need "
        f"{need / MIB:.0f} MB of it for their result queues even at the shallowest depth (4 batches of "
        f"{batch_bytes / MIB:.1f} MB per worker) and only {USABLE:.0%} of it is used. Give the host more shared memory "
        f"(docker run --shm-size={_suggested_mb(need)}m, or a larger tmpfs on {SHM_PATH}), or lower "
        "data.num_workers or data.batch_size"
    )


def _suggested_mb(need: int) -> int:
    """A --shm-size that holds `need` within USABLE, rounded up to 64 MB."""
    return -(-int(need / USABLE / MIB) // 64) * 64 + 64
