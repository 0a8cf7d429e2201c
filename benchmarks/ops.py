"""`ops`: where swinexp's train step spends its kernel time, per op kind, against timm's on torch (issue 42).

swinexp's step (the config's formulation, as `peers` builds it) runs under MindSpore's profiler
(`swinexp.engine.profiling.StepProfiler`, its CPU op table); timm's runs under `torch.profiler` in a process of its
own (`timm_peer --profile`). Both sides' op times are grouped into the same kinds (`KINDS`): the GEMMs, Softmax,
LayerNorm, GELU, the layout ops (transpose/reshape/copies/rolls/concats), Gather, the optimizer, the loss and the
rest (elementwise). Op times are self times (torch: an op's time without its child ops), per step; shares are of
each side's summed op time, so they sum to 100 % per side. Profilers inflate short ops, so compare shares and
per-kind milliseconds, and take the step's wall time from `peers`.
"""
from __future__ import annotations

import re
import tempfile
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

from benchmarks.harness import build_train_step, compose, make_step_call, random_batch
from benchmarks.host import describe, load_average
from benchmarks.options import Options
from benchmarks.peers import timm_settings
from benchmarks.table import BenchResult, Table
from benchmarks.timing import progress
from benchmarks.timm_peer import profile_in_process, reference_installed
from swinexp.engine.profiling import StepProfiler, read_op_times
from swinexp.registry import MODELS
from swinexp.runtime.hardware import set_seed

__all__ = ["KINDS", "kind_of", "kinds_table", "run", "stage_of", "swinexp_op_times"]

OPTIMIZER, OTHER = "optimizer (AdamW, global norm, clipping)", "elementwise and other"
GEMM, SOFTMAX, LAYERNORM, GELU, LOSS = ("MatMul / BatchMatMul (GEMMs)", "Softmax", "LayerNorm", "GELU",
                                       "loss (log-softmax)")
LAYOUT = "layout: transpose/reshape/copies/roll/concat/slice"
# (kind, pattern on the op type or aten name): the first match wins
KINDS: tuple[tuple[str, str], ...] = (
    (GEMM, r"^(aten::)?(mm|bmm|addmm|baddbmm|matmul|MatMul\w*|BatchMatMul\w*|Dense\w*|linear|_?convolution\w*|"
           r"mkldnn_convolution|Conv2D\w*)$"),
    (LOSS, r"(?i)log_?softmax"),
    (SOFTMAX, r"(?i)softmax"),
    (LAYERNORM, r"(?i)layer_?norm"),
    (GELU, r"(?i)^(aten::)?(gelu\w*|GeLU\w*|Erf\w*)$"),
    ("Gather (rel-pos bias, row permutations)", r"(?i)^(aten::)?(gather\w*|index\w*|embedding\w*|"
                                                r"UnsortedSegmentSum|ScatterAdd\w*|index_put_?|_index_put_impl_)$"),
    (LAYOUT, r"(?i)^(aten::)?(transpose\w*|permute|reshape|view|_?copy_?|clone|contiguous|roll|cat|concat|"
             r"split\w*|slice\w*|StridedSlice\w*|as_strided\w*|narrow|_unsafe_view|expand\w*|Tile|BroadcastTo|"
             r"Stack|Unstack|Roll|Identity|Cast|Flatten|squeeze|unsqueeze|PadV\d|pad|constant_pad_nd|fill_|zero_|"
             r"zeros_like|empty\w*|resize_|t|unbind|chunk|TensorMove)$"),
)
_COMPILED = [(kind, re.compile(pattern)) for kind, pattern in KINDS]
# MindSpore scopes (the op's full name without its last part). The CPU formulation writes LayerNorm, Softmax and GELU
# as cells with hand-written backward passes (kernels.py) made of MatMuls and elementwise ops; their whole cost is
# that kind's. The optimizer cell, and the train step's own ops directly under "Default/" (the global norm as dot
# products, the finite check, the packed outputs; engine/step.py) are the optimizer's.
_MS_SCOPES = ((re.compile(r"optimizer-"), OPTIMIZER), (re.compile(r"(?i)layer_?norm"), LAYERNORM),
              (re.compile(r"(?i)(?<!log)softmax"), SOFTMAX), (re.compile(r"(?i)(gelu|/act-)"), GELU))


