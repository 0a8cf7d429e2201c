"""The PyTorch peer of `peers` and `memory`: timm's SwinTransformer train step, in a process of its own.

    python -m benchmarks.timm_peer '<settings as JSON>'              # prints one JSON line (see `measure`)
    python -m benchmarks.timm_peer --profile '<settings as JSON>'    # the same steps under torch.profiler

torch and MindSpore never share a process here (their thread pools and allocators would meet, and the peak
memory would mix). The step is what the official `main.py` does in fp32: forward, timm's soft-target cross
entropy, backward, clip_grad_norm_ when the config clips, AdamW over main.py's two weight-decay groups. Needs the
`reference` extra; this module imports neither MindSpore nor the rest of swinexp's heavy parts.
"""
from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from benchmarks.peak import peak_rss_gb
from benchmarks.worker import json_from_worker

__all__ = ["TimmProfile", "TimmSettings", "TimmTiming", "measure", "profile", "profile_in_process",
           "reference_installed", "run_in_process", "torch_environment"]

TIMEOUT_S = 1800
CLIP_REGION = "clip_grad_norm_"
OPTIMIZER_REGIONS = ("Optimizer.step", CLIP_REGION)  # torch names the optimizer's region "Optimizer.step#AdamW.step"


def reference_installed() -> bool:
    """torch and timm importable (the `reference` extra)."""
    return all(importlib.util.find_spec(name) is not None for name in ("torch", "timm"))


@dataclass(frozen=True)
class TimmSettings:
    """What the peer process needs: plain numbers, so the parent can pass them as JSON.

    Attributes:
        arch: The swinexp model config's architecture (img_size, embed_dim, depths, ..., drop_path_rate).
        warmup: Untimed steps after the first; iters: timed steps after those.
    """

    arch: dict[str, Any]
    batch: int
    lr: float
    weight_decay: float
    betas: tuple[float, float]
    eps: float
    clip_grad: float | None
    seed: int
    warmup: int
    iters: int


@dataclass(frozen=True)
class TimmTiming:
    """One peer process's figures.

    Attributes:
        first_s: The first step (eager: no compilation; allocator and kernel selection warm-up).
        seconds: The timed steps after warm-up.
        peak_rss_gb: Peak resident memory of the process (VmHWM) after all its steps.
        threads: torch's intra-op threads.
    """

    first_s: float
    seconds: tuple[float, ...]
    peak_rss_gb: float
    threads: int
    torch_version: str
    timm_version: str


def _train_step(settings: TimmSettings) -> Callable[[], float]:
    import torch

    from swinexp.parity.reference import official_param_groups, soft_target_cross_entropy, timm_swin

    arch = settings.arch
    torch.manual_seed(settings.seed)
    model = timm_swin(arch, random=True)  # raises for what timm cannot express (ape)
    optimizer = torch.optim.AdamW(official_param_groups(model, settings.weight_decay), lr=settings.lr,
                                  betas=tuple(settings.betas), eps=settings.eps, weight_decay=settings.weight_decay)
    rng = np.random.default_rng(settings.seed)  # the same batch as benchmarks.harness.random_batch
    size, classes = int(arch["img_size"]), int(arch["num_classes"])
    images = torch.from_numpy(rng.standard_normal((settings.batch, 3, size, size)).astype(np.float32))
    targets = torch.from_numpy(np.eye(classes, dtype=np.float32)[rng.integers(0, classes, settings.batch)])

    def step() -> float:
        optimizer.zero_grad(set_to_none=True)
        loss = soft_target_cross_entropy(model(images), targets)
        loss.backward()
        if settings.clip_grad:
            with torch.profiler.record_function(CLIP_REGION):  # named, so `profile` counts it with the optimizer
                torch.nn.utils.clip_grad_norm_(model.parameters(), settings.clip_grad)
        optimizer.step()
        return float(loss.detach())  # a host float: the step has finished

    return step


def _timed(call: Callable[[], float]) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def measure(settings: TimmSettings) -> TimmTiming:
    """Run 1 + warmup + iters steps in this process; the figures of the timed ones and the process's peak RSS."""
    import timm
    import torch

    step = _train_step(settings)
    first = _timed(step)
    for _ in range(settings.warmup):
        step()
    seconds = tuple(_timed(step) for _ in range(settings.iters))
    peak_gb = peak_rss_gb()
    return TimmTiming(first, seconds, peak_gb, torch.get_num_threads(), torch.__version__, timm.__version__)


