"""`memory`: peak resident memory of three train steps, swinexp vs MindCV vs timm, each in a fresh process.

Each peer runs in a process of its own (a process's peak RSS only grows, and MindSpore keeps a compiled graph's
buffers for the life of the process), builds the same step as `peers` (swin_tiny, batch 16, 224 px by default)
and takes three steps; the figure is the process's peak resident set (VmHWM, `peak.py`), imports included.

    python -m benchmarks.memory <swinexp|MindCV> [overrides]   # the MindSpore worker; prints one JSON line
"""
from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

from benchmarks import peers
from benchmarks.harness import build_train_step, compose, configure_device, quiet_cell_teardown, random_batch
from benchmarks.host import describe, rss_gb
from benchmarks.options import Options
from benchmarks.peak import peak_rss_gb
from benchmarks.peers import MINDCV, SWINEXP, TIMM
from benchmarks.table import BenchResult, Table
from benchmarks.timing import progress
from benchmarks.timm_peer import reference_installed, run_in_process
from benchmarks.worker import json_from_worker

__all__ = ["Peak", "main", "run"]

STEPS = 3
TIMEOUT_S = 1800


@dataclass(frozen=True)
class Peak:
    """One peer process: its first step (MindSpore: compile + run) and resident memory."""

    first_s: float
    peak_rss_gb: float
    built_gb: float = float("nan")  # RSS once the model and optimizer exist, before the first step


def worker(peer: str, overrides: Sequence[str]) -> Peak:
    """Build `peer`'s train step in this process, take STEPS steps, return the figures."""
    from swinexp.registry import MODELS
    from swinexp.runtime.hardware import set_seed

    plan = compose(overrides)
    configure_device(plan)
    set_seed(plan.seed)
    model_cfg = plan.section("model")
    model = peers.build_mindcv_swin(model_cfg) if peer == MINDCV else MODELS.build(model_cfg)
    step = build_train_step(plan, model, STEPS)
    images, targets = random_batch(plan, plan.seed)
    built = rss_gb()
    start = time.perf_counter()
    step(images, targets).values()  # reading the outputs waits for the device to finish the step
    first = time.perf_counter() - start
    for _ in range(STEPS - 1):
        step(images, targets).values()
    return Peak(first, peak_rss_gb(), built)


def _in_process(peer: str, overrides: Sequence[str]) -> Peak:
    return Peak(**json_from_worker("benchmarks.memory", [peer, *overrides], f"the {peer} memory process",
                                   TIMEOUT_S))


def run(opts: Options) -> BenchResult | None:
    """The `memory` sub-benchmark; None (after saying why) when MindCV is not installed."""
    if not peers.mindcv_installed():
        progress(peers.SKIP_MESSAGE.replace("peers:", "memory:"))
        return None
    overrides = [*opts.model_overrides("swin_tiny", 16, 224), f"data.num_classes={opts.num_classes}",
                 "tracking=none", f"seed={opts.seed}", *opts.overrides]
    plan = compose(overrides)
    peaks: dict[str, Peak] = {}
    for peer in (SWINEXP, MINDCV):
        progress(f"memory: {peer}, {STEPS} steps in a fresh process")
        peaks[peer] = _in_process(peer, overrides)
    if reference_installed():
        progress(f"memory: {TIMM}, {STEPS} steps in a fresh process")
        timm = run_in_process(peers.timm_settings(plan, 0, STEPS - 1, opts.seed))
        peaks[TIMM] = Peak(timm.first_s, timm.peak_rss_gb)
    else:
        progress(peers.NO_TIMM_MESSAGE)
    return memory_table(peaks, plan)


def memory_table(peaks: dict[str, Peak], plan) -> BenchResult:
    """Rows in the order measured; ratios of peak RSS to MindCV and to timm (when it ran)."""
    rows, metrics = [], {}
    for name, peak in peaks.items():
        to_timm = f"{peak.peak_rss_gb / peaks[TIMM].peak_rss_gb:.2f}" if TIMM in peaks else "-"
        built = "-" if peak.built_gb != peak.built_gb else f"{peak.built_gb:.2f}"  # nan: not measured (timm)
        rows.append((name, f"{peak.first_s:.1f}", built, f"{peak.peak_rss_gb:.2f}",
                     f"{peak.peak_rss_gb / peaks[MINDCV].peak_rss_gb:.2f}", to_timm))
        metrics.update({f"memory/{name}/peak_rss_gb": peak.peak_rss_gb, f"memory/{name}/first_step_s": peak.first_s})
    if TIMM in peaks:
        metrics["memory/ratio_swinexp_over_timm"] = peaks[SWINEXP].peak_rss_gb / peaks[TIMM].peak_rss_gb
    title = (f"Peak resident memory of {STEPS} train steps, each peer in a fresh process: {plan.get('model.name')} "
             f"architecture, batch {plan.get('data.batch_size')}, {plan.get('data.img_size')} px, "
             f"amp {plan.get('amp.name')}, "
             f"{plan.hardware.mode} mode; {describe()}")
    notes = ("Peak RSS = VmHWM of the process after its steps (interpreter, imports, weights, "
             "compiled graph, gradients, optimizer state, activations). 'after build': RSS once the model and "
             "optimizer exist, before the first step (MindSpore peers).",)
    columns = ("model", "first step (s)", "after build (GiB)", "peak RSS (GiB)", "ratio to MindCV", "ratio to timm")
    return BenchResult("memory", Table(title, columns, tuple(rows), notes), metrics)


def main(argv: Sequence[str] | None = None) -> None:
    from dataclasses import asdict

    argv = list(sys.argv[1:] if argv is None else argv)
    quiet_cell_teardown()
    print(json.dumps(asdict(worker(argv[0], argv[1:]))), flush=True)


if __name__ == "__main__":
    main()
