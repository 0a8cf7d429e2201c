"""`step`: the full train step of a model config per variant (rewrites, amp policies), round-robin in one process.

Every variant is the same composed config plus its own Hydra overrides, built through the registries and run by
`swinexp.engine.step.make_train_step` exactly as training runs it (forward, soft-target loss, backward,
loss-scaled AdamW update). The reference (first) variant is the official formulation in fp32; the ratio column
divides each variant's step time by the reference's measured in the same process.
"""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from statistics import median

from benchmarks.harness import IMPORT_ROOT, build_train_step, compose, forward_flops, make_step_call, random_batch
from benchmarks.host import MemoryGuard, describe
from benchmarks.matmul_peak import PEAK_SIZE, matmul_peak_gflops
from benchmarks.options import Options
from benchmarks.table import BenchResult, Table
from benchmarks.timing import progress, round_robin
from swinexp.registry import MODELS, ConfigError
from swinexp.runtime.hardware import set_seed

__all__ = ["DEFAULT_VARIANTS", "PRESETS", "Measured", "Variant", "WorkerFailed", "measure", "parse_variant", "run",
           "split_groups", "step_table"]

OFFICIAL = "qkv=fused, patch_merging=slice, rel_pos_bias=gather"
CPU_REWRITES = ("model.qkv=fused_split", "model.patch_merging=reshape", "model.rel_pos_bias=gather",
                "model.custom_bprop=true")
FUSED = ("model.kernels=fused_cpu", "optimizer.kernel=fused_cpu")
PRESETS: dict[str, tuple[str, ...]] = {
    "baseline": (),  # the base overrides below: official formulation, amp o0
    "qkv=split": ("model.qkv=split",),
    "patch_merging=reshape": ("model.patch_merging=reshape",),
    "rel_pos_bias=onehot": ("model.rel_pos_bias=onehot",),
    "all three": ("model.qkv=split", "model.patch_merging=reshape", "model.rel_pos_bias=onehot"),
    "custom_bprop": ("model.custom_bprop=true",),
    # conf/model/formulation/cpu.yaml, what hardware=cpu trains with
    "cpu formulation": (*CPU_REWRITES, "model.permute=gather", "model.patch_embed=matmul", *FUSED),
    # the cpu formulation with MindSpore's GELU, LayerNorm, Softmax and AdamW kernels instead of fused_cpu.cc's
    "cpu, kernels=mindspore": (*CPU_REWRITES, "model.permute=gather", "model.patch_embed=matmul"),
    # the cpu formulation with MindSpore's AdamWeightDecay kernel (the model's fused kernels kept)
    "cpu, optimizer.kernel=mindspore": (*CPU_REWRITES, "model.permute=gather", "model.patch_embed=matmul", FUSED[0]),
    # the cpu formulation with the other permutation kernels (models/kernels.py): faster and holding memory, or slower
    "cpu, permute=transpose": (*CPU_REWRITES, "model.permute=transpose", "model.patch_embed=matmul", *FUSED),
    "cpu, permute=mint": (*CPU_REWRITES, "model.permute=mint", "model.patch_embed=matmul", *FUSED),
    # and with the official patch embedding, MindSpore's Conv2D (slow on CPU, layers.PatchMatMul)
    "cpu, patch_embed=conv": (*CPU_REWRITES, "model.permute=gather", "model.patch_embed=conv", *FUSED),
    "amp=o2": ("amp=o2",),
    "amp=o1_manual": ("amp=o1_manual",),
    # the cost of stochastic depth (masks drawn on the host and fed to the step): the ratio of `--variants baseline
    # drop_path=0` here against that of `--variants baseline model.drop_path_rate=0` on a checkout from before the
    # masks were inputs (kernel-RNG DropPath) is the change in cost; not in the default variants
    "drop_path=0": ("model.drop_path_rate=0",),
}
DEFAULT_VARIANTS = tuple(name for name in PRESETS if name != "drop_path=0")
# every variant starts from the official formulation with autodiff gradients in fp32; its own overrides win
BASE = ("model/rewrites=official", "model.custom_bprop=false", "model.permute=transpose", "model.patch_embed=conv",
        "model.kernels=mindspore", "optimizer.kernel=mindspore", "amp=o0", "tracking=none")


class WorkerFailed(RuntimeError):
    """The reference variant could not be measured (in this process or any worker): nothing to compare with."""


@dataclass(frozen=True)
class Variant:
    """A named list of Hydra overrides on top of the base config."""

    name: str
    overrides: tuple[str, ...]


