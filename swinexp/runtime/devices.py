"""The devices of this host and how `hydra/launcher=isolated` shares them out between concurrent jobs.

A job gets a set of device ids of its own: Ascend cards through `ASCEND_RT_VISIBLE_DEVICES`, GPUs through
`CUDA_VISIBLE_DEVICES` (the job then sees them as devices 0..n-1), CPU cores through the process's affinity
(`os.sched_setaffinity`); `swinexp.runtime.hardware.apply` sizes MindSpore's CPU kernel thread pool to the cores
the process may use, and `OMP_NUM_THREADS` does the same for OpenMP code.
"""
from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from swinexp.registry import ConfigError
from swinexp.runtime import chips

VISIBLE_DEVICES_ENV = {"Ascend": "ASCEND_RT_VISIBLE_DEVICES", "GPU": "CUDA_VISIBLE_DEVICES"}
UNIT = {"Ascend": "Ascend card", "GPU": "GPU", "CPU": "CPU core"}
# the first-generation 910's HCCS networks and card counts (runtime/chips.py, with their sources)
HCCS_GROUPS_910: tuple[frozenset[int], ...] = tuple(
    frozenset(group) for group in chips.CHIPS[chips.FIRST_GENERATION].hccs_groups or ())
HCCS_CARD_COUNTS_910 = chips.CHIPS[chips.FIRST_GENERATION].hccs_card_counts or ()


def hccs_groups(device_target: str, chip: str | None) -> tuple[frozenset[int], ...] | None:
    """The card groups a job must stay inside, or None where any set of cards works (GPU, CPU, 910B and later).
    A chip not given on Ascend may be a 910: its jobs are kept in groups to be safe."""
    if device_target != "Ascend":
        return None
    groups = chips.CHIPS[chip or chips.FIRST_GENERATION].hccs_groups
    return tuple(frozenset(group) for group in groups) if groups else None


