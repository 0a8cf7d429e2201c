"""What the training loop costs the host per step, behind a stand-in device step of fixed duration.

    python -m benchmarks.host_overhead --step-ms 450 --steps 60 [--read-every 1 50] [--no-loader] [-- overrides]

The device is a stub: each train-step call queues `--step-ms` of work on a thread that works through the queue in
order, as an accelerator works through the host's launches, and returns at once; reading a step's outputs blocks
until the stub has finished that step. Everything else is real: the composed config, the loader with its workers
and JPEG decoding, the loop with its progress bar, Philox draws, step-metric logging and checkpoints, and the
per-epoch evaluation (compiled on this CPU; it is outside the timed steps).

Per read cadence (`trainer.log_every_n_steps`) it prints: host ms per step (the main thread's time not spent
waiting on the device), that as a share of the step, device syncs per step (blocking reads of step outputs or
other device tensors, outside the loader), and wall ms per step against the stub's step time. With a read per
step the host's work adds to every step; with reads every N steps it overlaps the device's.
"""
from __future__ import annotations

import argparse
import os
import queue
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from mindspore import Parameter, Tensor

from benchmarks.harness import build_experiment, compose
from swinexp.engine import loop
from swinexp.engine import step as train_step
from swinexp.engine.step import StepOutput, TrainStep
from swinexp.runtime import hardware

DEFAULTS = ["model=swin_micro", "data=synthetic", "data.batch_size=16", "data.num_workers=2", "trainer.epochs=1",
            "trainer.limit_val_batches=1", "trainer.progress_bar=true", "tracking=none", "hardware=cpu",
            "trainer.amp_report=false"]
OUTPUT = np.array([2.3, 1.0, 0.0, 65536.0], np.float32)  # loss, grad norm, overflow, loss scale of a stub step


class StubDevice:
    """Works through queued steps of a fixed duration, one at a time, on its own thread."""

    def __init__(self, step_s: float) -> None:
        self.step_s, self.queued, self.finished = step_s, 0, 0
        self.waited_s = 0.0
        self._jobs: queue.Queue[int | None] = queue.Queue()
        self._done = threading.Condition()
        self._thread = threading.Thread(target=self._work, daemon=True)
        self._thread.start()

    def _work(self) -> None:
        while self._jobs.get() is not None:
            time.sleep(self.step_s)
            with self._done:
                self.finished += 1
                self._done.notify_all()

    def submit(self) -> int:
        self.queued += 1
        self._jobs.put(self.queued)
        return self.queued

    def wait(self, job: int) -> None:
        start = time.perf_counter()
        with self._done:
            self._done.wait_for(lambda: self.finished >= job)
        self.waited_s += time.perf_counter() - start

    def close(self) -> None:
        self._jobs.put(None)
        self._thread.join()


class StubStep:
    """Stands in for `TrainStep` in the real loop (the members of `engine.step_protocol.TrainStepLike`): a device
    step of fixed duration, outputs read on demand."""

    def __init__(self, device: StubDevice, real: TrainStep) -> None:
        self.device, self.real, self._step = device, real, real.optimizer_step
        self.jobs: dict[int, int] = {}  # id(output) -> its device job

    @property
    def optimizer_step(self) -> int:
        return self._step

    def draws(self, batch: int) -> tuple[Tensor, ...]:
        return self.real.draws(batch)  # the host's per-step Philox draws, as the real step makes them

    def next_compile(self) -> str | None:
        return None  # the stub compiles no graph, so the loop's progress bar has no compile to announce

    def __call__(self, images: Tensor, targets: Tensor) -> StepOutput:
        self.draws(int(images.shape[0]))
        out = StepOutput(Tensor(OUTPUT), True)
        self.jobs[id(out)] = self.device.submit()
        self._step += 1
        return out

    def state(self) -> dict[str, Parameter]:
        return self.real.state()

    def swap_ema(self) -> None:
        self.real.swap_ema()  # the real weights: evaluation with trainer.ema.decay set reads them


@dataclass(frozen=True)
class Result:
    loader: bool
    read_every: int
    steps: int
    wall_ms: float
    host_ms: float        # the loop's own work: wall minus waits on the device and on the loader
    loader_ms: float      # waiting for the next batch from the loader's workers
    syncs_per_step: float


