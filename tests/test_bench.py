"""`python -m benchmarks`: every sub-benchmark runs one tiny iteration through the real CLI and prints a
well-formed table; the pure parts (variants, groups, worker argv, ratios) are checked without timing anything."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from benchmarks import ops, peers, step
from benchmarks.__main__ import main, parse
from benchmarks.matmul_peak import matmul_peak_gflops
from benchmarks.options import Options
from benchmarks.per_image import alternate
from benchmarks.step import Measured, parse_variant, split_groups, step_table
from benchmarks.table import Table
from swinexp.registry import ConfigError
from tests.conftest import ROOT

# swin_micro shrunk further: 32 px, embed 16, one block per stage, 10 classes
MICRO = ["--model", "swin_micro", "--img-size", "32", "--batch", "2", "--num-classes", "10", "model.embed_dim=16",
         "model.depths=[1,1]", "model.num_heads=[1,2]", "--iters", "1", "--warmup", "0"]


def tables(stdout: str) -> list[tuple[list[str], list[list[str]]]]:
    """(header cells, body rows) of every markdown table in `stdout`, checking each has a separator row."""
    found = []
    for block in re.findall(r"(?:^\|.*\|$\n?)+", stdout, flags=re.MULTILINE):
        lines = block.strip().splitlines()
        cells = [[c.strip() for c in line.strip("|").split("|")] for line in lines]
        assert all(re.fullmatch(r"-{3,}:?", c) for c in cells[1]), lines[1]
        assert all(len(row) == len(cells[0]) for row in cells), block
        found.append((cells[0], cells[2:]))
    return found


def numbers(header: list[str], row: list[str], columns: tuple[str, ...]) -> list[float]:
    return [float(row[header.index(c)]) for c in columns]


def test_step_prints_one_row_per_variant(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["step", *MICRO, "--variants", "baseline", "all three"]) == 0
    ((header, rows),) = tables(capsys.readouterr().out)
    assert [r[0] for r in rows] == ["baseline", "all three"]
    assert header[:2] == ["variant", "overrides"]
    for row in rows:
        values = numbers(header, row, ("compile + 1st step (s)", "median (ms)", "min (ms)", "max (ms)", "images/s",
                                       "GFLOP/s", "ratio (median)", "ratio (min)"))
        assert all(v > 0 for v in values[:5]), row
    assert rows[0][header.index("ratio (median)")] == "1.000"  # the reference is the first variant
    assert "model.qkv=split" in rows[1][1]


def test_the_cpu_formulation_preset_is_what_hardware_cpu_trains_with() -> None:
    from benchmarks.harness import compose

    swin_tiny = ["model=swin_tiny", "data.img_size=224", "hardware=cpu"]
    trained = compose(swin_tiny)
    preset = compose([*swin_tiny, *step.BASE, *step.PRESETS["cpu formulation"]])
    assert preset.section("model") == trained.section("model")
    assert preset.section("optimizer") == trained.section("optimizer")
    assert compose([*swin_tiny, *step.BASE]).section("optimizer")["kernel"] == "mindspore"


def test_peers_compares_swinexp_with_a_micro_mindcv_swin(monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("mindcv")
    monkeypatch.setattr(peers, "reference_installed", lambda: False)  # without torch/timm: no timm row, a hint
    assert main(["peers", *MICRO]) == 0
    out = capsys.readouterr()
    ((header, rows),) = tables(out.out)
    assert [r[0] for r in rows] == [peers.MINDCV, peers.SWINEXP]
    assert "pip install -e '.[reference]'" in out.err
    for row in rows:
        assert all(v > 0 for v in numbers(header, row, ("median (ms)", "min (ms)", "max (ms)", "images/s")))
    assert re.search(r"swinexp / MindCV step time: \d+\.\d+", out.out)


def test_peers_times_timm_in_a_process_of_its_own(capsys: pytest.CaptureFixture[str]) -> None:
    from benchmarks.timm_peer import reference_installed

    pytest.importorskip("mindcv")
    if not reference_installed():
        pytest.skip("the reference extra (torch, timm) is not installed")
    assert main(["peers", *MICRO]) == 0
    out = capsys.readouterr().out
    ((header, rows),) = tables(out)
    assert [r[0] for r in rows] == [peers.MINDCV, peers.SWINEXP, peers.TIMM]
    timm_row = rows[2]
    assert all(v > 0 for v in numbers(header, timm_row, ("median (ms)", "min (ms)", "images/s")))
    assert timm_row[header.index("ratio to timm (median)")] == "1.000"
    assert "PyTorch" in timm_row[1] and re.search(r"swinexp / timm step time: \d+\.\d+", out)


def test_peers_table_divides_by_mindcv_and_by_timm() -> None:
    pytest.importorskip("mindcv")
    from benchmarks.harness import compose
    from benchmarks.timing import Samples, Timing
    from benchmarks.timm_peer import TimmTiming

    timings = {peers.MINDCV: Timing(9.0, Samples((3.0, 3.0)), 0.0),
               peers.SWINEXP: Timing(8.0, Samples((2.0, 2.0)), 0.0)}
    timm_runs = [TimmTiming(0.5, (1.0, 0.5), 3.0, 2, "t", "m"), TimmTiming(0.7, (1.5, 1.0), 3.5, 2, "t", "m")]
    cfg = compose(["model=swin_micro", "tracking=none"])
    result = peers.peers_table(timings, cfg, 10**9, Options(), timm_runs)
    columns = result.table.columns
    to_mindcv = {r[0]: r[columns.index("ratio to MindCV (median)")] for r in result.table.rows}
    to_timm = {r[0]: r[columns.index("ratio to timm (median)")] for r in result.table.rows}
    assert to_mindcv == {peers.MINDCV: "1.000", peers.SWINEXP: "0.667", peers.TIMM: "0.333"}
    assert to_timm == {peers.MINDCV: "3.000", peers.SWINEXP: "2.000", peers.TIMM: "1.000"}  # timm median of 4 steps
    assert result.metrics["peers/ratio_swinexp_over_timm"] == 2.0
    assert result.metrics["peers/timm/peak_rss_gb"] == 3.5
    without = peers.peers_table(timings, cfg, 10**9, Options())
    assert [r[0] for r in without.table.rows] == [peers.MINDCV, peers.SWINEXP]
    assert {r[columns.index("ratio to timm (median)")] for r in without.table.rows} == {"-"}


def test_the_timm_process_leaves_mindspores_library_folders_behind(monkeypatch: pytest.MonkeyPatch) -> None:
    from benchmarks.timm_peer import torch_environment

    plugin = "/venv/lib/python3.11/site-packages/mindspore/lib/plugin/cpu"
    monkeypatch.setenv("LD_LIBRARY_PATH", f"/opt/lib:{plugin}")
    monkeypatch.setenv("SWINEXP_PROBE", "kept")
    env = torch_environment()
    assert env["LD_LIBRARY_PATH"] == "/opt/lib" and env["SWINEXP_PROBE"] == "kept"
    monkeypatch.setenv("LD_LIBRARY_PATH", plugin)
    assert "LD_LIBRARY_PATH" not in torch_environment()


def test_a_worker_reports_its_own_peak_memory_not_its_parents() -> None:
    import subprocess
    import sys

    ballast = bytearray(600 * 2**20)  # the parent's resident set: 600 MiB more, touched
    ballast[::4096] = b"x" * len(ballast[::4096])
    code = ("import resource; from benchmarks.peak import peak_rss_gb; "
            "print(peak_rss_gb(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20)")
    own, inherited = map(float, subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                               check=True, cwd=ROOT).stdout.split())  # benchmarks/ is not installed
    assert own < 0.3 < 0.55 < inherited  # ru_maxrss kept the parent's peak across exec; VmHWM did not
    del ballast


def test_memory_measures_each_peer_in_a_fresh_process(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("mindcv")
    from benchmarks.timm_peer import reference_installed

    assert main(["memory", *MICRO]) == 0
    ((header, rows),) = tables(capsys.readouterr().out)
    expected = [peers.SWINEXP, peers.MINDCV] + ([peers.TIMM] if reference_installed() else [])
    assert [r[0] for r in rows] == expected
    for row in rows[:2]:  # MindSpore processes: RSS grows from model build to the peak of three steps
        built, peak = numbers(header, row, ("after build (GiB)", "peak RSS (GiB)"))
        assert 0.1 < built < peak
    assert rows[1][header.index("ratio to MindCV")] == "1.00"


def test_mindcv_peer_of_swin_tiny_is_mindcvs_swin_tiny() -> None:
    mindcv = pytest.importorskip("mindcv")
    from swinexp.models.factory import model_defaults

    def shapes(model) -> dict[str, tuple[int, ...]]:
        return {p.name: tuple(p.shape) for p in model.get_parameters()}

    ours = peers.build_mindcv_swin({**model_defaults("swin_tiny"), "img_size": 224, "num_classes": 1000})
    assert shapes(ours) == shapes(mindcv.create_model("swin_tiny", num_classes=1000))


def test_peers_without_mindcv_says_how_to_install_and_exits_0(monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(peers, "mindcv_installed", lambda: False)
    assert main(["peers", *MICRO]) == 0
    out = capsys.readouterr()
    assert out.out == "" and "pip install -e '.[bench]'" in out.err


def test_data_prints_images_per_second_per_pipeline(capsys: pytest.CaptureFixture[str]) -> None:
    from benchmarks.timm_peer import reference_installed

    assert main(["data", "--images", "16", "--batch", "8", "--img-size", "32", "--source-size", "48x36",
                 "--workers", "1", "--iters", "1"]) == 0
    out = capsys.readouterr()
    assert "to 48 x 36 px (JPEG q90), output 32 px" in out.out
    ((header, rows),) = tables(out.out)
    for row in rows:
        assert all(v > 0 for v in numbers(header, row, ("median (images/s)", "min (images/s)", "max (images/s)")))
    # train and eval, each in-process and through one Loader worker; with the reference extra, timm's loops too
    hows = [row[header.index("how")] for row in rows]
    timm_rows = [how for how in hows if "timm" in how]
    if reference_installed():
        assert len(rows) == 6 and len(timm_rows) == 2 and all("PyTorch" in how for how in timm_rows)
        assert re.search(r"swinexp / timm time per image.*swin train \d+\.\d+, eval \d+\.\d+", out.out)
    else:
        assert len(rows) == 4 and timm_rows == [] and "pip install -e '.[reference]'" in out.err


def test_loader_reports_the_feed_of_a_card(capsys: pytest.CaptureFixture[str]) -> None:
    """A tiny `loader` run: per dataset, pipeline, per-image ops (exact and native) and worker count, sane figures;
    uint8 pixels cross over."""
    from benchmarks.loader import COLUMNS
    from benchmarks.timm_peer import reference_installed
    from swinexp.data.datasets import PIPELINES

    assert main(["loader", "--images", "10", "--batch", "5", "--img-size", "16", "--workers", "1",
                 "--step-ms", "100"]) == 0
    out = capsys.readouterr().out
    ((header, rows),) = tables(out)
    assert tuple(header) == COLUMNS
    assert {(row[0].split(" ")[0], row[1]) for row in rows} >= {("generated", "train"), ("generated", "eval")}
    assert {(row[0], row[1], row[2]) for row in rows} == {(row[0], row[1], p) for row in rows for p in PIPELINES}
    for row in rows:
        assert row[header.index("workers")] == "1"
        assert float(row[header.index("pixel bytes/image")]) == 16 * 16 * 3  # uint8 HWC, nothing else per pixel
        extra = float(row[header.index("bytes/image")]) - 16 * 16 * 3
        assert 0 < extra <= 100  # label, index, flag and the erase draws: a few dozen bytes
        assert all(v > 0 for v in numbers(header, row, ("images/s", "worker ms/image")))
        # a tiny epoch's main-process CPU can be below getrusage's resolution, and round to 0.00 cores
        assert all(v >= 0 for v in numbers(header, row, ("main CPU ms/batch", "median main CPU ms/batch",
                                                         "cores/card")))
        exact = row[header.index("per-image ops")] == "exact"
        assert (row[header.index("timm ms/image")] != "-") == (reference_installed() and exact)
        assert (row[header.index("swinexp ms/image")] != "-") == exact
    assert "8-card host, train:" in out and "device prologue" in out


def test_native_distance_measures_each_operation_both_ways(capsys: pytest.CaptureFixture[str]) -> None:
    """A tiny `native_distance` run: lossless ops agree exactly, one op with one set of parameters stays close,
    and the differences the README names (shear pivot, timm's 1-bit Posterize at m9) show as large."""
    from benchmarks.native_distance import COLUMNS

    assert main(["native_distance", "--images", "6", "--img-size", "32"]) == 0
    ((header, rows),) = tables(capsys.readouterr().out)
    assert tuple(header) == COLUMNS
    mean = {row[0]: float(row[header.index("mean abs diff (levels)")]) for row in rows}
    assert {"decode (JPEG)", "resize + center crop (eval)", "random resized crop, same box", "horizontal flip",
            "Rotate", "Brightness", "Equalize"} <= mean.keys()
    assert mean["horizontal flip"] == mean["Solarize"] == mean["Posterize, same bits"] == 0
    assert mean["decode (JPEG)"] < 1  # both decode with libjpeg(-turbo)
    for same in ("resize + center crop (eval)", "random resized crop, same box", "Brightness", "Contrast",
                 "ShearX, same pivot (centre)", "TranslateX"):
        # interpolation and rounding, not a different image (the generated fallback's hard edges: up to 5.4)
        assert 0 <= mean[same] < 8, same
    assert mean["ShearX, as each applies it"] > 5 * mean["ShearX, same pivot (centre)"]
    assert mean["Posterize, each at m9"] > 20


def test_per_image_works_take_turns_image_by_image_after_an_untimed_pass() -> None:
    calls = []
    timings = alternate({name: lambda i, n=name: calls.append((n, i)) for name in ("a", "b")}, 3, passes=2)
    assert calls[:6] == [("a", 0), ("b", 0), ("a", 1), ("b", 1), ("a", 2), ("b", 2)]  # untimed
    assert calls[6:12] == [("a", 0), ("b", 0), ("b", 1), ("a", 1), ("a", 2), ("b", 2)]  # who goes first alternates
    assert len(calls) == 18 and {name: len(ms) for name, ms in timings.items()} == {"a": 2, "b": 2}


def test_data_and_loader_take_their_per_image_figures_from_one_timing(monkeypatch: pytest.MonkeyPatch,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """Both commands hand their works to `per_image.alternate` (decode included, on the same files) and print what
    it measured: the same swinexp / timm ratio from the same figures."""
    from benchmarks import data, loader, per_image
    from benchmarks.timm_peer import reference_installed

    assert data.alternate is loader.alternate is per_image.alternate
    given = []

    def measured(works: dict, count: int, passes: int = per_image.PASSES) -> dict[str, tuple[float, ...]]:
        given.append((sorted(works), count))
        for work in works.values():
            work(0)  # each work decodes and transforms a real file
        return {name: {"worker": (2.0,), "swinexp": (4.0,), "timm": (5.0,), "native": (1.0,)}[name] for name in works}

    monkeypatch.setattr(data, "alternate", measured)
    monkeypatch.setattr(loader, "alternate", measured)
    assert main(["data", "--images", "10", "--batch", "5", "--img-size", "16", "--workers", "1", "--iters", "1"]) == 0
    assert main(["loader", "--images", "10", "--batch", "5", "--img-size", "16", "--workers", "1"]) == 0
    out = capsys.readouterr().out
    timm = ["timm"] if reference_installed() else []
    assert given[:2] == [(["swinexp", *timm], 10)] * 2  # data: train, eval
    assert all(works == ["native", "swinexp", *timm, "worker"] and count == 10 for works, count in given[2:])  # loader
    (data_header, data_rows), (loader_header, loader_rows) = tables(out)
    assert {row[data_header.index("median (images/s)")] for row in data_rows if "in-process" in row[1]} == (
        {"250", "200"} if timm else {"250"})
    exact = [row for row in loader_rows if row[loader_header.index("per-image ops")] == "exact"]
    assert exact and {row[loader_header.index("swinexp ms/image")] for row in exact} == {"4.00"}
    if timm:
        assert "swin train 0.80, eval 0.80; < 1 means swinexp is faster" in out
        assert re.search(r"\(< 1: swinexp is faster\): .*train 0\.80, .*eval 0\.80\.", out)  # loader


def test_a_bad_source_size_is_refused_before_any_benchmark_runs(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["step", "data", "--source-size", "500 by 375"]) == 2
    assert "--source-size='500 by 375': give width x height in pixels, e.g. 500x375" in capsys.readouterr().err


def test_overhead_times_startup_phases_and_mlflow(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["overhead", *MICRO, "data.num_train=16", "data.num_val=10", f"data.root={tmp_path / 'data'}"]) == 0
    ((header, rows),) = tables(capsys.readouterr().out)
    names = [r[0] for r in rows]
    assert "process start to first step done" in names and any(n.startswith("MLflow: log_metrics") for n in names)
    for row in rows:
        assert all(v >= 0 for v in numbers(header, row, ("median", "min", "max"))), row


def test_overhead_with_the_compile_cache_fills_it_then_loads_it(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    cache = tmp_path / "cache"
    args = ["overhead", *MICRO, "data.num_train=16", "data.num_val=10", f"data.root={tmp_path / 'data'}",
            "hardware.compile_cache=true", f"hardware.compile_cache_dir={cache}"]
    assert main(args) == 0  # no warm-up: this process compiles, and publishes its graphs on exit
    assert "First train step: compiling the train step." in capsys.readouterr().out
    (published,) = list(cache.iterdir())
    assert json.loads((published / "graphs.json").read_text()) == ["the train step"]
    assert main(args) == 0
    assert "First train step: loading the train step from the compile cache." in capsys.readouterr().out
    assert list(cache.iterdir()) == [published]


def test_mlflow_run_holds_the_figures_and_the_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    assert main(["data", "--images", "10", "--batch", "5", "--img-size", "16", "--workers", "1", "--iters", "1",
                 "--mlflow", "--tracking-uri", uri]) == 0
    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("swinexp-bench").experiment_id])
    assert run.info.status == "FINISHED"
    assert run.data.metrics["data/train/in_process/images_per_s"] > 0
    assert run.data.params["images"] == "10"
    assert [a.path for a in client.list_artifacts(run.info.run_id)] == ["bench_data.md"]


def test_variants_are_presets_or_override_lists() -> None:
    assert parse_variant("all three").overrides == ("model.qkv=split", "model.patch_merging=reshape",
                                                    "model.rel_pos_bias=onehot")
    assert parse_variant("model.qkv=split amp=o2").overrides == ("model.qkv=split", "amp=o2")
    with pytest.raises(ConfigError, match="neither a preset"):
        parse_variant("split")


def test_groups_each_start_with_the_reference() -> None:
    variants = [parse_variant(v) for v in step.DEFAULT_VARIANTS]
    groups = split_groups(variants, 3)
    assert all(g[0].name == "baseline" and len(g) <= 3 for g in groups)
    assert [v.name for g in groups for v in g[1:]] == list(step.DEFAULT_VARIANTS[1:])


def test_ratios_are_taken_within_each_process() -> None:
    def measured(name: str, group: int, seconds: float) -> Measured:
        return Measured(name, (), group, 1.0, (seconds, seconds), 0.0, 4, 10**9)

    result = step_table([measured("baseline", 1, 2.0), measured("qkv=split", 1, 1.0),
                         measured("baseline", 2, 4.0), measured("amp=o2", 2, 6.0)], Options(model="swin_micro"))
    ratio = {row[0]: row[result.table.columns.index("ratio (median)")] for row in result.table.rows}
    assert ratio == {"baseline #1": "1.000", "qkv=split #1": "0.500", "baseline #2": "1.000", "amp=o2 #2": "1.500"}


def test_the_step_table_reads_each_step_against_the_matmul_peak() -> None:
    steps = [Measured(name, (), 1, 1.0, (seconds, seconds), 0.0, 4, 10**9)
             for name, seconds in (("a", 2.0), ("b", 4.0))]
    result = step_table(steps, Options(model="swin_micro"), matmul_peak=60.0)
    share = {row[0]: row[result.table.columns.index("of peak")] for row in result.table.rows}
    assert share == {"a": "10%", "b": "5%"}  # 3 x 1 GFLOP x 4 images / 2 s = 6 GFLOP/s of 60
    assert result.metrics["step/a/matmul_peak_share"] == pytest.approx(0.1)
    assert "of peak" not in step_table(steps, Options(model="swin_micro")).table.columns
    assert 0.1 < matmul_peak_gflops(size=256, repeats=2) < 1e4  # a real MatMul, timed


def test_worker_argv_reproduces_the_options() -> None:
    names, opts, _ = parse(["step", *MICRO, "optimizer.lr=1e-4", "--variants", "baseline", "amp=o2"])
    assert names == ["step"]
    _, again, _ = parse(["step", *opts.to_argv()])
    assert again == opts


def test_unknown_sub_benchmark_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["peer"]) == 2
    assert "Did you mean 'peers'" in capsys.readouterr().err


