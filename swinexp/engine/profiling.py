"""Profile a window of optimizer steps with MindSpore's profiler and summarise the busiest ops as markdown.

The training loop calls `before_step(step)` / `after_step(step)` around every optimizer step and `finish()` at the
end; only steps [start_step, start_step + num_steps) are recorded, so compilation and warm-up stay out of the data.
MindSpore writes its raw data to `out_dir/<host>_<pid>_<time>_ascend_ms/` (on every backend, despite the name):
`FRAMEWORK/cpu_op_detail_info_<rank>.csv` (per-op calls and total time, written when recording stops) and, after
its analysis, `ASCEND_PROFILER_OUTPUT/trace_view.json` (a timeline for chrome://tracing or ui.perfetto.dev).
`finish()` turns the per-op table into `out_dir/profile_summary.md`.
"""
from __future__ import annotations

import csv
import logging
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import mindspore as ms

from swinexp.registry import ConfigError

if TYPE_CHECKING:
    from mindspore.profiler import profile

__all__ = ["OpTime", "StepProfiler", "read_op_times", "summary_markdown"]

SUMMARY_NAME = "profile_summary.md"
TOP_OPS = 20
# MindSpore warns that a schedule without warm-up "can skew" results; here warm-up steps run before start_step anyway
_NO_WARMUP_WARNING = "won't be using warmup"


@dataclass(frozen=True)
class OpTime:
    """One op instance of the compiled graph over the recorded steps.

    Attributes:
        name: Full scoped name, e.g. "Gradients/Default/.../Grad_MatMul/MatMul-op12".
        op_type: Kernel type, e.g. "MatMul".
        calls: Executions while recording.
        total_ms: Summed kernel time.
    """

    name: str
    op_type: str
    calls: int
    total_ms: float


class _DropMessage(logging.Filter):
    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text

    def filter(self, record: logging.LogRecord) -> bool:
        return self.text not in record.getMessage()


def _activities() -> list:
    from mindspore.profiler import ProfilerActivity

    device = ms.get_context("device_target")
    extra = {"GPU": [ProfilerActivity.GPU], "Ascend": [ProfilerActivity.NPU]}.get(device, [])
    return [ProfilerActivity.CPU, *extra]


def _start_profile(out_dir: Path, num_steps: int) -> profile:
    """A started MindSpore profile that records `num_steps` steps, then stops and analyses into `out_dir`."""
    from mindspore import log as ms_log
    from mindspore.profiler import profile, schedule, tensorboard_trace_handler

    ms_logger = ms_log._get_logger()  # MindSpore's own logger has no public accessor
    quiet = _DropMessage(_NO_WARMUP_WARNING)
    ms_logger.addFilter(quiet)
    try:
        plan = schedule(wait=0, warmup=0, active=num_steps, repeat=1)
    finally:
        ms_logger.removeFilter(quiet)
    prof = profile(activities=_activities(), schedule=plan, start_profile=False,
                   on_trace_ready=tensorboard_trace_handler(str(out_dir)))
    prof.start()
    return prof


class StepProfiler:
    """Wraps optimizer steps [start_step, start_step + num_steps) in MindSpore's profiler.

    Args:
        out_dir: Where MindSpore's raw data and the summary go; created if missing.
        start_step: 1-based global optimizer step of the first recorded step (e.g. 3: after compile and warm-up).
        num_steps: Steps to record.
    """

    def __init__(self, out_dir: Path, start_step: int, num_steps: int) -> None:
        if start_step < 1:
            raise ConfigError(f"trainer.profile.start_step={start_step} must be >= 1 (1-based optimizer step); "
                              "3 or more keeps compilation out of the profile")
        if num_steps < 1:
            raise ConfigError(f"trainer.profile.num_steps={num_steps} must be >= 1")
        self.out_dir = Path(out_dir)
        self.start_step, self.num_steps = start_step, num_steps
        self.step_wall_s: list[float] = []  # host wall time of each recorded step
        self._prof: profile | None = None
        self._first_recorded = 0  # 0 until recording starts; later than start_step when a resumed run enters late
        self._step_started = 0.0

    @property
    def last_step(self) -> int:
        return self.start_step + self.num_steps - 1

    @property
    def recording(self) -> bool:
        return self._prof is not None

    def before_step(self, step: int) -> None:
        """Call before optimizer step `step` (1-based); starts recording at the first step inside the window."""
        if not self._first_recorded and self.start_step <= step <= self.last_step:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            self._prof = _start_profile(self.out_dir, self.last_step - step + 1)
            self._first_recorded = step
        if self.recording:
            self._step_started = time.perf_counter()

    def after_step(self, step: int) -> None:
        """Call after optimizer step `step` has finished (its outputs read back); stops after the last one."""
        if not self.recording:
            return
        self.step_wall_s.append(time.perf_counter() - self._step_started)
        self._prof.step()  # the schedule stops, writes and analyses after the last active step
        if step >= self.last_step:
            self._prof.stop()  # nothing left to record; marks the profile closed so its __del__ stays quiet
            self._prof = None

    def finish(self) -> Path | None:
        """Stop if still recording, then write the summary.

        Returns:
            `out_dir/profile_summary.md`, or None if no step of the window ran.
        """
        if self.recording:  # training ended inside the window
            self._prof.stop()
            self._prof = None
        if not self._first_recorded:
            return None
        path = self.out_dir / SUMMARY_NAME
        path.write_text(summary_markdown(read_op_times(self.out_dir), self.step_wall_s, self._first_recorded,
                                         self.out_dir))
        return path


