"""Time one full training step (forward, backward, AdamW update) of Swin per rewrite, against the official baseline.

    python benchmarks/rewrites.py                        # swin_tiny, batch 4, 224 px, 6 variants in one process
    python benchmarks/rewrites.py --isolate              # one process per variant, for hosts under ~40 GB RAM
    python benchmarks/rewrites.py --variants baseline split reshape onehot "all three"
    python benchmarks/rewrites.py --model swin_micro --img-size 64 --steps 3   # a quick check of the script

Every variant starts from the same weights and sees the same batch; the step is `swinexp.step.make_train_step`
with AdamW and amp o0, jitted in graph mode on the CPU. In one process, after each variant's first (compiling)
step and `--warmup` more, the timed steps run round-robin (one step of each variant per round), so slow phases
of a shared machine hit every variant alike. A compiled swin_tiny train step holds about 5-6 GB of host memory
in MindSpore 2.10 (graph mode keeps each graph's buffers), so six variants need ~35 GB; `--isolate` runs the
variants one after another in fresh processes instead (~7 GB peak), and then the load column shows how busy the
machine was. Prints a markdown table with the median, min and max step time and the ratio of medians.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import mindspore as ms
import numpy as np
from mindspore import Tensor

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from swinexp import hardware
from swinexp.config import HardwareCfg
from swinexp.models import create_model
from swinexp.models.convert import match_qkv
from swinexp.models.pretrained import assign, model_state
from swinexp.optim import adamw
from swinexp.registry import AMP_POLICIES
from swinexp.step import TrainStep, make_train_step

# name -> (qkv, patch_merging, rel_pos_bias); the baseline is the official formulation
VARIANTS: dict[str, tuple[str, str, str]] = {
    "baseline": ("fused", "slice", "gather"),
    "split": ("split", "slice", "gather"),
    "fused_split": ("fused_split", "slice", "gather"),
    "reshape": ("fused", "reshape", "gather"),
    "onehot": ("fused", "slice", "onehot"),
    "all three": ("split", "reshape", "onehot"),
}


@dataclass(frozen=True)
class Timing:
    """One variant's measurements."""

    compile_s: float        # the first call: graph compilation plus one step
    steps_s: list[float]    # the timed steps
    load: float             # mean 1-minute load average over the timed steps (cores busy, all processes)
    rss_gb: float           # resident memory of the measuring process after it compiled this variant


def cpu_model() -> str:
    """The `model name` line of /proc/cpuinfo (platform.processor() is often empty on Linux)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def rss_gb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1e6  # kB
    return float("nan")


def build_step(model_name: str, switches: tuple[str, str, str], img_size: int,
               weights: dict[str, np.ndarray]) -> TrainStep:
    """A jitted train step of a fresh model with these switches, starting from `weights` (fused names)."""
    qkv, merging, bias = switches
    model = create_model(model_name, img_size=img_size, qkv=qkv, patch_merging=merging, rel_pos_bias=bias)
    assign(model, match_qkv(weights, [p.name for p in model.get_parameters()]))
    amp = AMP_POLICIES.build({"name": "o0"})  # fp32: the rewrites are compared without casts in between
    model = amp.apply(model)
    model.set_train(True)
    return make_train_step(model, adamw(model, lr=1e-4), amp, clip_grad=None, jit=True)


def timed(step: TrainStep, images: Tensor, targets: Tensor) -> float:
    start = time.perf_counter()
    out = step(images, targets)  # StepOutput: its loss is a host float, so the step has finished
    if not math.isfinite(out.loss):
        raise FloatingPointError(f"loss {out.loss}")
    return time.perf_counter() - start


def measure(args: argparse.Namespace) -> dict[str, Timing]:
    """Compile, warm up and time `args.variants` in this process, round-robin."""
    hardware.apply(HardwareCfg(mode="graph"), seed=0)
    rng = np.random.default_rng(0)
    images = Tensor(rng.standard_normal((args.batch_size, 3, args.img_size, args.img_size)).astype(np.float32))
    targets = Tensor(np.eye(1000, dtype=np.float32)[rng.integers(0, 1000, args.batch_size)])  # (B, 1000) one-hot
    weights = model_state(create_model(args.model, img_size=args.img_size, qkv="fused"))

    steps, compile_s, rss = {}, {}, {}
    for name in args.variants:
        steps[name] = build_step(args.model, VARIANTS[name], args.img_size, weights)
        compile_s[name] = timed(steps[name], images, targets)
        rss[name] = rss_gb()
        print(f"{name}: compile + first step {compile_s[name]:.1f} s, rss {rss[name]:.1f} GB", file=sys.stderr,
              flush=True)
    for _ in range(args.warmup):
        for name in args.variants:
            timed(steps[name], images, targets)
    times: dict[str, list[float]] = {name: [] for name in args.variants}
    loads = []
    for round_ in range(args.steps):
        for name in args.variants:
            times[name].append(timed(steps[name], images, targets))
        loads.append(os.getloadavg()[0])
        print(f"round {round_ + 1}/{args.steps}: " + ", ".join(f"{n} {t[-1]:.2f} s" for n, t in times.items()),
              file=sys.stderr, flush=True)
    load = statistics.mean(loads)
    return {name: Timing(compile_s[name], times[name], load, rss[name]) for name in args.variants}


def measure_isolated(args: argparse.Namespace, argv: Sequence[str]) -> dict[str, Timing]:
    """Run `measure` for each variant in a fresh process of this script, one after another."""
    common = [a for a in argv if a != "--isolate"]
    out = {}
    for name in args.variants:
        cmd = [sys.executable, __file__, *common, "--json", "--variants", name]
        done = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True)
        out[name] = Timing(**json.loads(done.stdout)[name])
    return out


def report(args: argparse.Namespace, results: dict[str, Timing]) -> str:
    """The markdown table, ratios of medians to the first variant."""
    how = "one process per variant, in order" if args.isolate else "one process, round-robin"
    title = (f"{args.model}, batch {args.batch_size}, {args.img_size} px, AdamW + amp o0, graph mode, "
             f"MindSpore {ms.__version__}, {cpu_model()} ({os.cpu_count()} cores), {datetime.date.today()}; "
             f"{args.warmup} warm-up + {args.steps} timed steps per variant, {how}")
    lines = [title, "",
             ("| variant | qkv | patch_merging | rel_pos_bias | compile + 1st step (s) | median (s) | min (s) "
              f"| max (s) | ratio to {args.variants[0]} | load |"),
             "|---|---|---|---|---:|---:|---:|---:|---:|---:|"]
    base = statistics.median(results[args.variants[0]].steps_s)
    for name, r in results.items():
        median = statistics.median(r.steps_s)
        lines.append(f"| {name} | {' | '.join(VARIANTS[name])} | {r.compile_s:.1f} | {median:.3f} "
                     f"| {min(r.steps_s):.3f} | {max(r.steps_s):.3f} | {median / base:.3f} | {r.load:.1f} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the arguments, run the benchmark, print the table (or, with --json, the raw timings)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="swin_tiny")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--img-size", type=int, default=224)
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps per variant after the compiling one")
    parser.add_argument("--steps", type=int, default=5, help="timed steps per variant")
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS),
                        help="the first one is the reference of the ratio column")
    parser.add_argument("--isolate", action="store_true", help="one fresh process per variant (less memory)")
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)  # worker mode of --isolate
    args = parser.parse_args(argv)
    if args.json:
        print(json.dumps({name: asdict(t) for name, t in measure(args).items()}))
        return 0
    print(report(args, measure_isolated(args, argv) if args.isolate else measure(args)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