def test_table_right_aligns_numeric_columns() -> None:
    text = Table("t", ("name", "ms"), (("a", "1.5"), ("b", "2"))).markdown()
    assert text.splitlines()[2:] == ["| name | ms |", "|---|---:|", "| a | 1.5 |", "| b | 2 |"]


def test_memory_guard_stops_before_a_compile_that_would_not_fit(monkeypatch: pytest.MonkeyPatch) -> None:
    from benchmarks import host

    memory = {"rss": 1.0, "available": 20.0}
    monkeypatch.setattr(host, "rss_gb", lambda: memory["rss"])
    monkeypatch.setattr(host, "available_gb", lambda: memory["available"])
    guard = host.MemoryGuard(wait_s=0)
    guard.before_compile("baseline", compiled=0)
    memory.update(rss=7.0, available=14.0)  # the first compiled step kept 6 GiB
    guard.after_compile()
    guard.before_compile("qkv=split", compiled=1)  # 14 GiB free: fits
    memory.update(rss=13.0, available=6.0)  # 3 steps of 6 GiB fitted at the start, but others took memory since
    guard.after_compile()
    with pytest.raises(host.NotEnoughMemory, match="--max-resident 2"):
        guard.before_compile("amp=o2", compiled=2)


def test_a_candidate_that_fails_to_build_is_left_out_with_its_error() -> None:
    from benchmarks.timing import round_robin

    def broken() -> None:
        raise TypeError("The parameters number of the function is 0\nC++ call stack ...")

    failed: dict[str, str] = {}
    timings = round_robin({"ok": lambda: (lambda: None), "broken": broken}, warmup=0, iters=2, failed=failed)
    assert list(timings) == ["ok"] and len(timings["ok"].samples.seconds) == 2
    assert failed == {"broken": "TypeError: The parameters number of the function is 0"}
    with pytest.raises(TypeError):
        round_robin({"broken": broken}, warmup=0, iters=1)


