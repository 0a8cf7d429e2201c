"""tests/ci_skips.py: under CI=true an unlisted skip fails the run, with and without xdist; a listed one does not."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import ci_skips
from tests.conftest import ROOT

TESTS = '''
import pytest

def test_runs():
    pass

def test_listed():
    pytest.skip("no card here")

def test_wrong_reason():
    pytest.skip("something else")

@pytest.mark.skipif(True, reason="unlisted condition")
def test_unlisted():
    pass

@pytest.mark.device
def test_on_card():
    pytest.skip("no GPU")

@pytest.mark.xfail(reason="an xfail is not a skip")
def test_xfail():
    assert False
'''
SKIPPED_MODULE = '''
import pytest
pytest.importorskip("swinexp_no_such_module", reason="the extra is missing")

def test_never_collected():
    pass
'''
ALLOWLIST = '''
# a comment line, and a blank one

test_a.py::test_listed | no card*
test_a.py::test_wrong_reason | no card*  # the test skips, but not for this reason
mark:device | no GPU
'''
UNLISTED = ["test_a.py::test_wrong_reason: something else", "test_a.py::test_unlisted: unlisted condition",
            "test_b.py: the extra is missing"]
ALLOWED = ["test_a.py::test_listed", "test_a.py::test_on_card", "test_a.py::test_xfail", "test_a.py::test_runs"]


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A tiny test project whose conftest installs the guard with its own allowlist."""
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    device: needs a card\n")
    (tmp_path / "conftest.py").write_text(
        "from pathlib import Path\nfrom tests import ci_skips\n\n\ndef pytest_configure(config):\n"
        "    ci_skips.register(config, Path(__file__).with_name('ci_skips.txt'))\n")
    (tmp_path / "ci_skips.txt").write_text(ALLOWLIST)
    (tmp_path / "test_a.py").write_text(TESTS)
    (tmp_path / "test_b.py").write_text(SKIPPED_MODULE)
    return tmp_path


def pytest_in(project: Path, *args: str, ci: str = "true") -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "XDIST_"))}  # not this run's worker
    env.update(CI=ci, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rs", "--rootdir", str(project),
                           *args], cwd=project, env=env, capture_output=True, text=True, timeout=180)


def unlisted_lines(stdout: str) -> list[str]:
    section = stdout.split("skips not allowed in CI", 1)[1]
    return [line for line in section.splitlines() if line.startswith("test_")]


@pytest.mark.parametrize("workers", ["0", "2"])
def test_an_unlisted_skip_fails_the_run_and_is_named_with_its_reason(project: Path, workers: str) -> None:
    result = pytest_in(project, "-n", workers)
    assert result.returncode == pytest.ExitCode.TESTS_FAILED, result.stdout + result.stderr
    assert sorted(unlisted_lines(result.stdout)) == sorted(UNLISTED), result.stdout
    assert "3 test(s) skipped under CI=true without an entry in" in result.stdout


def test_listed_skips_pass_under_xdist(project: Path) -> None:
    result = pytest_in(project, "-n", "2", *ALLOWED)
    assert result.returncode == pytest.ExitCode.OK, result.stdout + result.stderr
    assert "2 skipped" in result.stdout and "1 xfailed" in result.stdout
    assert "skips not allowed in CI" not in result.stdout


def test_outside_ci_skips_are_only_reported(project: Path) -> None:
    result = pytest_in(project, "-n", "0", ci="")
    assert result.returncode == pytest.ExitCode.OK, result.stdout + result.stderr
    assert "skips not allowed in CI" not in result.stdout


def test_a_failing_run_keeps_its_own_exit_status(project: Path) -> None:
    (project / "test_c.py").write_text("def test_fails():\n    assert False\n")
    result = pytest_in(project, "-n", "0", "test_a.py", "test_c.py")
    assert result.returncode == pytest.ExitCode.TESTS_FAILED and "skips not allowed in CI" in result.stdout


def test_a_malformed_allowlist_line_is_a_usage_error_naming_the_line(project: Path) -> None:
    (project / "ci_skips.txt").write_text("test_a.py::test_listed\n")
    result = pytest_in(project, "-n", "0")
    assert result.returncode == pytest.ExitCode.USAGE_ERROR
    assert "ci_skips.txt:1: 'test_a.py::test_listed' is not 'PATTERN | REASON'" in result.stderr


def test_the_projects_allowlist_parses_and_admits_only_device_tests() -> None:
    entries = ci_skips.parse(ci_skips.ALLOWLIST.read_text())
    assert entries and all(e.pattern.startswith(ci_skips.MARK_PREFIX) for e in entries), entries
    assert {e.pattern for e in entries} == {"mark:device"}