def _newest_run_dir(out_dir: Path) -> Path | None:
    runs = sorted(out_dir.glob("*_ascend_ms"), key=lambda p: p.stat().st_mtime)
    return runs[-1] if runs else None


def read_op_times(out_dir: Path) -> list[OpTime]:
    """Per-op times of the newest profile under `out_dir` (all ranks' files summed), busiest first.

    Returns:
        Empty when MindSpore wrote no CPU op table (e.g. on Ascend, whose kernels are in ASCEND_PROFILER_OUTPUT).
    """
    run = _newest_run_dir(Path(out_dir))
    if run is None:
        return []
    totals: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0, 0.0])
    for table in sorted(run.glob("FRAMEWORK/cpu_op_detail_info_*.csv")):
        with table.open(newline="") as f:
            for row in csv.DictReader(f):
                entry = totals[(row["full_op_name"], row["op_type"])]
                entry[0] += int(row["op_occurrences"])
                entry[1] += float(row["op_total_time(ms)"])
    ops = [OpTime(name, op_type, int(calls), total) for (name, op_type), (calls, total) in totals.items()]
    return sorted(ops, key=lambda op: op.total_ms, reverse=True)


def _by_type(ops: list[OpTime]) -> list[tuple[str, int, float]]:
    types: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for op in ops:
        types[op.op_type][0] += op.calls
        types[op.op_type][1] += op.total_ms
    return sorted(((t, int(c), ms_) for t, (c, ms_) in types.items()), key=lambda r: r[2], reverse=True)


def summary_markdown(ops: list[OpTime], step_wall_s: list[float], first_step: int, out_dir: Path) -> str:
    """The summary: wall time per step, then the op types and op instances with the most kernel time.

    Args:
        ops: From `read_op_times`.
        step_wall_s: Host wall time of each recorded step.
        first_step: Global optimizer step of the first recorded step.
        out_dir: Shown as the location of the raw data.
    """
    steps = len(step_wall_s)
    lines = [f"# Profile of optimizer steps {first_step}-{first_step + steps - 1}", "",
             (f"MindSpore {ms.__version__}, {ms.get_context('device_target')}, "
              f"{'graph' if ms.get_context('mode') == ms.GRAPH_MODE else 'pynative'} mode. "
              f"Raw data: `{out_dir}` (`ASCEND_PROFILER_OUTPUT/trace_view.json` opens in ui.perfetto.dev)."), ""]
    if not ops:
        lines.append("MindSpore wrote no CPU op table (`FRAMEWORK/cpu_op_detail_info_*.csv`); on GPU/Ascend, open the "
                     "raw data in MindStudio Insight.")
        return "\n".join(lines) + "\n"
    kernel_ms = sum(op.total_ms for op in ops)
    wall_ms = 1000 * sum(step_wall_s)
    lines += [(f"{steps} steps, wall time per step (ms): {', '.join(f'{1000 * s:.1f}' for s in step_wall_s)}. "
               f"Kernel time summed over all ops: {kernel_ms:.1f} ms, {100 * kernel_ms / wall_ms:.0f} % of the wall "
               "time (the rest is host work between kernels). `share` is of the summed kernel time."), "",
              "## Op types by total time", "",
              "| op type | calls | calls/step | total (ms) | mean (ms) | share (%) |", "|---|---:|---:|---:|---:|---:|"]
    for op_type, calls, total in _by_type(ops)[:TOP_OPS]:
        lines.append(f"| {op_type} | {calls} | {calls / steps:.0f} | {total:.3f} | {total / calls:.4f} "
                     f"| {100 * total / kernel_ms:.1f} |")
    lines += ["", f"## Top {TOP_OPS} ops by total time", "",
              "| op | type | calls | total (ms) | share (%) |", "|---|---|---:|---:|---:|"]
    for op in ops[:TOP_OPS]:
        lines.append(f"| `{op.name}` | {op.op_type} | {op.calls} | {op.total_ms:.3f} "
                     f"| {100 * op.total_ms / kernel_ms:.1f} |")
    return "\n".join(lines) + "\n"