def parse_variant(spec: str) -> Variant:
    """A preset name ("qkv=split", "all three", ...) or space-separated overrides ("model.qkv=split amp=o2")."""
    if spec in PRESETS:
        return Variant(spec, PRESETS[spec])
    overrides = tuple(spec.split())
    if not overrides or any("=" not in o for o in overrides):
        raise ConfigError(f"--variants '{spec}' is neither a preset ({', '.join(PRESETS)}) nor Hydra overrides such as "
                          "'model.qkv=split amp=o2'")
    return Variant(spec, overrides)


@dataclass(frozen=True)
class Measured:
    """One variant's timing in one process (JSON-friendly: worker processes send these back).

    Attributes:
        group: Index of the process that measured it; ratios compare variants of the same group only.
        first_s: Graph compilation plus the first step.
        seconds: Timed steps.
        load: Mean 1-minute load average over the timed rounds.
        batch: Images per step.
        flops: Forward FLOPs of one image (official Swin count).
    """

    name: str
    overrides: tuple[str, ...]
    group: int
    first_s: float
    seconds: tuple[float, ...]
    load: float
    batch: int
    flops: int


def base_overrides(opts: Options) -> list[str]:
    return [*opts.model_overrides("swin_tiny", 4, 224), f"data.num_classes={opts.num_classes}", *BASE,
            *opts.overrides]


def measure(opts: Options, variants: list[Variant], group: int = 0) -> tuple[list[Measured], dict[str, str]]:
    """Compile and time `variants` in this process, round-robin.

    Returns:
        The measured variants, and name -> error of those that failed to build or compile (left out).
    """
    base = base_overrides(opts)
    plans = {v.name: compose([*base, *v.overrides]) for v in variants}  # a config typo fails before any compile
    total_steps = 1 + opts.warmup + opts.iters
    flops: dict[str, int] = {}

    def builder(name: str) -> Callable[[], Callable[[], object]]:
        def build() -> Callable[[], object]:
            plan = plans[name]
            set_seed(opts.seed)  # same initial weights wherever the variants' parameters have the same shapes
            model = MODELS.build(plan.section("model"))
            flops[name] = forward_flops(model)
            return make_step_call(build_train_step(plan, model, total_steps), *random_batch(plan, opts.seed))
        return build

    failed: dict[str, str] = {}
    timings = round_robin({v.name: builder(v.name) for v in variants}, opts.warmup, opts.iters, MemoryGuard(), failed)
    if variants[0].name in failed:
        raise WorkerFailed(f"the reference variant '{variants[0].name}' failed ({failed[variants[0].name]}); "
                           "nothing to compare with")
    measured = [Measured(v.name, v.overrides, group, timings[v.name].first_s, timings[v.name].samples.seconds,
                         timings[v.name].load, int(plans[v.name].get('data.batch_size')), flops[v.name])
                for v in variants if v.name in timings]
    return measured, failed


def split_groups(variants: list[Variant], max_resident: int) -> list[list[Variant]]:
    """Groups of at most `max_resident` variants, each starting with the reference (the first variant)."""
    reference, others = variants[0], variants[1:]
    size = max_resident - 1
    return [[reference, *others[i:i + size]] for i in range(0, len(others), size)] or [[reference]]


def measure_in_groups(opts: Options, variants: list[Variant]) -> tuple[list[Measured], dict[str, str]]:
    """Run `measure` in one worker process per group of `opts.max_resident` variants, each led by the reference."""
    groups = split_groups(variants, opts.max_resident)
    measured: list[Measured] = []
    failed: dict[str, str] = {}
    for index, group in enumerate(groups, start=1):
        progress(f"process {index}/{len(groups)}: {', '.join(v.name for v in group)}")
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "measured.json"
            worker = replace(opts, variants=tuple(v.name for v in group), max_resident=0)
            cmd = [sys.executable, "-m", "benchmarks", "step", *worker.to_argv(), f"--json-out={out}",
                   f"--group={index}"]
            status = subprocess.run(cmd, cwd=IMPORT_ROOT, check=False).returncode
            if status != 0:  # the other groups still count: report this one's variants as left out
                progress(f"process {index}/{len(groups)} failed with exit status {status}; going on")
                failed.update({v.name: f"its process exited with status {status} (error above)" for v in group[1:]})
                continue
            result = json.loads(out.read_text())
            measured += [Measured(**{**m, "overrides": tuple(m["overrides"]), "seconds": tuple(m["seconds"])})
                         for m in result["measured"]]
            failed.update(result["failed"])
    if not measured:
        raise WorkerFailed(f"no process measured anything; errors: {failed}")
    return measured, failed


def _label(m: Measured, grouped: bool) -> str:
    return f"{m.name} #{m.group}" if grouped else m.name


def _describe_overrides(m: Measured) -> str:
    return " ".join(m.overrides) if m.overrides else f"({OFFICIAL}, amp=o0)"


