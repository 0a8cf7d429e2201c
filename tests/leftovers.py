"""Nothing outlives its command: a pytest plugin that fails a test whose processes survive it.

The pytest process becomes a child subreaper, so an orphan (a double-forked daemon, an `mlflow server` whose parent
died, a dataset worker) re-parents to pytest instead of init and stays in its process tree. Each test's new
descendants still alive after its teardown (and a short grace period) are reported as an error of that test, with
their command lines, and killed so that they do not spill into the next test. Processes that a module- or
session-scoped fixture starts belong to that fixture: they are checked when it is finalized. Under xdist each worker
guards its own tree.
"""
from __future__ import annotations

import ctypes
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h
GRACE_S = 5.0                # how long a process may take to exit after its test ended


def become_subreaper() -> bool:
    """Make this process the reaper of its orphaned descendants (Linux >= 3.4); False where that is unavailable."""
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


# A process is (pid, start time in clock ticks since boot): a pid reused by a later process is another process.
Proc = tuple[int, int]


def _stat(pid: int) -> tuple[int, str, int] | None:
    """(ppid, state, start time) from /proc/<pid>/stat, or None if it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()  # the command name in parentheses may hold spaces
    return int(fields[1]), fields[0], int(fields[19])


def descendants(root: int | None = None) -> dict[Proc, int]:
    """Every live (not zombie) descendant of `root` (this process): {process: parent pid}."""
    root = os.getpid() if root is None else root
    children: dict[int, list[tuple[int, int]]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and (st := _stat(int(entry.name))) is not None and st[1] != "Z":
            children.setdefault(st[0], []).append((int(entry.name), st[2]))
    found, todo = {}, [root]
    while todo:
        parent = todo.pop()
        for pid, start in children.get(parent, []):
            found[(pid, start)] = parent
            todo.append(pid)
    return found


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"


def alive(proc: Proc) -> bool:
    st = _stat(proc[0])
    return st is not None and st[1] != "Z" and st[2] == proc[1]


def reap_zombie_children(keep: set[int] = frozenset()) -> None:
    """Collect the exit status of adopted orphans that have died (a subreaper must, or they stay zombies); the
    pids in `keep` are left to whoever started them (a fixture's Popen still waits for its own child)."""
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and int(entry.name) not in keep and (st := _stat(int(entry.name))) is not None \
                and st[0] == os.getpid() and st[1] == "Z":
            try:
                os.waitpid(int(entry.name), os.WNOHANG)
            except ChildProcessError:
                pass


def settle(procs: set[Proc], grace_s: float = GRACE_S) -> dict[Proc, str]:
    """Wait up to `grace_s` for `procs` to exit; kill (SIGKILL) those still alive and return them with their
    command lines, read before the kill."""
    deadline = time.monotonic() + grace_s
    while (left := {p for p in procs if alive(p)}) and time.monotonic() < deadline:
        time.sleep(0.05)
    survivors = {p: cmdline(p[0]) for p in left}
    for pid, _ in survivors:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 5
    while any(alive(p) for p in survivors) and time.monotonic() < deadline:
        time.sleep(0.02)
    return survivors


class LeftoverProcesses(AssertionError):
    """Processes a test (or a fixture) started are still running after it ended."""


def describe(survivors: dict[Proc, str], owner: str) -> str:
    lines = "\n".join(f"  pid {pid}: {cmd}" for (pid, _), cmd in sorted(survivors.items()))
    return (f"{len(survivors)} process(es) started by {owner} outlived it (killed now):\n{lines}\n"
            "Stop what you start: terminate and wait for it in a finally or a fixture's teardown")


@dataclass(eq=False)  # pytest keeps its plugins in sets
class Guard:
    """The plugin: registered once per pytest process (controller and each xdist worker)."""

    grace_s: float = GRACE_S
    before: dict[Proc, int] = field(default_factory=dict)           # descendants when the test's setup began
    held: dict[str, set[Proc]] = field(default_factory=dict)        # broad-scoped fixture -> the processes it started
    finalized: list[tuple[str, dict[Proc, str]]] = field(default_factory=list)  # broad fixtures' survivors

    @staticmethod
    def _subtree(roots: set[Proc], tree: dict[Proc, int]) -> set[Proc]:
        """`roots` and their live descendants in `tree`."""
        found, pids = set(roots), {pid for pid, _ in roots}
        while more := {p for p, parent in tree.items() if parent in pids and p not in found}:
            found |= more
            pids |= {pid for pid, _ in more}
        return found

    def _excused(self, tree: dict[Proc, int]) -> set[Proc]:
        """What broad-scoped fixtures started, with everything below it (a server's workers spawned later); each
        fixture's set grows to it, so that its workers are still checked after the server itself has gone."""
        for owner, procs in self.held.items():  # the dead stay: a fixture's Popen may still wait for its zombie
            self.held[owner] = self._subtree(procs, tree)
        return set().union(*self.held.values()) if self.held else set()

    @pytest.hookimpl(tryfirst=True)
    def pytest_configure(self, config: pytest.Config) -> None:
        become_subreaper()

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item):
        self.before = descendants()
        return (yield)

    @pytest.hookimpl(wrapper=True)
    def pytest_fixture_setup(self, fixturedef: pytest.FixtureDef, request: pytest.FixtureRequest):
        if fixturedef.scope == "function":
            return (yield)
        start = set(descendants())
        try:
            return (yield)
        finally:
            new = set(descendants()) - start - self._excused(descendants())
            if new:
                self.held[f"{fixturedef.scope} fixture '{fixturedef.argname}'"] = new

    def pytest_fixture_post_finalizer(self, fixturedef: pytest.FixtureDef, request: pytest.FixtureRequest) -> None:
        owner = f"{fixturedef.scope} fixture '{fixturedef.argname}'"
        if owner in self.held:
            self._excused(descendants())  # take in what its processes started since the last check
            if survivors := settle(self.held.pop(owner), self.grace_s):
                self.finalized.append((owner, survivors))

    @pytest.hookimpl(wrapper=True, trylast=True)
    def pytest_runtest_teardown(self, item: pytest.Item, nextitem: pytest.Item | None):
        try:
            result = yield
        except BaseException:
            self._check(item)  # still stop what the test left: the teardown's own error is the one reported
            raise
        if messages := self._check(item):
            raise LeftoverProcesses("\n".join(messages))
        return result

    def _check(self, item: pytest.Item) -> list[str]:
        """Settle and kill what `item` (and the broad fixtures finalized with it) left alive; what to report."""
        tree = descendants()
        excused = self._excused(tree)
        survivors = settle(set(tree) - set(self.before) - excused, self.grace_s)
        reap_zombie_children(keep={pid for pid, _ in excused})
        messages = [describe(survivors, f"test {item.nodeid}")] if survivors else []
        messages += [describe(s, owner) for owner, s in self.finalized]
        self.finalized.clear()
        return messages


def register(config: pytest.Config) -> None:
    """Install the guard (from a conftest's pytest_configure); LEFTOVERS_GUARD=0 turns it off."""
    if os.environ.get("LEFTOVERS_GUARD", "1") != "0" and not config.pluginmanager.has_plugin("leftovers"):
        guard = Guard()
        config.pluginmanager.register(guard, "leftovers")
        become_subreaper()
