"""Multi-node runs start only when every node's run directory is the same shared directory.

Checkpoints, resume and the MLflow run id live in the run dir, written by rank 0 on node 0 and read on every node;
per-node directories that merely have the same path would resume different states. So before msrun starts, the
node launchers shake hands through files in `<run dir>/.swinexp-nodes/`: node 0 writes a fresh random token; every
other node answers `ack-<node>` = "<token> <its own fresh nonce>"; once all answers carry the token, node 0 writes
`go` with those answers, and each node starts when it finds its own answer there. Fresh nonces on both sides mean
files left by an earlier launch (e.g. in a node-local directory that once belonged to node 0) never pass the check.
"""
from __future__ import annotations

import os
import secrets
import time
from collections.abc import Callable
from pathlib import Path

from swinexp.registry import ConfigError

SYNC_DIR = ".swinexp-nodes"
POLL_S = 0.2


def check_shared(run_dir: Path, node_rank: int, num_nodes: int, timeout_s: float) -> None:
    """Return once all `num_nodes` launchers have met in `run_dir`; ConfigError after `timeout_s` without them."""
    if num_nodes <= 1:
        return
    sync = run_dir / SYNC_DIR
    sync.mkdir(parents=True, exist_ok=True)
    met = _lead(sync, num_nodes) if node_rank == 0 else _follow(sync, node_rank)
    deadline = time.monotonic() + timeout_s
    while (missing := met()) is not None:
        if time.monotonic() > deadline:
            raise ConfigError(
                f"hardware.num_nodes={num_nodes}: {missing} within {timeout_s:g} s in the run dir {run_dir}: "
                "give every node the same hydra.run.dir on a filesystem all nodes mount (e.g. under "
                "hardware.shared_dir)")
        time.sleep(POLL_S)


def _lead(sync: Path, num_nodes: int) -> Callable[[], str | None]:
    """Node 0's side: a fresh token out; a poll that returns None once every node answered it (and writes `go`),
    else what is missing."""
    token = secrets.token_hex(8)
    (sync / "go").unlink(missing_ok=True)
    _write(sync / "token", token)

    def poll() -> str | None:
        answers = {node: _read(sync / f"ack-{node}") for node in range(1, num_nodes)}
        missing = [node for node, answer in answers.items() if answer.split(" ")[0] != token]
        if missing:
            return (f"node(s) {missing} did not answer node 0 (their run dirs are not this directory, or they did "
                    "not start)")
        _write(sync / "go", "\n".join(answers[node] for node in sorted(answers)))
        return None

    return poll


def _follow(sync: Path, node_rank: int) -> Callable[[], str | None]:
    """Another node's side: a poll that answers node 0's current token with a fresh nonce and returns None once
    `go` holds that answer, else what is missing."""
    nonce, answered = secrets.token_hex(8), ""

    def poll() -> str | None:
        nonlocal answered
        token = _read(sync / "token")
        if token and token != answered.split(" ")[0]:  # node 0 (re)started: answer its current token
            answered = f"{token} {nonce}"
            _write(sync / f"ack-{node_rank}", answered)
        if answered and answered in _read(sync / "go").splitlines():
            return None
        return f"node {node_rank} did not meet node 0 (node 0 uses another directory, or did not start)"

    return poll


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        return ""


def _write(path: Path, text: str) -> None:
    """Whole or not at all, for a reader on another node: a temporary file renamed over the target."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    tmp.write_text(text + "\n")
    os.replace(tmp, path)