def kind_of(op_type: str, scope: str = "", in_optimizer: bool = False) -> str:
    """The op kind of one kernel: its MindSpore scope first (see `_MS_SCOPES`), then its type.

    Args:
        op_type: MindSpore kernel type ("MatMul") or torch op name ("aten::mm").
        scope: MindSpore's full op name ("Default/model-SwinTransformer/.../MatMul-op3"); "" for torch.
        in_optimizer: torch: the op ran inside `Optimizer.step` or the gradient clipping.
    """
    parent = scope.rsplit("/", 1)[0] if "/" in scope else ""
    if in_optimizer or (parent == "Default" and not re.search(r"(?i)log_?softmax", op_type)):
        return OPTIMIZER
    for pattern, kind in _MS_SCOPES:
        if pattern.search(parent):
            return kind
    for kind, pattern in _COMPILED:
        if pattern.search(op_type):
            return kind
    return OTHER


def stage_of(scope: str) -> str:
    """The part of the model a MindSpore op belongs to: a stage, the patch embedding, the rest of the model (final
    norm, pooling, head), the step (loss, global norm, optimizer), or MindSpore's automatic gradients.

    The forward ops and the hand-written backward passes (custom_bprop: LayerNorm, Softmax, GELU, ...) carry their
    cell's scope. The automatic gradients ("Gradients/...") do not reliably: MindSpore names a layer type's shared
    gradient graph after one instance (every Linear's weight-gradient MatMul under `head-Linear/Grad_MatMul`).
    """
    if scope.startswith("Gradients/"):
        return "automatic gradients (all stages)"
    if match := re.search(r"layers-CellList/(\d+)-", scope):
        return f"stage {match.group(1)}"
    if "patch_embed" in scope:
        return "patch embedding"
    return "norm + head" if "model-" in scope else "loss + optimizer"


def group_by_kind(ops: Iterable[tuple[str, str, bool, float]]) -> dict[str, float]:
    """(op type, scope, in optimizer, ms) -> summed ms per kind."""
    totals: dict[str, float] = defaultdict(float)
    for op_type, scope, in_optimizer, ms in ops:
        totals[kind_of(op_type, scope, in_optimizer)] += ms
    return dict(totals)


def swinexp_op_times(opts: Options, overrides: list[str],
                     out_dir: Path) -> tuple[dict[str, float], list[float], dict[str, float], dict[str, float]]:
    """Profile `opts.iters` train steps after 1 + `opts.warmup`.

    Returns:
        ms per step by kind, wall s of each profiled step, ms per step by op type, ms per step by `stage_of`.
    """
    plan = compose(overrides)
    set_seed(opts.seed)
    model = MODELS.build(plan.section("model"))
    total = 1 + opts.warmup + opts.iters
    call = make_step_call(build_train_step(plan, model, total), *random_batch(plan, opts.seed))
    profiler = StepProfiler(out_dir, start_step=2 + opts.warmup, num_steps=opts.iters)
    for step in range(1, total + 1):
        profiler.before_step(step)
        call()
        profiler.after_step(step)
    profiler.finish()
    ops = read_op_times(out_dir)
    if not ops:
        raise RuntimeError(f"MindSpore's profiler wrote no CPU op table under {out_dir}")
    steps = len(profiler.step_wall_s)
    by_kind = group_by_kind((op.op_type, op.name, False, op.total_ms / steps) for op in ops)
    by_type: dict[str, float] = defaultdict(float)
    by_stage: dict[str, float] = defaultdict(float)
    for op in ops:
        by_type[op.op_type] += op.total_ms / steps
        by_stage[stage_of(op.name)] += op.total_ms / steps
    return by_kind, profiler.step_wall_s, dict(by_type), dict(by_stage)


def run(opts: Options) -> BenchResult:
    """The `ops` sub-benchmark: per-kind kernel time of swinexp's step, and of timm's when torch is installed."""
    overrides = [*opts.model_overrides("swin_tiny", 4, 224), f"data.num_classes={opts.num_classes}",
                 "tracking=none", *opts.overrides]
    plan = compose(overrides)
    load_before = load_average()
    progress(f"ops: profiling swinexp's step ({opts.iters} steps after 1 + {opts.warmup})")
    with tempfile.TemporaryDirectory(prefix="swinexp_ops_") as tmp:
        ours, wall_s, ours_by_type, ours_by_stage = swinexp_op_times(opts, overrides, Path(tmp))
    theirs: dict[str, float] | None = None
    theirs_by_op: dict[str, float] = {}
    timm_wall: list[float] = []
    if reference_installed():
        progress("ops: profiling timm's step in its own process (torch.profiler)")
        profiled = profile_in_process(timm_settings(plan, opts.warmup, opts.iters, opts.seed))
        theirs = group_by_kind((name, "", in_optimizer, ms) for name, in_optimizer, ms in profiled.ops)
        for name, _, ms in profiled.ops:
            theirs_by_op[name] = theirs_by_op.get(name, 0.0) + ms
        timm_wall = list(profiled.wall_ms)
    else:
        progress("ops: no timm column; install the reference extra (pip install -e '.[reference]')")
    load = (load_before + load_average()) / 2
    return kinds_table(ours, theirs, plan_title(plan, opts, load), [1000 * s for s in wall_s], timm_wall,
                       ours_by_type, theirs_by_op, ours_by_stage)


