"""Named moments of a training process, where a fault-injection check can stop it on purpose (`debug.*` config).

The loop marks four phases: `step` (an optimizer step applied, the loop's bookkeeping not yet), `eval` (inside
the validation pass, after its first batch), `checkpoint` (the new file written, not yet renamed into place) and
`mlflow` (the epoch's checkpoint on disk, its metrics not yet logged). With `debug.phase_file` set, each mark
appends `<phase> <n>` (n counts that phase in this process); with `debug.park_at=<phase>:<n>` the process
writes `<phase> <n> parked` there and then waits to be killed (`python -m benchmarks chaos` SIGKILLs it).
Both null (the default): `mark` does nothing.
"""
from __future__ import annotations

import os
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from swinexp.registry import ConfigError

PHASES = ("step", "eval", "checkpoint", "mlflow")
PARK_LIMIT_S = 600.0  # a parked process nobody kills goes on after this (a forgotten hook never hangs a run)


@dataclass
class PhaseHook:
    phase_file: Path | None = None
    park_at: tuple[str, int] | None = None
    seen: Counter = field(default_factory=Counter)

    def mark(self, phase: str) -> None:
        if self.phase_file is None:
            return
        self.seen[phase] += 1
        parked = self.park_at == (phase, self.seen[phase])
        with open(self.phase_file, "a") as out:
            out.write(f"{phase} {self.seen[phase]}{' parked' if parked else ''} pid={os.getpid()}\n")
            out.flush()
            os.fsync(out.fileno())
        if parked:
            time.sleep(PARK_LIMIT_S)


_hook = PhaseHook()


def configure(debug: Any) -> None:
    """Set the hook from the `debug` config node (`phase_file`, `park_at`); call once per process.

    Raises:
        ConfigError: debug.park_at is not `<phase>:<n>` with a known phase, or lacks debug.phase_file.
    """
    global _hook
    phase_file = debug.get("phase_file") if debug is not None else None
    park_at = debug.get("park_at") if debug is not None else None
    parsed = None
    if park_at is not None:
        phase, _, count = str(park_at).partition(":")
        if phase not in PHASES or not count.isdigit() or int(count) < 1:
            raise ConfigError(f"debug.park_at='{park_at}' must be <phase>:<n> with phase one of {', '.join(PHASES)} "
                              "and n >= 1, e.g. debug.park_at=checkpoint:2; null = never park")
        if phase_file is None:
            raise ConfigError("debug.park_at needs debug.phase_file (where the parked process says so)")
        parsed = (phase, int(count))
    _hook = PhaseHook(Path(phase_file) if phase_file else None, parsed)


def mark(phase: str) -> None:
    """This process is now in `phase` (one of PHASES)."""
    _hook.mark(phase)