@contextmanager
def counting_syncs(counter: list[int], timed: dict[str, float]) -> Iterator[None]:
    """Count blocking reads of device tensors made during the timed steps outside the loader (whose tensors are
    host memory)."""
    originals = {name: getattr(Tensor, name) for name in ("asnumpy", "__float__", "__bool__", "item")}

    def counted(original):  # noqa: ANN001, ANN202
        def read(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
            stepping = timed["start"] and not timed["end"]
            if stepping and f"swinexp{os.sep}data{os.sep}" not in sys._getframe(1).f_code.co_filename:
                counter[0] += 1
            return original(self, *args, **kwargs)
        return read

    for name, original in originals.items():
        setattr(Tensor, name, counted(original))
    try:
        yield
    finally:
        for name, original in originals.items():
            setattr(Tensor, name, original)


def measure(overrides: list[str], step_ms: float, steps: int, read_every: int, loader: bool = True) -> Result:
    plan = compose([*DEFAULTS, f"trainer.limit_train_batches={steps}", f"trainer.log_every_n_steps={read_every}",
                    *overrides])
    exp = build_experiment(plan)
    device = StubDevice(step_ms / 1000)
    stub: StubStep | None = None
    timed = {"start": 0.0, "end": 0.0}
    syncs = [0]
    # every factory of the loop's step (make_train_step and what calls it) builds it by the name step.TrainStep
    real_step, real_read_all, real_epoch_metrics = train_step.TrainStep, loop.read_all, loop._epoch_metrics

    def make_stub(*args, **kwargs) -> StubStep:  # noqa: ANN002, ANN003
        nonlocal stub
        stub = StubStep(device, real_step(*args, **kwargs))
        return stub

    loader_wait = [0.0]
    real_epoch = exp.train_loader.epoch

    def timed_epoch(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        batches = real_epoch(*args, **kwargs)
        first = next(batches)  # the workers' start-up: before the timed steps
        if not loader:  # the loop alone: the first batch again and again, no loader running beside it
            batches.close()
            batches = iter([first] * (steps - 1))
        timed["start"] = time.perf_counter()
        yield first
        while True:
            start = time.perf_counter()
            try:
                batch = next(batches)
            except StopIteration:
                return
            loader_wait[0] += time.perf_counter() - start
            yield batch

    exp.train_loader.epoch = timed_epoch

    def read_stub(outputs: list[StepOutput]) -> None:  # one blocking read: wait for the newest, copy all
        syncs[0] += 1
        device.wait(max(stub.jobs[id(o)] for o in outputs))
        for o in outputs:
            o._values = OUTPUT

    def epoch_metrics(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        timed["end"] = time.perf_counter()  # the steps end here; evaluation is not part of the step path
        return real_epoch_metrics(*args, **kwargs)

    train_step.TrainStep, loop.read_all, loop._epoch_metrics = make_stub, read_stub, epoch_metrics
    try:
        with tempfile.TemporaryDirectory() as run_dir, counting_syncs(syncs, timed):
            loop.fit(exp, Path(run_dir), jit=True)
    finally:
        train_step.TrainStep, loop.read_all, loop._epoch_metrics = real_step, real_read_all, real_epoch_metrics
        device.close()
    wall = timed["end"] - timed["start"]
    host = wall - device.waited_s - loader_wait[0]
    return Result(loader, read_every, steps, 1000 * wall / steps, 1000 * host / steps, 1000 * loader_wait[0] / steps,
                  syncs[0] / steps)


def table(results: list[Result], step_ms: float) -> str:
    lines = [f"stub device step {step_ms:.0f} ms; loop host ms = main-thread time not waiting on the device or loader",
             "| batches from | reads every N steps | steps | loop host ms / step | of the step time | "
             "device syncs / step | loader wait ms / step | wall ms / step |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {'the loader' if r.loader else 'memory'} | {r.read_every} | {r.steps} | {r.host_ms:.2f} | "
              f"{100 * r.host_ms / step_ms:.2f} % | "
              f"{r.syncs_per_step:.3f} | {r.loader_ms:.1f} | {r.wall_ms:.1f} |" for r in results]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--step-ms", type=float, default=450.0, help="the stub device's step (MindCV's 910 Swin-T)")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--read-every", type=int, nargs="+", default=[1, 50],
                        help="trainer.log_every_n_steps values to compare")
    parser.add_argument("--no-loader", action="store_true",
                        help="also time the loop alone: one batch reused, no loader workers beside the loop")
    parser.add_argument("overrides", nargs="*", help="config overrides, e.g. data.batch_size=32")
    args = parser.parse_args(argv)
    hardware.apply(hardware.HardwareCfg(), seed=0)
    sources = [True, False] if args.no_loader else [True]
    results = [measure(args.overrides, args.step_ms, args.steps, n, loader) for loader in sources
               for n in args.read_every]
    text = table(results, args.step_ms)
    print(text)
    return text


if __name__ == "__main__":
    main()