def step_table(measured: list[Measured], opts: Options, failed: dict[str, str] | None = None,
               matmul_peak: float | None = None) -> BenchResult:
    """The markdown table and MLflow metrics of `measured` (ratios to the first variant of each group); with
    `matmul_peak` (GFLOP/s of one large MatMul here), each step's share of it."""
    grouped = len({m.group for m in measured}) > 1
    reference = {}
    for m in measured:
        reference.setdefault(m.group, m)
    rows, metrics = [], {}
    for m in measured:
        mid, low, high = median(m.seconds), min(m.seconds), max(m.seconds)
        ratio, ratio_min = mid / median(reference[m.group].seconds), low / min(reference[m.group].seconds)
        gflops = 3 * m.flops * m.batch / mid / 1e9
        rows.append((_label(m, grouped), _describe_overrides(m), f"{m.first_s:.1f}", f"{1000 * mid:.1f}",
                     f"{1000 * low:.1f}", f"{1000 * high:.1f}", f"{m.batch / mid:.2f}", f"{gflops:.2f}",
                     *([f"{100 * gflops / matmul_peak:.0f}%"] if matmul_peak else []), f"{ratio:.3f}",
                     f"{ratio_min:.3f}"))
        key = f"step/{_label(m, grouped)}"
        metrics.update({f"{key}/median_ms": 1000 * mid, f"{key}/min_ms": 1000 * low, f"{key}/max_ms": 1000 * high,
                        f"{key}/compile_s": m.first_s, f"{key}/images_per_s": m.batch / mid,
                        f"{key}/gflops_per_s": gflops, f"{key}/ratio_median": ratio,
                        **({f"{key}/matmul_peak_share": gflops / matmul_peak} if matmul_peak else {})})
    first = measured[0]
    plan = compose(base_overrides(opts))
    where = (f"{len(reference)} processes of <= {opts.max_resident} variants, round-robin within each" if grouped
             else "round-robin in one process")
    title = (f"Train step of {plan.get('model.name')}, batch {plan.get('data.batch_size')}, "
             f"{plan.get('data.img_size')} px, "
             f"{plan.hardware.mode} mode, {len(first.seconds)} timed steps per variant after {opts.warmup} warm-up, "
             f"{where}; {describe()}")
    loads = ", ".join(f"{m.load:.1f}" for m in reference.values())
    notes = (
        (f"A step is one `make_train_step` call: forward, soft-target cross entropy, backward, loss-scaled "
         f"{plan.get('optimizer.name')} update, as `swinexp.engine.loop.fit` runs it. Baseline: the official "
         f"formulation ({OFFICIAL}), amp o0 (fp32); the other rows add their overrides to it."),
        "ratio: median (min) step time / the same of the first row"
        + (" of the same process (`#n`)" if grouped else "") + "; < 1 is faster.",
        ("GFLOP/s: 3 x forward FLOPs x batch / median step time (backward counted as 2 x forward; loss and "
         "optimizer not counted). Forward FLOPs from `swinexp.models.summary`, the official Swin count where a "
         f"multiply-add is one FLOP: {first.flops / 1e9:.3f} G per image here."),
        *([f"of peak: the step's GFLOP/s over one {PEAK_SIZE}^3 fp32 MatMul's here, {matmul_peak:.1f} GFLOP/s (same "
           "count: a multiply-add is one FLOP; `benchmarks/matmul_peak.py`), the practical limit of these cores"]
          if matmul_peak else []),
        f"Mean 1-minute load average during the timed steps: {loads} (whole machine, other jobs included).",
        *(f"Left out, failed to build or compile: {name} ({error})" for name, error in (failed or {}).items()),
    )
    columns = ("variant", "overrides", "compile + 1st step (s)", "median (ms)", "min (ms)", "max (ms)", "images/s",
               "GFLOP/s", *(["of peak"] if matmul_peak else []), "ratio (median)", "ratio (min)")
    return BenchResult("step", Table(title, columns, tuple(rows), notes), metrics)


def run(opts: Options) -> BenchResult:
    """The `step` sub-benchmark."""
    variants = [parse_variant(spec) for spec in (opts.variants or DEFAULT_VARIANTS)]
    if len({v.name for v in variants}) < len(variants):
        raise ConfigError(f"--variants lists a variant twice: {[v.name for v in variants]}")
    if opts.max_resident == 1 or opts.max_resident < 0:
        raise ConfigError(f"--max-resident={opts.max_resident}: use 0 (all variants in one process) or >= 2 "
                          "(the reference plus at least one variant per process)")
    grouped = opts.max_resident and len(variants) > opts.max_resident
    measured, failed = measure_in_groups(opts, variants) if grouped else measure(opts, variants)
    return step_table(measured, opts, failed, matmul_peak_gflops())
