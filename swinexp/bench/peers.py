"""`peers`: swinexp's Swin against MindCV's, as the same train step on the same MindSpore, input and optimizer.

Both models get the same architecture numbers from the composed model config, the same amp policy, our AdamW with
the same no-decay groups (norms, biases, relative-position tables), the same soft-target loss and the same
`make_train_step`, so the only difference timed is the model code. swinexp runs in the formulation its hardware
preset chooses (conf/model/formulation; overrides such as model.rel_pos_bias=onehot change it), as training does.
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
from collections.abc import Callable
from typing import Any

from mindspore import nn
from omegaconf import DictConfig

from swinexp.bench.harness import build_train_step, compose, forward_flops, make_step_call, random_batch
from swinexp.bench.host import MemoryGuard, describe
from swinexp.bench.options import Options
from swinexp.bench.table import BenchResult, Table
from swinexp.bench.timing import Timing, progress, round_robin
from swinexp.build import node
from swinexp.registry import MODELS
from swinexp.runtime.hardware import set_seed

__all__ = ["MINDCV_ARGS", "SKIP_MESSAGE", "build_mindcv_swin", "mindcv_installed", "run"]

SKIP_MESSAGE = ("peers: skipped, MindCV is not installed. Install the benchmark extra with "
                "pip install -e '.[bench]' (mindcv==0.3.0) and rerun.")
# swinexp builder argument -> mindcv.models.swintransformer.SwinTransformer argument
MINDCV_ARGS = {"img_size": "image_size", "patch_size": "patch_size", "in_chans": "in_chans",
               "num_classes": "num_classes", "embed_dim": "embed_dim", "depths": "depths", "num_heads": "num_heads",
               "window_size": "window_size", "mlp_ratio": "mlp_ratio", "qkv_bias": "qkv_bias",
               "drop_rate": "drop_rate", "attn_drop_rate": "attn_drop_rate", "drop_path_rate": "drop_path_rate",
               "ape": "ape", "patch_norm": "patch_norm"}
MINDCV, SWINEXP = "MindCV", "swinexp"


def mindcv_installed() -> bool:
    return importlib.util.find_spec("mindcv") is not None


def build_mindcv_swin(model_cfg: dict[str, Any]) -> nn.Cell:
    """MindCV's SwinTransformer with the architecture of a swinexp model config (swin_tiny: its `swin_tiny`)."""
    from mindcv.models.swintransformer import SwinTransformer

    return SwinTransformer(**{theirs: model_cfg[ours] for ours, theirs in MINDCV_ARGS.items()})


def run(opts: Options) -> BenchResult | None:
    """The `peers` sub-benchmark; None (after saying why) when MindCV is not installed."""
    if not mindcv_installed():
        progress(SKIP_MESSAGE)
        return None
    cfg = compose([*opts.model_overrides("swin_tiny", 4, 224), f"data.num_classes={opts.num_classes}",
                   "tracking=none", *opts.overrides])
    model_cfg = node(cfg, "model")
    total_steps = 1 + opts.warmup + opts.iters
    flops: list[int] = []  # forward FLOPs of one image, counted on swinexp's model (the same architecture)

    def build(make_model: Callable[[], nn.Cell]) -> Callable[[], Callable[[], object]]:
        def builder() -> Callable[[], object]:
            set_seed(opts.seed)
            model = make_model()
            return make_step_call(build_train_step(cfg, model, total_steps), *random_batch(cfg, opts.seed))
        return builder

    def swinexp_model() -> nn.Cell:
        model = MODELS.build(model_cfg)
        flops.append(forward_flops(model))
        return model

    timings = round_robin({MINDCV: build(lambda: build_mindcv_swin(model_cfg)), SWINEXP: build(swinexp_model)},
                          opts.warmup, opts.iters, MemoryGuard())
    return peers_table(timings, cfg, flops[0], opts)


def peers_table(timings: dict[str, Timing], cfg: DictConfig, flops: int, opts: Options) -> BenchResult:
    """Rows MindCV then swinexp; ratio = row / MindCV."""
    batch = int(cfg.data.batch_size)
    ref = timings[MINDCV].samples
    version = importlib.metadata.version("mindcv")
    formulation = {MINDCV: f"mindcv {version} `SwinTransformer` (separate q/k/v, one-hot bias, reshape merging)",
                   SWINEXP: "swinexp `SwinTransformer`, " + ", ".join(
                       f"{key}={cfg.model[key]}" for key in ("qkv", "patch_merging", "rel_pos_bias", "custom_bprop"))}
    rows, metrics = [], {}
    for name, timing in timings.items():
        s = timing.samples
        gflops = 3 * flops * batch / s.median / 1e9
        rows.append((name, formulation[name], f"{timing.first_s:.1f}", f"{1000 * s.median:.1f}", f"{1000 * s.min:.1f}",
                     f"{1000 * s.max:.1f}", f"{batch / s.median:.2f}", f"{gflops:.2f}",
                     f"{s.median / ref.median:.3f}", f"{s.min / ref.min:.3f}"))
        metrics.update({f"peers/{name}/median_ms": 1000 * s.median, f"peers/{name}/min_ms": 1000 * s.min,
                        f"peers/{name}/max_ms": 1000 * s.max, f"peers/{name}/compile_s": timing.first_s,
                        f"peers/{name}/images_per_s": batch / s.median})
    ours = timings[SWINEXP].samples
    metrics["peers/ratio_swinexp_over_mindcv"] = ours.median / ref.median
    title = (f"Train step, swinexp vs MindCV: {cfg.model.name} architecture, batch {batch}, {cfg.data.img_size} px, "
             f"amp {cfg.amp.name}, {cfg.hardware.mode} mode, {len(ref.seconds)} timed steps each after "
             f"{opts.warmup} warm-up, round-robin in one process; {describe()}")
    notes = ((f"swinexp / MindCV step time: {ours.median / ref.median:.3f} (medians), {ours.min / ref.min:.3f} "
              "(minimums); > 1 means swinexp is slower."),
             (f"Same for both: input, soft-target cross entropy, swinexp's `{cfg.optimizer.name}` optimizer with the "
              "no-decay groups, amp policy and `make_train_step`; only the model code differs. GFLOP/s as in `step` "
              f"(3 x forward FLOPs, official count: {flops / 1e9:.3f} G per image)."),
             f"Mean 1-minute load average during the timed steps: {timings[MINDCV].load:.1f}.")
    columns = ("model", "formulation", "compile + 1st step (s)", "median (ms)", "min (ms)", "max (ms)", "images/s",
               "GFLOP/s", "ratio to MindCV (median)", "ratio to MindCV (min)")
    return BenchResult("peers", Table(title, columns, tuple(rows), notes), metrics)