def test_memory_guard_waits_for_memory_other_jobs_free(monkeypatch: pytest.MonkeyPatch) -> None:
    from benchmarks import host

    memory = {"rss": 7.0, "available": 3.0}
    monkeypatch.setattr(host, "rss_gb", lambda: memory["rss"])
    monkeypatch.setattr(host, "available_gb", lambda: memory["available"])
    monkeypatch.setattr(host.time, "sleep", lambda s: memory.update(available=memory["available"] + 2.0))
    guard = host.MemoryGuard(wait_s=60, poll_s=1)
    guard.largest_gb = 6.0  # one step compiled: the next needs 6.6 GiB free
    guard.before_compile("qkv=split", compiled=1)  # returns once another job has freed enough (3 -> 7 GiB)
    assert memory["available"] == 7.0


def test_ops_splits_both_steps_kernel_time_into_op_kinds(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("timm")
    assert main(["ops", *MICRO]) == 0
    out = capsys.readouterr().out
    ((header, rows),) = tables(out)
    assert header == ["op kind", "swinexp (ms/step)", "swinexp share (%)", "timm (ms/step)", "timm share (%)",
                      "gap (ms/step)"]
    body, total = rows[:-1], rows[-1]
    assert total[0] == "total (sum of op times)"
    kinds = {row[0] for row in body}
    assert {ops.GEMM, ops.SOFTMAX, ops.LAYERNORM, ops.GELU, ops.OPTIMIZER} <= kinds, kinds
    for side in ("swinexp", "timm"):
        ms = numbers(header, total, (f"{side} (ms/step)",))[0]
        shares = [float(row[header.index(f"{side} share (%)")]) for row in body]
        assert ms > 0 and abs(sum(shares) - 100) < 0.5, (side, shares)  # rounded to 0.1 each
        per_kind = [float(row[header.index(f"{side} (ms/step)")]) for row in body]
        assert sum(per_kind) == pytest.approx(ms, abs=0.1 * len(body))
        assert numbers(header, next(r for r in body if r[0] == ops.GEMM), (f"{side} (ms/step)",))[0] > 0
    assert re.search(r"swinexp per part of the model.*stage 0 \d+\.\d.*stage 1 \d+\.\d", out)


def test_gemm_times_every_linear_shape_in_every_orientation(capsys: pytest.CaptureFixture[str]) -> None:
    from benchmarks.gemm import ORIENTATIONS
    from benchmarks.gemm_torch import ORIENTATIONS as TORCH_ORIENTATIONS

    assert list(TORCH_ORIENTATIONS) == [o.label for o in ORIENTATIONS]  # the torch process answers by index

    assert main(["gemm", *MICRO]) == 0
    ((header, rows),) = tables(capsys.readouterr().out)
    by_layer = {row[0]: row[1] for row in rows}
    # batch 2 x (32 px / patch 4)^2 tokens in stage 0, a quarter of them after the merging; the head sees the batch
    assert by_layer["stage 0 qkv (1)"] == "128 x 16 -> 48" and by_layer["merging 0-1 (1)"] == "32 x 64 -> 32"
    assert by_layer["head (1)"] == "2 x 32 -> 10"
    assert len(rows) == len(by_layer) * len(ORIENTATIONS)
    torch_columns = ("torch median (ms)", "torch min (ms)") if "torch min (ms)" in header else ()  # torch installed
    for row in rows:
        median, best, speed, *theirs = numbers(header, row, ("MindSpore median (ms)", "MindSpore min (ms)",
                                                             "MindSpore GFLOP/s (min)", *torch_columns))
        rows_, fan_in, fan_out = map(int, re.findall(r"\d+", row[1]))
        assert 0 < best <= median and all(v > 0 for v in theirs), row
        # both columns are printed rounded: the time to 0.0005 ms, the speed to 0.05 GFLOP/s
        multiply_adds = rows_ * fan_in * fan_out
        slowest, fastest = multiply_adds / (best + 5e-4) / 1e6, multiply_adds / max(best - 5e-4, 1e-9) / 1e6
        assert slowest - 0.05 - 1e-9 <= speed <= fastest + 0.05 + 1e-9, row
    firsts = [row for row in rows if row[3] in {"y = x W^T", "dx = dy W", "dW = dy^T x"}]
    assert {row[header.index("vs autodiff (median)")] for row in firsts} == {"1.00"}  # each gemm's reference


@pytest.mark.parametrize("op_type,scope,in_optimizer,kind", [
    ("MatMul", "Default/model-SwinTransformer/layers-CellList/0-BasicLayer/blocks-CellList/0-SwinTransformerBlock/"
               "mlp-Mlp/fc1-Linear/MatMul-op0", False, ops.GEMM),
    ("MatMul", "Default/model-SwinTransformer/norm-LastAxisLayerNorm/fn-_LayerNormFn/MatMul-op8", False, ops.LAYERNORM),
    ("Mul", "Gradients/Default/model-SwinTransformer/layers-CellList/0-BasicLayer/blocks-CellList/0-"
            "SwinTransformerBlock/mlp-Mlp/act-ExactGELU/fn-_GeluFn/Mul-op3", False, ops.GELU),
    ("Sub", ".../attn-WindowAttention/softmax-LastAxisSoftmax/fn-_SoftmaxFn/Sub-op0", False, ops.SOFTMAX),
    ("MatMul", "Default/MatMul-op10", False, ops.OPTIMIZER),  # the global norm's dot products
    ("AdamWeightDecay", "Default/optimizer-AdamW/AdamWeightDecay-op8", False, ops.OPTIMIZER),
    ("LogSoftmax", "Default/LogSoftmax-op0", False, ops.LOSS),
    ("aten::native_layer_norm_backward", "", False, ops.LAYERNORM),
    ("aten::_softmax_backward_data", "", False, ops.SOFTMAX),
    ("aten::_log_softmax", "", False, ops.LOSS),
    ("aten::addmm", "", False, ops.GEMM),
    ("aten::gelu_backward", "", False, ops.GELU),
    ("aten::copy_", "", False, ops.LAYOUT),
    ("aten::mul", "", True, ops.OPTIMIZER),
    ("aten::add", "", False, ops.OTHER),
])
def test_op_kinds_follow_scope_then_type(op_type: str, scope: str, in_optimizer: bool, kind: str) -> None:
    assert ops.kind_of(op_type, scope, in_optimizer) == kind
