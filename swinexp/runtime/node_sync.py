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
    deadline = time.monotonic() + timeout_s
    if node_rank == 0:
        _lead(sync, num_nodes, deadline, run_dir, timeout_s)
    else:
        _follow(sync, node_rank, num_nodes, deadline, run_dir, timeout_s)


def _lead(sync: Path, num_nodes: int, deadline: float, run_dir: Path, timeout_s: float) -> None:
    token = secrets.token_hex(8)
    (sync / "go").unlink(missing_ok=True)
    _write(sync / "token", token)
    while True:
        answers = {node: _read(sync / f"ack-{node}") for node in range(1, num_nodes)}
        missing = [node for node, answer in answers.items() if answer.split(" ")[0] != token]
        if not missing:
            _write(sync / "go", "\n".join(answers[node] for node in sorted(answers)))
            return
        if time.monotonic() > deadline:
            raise ConfigError(
                f"hardware.num_nodes={num_nodes}: node(s) {missing} did not answer node 0 in the run dir {run_dir} "
                f"within {timeout_s:g} s: their run dirs are not this directory (or they did not start); give every "
                "node the same hydra.run.dir on a filesystem all nodes mount (e.g. under hardware.shared_dir)")
        time.sleep(POLL_S)


def _follow(sync: Path, node_rank: int, num_nodes: int, deadline: float, run_dir: Path, timeout_s: float) -> None:
    nonce = secrets.token_hex(8)
    answered = ""
    while True:
        token = _read(sync / "token")
        if token and token != answered.split(" ")[0]:  # node 0 (re)started: answer its current token
            answered = f"{token} {nonce}"
            _write(sync / f"ack-{node_rank}", answered)
        if answered and answered in _read(sync / "go").splitlines():
            return
        if time.monotonic() > deadline:
            raise ConfigError(
                f"hardware.num_nodes={num_nodes}: node {node_rank} did not meet node 0 in its run dir {run_dir} within "
                f"{timeout_s:g} s: node 0 uses another directory (or did not start); give every node the same "
                "hydra.run.dir on a filesystem all nodes mount (e.g. under hardware.shared_dir)")
        time.sleep(POLL_S)


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
