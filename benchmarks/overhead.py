"""`overhead`: what a run pays besides training: start-up to the first finished step, and MLflow logging per epoch.

Start-up is timed in fresh processes (`benchmarks.startup`), phase by phase, for run.py's default model and
data with `trainer=smoke tracking=none` (override with --model/--batch/--img-size or Hydra overrides). MLflow is
timed in this process against a new SQLite store in a temporary folder, through `swinexp.tracking.MlflowTracker`
as training uses it; the per-epoch cost is one `log_metrics` of the dict `fit` logs, shown also as a share of one
epoch of the same config (its batches x the median steady step).
"""
from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import startup
from benchmarks.harness import IMPORT_ROOT, compose
from benchmarks.host import describe, load_average
from benchmarks.options import Options
from benchmarks.table import BenchResult, Table
from benchmarks.timing import progress
from swinexp.config import thaw
from swinexp.tracking import MlflowTracker, flatten, resolve_uri

__all__ = ["EPOCH_METRICS", "STARTUP_CODE", "run"]

# argv[0] is startup.py, as a script's would be: MindSpore's compile cache (hardware.compile_cache) reads the entry
# file; the imports as the swinexp command makes them (app/cli.py), with the garbage collector paused
STARTUP_CODE = ("import time; started = time.time(); import sys; sys.argv[0] = sys.argv.pop(1)\n"
                "from swinexp.runtime.gc_pause import long_lived_imports\n"
                "with long_lived_imports('benchmarks.startup'):\n    from benchmarks.startup import main\n"
                "main(started)")
STEADY_STEPS = 3
# (row, from stamp, to stamp) of the start-up phases; "spawned" is taken here, just before the child starts
PHASES = (("python interpreter start", "spawned", "started"),
          ("imports: swinexp, MindSpore, Hydra", "started", "imported"),
          ("compose the config", "imported", "composed"),
          ("build: context, dataset, model, optimizer", "composed", "built"),
          ("first train step: compile + run", "built", "first_step"),
          ("process start to first step done", "spawned", "first_step"))
# the keys swinexp.engine.loop.fit logs after every epoch (without EMA)
EPOCH_METRICS = ("train/loss", "train/grad_norm", "train/overflow_steps", "train/loss_scale", "train/optimizer_steps",
                 "train/total_batch", "lr", "epoch_time_s", "train/images_per_s", "val/loss", "val/top1", "val/top5",
                 "data/train_skipped_files", "data/val_skipped_files")


def startup_overrides(opts: Options) -> list[str]:
    return [*opts.model_overrides(None, None, None), "trainer=smoke", "tracking=none", *opts.overrides]


def time_startups(overrides: list[str], runs: int) -> list[dict]:
    """`runs` fresh processes through the start-up phases; their stamps, with "spawned" added."""
    out = []
    for i in range(runs):
        spawned = time.time()
        done = subprocess.run([sys.executable, "-c", STARTUP_CODE, startup.__file__, str(STEADY_STEPS), *overrides],
                              cwd=IMPORT_ROOT, check=True, stdout=subprocess.PIPE, text=True)
        stamps = {**json.loads(done.stdout.strip().splitlines()[-1]), "spawned": spawned}
        progress(f"start-up {i + 1}/{runs}: first step done {stamps['first_step'] - spawned:.1f} s after spawn")
        out.append(stamps)
    return out


def time_mlflow(params: dict, stores: int, epochs: int) -> dict[str, list[float]]:
    """Seconds, in `stores` fresh stores after an untimed one (it pays MLflow's import): open + start a run,
    log_params once, then log_metrics once per each of `epochs` epochs."""
    costs: dict[str, list[float]] = {"open": [], "params": [], "epoch": []}
    metrics = dict.fromkeys(EPOCH_METRICS, 0.5)
    for store in range(stores + 1):
        timed = {"open": [], "params": [], "epoch": []}
        with tempfile.TemporaryDirectory() as tmp:
            start = time.perf_counter()
            tracker = MlflowTracker(resolve_uri(f"sqlite:///{tmp}/mlflow.db", Path(tmp)), "swinexp-bench-overhead")
            tracker.start("overhead", {})
            timed["open"].append(time.perf_counter() - start)
            start = time.perf_counter()
            tracker.log_params(params)
            timed["params"].append(time.perf_counter() - start)
            for epoch in range(1, epochs + 1):
                start = time.perf_counter()
                tracker.log_metrics(metrics, step=epoch)
                timed["epoch"].append(time.perf_counter() - start)
            tracker.close()
        if store > 0:
            for key, values in timed.items():
                costs[key] += values
    return costs


def _row(name: str, values: list[float], unit: str, scale: float = 1.0) -> tuple[str, ...]:
    scaled = [scale * v for v in values]
    return name, f"{statistics.median(scaled):.3f}", f"{min(scaled):.3f}", f"{max(scaled):.3f}", unit


def run(opts: Options) -> BenchResult:
    """The `overhead` sub-benchmark."""
    overrides = startup_overrides(opts)
    plan = compose(overrides)  # a config mistake fails here, before any process starts
    warmup = min(opts.warmup, 1)  # one process warms the dataset cache and the OS file cache
    loads = [load_average()]
    stamps = time_startups(overrides, warmup + opts.iters)[warmup:]
    params = flatten(thaw(plan.values))
    costs = time_mlflow(params, opts.iters, epochs=10)  # 10: the default run's epochs
    loads.append(load_average())
    steady = [s for run_ in stamps for s in run_["steady_s"]]
    batches = stamps[0]["batches_per_epoch"]
    epoch_s = batches * statistics.median(steady)
    rows = [_row(name, [s[end] - s[begin] for s in stamps], "s") for name, begin, end in PHASES]
    rows += [_row("steady train step, data included", steady, "ms", 1000),
             _row("MLflow: open a new SQLite store + start a run", costs["open"], "s"),
             _row("MLflow: log_params of the resolved config (once per run)", costs["params"], "ms", 1000),
             _row(f"MLflow: log_metrics of one epoch ({len(EPOCH_METRICS)} metrics)", costs["epoch"], "ms", 1000),
             _row("MLflow: log_metrics per epoch, share of one epoch", costs["epoch"], "% of epoch", 100 / epoch_s)]
    metrics = {f"overhead/{name}": float(row[1]) for name, row in zip(
        ("interpreter_s", "imports_s", "compose_s", "build_s", "first_step_s", "to_first_step_s", "steady_step_ms",
         "mlflow_open_s", "mlflow_params_ms", "mlflow_epoch_ms", "mlflow_epoch_pct"), rows)}
    first = stamps[0]
    title = (f"Overhead of `python run.py {' '.join(overrides)}` ({first['model']}, batch {first['batch']}, "
             f"{first['img_size']} px): {opts.iters} fresh processes after {warmup} warm-up, and {opts.iters} MLflow "
             f"stores; {describe()}")
    notes = ((f"One epoch of this config: {batches} batches x {1000 * statistics.median(steady):.1f} ms median "
              f"steady step = {epoch_s:.1f} s (evaluation and checkpointing not included)."),
             f"{len(params)} params; MLflow store: SQLite in a temporary folder, through "
             "swinexp.tracking.MlflowTracker.",
             "First train step: " + ", ".join(sorted({f"{s['first_step_work']}" for s in stamps})) + ".",
             f"1-minute load average: {loads[0]:.1f} before, {loads[1]:.1f} after.")
    columns = ("phase", "median", "min", "max", "unit")
    return BenchResult("overhead", Table(title, columns, tuple(rows), notes), metrics)
