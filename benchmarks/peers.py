"""`peers`: swinexp's Swin against MindCV's, as the same train step on the same MindSpore, input and optimizer.

Both models get the same architecture numbers from the composed model config, the same amp policy, our AdamW with
the same no-decay groups (norms, biases, relative-position tables), the same soft-target loss and the same
`make_train_step`, so the only difference timed is the model code. swinexp runs in the formulation its hardware
preset chooses (conf/model/formulation; overrides such as model.rel_pos_bias=onehot change it), as training does.

With the `reference` extra installed, timm's SwinTransformer (PyTorch eager, fp32, the same batch, AdamW groups,
loss and clipping) is timed in a process of its own just before and just after the MindSpore pair
(`timm_peer`), and a third ratio column divides by its median.
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
from collections.abc import Callable
from typing import Any

from mindspore import nn

from benchmarks.harness import build_train_step, compose, forward_flops, make_step_call, random_batch
from benchmarks.host import MemoryGuard, describe
from benchmarks.options import Options
from benchmarks.table import BenchResult, Table
from benchmarks.timing import Samples, Timing, progress, round_robin
from benchmarks.timm_peer import TimmSettings, TimmTiming, reference_installed, run_in_process
from swinexp.config import Plan
from swinexp.registry import MODELS
from swinexp.runtime.hardware import set_seed

__all__ = ["MINDCV_ARGS", "SKIP_MESSAGE", "build_mindcv_swin", "mindcv_installed", "peers_table", "run",
           "timm_settings"]

SKIP_MESSAGE = ("peers: skipped, MindCV is not installed. Install the benchmark extra with "
                "pip install -e '.[bench]' (mindcv==0.3.0) and rerun.")
# swinexp builder argument -> mindcv.models.swintransformer.SwinTransformer argument
MINDCV_ARGS = {"img_size": "image_size", "patch_size": "patch_size", "in_chans": "in_chans",
               "num_classes": "num_classes", "embed_dim": "embed_dim", "depths": "depths", "num_heads": "num_heads",
               "window_size": "window_size", "mlp_ratio": "mlp_ratio", "qkv_bias": "qkv_bias",
               "drop_rate": "drop_rate", "attn_drop_rate": "attn_drop_rate", "drop_path_rate": "drop_path_rate",
               "ape": "ape", "patch_norm": "patch_norm"}
MINDCV, SWINEXP, TIMM = "MindCV", "swinexp", "timm"
NO_TIMM_MESSAGE = ("peers: no timm (PyTorch) row: install the reference extra with pip install -e '.[reference]' "
                   "(torch, torchvision, timm) to time timm's Swin beside the MindSpore pair.")


def mindcv_installed() -> bool:
    return importlib.util.find_spec("mindcv") is not None


def build_mindcv_swin(model_cfg: dict[str, Any]) -> nn.Cell:
    """MindCV's SwinTransformer with the architecture of a swinexp model config (swin_tiny: its `swin_tiny`)."""
    from mindcv.models.swintransformer import SwinTransformer

    return SwinTransformer(**{theirs: model_cfg[ours] for ours, theirs in MINDCV_ARGS.items()})


def timm_settings(plan: Plan, warmup: int, iters: int, seed: int) -> TimmSettings:
    """The timm peer's step: the composed config's architecture, batch, optimizer numbers and clipping."""
    model_cfg, optimizer = plan.section("model"), plan.section("optimizer")
    arch = {key: model_cfg[key] for key in MINDCV_ARGS}
    return TimmSettings(arch=arch, batch=int(plan.get('data.batch_size')), lr=float(optimizer['lr']),
                        weight_decay=float(optimizer['weight_decay']), betas=tuple(optimizer['betas']),
                        eps=float(optimizer['eps']), clip_grad=plan.trainer.clip_grad, seed=seed, warmup=warmup,
                        iters=iters)


def _time_timm(settings: TimmSettings, when: str) -> TimmTiming:
    progress(f"{TIMM}: timing timm's Swin in its own process ({when} the MindSpore pair)")
    timing = run_in_process(settings)
    median_ms = 1000 * Samples(timing.seconds).median
    progress(f"{TIMM} ({when}): first step {timing.first_s:.1f} s, median {median_ms:.0f} ms")
    return timing


def run(opts: Options) -> BenchResult | None:
    """The `peers` sub-benchmark; None (after saying why) when MindCV is not installed."""
    if not mindcv_installed():
        progress(SKIP_MESSAGE)
        return None
    plan = compose([*opts.model_overrides("swin_tiny", 4, 224), f"data.num_classes={opts.num_classes}",
                   "tracking=none", *opts.overrides])
    model_cfg = plan.section("model")
    total_steps = 1 + opts.warmup + opts.iters
    flops: list[int] = []  # forward FLOPs of one image, counted on swinexp's model (the same architecture)

    def build(make_model: Callable[[], nn.Cell]) -> Callable[[], Callable[[], object]]:
        def builder() -> Callable[[], object]:
            set_seed(opts.seed)
            model = make_model()
            return make_step_call(build_train_step(plan, model, total_steps), *random_batch(plan, opts.seed))
        return builder

    def swinexp_model() -> nn.Cell:
        model = MODELS.build(model_cfg)
        flops.append(forward_flops(model))
        return model

    settings = timm_settings(plan, opts.warmup, opts.iters, opts.seed)
    timm_runs = [_time_timm(settings, "before")] if reference_installed() else []
    if not timm_runs:
        progress(NO_TIMM_MESSAGE)
    timings = round_robin({MINDCV: build(lambda: build_mindcv_swin(model_cfg)), SWINEXP: build(swinexp_model)},
                          opts.warmup, opts.iters, MemoryGuard())
    if timm_runs:
        timm_runs.append(_time_timm(settings, "after"))
    return peers_table(timings, plan, flops[0], opts, timm_runs)


