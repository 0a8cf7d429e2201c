"""Real servers a test starts and always stops: `mlflow server` and `mlflow ui` on 127.0.0.1."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def serving(module_args: Sequence[str], port: int, log: Path, seconds: int = 120) -> Iterator[str]:
    """`python -m <module_args>` in its own process group; yields its base URL once it answers /health, and stops
    the group (the server and its workers: TERM, then KILL) whatever happens."""
    proc = subprocess.Popen([sys.executable, "-m", *module_args], stdout=subprocess.DEVNULL, stderr=log.open("a"),
                            start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(2 * seconds):
            try:
                urllib.request.urlopen(f"{base}/health", timeout=1).close()
                break
            except OSError as err:
                if proc.poll() is not None:
                    raise RuntimeError(log.read_text()[-2000:]) from err
                time.sleep(0.5)
        else:
            raise RuntimeError(f"{' '.join(module_args[:2])} did not answer /health in {seconds} s")
        yield base
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@contextmanager
def mlflow_server(root: Path, port: int | None = None) -> Iterator[str]:
    """A real tracking server with a sqlite backend and its artifacts in `root`; yields its URL."""
    port = port or free_port()
    args = ["mlflow", "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
            "--backend-store-uri", f"sqlite:///{root}/mlflow.db", "--artifacts-destination", str(root / "artifacts")]
    with serving(args, port, root / "server.log") as url:
        yield url
