"""Every `python -m benchmarks ...` command that README.md, BENCHMARKS.md or a page of docs/ cites is smoke-run by a
named test at its smallest settings: the sub-benchmarks of `python -m benchmarks` by tests/test_bench.py and the files
beside it, the stand-alone modules here. A command the docs start to cite fails
`test_every_cited_benchmark_is_smoke_run` until SMOKE_RUN names the test that runs it."""
from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from benchmarks.__main__ import BENCHMARKS
from tests.conftest import ROOT

DOCS = (ROOT / "README.md", ROOT / "BENCHMARKS.md", *sorted((ROOT / "docs").glob("*.md")))  # the history too

# what the docs cite -> the test that runs it (a `python -m benchmarks.<worker>` is run by its sub-benchmark)
SMOKE_RUN = {
    "benchmarks step": "tests/test_bench.py::test_step_prints_one_row_per_variant",
    "benchmarks peers": "tests/test_bench.py::test_peers_times_timm_in_a_process_of_its_own",
    "benchmarks memory": "tests/test_bench.py::test_memory_measures_each_peer_in_a_fresh_process",
    "benchmarks data": "tests/test_bench.py::test_data_prints_images_per_second_per_pipeline",
    "benchmarks loader": "tests/test_bench.py::test_loader_reports_the_feed_of_a_card",
    "benchmarks native_distance": "tests/test_bench.py::test_native_distance_measures_each_operation_both_ways",
    "benchmarks overhead": "tests/test_bench.py::test_overhead_times_startup_phases_and_mlflow",
    "benchmarks ops": "tests/test_bench.py::test_ops_splits_both_steps_kernel_time_into_op_kinds",
    "benchmarks gemm": "tests/test_bench.py::test_gemm_times_every_linear_shape_in_every_orientation",
    "benchmarks kernels": "tests/test_kernel_memory.py::test_the_kernels_bench_prints_one_row_per_probe_with_its_unit",
    "benchmarks chaos": "tests/test_chaos.py::test_a_sigkill_in_each_phase_loses_and_duplicates_nothing",
    "benchmarks.memory": "tests/test_bench.py::test_memory_measures_each_peer_in_a_fresh_process",
    "benchmarks.kernels": "tests/test_kernel_memory.py::test_the_kernels_bench_prints_one_row_per_probe_with_its_unit",
    "benchmarks.host_overhead": "tests/test_bench_cited.py::test_host_overhead_runs_the_real_loop_behind_the_stub",
    "benchmarks.sweep_spread": "tests/test_bench_cited.py::test_sweep_spread_reads_a_sweeps_jobs",
}


def cited() -> set[str]:
    """'benchmarks <sub>' for each sub-benchmark named after `python -m benchmarks` (none named: step, its
    default) and 'benchmarks.<module>' for each `python -m benchmarks.<module>`, across line breaks."""
    text = " ".join(doc.read_text() for doc in DOCS).replace("\n", " ")
    found = set()
    for match in re.finditer(r"python -m benchmarks(\.\w+)?", text):
        if match.group(1):
            found.add(f"benchmarks{match.group(1)}")
            continue
        subs = []
        for token in text[match.end():].split():
            name = token.strip("[]`'\"(),.;:")
            if name not in BENCHMARKS:
                break
            subs.append(name)
        found.update(f"benchmarks {sub}" for sub in subs or ["step"])
    return found


def test_every_cited_benchmark_is_smoke_run() -> None:
    missing = sorted(cited() - SMOKE_RUN.keys())
    assert not missing, (f"README.md/BENCHMARKS.md/docs cite {missing} but no test smoke-runs them: add a test at the "
                         "smallest settings and name it in SMOKE_RUN (tests/test_bench_cited.py)")
    assert {"benchmarks step", "benchmarks.host_overhead", "benchmarks.sweep_spread"} <= cited()  # the parser reads


@pytest.mark.parametrize("cited_as", sorted(SMOKE_RUN))
def test_the_named_smoke_test_exists(cited_as: str) -> None:
    path, name = SMOKE_RUN[cited_as].split("::")
    tree = ast.parse((ROOT / path).read_text())
    assert name in {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}, (
        f"SMOKE_RUN['{cited_as}'] names {SMOKE_RUN[cited_as]}, which does not exist")


def run_module(args: list[str], cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    """`python -m <args>` from the repository root, as the docs run it (benchmarks/ is not installed)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, "-m", *args], cwd=cwd, env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


@pytest.mark.slow
def test_host_overhead_runs_the_real_loop_behind_the_stub(tmp_path: Path) -> None:
    """BENCHMARKS.md's command (both batch sources, two read cadences), shrunk to 3 steps of a 1 ms stub step."""
    result = run_module(["benchmarks.host_overhead", "--step-ms", "1", "--steps", "3", "--read-every", "1", "3",
                         "--no-loader", "--", "trainer.progress_bar=false", "data.batch_size=4", "data.num_train=20",
                         "data.num_val=10", f"data.root={tmp_path / 'data'}"])
    rows = [line for line in result.stdout.splitlines() if line.startswith("| the loader") or
            line.startswith("| memory")]
    assert [row.split("|")[1:3] for row in rows] == [[" the loader ", " 1 "], [" the loader ", " 3 "],
                                                     [" memory ", " 1 "], [" memory ", " 3 "]], result.stdout
    # device syncs per step: the one read at each read point, no other (README's "0 syncs per step" between them)
    assert [row.split("|")[6].strip() for row in rows] == ["1.000", "0.333", "1.000", "0.333"], result.stdout


@pytest.mark.slow
def test_sweep_spread_reads_a_sweeps_jobs(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    experiment = client.create_experiment("swinexp")
    parent = client.create_run(experiment, run_name="sweep seed=1,2", tags={"sweep.role": "parent"}).info.run_id
    for job, offset in enumerate((0.0, 0.25)):
        run = client.create_run(experiment, run_name=f"seed={job + 1}",
                                tags={"sweep.id": parent, "sweep.job": str(job)}).info.run_id
        for epoch in (1, 2):
            for metric in ("train/loss", "val/loss", "val/top1"):
                client.log_metric(run, metric, epoch + offset * epoch, step=epoch)
    out = run_module(["benchmarks.sweep_spread", "--tracking-uri", uri], cwd=tmp_path).stdout
    assert "sweep sweep seed=1,2: 2 jobs (seed=1, seed=2)" in out
    assert "val/top1: largest difference between jobs 0.5 (epoch 2)" in out, out
