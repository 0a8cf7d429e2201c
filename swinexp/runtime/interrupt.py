"""SIGINT/SIGTERM during training: finish the current step, checkpoint, then stop (a second Ctrl-C stops at once)."""
from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

log = logging.getLogger("swinexp")


class Interrupted(Exception):
    """Training stopped on a signal after writing a checkpoint."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"stopped by {signal.Signals(signum).name}; a checkpoint of the last finished step was "
                         "written: rerun the same command with hydra.run.dir=<this run dir> to resume")
        self.signum = signum


class StopRequest:
    """Set by the handlers; the training loop polls `signum` between steps."""

    def __init__(self) -> None:
        self.signum: int | None = None

    def _handle(self, signum: int, _frame: Any) -> None:
        if self.signum is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt  # the second Ctrl-C: stop now, without the checkpoint
        self.signum = signum
        log.warning("%s received: finishing the current step, then checkpointing and stopping (Ctrl-C again to "
                    "stop at once)", signal.Signals(signum).name)


@contextmanager
def stop_on_signals() -> Iterator[StopRequest]:
    """Install the handlers for the block (main thread only; elsewhere the request never fires)."""
    request = StopRequest()
    if threading.current_thread() is not threading.main_thread():
        yield request
        return
    previous = {s: signal.signal(s, request._handle) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield request
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