def cpu_identity() -> str:
    """This host's CPU model and feature flags (what code compiled with -march=native, or a graph holding such code,
    depends on)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor() or platform.machine()
    wanted = ("model name", "flags", "Features", "CPU part")
    return "\n".join(dict.fromkeys(line for line in lines if line.split(":")[0].strip() in wanted))


def host_devices(device_target: str, declared: Sequence[int] | None = None) -> list[int]:
    """The device ids this sweep may hand out: `declared` (hydra.launcher.devices), else what the host shows.

    Ascend and GPU: the ids in the visible-devices variable if set, else the device files (/dev/davinciN) or
    `nvidia-smi -L`. CPU: the cores this process may run on.
    """
    if declared:
        return [int(d) for d in declared]
    if device_target == "CPU":
        return sorted(os.sched_getaffinity(0))
    visible = os.environ.get(VISIBLE_DEVICES_ENV[device_target], "").strip()
    if visible:
        return [int(d) for d in visible.split(",") if d.strip()]
    if device_target == "Ascend":
        return sorted(int(m.group(1)) for p in Path("/dev").glob("davinci*")
                      if (m := re.fullmatch(r"davinci(\d+)", p.name)))
    if shutil.which("nvidia-smi") is None:
        return []
    listing = subprocess.run(["nvidia-smi", "-L"], check=False, capture_output=True, text=True, timeout=30).stdout
    return list(range(sum(line.startswith("GPU ") for line in listing.splitlines())))


def devices_per_job(device_target: str, num_devices: int, requested: int | None, host: Sequence[int],
                    max_parallel: int, groups: Sequence[frozenset[int]] | None = None) -> int:
    """How many devices one job takes; ConfigError when it needs more than it may have or the host has, or a count
    the card groups cannot hold.

    Args:
        num_devices: the job's hardware.num_devices (msrun workers on this node; each Ascend/GPU worker needs a card).
        requested: hydra.launcher.devices_per_job; None: hardware.num_devices cards, or an equal share of the cores.
        groups: `hccs_groups(...)` of the job's chip; None: any cards.
    """
    unit = UNIT[device_target]
    if device_target == "CPU":
        wanted = requested or max(1, len(host) // max_parallel)
    else:
        wanted = requested or num_devices
        if wanted < num_devices:
            raise ConfigError(
                f"hardware.num_devices={num_devices} starts {num_devices} workers, one per {unit}, but "
                f"hydra.launcher.devices_per_job={wanted}; set hydra.launcher.devices_per_job={num_devices} or "
                f"lower hardware.num_devices")
    if wanted < 1:
        raise ConfigError(f"hydra.launcher.devices_per_job={requested} must be >= 1 (or null)")
    if wanted > len(host):
        raise ConfigError(
            f"the job needs {wanted} {unit}(s) (hydra.launcher.devices_per_job={requested}, hardware.num_devices="
            f"{num_devices}) but this host has {len(host)}: {list(host)}; lower hydra.launcher.devices_per_job or "
            f"hardware.num_devices, or declare the host's devices with hydra.launcher.devices=[...]")
    if groups is not None:
        _check_grouped(wanted, host, groups)
    return wanted


def _check_grouped(wanted: int, host: Sequence[int], groups: Sequence[frozenset[int]]) -> None:
    """A first-generation 910 job's card count is one HCCS allows, and the host's cards can hold it in one group."""
    if wanted not in HCCS_CARD_COUNTS_910:
        raise ConfigError(f"a job on Ascend 910 cards (hardware.chip=ascend910, or not given) takes {wanted} cards, "
                          f"but its cards talk over HCCS in groups {_named(groups)}: a job uses "
                          f"{', '.join(map(str, HCCS_CARD_COUNTS_910))} cards; set hydra.launcher.devices_per_job or "
                          "hardware.num_devices to one of them (or hardware.chip=ascend910b on a 910B)")
    if wanted == 8 or wanted == 1:
        return  # one card fits anywhere; eight are both groups whole, which the host count check already covers
    if not any(len(group.intersection(host)) >= wanted for group in groups):
        raise ConfigError(f"a job of {wanted} Ascend 910 cards must stay inside one HCCS group {_named(groups)}, but "
                          f"the cards to share out, {sorted(host)}, hold no {wanted} in one group; declare "
                          "hydra.launcher.devices=[...] with whole groups (e.g. [0,1,2,3])")


def _named(groups: Sequence[frozenset[int]]) -> str:
    return ", ".join(f"{{{min(g)}-{max(g)}}}" for g in groups)


@dataclass(frozen=True)
class Slot:
    """The devices one job runs on."""

    device_target: str
    devices: tuple[int, ...]

    def env(self) -> dict[str, str]:
        """What the job's environment must say about its devices."""
        ids = ",".join(map(str, self.devices))
        if self.device_target == "CPU":
            return {"OMP_NUM_THREADS": str(len(self.devices))}
        return {VISIBLE_DEVICES_ENV[self.device_target]: ids}

    def confine(self) -> None:
        """Run in the job's process before it starts (Popen's preexec_fn): pin it to its cores."""
        if self.device_target == "CPU":
            os.sched_setaffinity(0, self.devices)


class DevicePool:
    """Free device ids; a job takes the lowest free ids it needs and gives them back when it ends.

    With card groups (a first-generation 910's HCCS), a job of up to a group's cards takes them inside one group:
    the fullest group that still holds it, so that whole groups stay free for larger jobs.
    """

    def __init__(self, device_target: str, devices: Sequence[int]) -> None:
        self.device_target, self.free = device_target, sorted(devices)

    def take(self, count: int, groups: Sequence[frozenset[int]] | None = None) -> Slot | None:
        """`count` free devices (inside one of `groups` when it is smaller than a group), or None until enough are."""
        if count > len(self.free):
            return None
        if groups is not None and 1 < count <= max(map(len, groups)):
            fitting = [free for g in groups if len(free := [d for d in self.free if d in g]) >= count]
            if not fitting:
                return None
            taken = min(fitting, key=len)[:count]
        else:
            taken = self.free[:count]
        self.free = [d for d in self.free if d not in taken]
        return Slot(self.device_target, tuple(taken))

    def give(self, slot: Slot) -> None:
        self.free = sorted([*self.free, *slot.devices])