def _timm_timing(runs: list[TimmTiming]) -> Timing:
    """The timm processes as one candidate: every timed step of both, the first step of the first."""
    return Timing(runs[0].first_s, Samples(tuple(t for run in runs for t in run.seconds)), float("nan"))


def peers_table(timings: dict[str, Timing], plan: Plan, flops: int, opts: Options,
                timm_runs: list[TimmTiming] | None = None) -> BenchResult:
    """Rows MindCV, swinexp, then timm when it ran; ratios = row / MindCV and row / timm."""
    batch = int(plan.get('data.batch_size'))
    timings = dict(timings)
    if timm_runs:
        timings[TIMM] = _timm_timing(timm_runs)
    ref = timings[MINDCV].samples
    torch_ref = timings[TIMM].samples if TIMM in timings else None
    version = importlib.metadata.version("mindcv")
    formulation = {MINDCV: f"mindcv {version} `SwinTransformer` (separate q/k/v, one-hot bias, reshape merging)",
                   SWINEXP: "swinexp `SwinTransformer`, " + ", ".join(
                       f"{key}={plan.get(f'model.{key}')}"
                       for key in ("qkv", "patch_merging", "rel_pos_bias", "custom_bprop", "permute", "patch_embed",
                                   "kernels"))}
    if timm_runs:
        first = timm_runs[0]
        formulation[TIMM] = (f"timm {first.timm_version} `SwinTransformer`, PyTorch {first.torch_version} eager fp32, "
                             f"{first.threads} threads, own process before and after")
    rows, metrics = [], {}
    for name, timing in timings.items():
        s = timing.samples
        gflops = 3 * flops * batch / s.median / 1e9
        to_timm = f"{s.median / torch_ref.median:.3f}" if torch_ref else "-"
        rows.append((name, formulation[name], f"{timing.first_s:.1f}", f"{1000 * s.median:.1f}", f"{1000 * s.min:.1f}",
                     f"{1000 * s.max:.1f}", f"{batch / s.median:.2f}", f"{gflops:.2f}",
                     f"{s.median / ref.median:.3f}", f"{s.min / ref.min:.3f}", to_timm))
        metrics.update({f"peers/{name}/median_ms": 1000 * s.median, f"peers/{name}/min_ms": 1000 * s.min,
                        f"peers/{name}/max_ms": 1000 * s.max, f"peers/{name}/compile_s": timing.first_s,
                        f"peers/{name}/images_per_s": batch / s.median})
    ours = timings[SWINEXP].samples
    metrics["peers/ratio_swinexp_over_mindcv"] = ours.median / ref.median
    title = (f"Train step, swinexp vs MindCV{' vs timm' if torch_ref else ''}: {plan.get('model.name')} architecture, "
             f"batch {batch}, {plan.get('data.img_size')} px, amp {plan.get('amp.name')}, {plan.hardware.mode} mode, "
             f"{len(ref.seconds)} timed steps each after {opts.warmup} warm-up, the MindSpore pair round-robin in "
             f"one process; {describe()}")
    notes = [(f"swinexp / MindCV step time: {ours.median / ref.median:.3f} (medians), {ours.min / ref.min:.3f} "
              "(minimums); > 1 means swinexp is slower."),
             (f"Same for both: input, soft-target cross entropy, swinexp's `{plan.get('optimizer.name')}` optimizer "
              "with the no-decay groups, amp policy and `make_train_step`; only the model code differs. GFLOP/s as in "
              f"`step` (3 x forward FLOPs, official count: {flops / 1e9:.3f} G per image)."),
             f"Mean 1-minute load average during the MindSpore pair's timed steps: {timings[MINDCV].load:.1f}."]
    if timm_runs and torch_ref:
        metrics["peers/ratio_swinexp_over_timm"] = ours.median / torch_ref.median
        metrics[f"peers/{TIMM}/peak_rss_gb"] = max(run.peak_rss_gb for run in timm_runs)
        halves = " and ".join(f"{1000 * Samples(run.seconds).median:.1f}" for run in timm_runs)
        notes.insert(1, f"swinexp / timm step time: {ours.median / torch_ref.median:.3f} (medians); timm's "
                        f"medians before and after the pair: {halves} ms (its first step is eager, no compilation).")
        notes.insert(2, "timm: the same batch, the official two AdamW groups, soft-target cross entropy and clipping "
                        "(when trainer.clip_grad is set) as swinexp.parity.reference; drop path as the model config.")
    columns = ("model", "formulation", "compile + 1st step (s)", "median (ms)", "min (ms)", "max (ms)", "images/s",
               "GFLOP/s", "ratio to MindCV (median)", "ratio to MindCV (min)", "ratio to timm (median)")
    return BenchResult("peers", Table(title, columns, tuple(rows), tuple(notes)), metrics)