def plan_title(plan: object, opts: Options, load: float) -> str:
    formulation = ", ".join(f"{key}={plan.get(f'model.{key}')}" for key in (  # type: ignore[attr-defined]
        "qkv", "patch_merging", "rel_pos_bias", "custom_bprop", "permute", "patch_embed"))
    return (f"Kernel time per train step by op kind: {plan.get('model.name')}, batch "  # type: ignore[attr-defined]
            f"{plan.get('data.batch_size')}, {plan.get('data.img_size')} px, "  # type: ignore[attr-defined]
            f"amp {plan.get('amp.name')}, {opts.iters} profiled steps after 1 + {opts.warmup}; "  # type: ignore
            f"swinexp formulation {formulation}; mean 1-minute load average {load:.1f}; {describe()}")


def _top(by_name: dict[str, float], n: int = 8) -> str:
    return ", ".join(f"{name} {ms:.1f}" for name, ms in sorted(by_name.items(), key=lambda kv: -kv[1])[:n])


def kinds_table(ours: dict[str, float], theirs: dict[str, float] | None, title: str, wall_ms: list[float],
                timm_wall_ms: list[float], ours_by_type: dict[str, float] | None = None,
                theirs_by_op: dict[str, float] | None = None,
                ours_by_stage: dict[str, float] | None = None) -> BenchResult:
    """One row per op kind (busiest first on swinexp's side), then a total row; gap = swinexp - timm (ms/step)."""
    ours_total = sum(ours.values())
    theirs_total = sum(theirs.values()) if theirs else 0.0
    kinds = sorted(set(ours) | set(theirs or {}), key=lambda k: -ours.get(k, 0.0))
    rows, metrics = [], {}
    for kind in kinds:
        mine = ours.get(kind, 0.0)
        row = [kind, f"{mine:.1f}", f"{100 * mine / ours_total:.1f}"]
        metrics[f"ops/swinexp/{kind}/ms"] = mine
        if theirs is not None:
            other = theirs.get(kind, 0.0)
            row += [f"{other:.1f}", f"{100 * other / theirs_total:.1f}", f"{mine - other:+.1f}"]
            metrics[f"ops/timm/{kind}/ms"] = other
        rows.append(tuple(row))
    total = ["total (sum of op times)", f"{ours_total:.1f}", "100.0"]
    if theirs is not None:
        total += [f"{theirs_total:.1f}", "100.0", f"{ours_total - theirs_total:+.1f}"]
    rows.append(tuple(total))
    columns = ["op kind", "swinexp (ms/step)", "swinexp share (%)"]
    if theirs is not None:
        columns += ["timm (ms/step)", "timm share (%)", "gap (ms/step)"]
    wall = ", ".join(f"{ms:.0f}" for ms in wall_ms)
    notes = [f"swinexp wall time of the profiled steps (ms, under the profiler): {wall}."]
    if theirs is not None:
        notes.append("timm wall time of the profiled steps (ms, under torch.profiler): "
                     + ", ".join(f"{ms:.0f}" for ms in timm_wall_ms[:-1]) + f"; its op times are those of the "
                     f"step of median wall time ({timm_wall_ms[-1]:.0f} ms), as single steps stall on a shared host.")
    notes.append("Op times are kernel self times summed per kind and divided by the profiled steps; shares are of "
                 "each side's own total. gap > 0: swinexp spends more on that kind.")
    if ours_by_type:
        notes.append(f"swinexp's busiest op types (ms/step): {_top(ours_by_type)}.")
    if ours_by_stage:
        notes.append("swinexp per part of the model (ms/step; forward and hand-written backward passes by their "
                     "scope, MindSpore's automatic gradients apart, see `stage_of`): " + ", ".join(
            f"{name} {ms:.1f}" for name, ms in sorted(ours_by_stage.items())) + ".")
    if theirs_by_op:
        notes.append(f"timm's busiest ops (ms/step): {_top(theirs_by_op)}.")
    metrics["ops/swinexp/total_ms"] = ours_total
    if theirs is not None:
        metrics["ops/timm/total_ms"] = theirs_total
    return BenchResult("ops", Table(title, tuple(columns), tuple(rows), tuple(notes)), metrics)
