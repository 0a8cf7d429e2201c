"""The child process of `overhead`: time each phase from interpreter start to the first finished train step.

    python -c "<overhead.STARTUP_CODE>" <this file> STEADY [overrides]

It does what `python run.py <overrides>` does up to its first train step (compose, hardware.apply, the compile
cache when hardware.compile_cache is on, build_experiment, the train step as `fit` builds it, the first batch),
then STEADY more steps with their data, and prints one JSON line: the wall-clock stamp (time.time()) at the end of
each phase, the steady step times and the batches of a full epoch.
"""
from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator, Sequence

from benchmarks.harness import build_experiment, compose, configure_device
from swinexp.data import Loader
from swinexp.engine.step import train_step_for
from swinexp.runtime import compile_cache
from swinexp.tracking import NullTracker

__all__ = ["main"]


def _batches(loader: Loader) -> Iterator[tuple]:
    """Batches across epochs, for smoke data shorter than the steps asked for."""
    epoch = 0
    while True:
        yield from loader.epoch(epoch)
        epoch += 1


def main(started: float, argv: Sequence[str] | None = None) -> None:
    """Run the phases and print their stamps; `started` is time.time() as the interpreter began the -c code."""
    imported = time.time()  # the imports above: swinexp (all registries), MindSpore, Hydra, OmegaConf
    argv = list(sys.argv[1:] if argv is None else argv)
    steady_steps, overrides = int(argv[0]), argv[1:]
    plan = compose(overrides)
    composed = time.time()
    hw = plan.hardware
    plan = configure_device(plan)
    compile_cache.enable(plan)  # as train.main: a sweep job's start-up from the graphs an earlier job compiled
    exp = build_experiment(plan, NullTracker())
    built = time.time()
    step = train_step_for(exp, hw.mode == "graph")  # the loop's own factory
    batches = _batches(exp.train_loader)
    graph = step.next_compile()
    first_step_work = compile_cache.compiling(graph) if graph else "no compile"  # before the call: what it does
    with compile_cache.first_call(graph):  # as fit: only a step graph's first call goes through the cache
        step(*next(batches)).values()  # reading the outputs waits for the device to finish the step
    first_step = time.time()
    steady = []
    for _ in range(steady_steps):
        start = time.perf_counter()
        step(*next(batches)).values()
        steady.append(time.perf_counter() - start)
    batches.close()
    print(json.dumps({"started": started, "imported": imported, "composed": composed, "built": built,
                      "first_step": first_step, "first_step_work": first_step_work, "steady_s": steady,
                      "batches_per_epoch": len(exp.train_loader),
                      "model": plan.get("model.name"), "batch": int(plan.get("data.batch_size")),
                      "img_size": int(plan.get("data.img_size"))}))
