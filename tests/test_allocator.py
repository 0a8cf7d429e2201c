"""A preloaded malloc replacement (runtime/allocator.py): jemalloc accepted on CPU because a run on it equals the run
on glibc's malloc bit for bit (shown with the real jemalloc where it is installed); the others refused before any
work."""
from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from swinexp.registry import ConfigError
from swinexp.runtime.allocator import ALLOW_ENV, check, current, in_use
from tests.conftest import ROOT, SMOKE

PLAIN_MAPS = ("7f00-7f10 r-xp 00000000 08:01 12 /usr/lib/x86_64-linux-gnu/libc.so.6\n"
              "7f20-7f30 rw-p 00000000 00:00 0 [heap]\n7f40-7f50 rw-p 00000000 00:00 0\n")
JEMALLOC = "/opt/my libs/libjemalloc.so.2"
TCMALLOC = "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"
SYSTEM_JEMALLOC = Path("/usr/lib/x86_64-linux-gnu/libjemalloc.so.2")


@pytest.fixture
def maps(tmp_path: Path) -> dict[str, Path]:
    (tmp_path / "plain").write_text(PLAIN_MAPS)
    (tmp_path / "jemalloc").write_text(PLAIN_MAPS + f"7f60-7f70 r-xp 00000000 08:01 13 {JEMALLOC}\n")
    (tmp_path / "tcmalloc").write_text(PLAIN_MAPS + f"7f60-7f70 r-xp 00000000 08:01 14 {TCMALLOC}\n")
    return {name: tmp_path / name for name in ("plain", "jemalloc", "tcmalloc", "missing")}


def test_the_mapped_replacement_is_found_by_its_file(maps: dict[str, Path]) -> None:
    assert in_use(maps["jemalloc"]) == Path(JEMALLOC) and current(maps["jemalloc"]) == "libjemalloc.so.2"
    assert in_use(maps["plain"]) is None and current(maps["plain"]) == "system"
    assert in_use(maps["missing"]) is None  # no /proc: nothing known to be preloaded


def test_cpu_accepts_jemalloc_refuses_the_others_unless_allowed_and_accelerators_warn(
        maps: dict[str, Path], caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(ConfigError) as err:
        check("CPU", maps["tcmalloc"], environ={})
    assert f"{TCMALLOC} is preloaded" in str(err.value) and "Preload jemalloc instead" in str(err.value)
    assert f"{ALLOW_ENV}=1" in str(err.value)
    check("CPU", maps["plain"], environ={})  # the C library's malloc: nothing to say
    check("CPU", maps["jemalloc"], environ={})  # verified: nothing to say either
    assert not caplog.records
    with caplog.at_level(logging.WARNING, logger="swinexp"):
        check("CPU", maps["tcmalloc"], environ={ALLOW_ENV: "1"})
        check("Ascend", maps["jemalloc"], environ={})
        check("Ascend", maps["jemalloc"], environ={})  # a job validates its hardware more than once: one warning
    assert [r.getMessage().endswith("running anyway") for r in caplog.records] == [True, False]
    assert "on Ascend was verified only with glibc's malloc" in caplog.records[1].getMessage()


def _train(run_dir: Path, data_root: Path, *, preload: str | None = None,
           malloc_conf: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", ALLOW_ENV, "MALLOC_CONF")}
    env.update({"LD_PRELOAD": preload} if preload else {})
    env.update({"MALLOC_CONF": malloc_conf} if malloc_conf else {})
    args = [*SMOKE, f"data.root={data_root}", "data.num_train=160", "trainer.limit_train_batches=null",
            "trainer.epochs=1", "hardware.compile_cache=false", f"hydra.run.dir={run_dir}"]
    return subprocess.run([sys.executable, str(ROOT / "run.py"), *args], cwd=run_dir.parent, env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_the_command_stops_before_any_work_under_a_preloaded_replacement(tmp_path: Path) -> None:
    compiler = shutil.which("cc") or shutil.which("gcc") or shutil.which("g++")
    if compiler is None:
        pytest.skip("no C compiler to build the stand-in library")
    (tmp_path / "stub.c").write_text("int swinexp_stub(void) { return 0; }\n")
    stub = tmp_path / "libtcmalloc_minimal.so.4"  # an empty library by tcmalloc's name: mapped, and harmless
    subprocess.run([compiler, "-shared", "-fPIC", "-o", str(stub), str(tmp_path / "stub.c")], check=True)
    out = _train(tmp_path / "run", tmp_path / "data", preload=str(stub))
    assert out.returncode == 1, out.stderr[-2000:]
    assert f"ConfigError: {stub} is preloaded in place of the C library's malloc" in out.stderr
    assert "Traceback" not in out.stderr and not (tmp_path / "run" / "checkpoints").exists()


def _weights(run_dir: Path) -> dict[str, np.ndarray]:
    import mindspore as ms

    from swinexp.engine import checkpoint

    values = checkpoint.read(run_dir / "checkpoints" / "last.ckpt")
    return {k: v.asnumpy() for k, v in values.items() if isinstance(v, ms.Parameter | ms.Tensor)}


@pytest.mark.slow
@pytest.mark.skipif(not SYSTEM_JEMALLOC.is_file(), reason="jemalloc is not installed (apt-get install libjemalloc2)")
def test_a_run_on_jemalloc_equals_the_run_on_glibc_bit_for_bit(tmp_path: Path) -> None:
    """The same one-epoch run (20 steps) on glibc's malloc and on jemalloc, junk-filling its allocations: every weight
    equal. With MindSpore's LogSoftmax in the loss (step.py `log_softmax`) the jemalloc run left its course from the
    13th step (0.33 apart at the end, 2026-12-07)."""
    data = tmp_path / "data"
    on_glibc = _train(tmp_path / "glibc", data)
    assert on_glibc.returncode == 0, on_glibc.stderr[-2000:]
    on_jemalloc = _train(tmp_path / "jemalloc", data, preload=str(SYSTEM_JEMALLOC), malloc_conf="junk:alloc")
    assert on_jemalloc.returncode == 0, on_jemalloc.stderr[-2000:]
    reference, other = _weights(tmp_path / "glibc"), _weights(tmp_path / "jemalloc")
    assert reference.keys() == other.keys()
    assert [k for k in reference if not np.array_equal(reference[k], other[k])] == []
