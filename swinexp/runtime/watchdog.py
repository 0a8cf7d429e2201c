"""`python watchdog.py <launcher pid>`: once an msrun launcher is gone (even SIGKILLed), kill all it started.

Everything a launch starts (msrun, its scheduler, workers, their `tail -f` and data processes) inherits the
environment variable LAUNCHER_ENV=<launcher pid>, which is how they are found: neither process groups (msrun
puts each worker in a session of its own) nor parent links (orphans are re-parented) survive the launcher's
death. The launcher starts this watchdog beside msrun and stops it when msrun has ended. Stand-alone on purpose
(no swinexp or MindSpore import): it is up in milliseconds, and it works while the launcher is being killed.
"""
from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

LAUNCHER_ENV = "SWINEXP_LAUNCHER_PID"
POLL_S = 0.5


def launched_processes(launcher_pid: int) -> dict[int, dict[str, str]]:
    """pid -> MS_* environment (and its command line, key "cmdline") of every live process started under the
    launcher `launcher_pid`, orphans included."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            env = dict(item.split("=", 1) for item in (entry / "environ").read_bytes().decode(errors="replace")
                       .split("\0") if "=" in item)
            if env.get(LAUNCHER_ENV) == str(launcher_pid):
                cmdline = (entry / "cmdline").read_bytes().decode(errors="replace").replace("\0", " ").strip()
                found[int(entry.name)] = {**{k: v for k, v in env.items() if k.startswith("MS_")}, "cmdline": cmdline}
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return found


def kill_launched(launcher_pid: int) -> int:
    """SIGKILL every process started under `launcher_pid`; how many there were."""
    pids = launched_processes(launcher_pid)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return len(pids)


def watch(launcher_pid: int) -> None:
    """Wait while the launcher (this process's parent) lives; then kill what it started, until nothing is left."""
    while os.getppid() == launcher_pid:  # a dead launcher's children are re-parented, zombie or not
        time.sleep(POLL_S)
    for _ in range(50):  # a process may start another while being killed: repeat until none is left
        if kill_launched(launcher_pid) == 0:
            return
        time.sleep(0.1)


if __name__ == "__main__":
    watch(int(sys.argv[1]))