@dataclass(frozen=True)
class TimmProfile:
    """torch.profiler's view of the timed steps.

    Attributes:
        ops: (aten op name, inside the optimizer step or clipping, self time in ms) of the profiled step with the
            median wall time, one per pair; only `aten::` ops, so the profiler's own regions and autograd's
            bookkeeping are left out.
        wall_ms: Wall time of each profiled step, then (last) that median step's as the profiler saw it.
    """

    ops: tuple[tuple[str, bool, float], ...]
    wall_ms: tuple[float, ...]
    torch_version: str
    timm_version: str


def _in_optimizer(event: Any) -> bool:
    while event is not None:
        if event.name.startswith(OPTIMIZER_REGIONS):
            return True
        event = event.cpu_parent
    return False


def profile(settings: TimmSettings) -> TimmProfile:
    """Run 1 + warmup steps, then profile `iters` steps with torch.profiler; self time per aten op and region of
    the median step."""
    import timm
    import torch
    from torch.profiler import ProfilerActivity

    step = _train_step(settings)
    for _ in range(1 + settings.warmup):
        step()
    # one profiled-but-discarded step first: torch's first traced step carries the profiler's own start-up
    plan = torch.profiler.schedule(wait=0, warmup=1, active=settings.iters, repeat=1)
    wall_ms = []
    with torch.profiler.profile(activities=[ProfilerActivity.CPU], schedule=plan) as prof:
        for _ in range(1 + settings.iters):
            wall_ms.append(1000 * _timed(step))
            prof.step()
    wall_ms = wall_ms[1:]
    # on a shared machine single steps stall (seconds, measured); report the step of median wall time, not the mean
    events = list(prof.events())
    steps = sorted((e.time_range.start, e.time_range.end) for e in events if e.name.startswith("ProfilerStep"))
    median = sorted(steps, key=lambda se: se[1] - se[0])[len(steps) // 2]
    totals: dict[tuple[str, bool], float] = {}
    for event in events:
        if event.name.startswith("aten::") and median[0] <= event.time_range.start <= median[1]:
            key = (event.name, _in_optimizer(event))
            totals[key] = totals.get(key, 0.0) + event.self_cpu_time_total / 1000
    ops = tuple((name, opt, ms) for (name, opt), ms in totals.items())
    wall_ms.append((median[1] - median[0]) / 1000)  # last: the step whose ops these are
    return TimmProfile(ops, tuple(wall_ms), torch.__version__, timm.__version__)


def profile_in_process(settings: TimmSettings) -> TimmProfile:
    """`profile` in a fresh Python process (this one may hold MindSpore)."""
    result = json_from_worker("benchmarks.timm_peer", ["--profile", json.dumps(asdict(settings))],
                              "the timm profile process", TIMEOUT_S, env=torch_environment())
    return TimmProfile(tuple(tuple(op) for op in result["ops"]), tuple(result["wall_ms"]),  # type: ignore[misc]
                       result["torch_version"], result["timm_version"])


def torch_environment() -> dict[str, str]:
    """This process's environment without the library folders MindSpore put on LD_LIBRARY_PATH when imported.

    Inherited, they make torch in the child run on 1 thread instead of one per core (measured here: 1 vs 2).
    """
    env = dict(os.environ)
    kept = [d for d in env.get("LD_LIBRARY_PATH", "").split(os.pathsep) if d and "mindspore" not in d]
    env.pop("LD_LIBRARY_PATH", None)
    if kept:
        env["LD_LIBRARY_PATH"] = os.pathsep.join(kept)
    return env


def run_in_process(settings: TimmSettings) -> TimmTiming:
    """`measure` in a fresh Python process (this one may hold MindSpore)."""
    result = json_from_worker("benchmarks.timm_peer", [json.dumps(asdict(settings))], "the timm peer process",
                              TIMEOUT_S, env=torch_environment())
    return TimmTiming(**{**result, "seconds": tuple(result["seconds"])})


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    profiling = argv[0] == "--profile"
    settings = json.loads(argv[-1])
    settings = TimmSettings(**{**settings, "betas": tuple(settings["betas"])})
    result = profile(settings) if profiling else measure(settings)
    print(json.dumps(asdict(result)), flush=True)


if __name__ == "__main__":
    main()
