"""Per-rank step times and stragglers in a data-parallel run, from each rank's own host clock at the loop's existing
read points: no device sync and no collective is added.

Every rank times each interval between two read points (`StepClock`): its wall time and the part of it the host
spent waiting — inside the train step call and the read of the step outputs, where a rank waits for its device and,
through the gradient all-reduce, for the slowest rank. It appends one line per interval to
`<run dir>/rank_times/rank<r>.tsv`. Rank 0 reads the new lines at its own read points (`StragglerWatch`).

In synchronous data parallelism every rank's wall time per step is the same (all wait for the slowest), so a rank's
step time is its wall time less the part of its wait that the least-waiting rank did not have: the time it spent
waiting for others. A rank whose host is slow (data loading, a busy CPU) waits least and keeps the whole step; the
others shed what they waited for it. That is `rank/step_ms_<r>`, its median over an epoch's intervals; a rank above
trainer.straggler_factor x the median of the other ranks at trainer.straggler_patience read points in a row is a
straggler: a warning, and the run's tag `straggler.ranks`. A rank whose device is slow cannot be told from the
others by host clocks (they all wait for it on the device), and rank 0 reads only what every rank has written.
"""
from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from swinexp.tracking import Tracker

log = logging.getLogger("swinexp")

FOLDER = "rank_times"
STRAGGLER_TAG = "straggler.ranks"


def rank_file(run_dir: Path, rank: int) -> Path:
    return run_dir / FOLDER / f"rank{rank}.tsv"


class StepClock:
    """This rank's intervals between read points; `path` None (one process) keeps no record."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        if path is not None:  # this launch's lines only: a resumed run starts its file again
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("")
        self.restart()

    def restart(self) -> None:
        """A new interval from now: at an epoch's start and after a checkpoint (its writing is no step's time)."""
        self.start, self.waited, self.compiled = time.perf_counter(), 0.0, False

    @contextmanager
    def waiting(self) -> Iterator[None]:
        began = time.perf_counter()
        try:
            yield
        finally:
            self.waited += time.perf_counter() - began

    def exclude(self) -> None:
        """This interval compiled a graph: it says nothing about the step time."""
        self.compiled = True

    def mark(self, epoch: int, step: int, optimizer_steps: int) -> None:
        """A read point at global optimizer step `step`, `optimizer_steps` after the last one: record, restart."""
        if self.path is not None and optimizer_steps > 0 and not self.compiled:
            wall = (time.perf_counter() - self.start) * 1000 / optimizer_steps
            with open(self.path, "a") as out:
                out.write(f"{epoch}\t{step}\t{wall:.3f}\t{self.waited * 1000 / optimizer_steps:.3f}\n")
        self.restart()


class StragglerWatch:
    """Rank 0's reader of every rank's intervals: the epoch medians to log, and the stragglers to flag.

    Args:
        factor: trainer.straggler_factor (> 1, checked by build.check_trainer before launch).
        patience: trainer.straggler_patience (>= 1): read points in a row above factor x the other ranks' median.
    """

    def __init__(self, run_dir: Path, world: int, factor: float, patience: int, tracker: Tracker) -> None:
        self.files = [rank_file(run_dir, r) for r in range(world)]
        self.factor, self.patience, self.tracker = factor, patience, tracker
        self._offsets = [0] * world
        self._intervals: dict[tuple[int, int], dict[int, tuple[float, float]]] = {}  # (epoch, step) -> rank -> times
        self._epoch_times: dict[int, list[float]] = {r: [] for r in range(world)}
        self._streaks = [0] * world
        self.flagged: list[int] = []

    def poll(self) -> None:
        """Take in the lines written since the last poll; judge every interval that all ranks have reported."""
        for rank, path in enumerate(self.files):
            for epoch, step, wall, wait in self._new_lines(rank, path):
                self._intervals.setdefault((epoch, step), {})[rank] = (wall, wait)
        for key in sorted(k for k, times in self._intervals.items() if len(times) == len(self.files)):
            self._judge(key[1], self._intervals.pop(key))

    def end_epoch(self) -> dict[str, float]:
        """`rank/step_ms_<r>` of the epoch that ended (after its evaluation's all-reduce: every rank has written)."""
        self.poll()
        self._intervals.clear()  # intervals some rank did not report (one that compiled there, a signal's read)
        medians = {f"rank/step_ms_{r}": statistics.median(t) for r, t in self._epoch_times.items() if t}
        self._epoch_times = {r: [] for r in self._epoch_times}
        return medians

    def _new_lines(self, rank: int, path: Path) -> Iterator[tuple[int, int, float, float]]:
        try:
            with open(path) as src:
                src.seek(self._offsets[rank])
                text = src.read()
        except FileNotFoundError:
            return
        complete = text[:text.rfind("\n") + 1]  # a line still being written is read next time
        self._offsets[rank] += len(complete)
        for line in complete.splitlines():
            epoch, step, wall, wait = line.split("\t")
            yield int(epoch), int(step), float(wall), float(wait)

    def _judge(self, step: int, times: dict[int, tuple[float, float]]) -> None:
        least_wait = min(wait for _, wait in times.values())
        own = {r: wall - (wait - least_wait) for r, (wall, wait) in times.items()}  # less what it waited for others
        for rank, ms in own.items():
            self._epoch_times[rank].append(ms)
        for rank, ms in sorted(own.items()):
            others = statistics.median(v for r, v in own.items() if r != rank)  # with 2 ranks: the other one
            self._streaks[rank] = self._streaks[rank] + 1 if ms > self.factor * others else 0
            if self._streaks[rank] == self.patience:
                self._flag(rank, ms, others, step)

    def _flag(self, rank: int, ms: float, median: float, step: int) -> None:
        log.warning("rank %d is a straggler: %.1f ms per step against the other ranks' median %.1f ms, above "
                    "trainer.straggler_factor=%g x the median at %d read points in a row (trainer.straggler_patience)"
                    " up to optimizer step %d; every rank waits for it. Its host spends the time outside the step "
                    "(data loading, a busy or slower CPU, I/O): see rank/step_ms_%d and its worker log", rank, ms,
                    median, self.factor, self.patience, step, rank)
        if rank not in self.flagged:
            self.flagged = sorted([*self.flagged, rank])
            self.tracker.set_tags({STRAGGLER_TAG: ",".join(map(str, self.flagged))})
