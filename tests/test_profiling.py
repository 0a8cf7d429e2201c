"""StepProfiler: MindSpore's profiler around a window of real jitted train steps, summarised as markdown."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from mindspore import Tensor

from swinexp.config import HardwareCfg
from swinexp.engine.profiling import StepProfiler, read_op_times
from swinexp.engine.step import make_train_step
from swinexp.models import create_model
from swinexp.optim import adamw
from swinexp.registry import AMP_POLICIES, ConfigError
from swinexp.runtime import hardware

MICRO = {"img_size": 32, "num_classes": 10, "embed_dim": 16, "depths": [1, 1], "num_heads": [1, 2],
         "drop_path_rate": 0.0}


def _rows(markdown: str, section: str) -> list[list[str]]:
    """Body rows of the table under the heading `section`, checking its header and separator."""
    block = markdown.split(f"## {section}", 1)[1].strip().split("\n\n", 1)[0].splitlines()
    header, separator, body = block[0], block[1], block[2:]
    assert re.fullmatch(r"\|(-{3,}:?\|)+", separator), separator
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in body]
    assert all(len(row) == header.count("|") - 1 for row in rows), block
    return rows


def test_profiles_two_steps_of_a_jitted_micro_swin(tmp_path: Path) -> None:
    hardware.apply(HardwareCfg(mode="graph"), seed=0)
    model = create_model("swin_micro", **MICRO)
    amp = AMP_POLICIES.build({"name": "o0"})
    step = make_train_step(model, adamw(model, lr=1e-3), amp, clip_grad=None, jit=True)
    rng = np.random.default_rng(0)
    images = Tensor(rng.standard_normal((4, 3, 32, 32)).astype(np.float32))
    targets = Tensor(np.eye(10, dtype=np.float32)[rng.integers(0, 10, 4)])
    profiler = StepProfiler(tmp_path / "profile", start_step=2, num_steps=2)

    for global_step in range(1, 5):  # step 1 compiles; steps 2 and 3 are recorded; step 4 is not
        profiler.before_step(global_step)
        step(images, targets)
        profiler.after_step(global_step)
    summary = profiler.finish()

    assert summary is not None and summary.is_file()
    text = summary.read_text()
    assert "optimizer steps 2-3" in text and len(profiler.step_wall_s) == 2
    by_type = _rows(text, "Op types by total time")
    assert by_type, text
    types = {row[0] for row in by_type}
    assert "MatMul" in types  # real kernel names from MindSpore's CPU op table
    for op_type, calls, _per_step, total, mean, share in by_type:  # a tiny op's share can print as 0.0
        assert int(calls) > 0 and float(total) > 0 and float(mean) > 0 and 0 <= float(share) <= 100, op_type
    shares = [float(row[5]) for row in by_type]
    assert shares == sorted(shares, reverse=True) and shares[0] > 0 and sum(shares) <= 100.1  # of one kernel total
    top = _rows(text, "Top 20 ops by total time")
    assert any("Gradients/" in row[0] for row in top)  # backward kernels are in the window too
    ops = read_op_times(tmp_path / "profile")
    assert all(op.calls > 0 and op.total_ms >= 0 for op in ops) and ops[0].total_ms > 0
    matmul_calls_per_step = {op.calls for op in ops if op.op_type == "MatMul"}
    assert matmul_calls_per_step == {2}, matmul_calls_per_step  # each MatMul ran once in each recorded step


def test_never_entered_window_gives_no_summary(tmp_path: Path) -> None:
    profiler = StepProfiler(tmp_path, start_step=10, num_steps=2)
    for global_step in range(1, 4):
        profiler.before_step(global_step)
        profiler.after_step(global_step)
    assert profiler.finish() is None
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("start_step,num_steps", [(0, 2), (3, 0)])
def test_rejects_an_empty_or_zero_based_window(tmp_path: Path, start_step: int, num_steps: int) -> None:
    with pytest.raises(ConfigError, match="trainer.profile"):
        StepProfiler(tmp_path, start_step, num_steps)
