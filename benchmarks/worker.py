"""Run a benchmark worker (`python -m <module> <args>`) in a fresh process and read the JSON line it prints last.

Fresh processes because a process's peak resident set only grows and MindSpore keeps compiled graphs' buffers for
the process's life. Imports nothing heavy: the timm peer uses it without MindSpore.
"""
from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["IMPORT_ROOT", "json_from_worker"]

IMPORT_ROOT = Path(__file__).resolve().parents[1]  # the repository root (swinexp/, benchmarks/): where workers start


def json_from_worker(module: str, args: Sequence[str], what: str, timeout_s: float,
                     env: Mapping[str, str] | None = None) -> Any:
    """The last stdout line of `python -m module *args`, parsed as JSON; RuntimeError naming `what` if it fails."""
    done = subprocess.run([sys.executable, "-m", module, *args], cwd=IMPORT_ROOT, capture_output=True, text=True,
                          timeout=timeout_s, check=False, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"{what} exited with {done.returncode}:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])
