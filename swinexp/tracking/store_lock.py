"""Many processes, one sqlite store: open it one process at a time, and retry writes that find it locked.

Opening a new sqlite store runs MLflow's schema migration (alembic). Two processes migrating the same new file at
once break it (`Online migration expected to match one row`, `table _alembic_tmp_experiments already exists`) and
can leave it half-migrated for good, so opening is serialized by a lock file beside the database. Once open,
concurrent writers are fine except that sqlite allows one writer at a time: a write that waited past sqlite's
busy timeout fails with "database is locked" and is simply tried again, with backoff.
"""
from __future__ import annotations

import contextlib
import logging
import random
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

from filelock import FileLock

log = logging.getLogger("swinexp")

T = TypeVar("T")

OPEN_TIMEOUT_S = 600.0   # waiting for other processes to finish opening (a migration takes seconds)
LOCKED_RETRIES = 8       # a write retried this many times on "database is locked" ...
FIRST_BACKOFF_S = 0.1    # ... after 0.1, 0.2, 0.4 ... s (+ jitter): about 25 s in all
LOCKED_MESSAGE = "database is locked"


def sqlite_path(uri: str) -> Path | None:
    """The database file of a `sqlite:///` URI; None for other stores (servers, file stores)."""
    return Path(uri[len("sqlite:///"):]) if uri.startswith("sqlite:///") else None


def lock_path(database: Path) -> Path:
    return database.with_name(database.name + ".lock")


@contextlib.contextmanager
def opening(uri: str) -> Iterator[None]:
    """Hold the store's open lock (`<database>.lock`) for the block; a no-op for stores that are not sqlite."""
    database = sqlite_path(uri)
    if database is None:
        yield
        return
    database.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(lock_path(database)), timeout=OPEN_TIMEOUT_S):
        yield


def is_locked_error(err: BaseException) -> bool:
    """sqlite's "database is locked", however MLflow / SQLAlchemy wrapped it."""
    seen: BaseException | None = err
    while seen is not None:
        if LOCKED_MESSAGE in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def retry_locked(store_call: Callable[[], T], retries: int = LOCKED_RETRIES,
                 first_backoff_s: float = FIRST_BACKOFF_S) -> T:
    """`store_call()`, tried again with exponential backoff while it fails because the database is locked."""
    for attempt in range(retries + 1):
        try:
            return store_call()
        except Exception as err:  # MLflow wraps sqlite's OperationalError in several types
            if attempt == retries or not is_locked_error(err):
                raise
            delay = first_backoff_s * 2 ** attempt * (1 + random.random())  # jitter: writers do not retry in step
            log.debug("the tracking store is locked by another process; retrying in %.2f s", delay)
            time.sleep(delay)
    raise AssertionError("unreachable")
