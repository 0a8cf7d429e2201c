"""The leftover-process guard (tests/leftovers.py) finds and kills what a test leaves running, passes the rest."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import leftovers
from tests.conftest import ROOT

pytest_plugins = ("pytester",)

# Inner test session: a double-forked sleeper (its parent exits at once: an orphan, as a daemonized server is), a
# child that exits within the grace period, a clean test, and a module fixture that stops its server on teardown.
INNER = '''
import os, subprocess, sys, time
from pathlib import Path

import pytest

PIDS = Path(os.environ["PIDS_FILE"])

def _orphan():
    # the shell's background job outlives the shell: `sleep` is re-parented to the subreaper
    subprocess.run(["sh", "-c", f"sleep 300 & echo $! >> {PIDS}; exit 0"], check=True)

def test_orphan():
    _orphan()

def test_child_that_exits_in_time():
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.5)"])

def test_clean():
    assert subprocess.run(["true"]).returncode == 0

@pytest.fixture(scope="module")
def server():
    proc = subprocess.Popen(["sleep", "300"])
    yield proc
    proc.terminate(); proc.wait()

def test_uses_a_module_server(server):
    assert server.poll() is None

def test_again_with_the_server(server):
    assert server.poll() is None
'''


# A module fixture that never stops its server: reported when the fixture is finalized, after the module's last test.
LEAKY_FIXTURE = '''
import subprocess

import pytest

@pytest.fixture(scope="module")
def leaky():
    yield subprocess.Popen(["sleep", "301"])

def test_first(leaky):
    pass

def test_last(leaky):
    pass
'''


def test_an_orphan_is_reported_with_its_command_line_and_killed(pytester: pytest.Pytester, tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    pytester.makeconftest("from tests import leftovers\n\n"
                          "def pytest_configure(config):\n    leftovers.register(config)\n")
    pytester.makepyfile(test_inner=INNER, test_leaky=LEAKY_FIXTURE)
    env = {"PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "PIDS_FILE": str(pids)}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:xdist", "-v")
    finally:
        for k, v in old.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    out = result.stdout.str()
    result.assert_outcomes(passed=7, errors=2)
    assert "test_inner.py::test_orphan PASSED" in out and "ERROR at teardown of test_orphan" in out
    assert "1 process(es) started by test test_inner.py::test_orphan outlived it (killed now)" in out
    (orphan,) = [int(line) for line in pids.read_text().split()]
    assert f"pid {orphan}: sleep 300" in out
    for name in ("test_child_that_exits_in_time", "test_clean", "test_uses_a_module_server",
                 "test_again_with_the_server"):
        assert f"test_inner.py::{name} PASSED" in out and f"ERROR at teardown of {name}" not in out
    assert not Path(f"/proc/{orphan}").exists()  # killed, and reaped by the inner session
    assert "ERROR at teardown of test_last" in out and "ERROR at teardown of test_first" not in out
    assert "1 process(es) started by module fixture 'leaky' outlived it (killed now)" in out
    assert "sleep 301" in out


def test_settle_waits_for_exits_and_kills_the_rest() -> None:
    quick = subprocess.Popen(["sleep", "0.2"])
    slow = subprocess.Popen(["sleep", "300"])
    procs = {p for p in leftovers.descendants() if p[0] in (quick.pid, slow.pid)}
    assert {pid for pid, _ in procs} == {quick.pid, slow.pid}
    started = time.monotonic()
    quick.wait()  # reaped: no longer alive, a zombie is not a leftover either
    survivors = leftovers.settle(procs, grace_s=1.0)
    assert [pid for pid, _ in survivors] == [slow.pid] and survivors[next(iter(survivors))] == "sleep 300"
    assert slow.wait(timeout=5) == -9 and time.monotonic() - started >= 1.0


def test_the_guard_runs_here_as_a_subreaper() -> None:
    assert leftovers.become_subreaper()
    assert sys.platform.startswith("linux")
