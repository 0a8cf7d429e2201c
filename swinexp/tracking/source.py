"""Where a run's code came from: the git commit of swinexp's checkout, for the run's tags."""
from __future__ import annotations

import subprocess
from pathlib import Path


def git_commit() -> str | None:
    """The commit of the checkout swinexp runs from, or None (a wheel install, no git, not a repository)."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).resolve().parent, capture_output=True,
                             text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None
