"""The command's allocator (runtime/allocator.py): which library SWINEXP_ALLOCATOR picks, and the re-execution that
preloads it — run for real in subprocesses, with a stub library built here standing in for jemalloc."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from swinexp.runtime import allocator
from swinexp.runtime.allocator import ENV_VAR, AllocatorError, in_use, library_for
from tests.conftest import ROOT

# prints one line per start of the interpreter, then what the process ended up with
PROBE = ("import json, os, sys\nprint('start', os.getpid(), flush=True)\n"
         "from swinexp.runtime.allocator import current, environment_of_a_new_shell, preload_or_exit\n"
         "preload_or_exit()\n"
         "print(json.dumps({'pid': str(os.getpid()), 'allocator': current(), 'argv': sys.argv[1:],\n"
         "                  'LD_PRELOAD': os.environ.get('LD_PRELOAD'), 'env': sorted(os.environ),\n"
         "                  'new_shell_preload': environment_of_a_new_shell().get('LD_PRELOAD')}))\n")


def _touch(folder: Path, *names: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        (folder / name).write_bytes(b"")
    return folder


def test_auto_takes_the_first_allocator_installed_in_order(tmp_path: Path) -> None:
    both = _touch(tmp_path / "both", "libmimalloc.so.2", "libjemalloc.so.2")
    assert library_for("auto", [both]) == both / "libjemalloc.so.2"
    only_tcmalloc = _touch(tmp_path / "tc", "libtcmalloc_minimal.so.4", "libmimalloc.so.2")
    assert library_for("auto", [tmp_path / "empty", only_tcmalloc]) == only_tcmalloc / "libtcmalloc_minimal.so.4"
    assert library_for("", [only_tcmalloc]) == only_tcmalloc / "libtcmalloc_minimal.so.4"  # unset = auto
    assert library_for("auto", [_touch(tmp_path / "none", "libc.so.6")]) is None  # the system's malloc
    assert library_for("system", [both]) is None
    assert library_for("mimalloc", [both]) == both / "libmimalloc.so.2"


@pytest.mark.parametrize(("setting", "says"), [
    ("jemalloc", "apt-get install libjemalloc2"),
    ("tcmalloc", "apt-get install libtcmalloc-minimal4"),
    ("/no/such/libjemalloc.so.2", "no such file"),
    ("glibc", "is not an allocator: use auto (the default), system, jemalloc, tcmalloc, mimalloc"),
])
def test_a_setting_that_cannot_be_used_names_the_fix(tmp_path: Path, setting: str, says: str) -> None:
    with pytest.raises(AllocatorError, match=ENV_VAR) as err:
        library_for(setting, [_touch(tmp_path / "libs", "libmimalloc.so.2")])
    assert says in str(err.value)


def test_in_use_reads_the_mapped_allocator(tmp_path: Path) -> None:
    plain = ("7f00-7f10 r-xp 00000000 08:01 12 /usr/lib/x86_64-linux-gnu/libc.so.6\n"
             "7f20-7f30 rw-p 00000000 00:00 0 [heap]\n7f40-7f50 rw-p 00000000 00:00 0\n")
    (tmp_path / "plain").write_text(plain)
    (tmp_path / "jemalloc").write_text(plain + "7f60-7f70 r-xp 00000000 08:01 13 /opt/my libs/libjemalloc.so.2\n")
    assert in_use(tmp_path / "plain") is None
    assert in_use(tmp_path / "jemalloc") == Path("/opt/my libs/libjemalloc.so.2")
    assert in_use(tmp_path / "missing") is None


@pytest.fixture(scope="module")
def stub_library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty shared library named like jemalloc: preloading it shows in /proc/self/maps, and changes nothing."""
    compiler = shutil.which("cc") or shutil.which("gcc") or shutil.which("g++")
    if compiler is None:
        pytest.skip("no C compiler to build the stub library")
    folder = tmp_path_factory.mktemp("stub")
    (folder / "stub.c").write_text("int swinexp_stub_allocator(void) { return 0; }\n")
    subprocess.run([compiler, "-shared", "-fPIC", "-o", str(folder / "libjemalloc.so.2"), str(folder / "stub.c")],
                   check=True)
    return folder / "libjemalloc.so.2"


def _probe(setting: str, tmp_path: Path, preload: str | None = None) -> tuple[list[str], dict, str]:
    """The pids of the interpreter's starts, what the process ran with, and its stderr."""
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", ENV_VAR)}
    env.update({ENV_VAR: setting, "PYTHONPATH": str(ROOT)})
    if preload:
        env["LD_PRELOAD"] = preload
    done = subprocess.run([sys.executable, "-c", PROBE, "a", "b=c"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    *starts, ran = done.stdout.splitlines()
    assert all(line.startswith("start ") for line in starts), starts
    return [line.split()[1] for line in starts], json.loads(ran), done.stderr


def test_the_door_reexecutes_once_with_the_library_preloaded(stub_library: Path, tmp_path: Path) -> None:
    starts, ran, _ = _probe(str(stub_library), tmp_path, preload="/keep/this.so")
    assert starts == [ran["pid"], ran["pid"]]  # the interpreter started twice, in the same process: exec
    assert ran["allocator"] == "libjemalloc.so.2" and ran["argv"] == ["a", "b=c"]
    assert ran["LD_PRELOAD"] == f"{stub_library}:/keep/this.so"  # children inherit it; the user's preload stays
    assert "SWINEXP_ALLOCATOR_REEXECUTED" not in ran["env"]
    assert ran["new_shell_preload"] == "/keep/this.so"  # what a benchmark's child starts from, as from a shell


def test_no_reexecution_for_the_system_malloc_or_an_allocator_already_preloaded(stub_library: Path,
                                                                                 tmp_path: Path) -> None:
    starts, ran, _ = _probe("system", tmp_path)
    assert len(starts) == 1 and ran["allocator"] == "system" and ran["LD_PRELOAD"] is None
    starts, ran, _ = _probe("auto", tmp_path, preload=str(stub_library))  # e.g. a child of a preloaded process
    assert len(starts) == 1 and ran["allocator"] == "libjemalloc.so.2"


def test_a_library_the_loader_refuses_runs_on_without_a_loop(tmp_path: Path) -> None:
    not_elf = _touch(tmp_path / "bad", "libjemalloc.so.2") / "libjemalloc.so.2"  # ld.so ignores it, with a message
    starts, ran, stderr = _probe(str(not_elf), tmp_path)
    assert len(starts) == 2 and ran["allocator"] == "system"
    assert f"swinexp: {not_elf} could not be preloaded; running on the system's malloc" in stderr
    assert ran["LD_PRELOAD"] is None  # taken out again: children would only repeat the loader's complaint


def test_a_bad_setting_stops_the_command_before_any_work(tmp_path: Path) -> None:
    env = {**os.environ, ENV_VAR: "glibc"}
    env.pop("LD_PRELOAD", None)
    done = subprocess.run([sys.executable, str(ROOT / "run.py"), "tracking=none"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert done.stderr.strip().startswith(f"AllocatorError: {ENV_VAR}='glibc' is not an allocator")
    assert "Traceback" not in done.stderr and not (tmp_path / "outputs").exists()


def test_off_linux_nothing_changes(tmp_path: Path) -> None:
    def refuse(*_: object) -> None:
        raise AssertionError("re-executed off Linux")

    environ = {ENV_VAR: "auto"}
    allocator.preload_or_exit(environ, ["python", "run.py"], platform="darwin", execv=refuse)
    assert environ == {ENV_VAR: "auto"}
