"""No silent skip in CI: under `CI=true`, a skipped test fails the run unless tests/ci_skips.txt lists it.

Each line of the allowlist is `PATTERN | REASON`: PATTERN is a glob on the test's node id
(`tests/test_x.py::test_y*`) or `mark:NAME` for every test carrying that marker; REASON is a glob the skip's reason
must match, so a listed test that starts skipping for another reason fails too. `#` starts a comment.

Under xdist the workers' reports reach the controller's `pytest_runtest_logreport` (tests) and
`pytest_collectreport` (a module skipped whole, e.g. by a module-level `importorskip`); the controller decides at
`pytest_sessionfinish` and turns a passing exit status into "tests failed", listing each unlisted skip.
"""
from __future__ import annotations

import fnmatch
import os
from dataclasses import dataclass
from pathlib import Path

import pytest

ALLOWLIST = Path(__file__).with_name("ci_skips.txt")
MARK_PREFIX = "mark:"


@dataclass(frozen=True)
class Allowed:
    pattern: str  # glob on the node id, or mark:NAME
    reason: str   # glob on the skip reason

    def covers(self, skip: Skip) -> bool:
        if self.pattern.startswith(MARK_PREFIX):
            where = self.pattern[len(MARK_PREFIX):] in skip.markers
        else:
            where = fnmatch.fnmatchcase(skip.nodeid, self.pattern)
        return where and fnmatch.fnmatchcase(skip.reason, self.reason)


@dataclass(frozen=True)
class Skip:
    nodeid: str
    reason: str
    markers: frozenset[str] = frozenset()


def parse(text: str, source: str = str(ALLOWLIST)) -> list[Allowed]:
    """The allowlist's entries; a line without a pattern and a reason is an error naming the line."""
    entries = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        pattern, bar, reason = (part.strip() for part in line.partition("|"))
        if not bar or not pattern or not reason:
            raise pytest.UsageError(f"{source}:{number}: '{raw.strip()}' is not 'PATTERN | REASON' (a node-id glob "
                                    "or mark:NAME, then a glob of the skip reason)")
        entries.append(Allowed(pattern, reason))
    return entries


def skip_of(report: pytest.TestReport | pytest.CollectReport) -> Skip | None:
    """The skip a report records, or None (passed, failed, or an xfail, which pytest also reports as skipped)."""
    if not report.skipped or hasattr(report, "wasxfail"):
        return None
    longrepr = report.longrepr
    # a skip's longrepr is (path, line, "Skipped: reason"); keep anything else whole rather than lose it
    reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    reason = reason.removeprefix("Skipped: ")
    markers = frozenset(k for k, v in getattr(report, "keywords", {}).items() if v)
    return Skip(report.nodeid, reason, markers)


class SkipGuard:
    """Collects the skips no allowlist entry covers and fails the session on them."""

    def __init__(self, allowed: list[Allowed], source: Path) -> None:
        self.allowed, self.source = allowed, source
        self.unlisted: list[Skip] = []

    def _check(self, report: pytest.TestReport | pytest.CollectReport) -> None:
        skip = skip_of(report)
        if skip is not None and not any(entry.covers(skip) for entry in self.allowed):
            self.unlisted.append(skip)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self._check(report)

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        self._check(report)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.unlisted and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if not self.unlisted:
            return
        terminalreporter.section("skips not allowed in CI", sep="=", red=True, bold=True)
        for skip in self.unlisted:
            terminalreporter.line(f"{skip.nodeid}: {skip.reason}", red=True)
        terminalreporter.line(
            f"{len(self.unlisted)} test(s) skipped under CI=true without an entry in {self.source}. Install what they "
            "need in .ci/run, or, if the skip is right on every CI host, add a line 'NODEID-GLOB | REASON-GLOB' "
            "with the reason there.")


def register(config: pytest.Config, allowlist: Path = ALLOWLIST) -> None:
    """Install the guard in this process when CI=true, unless it is an xdist worker (the controller decides)."""
    if os.environ.get("CI", "").lower() != "true" or hasattr(config, "workerinput"):
        return
    if not allowlist.is_file():
        raise pytest.UsageError(f"CI=true but the skip allowlist {allowlist} does not exist; create it (it may be "
                                "empty) or unset CI")
    guard = SkipGuard(parse(allowlist.read_text(), str(allowlist)), allowlist)
    config.pluginmanager.register(guard, "swinexp-ci-skips")
