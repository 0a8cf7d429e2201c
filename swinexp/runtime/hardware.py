"""The one place that writes MindSpore's global state: execution context, determinism and seeds."""
from __future__ import annotations

import os
import random

import mindspore as ms
import mindspore.dataset as msds
import numpy as np
from mindspore._c_expression import MSContext
from mindspore.communication import get_group_size, init

from swinexp.amp import KEEP_ORIGIN, overflow
from swinexp.config import HardwareCfg
from swinexp.registry import ConfigError
from swinexp.runtime import allocator
from swinexp.runtime.modelarts import PLATFORMS

MODES = {"graph": ms.GRAPH_MODE, "pynative": ms.PYNATIVE_MODE}
DEVICE_TARGETS = ("CPU", "GPU", "Ascend")
MEMORY_LEVELS = ("O0", "O1")
# MindSpore's names (MSContext.get_ascend_soc_version) for the card families swinexp knows what to do on
ASCEND_CHIPS = ("ascend910", "ascend910b", "ascend910_93")


def validate(hw: HardwareCfg) -> None:
    """Reject impossible hardware settings before anything is built."""
    if hw.mode not in MODES:
        raise ConfigError(f"hardware.mode='{hw.mode}' is not valid; choose one of: {', '.join(MODES)}")
    if hw.device_target not in DEVICE_TARGETS:
        raise ConfigError(
            f"hardware.device_target='{hw.device_target}' is not valid; choose one of: {', '.join(DEVICE_TARGETS)}"
        )
    if hw.num_devices < 1 or hw.num_nodes < 1:
        raise ConfigError(f"hardware.num_devices={hw.num_devices} and hardware.num_nodes={hw.num_nodes} must be >= 1")
    if hw.cpu_threads is not None and hw.cpu_threads < 1:
        raise ConfigError(f"hardware.cpu_threads={hw.cpu_threads} must be >= 1, or null for one per core")
    if hw.chip is not None and hw.device_target != "Ascend":
        raise ConfigError(f"hardware.chip={hw.chip} names an Ascend card, but hardware.device_target="
                          f"{hw.device_target}; set hardware.chip=null")
    if hw.chip is not None and hw.chip not in ASCEND_CHIPS:
        raise ConfigError(f"hardware.chip='{hw.chip}' is not a known Ascend card; choose one of: "
                          f"{', '.join(ASCEND_CHIPS)} (ascend910 = the first-generation 910 of the Atlas training "
                          "series), or null to read it from the card")
    overflow.resolve(hw.overflow_check, hw.device_target, hw.chip)  # raises on a name or device it cannot be
    if hw.platform not in (None, *PLATFORMS):
        raise ConfigError(f"hardware.platform='{hw.platform}' is not known; choose one of: {', '.join(PLATFORMS)} "
                          "(or null)")
    if hw.node_sync_timeout_s <= 0:
        raise ConfigError(f"hardware.node_sync_timeout_s={hw.node_sync_timeout_s} must be > 0 (seconds)")
    if hw.memory_optimize_level not in (None, *MEMORY_LEVELS):
        raise ConfigError(f"hardware.memory_optimize_level='{hw.memory_optimize_level}' is not valid; choose one of: "
                          f"{', '.join(MEMORY_LEVELS)} (or null for MindSpore's default)")
    if hw.compile_cache_max_gb <= 0:
        raise ConfigError(f"hardware.compile_cache_max_gb={hw.compile_cache_max_gb} must be > 0; to do without the "
                          "compile cache, set hardware.compile_cache=false")


def check_backend(hw: HardwareCfg) -> None:
    """Fail in a second when this MindSpore build cannot run hw.device_target (e.g. the CPU wheel and an Ascend preset).

    Call it after a dry-run check: `dry_run=true` must keep working for any preset, on any machine. Also refuses
    this process's malloc where it breaks MindSpore's train step (allocator.py): a fact of the process, like the
    build.
    """
    allocator.check(hw.device_target)
    # the quiet form of ms.device_context.<target>.is_available(), which logs warnings of its own
    context = MSContext.get_instance()
    if context.is_pkg_support_device(hw.device_target):
        return
    why = [line for line in context.load_plugin_error().splitlines() if hw.device_target.lower() in line.lower()]
    reason = why[0] if why else "its plugin is not installed"
    raise ConfigError(
        f"hardware.device_target='{hw.device_target}' (set by the hardware option) but this MindSpore "
        f"{ms.__version__} build has no {hw.device_target} backend ({reason}); "
        f"install MindSpore's {hw.device_target} build (see mindspore.cn), run here with hardware=cpu, or check the "
        f"launch without the hardware by adding dry_run=true to the same command"
    )


def apply(hw: HardwareCfg, seed: int, deterministic: bool = False, precision_mode: str = KEEP_ORIGIN) -> None:
    """Set the MindSpore context and seed every random source; call once per process, before building.

    Args:
        deterministic: trainer.deterministic: also ask the backend for deterministic kernels.
        precision_mode: the amp policy's Ascend operator precision mode (`AmpPolicy.ascend_precision_mode`);
            set on Ascend only, and checked to have taken effect.
    """
    validate(hw)
    check_backend(hw)
    ms.set_device(hw.device_target)
    ms.set_context(mode=MODES[hw.mode])
    if hw.device_target == "Ascend":
        check_chip(hw.chip, detected_chip())
        set_ascend_precision_mode(precision_mode)
    if hw.device_target == "CPU":
        set_cpu_threads(hw.cpu_threads)
    if hw.memory_optimize_level is not None:
        ms.runtime.set_memory(optimize_level=hw.memory_optimize_level)
    if hw.jit_level is not None:
        ms.set_context(jit_config={"jit_level": hw.jit_level})
    set_deterministic(deterministic)
    if hw.num_devices * hw.num_nodes > 1:
        init()  # inside an msrun worker: join the collective group (HCCL, NCCL or MindSpore's own on CPU)
        ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True,
                                     device_num=get_group_size())
    set_seed(seed)  # the same seed on every rank: identical initial weights, rank-specific data via the shard


def detected_chip() -> str:
    """The Ascend card MindSpore runs on, in its own naming (e.g. ascend910, ascend910b)."""
    return MSContext.get_instance().get_ascend_soc_version().lower()


def check_chip(configured: str | None, detected: str) -> None:
    """Refuse to run when hardware.chip names another card than the one present: overflow detection and the bf16
    check depend on it."""
    if configured is not None and configured != detected:
        raise ConfigError(f"hardware.chip={configured} but this machine's card is {detected}; run with "
                          f"hardware.chip={detected} (or null to follow the card), so that overflow detection "
                          "matches the card's saturation mode")


def set_ascend_precision_mode(mode: str, op_precision: object | None = None) -> None:
    """Pin Ascend's operator precision mode and check it took effect (it can be set once per process).

    Args:
        mode: e.g. must_keep_origin_dtype.
        op_precision: the module with `precision_mode(mode)` (default mindspore.device_context.ascend.op_precision).
    """
    if op_precision is None:
        op_precision = ms.device_context.ascend.op_precision
    try:
        op_precision.precision_mode(mode)
    except RuntimeError as err:  # set already in this process with another value
        raise ConfigError(f"Ascend's precision_mode is already set in this process and cannot become {mode} "
                          f"({err}); start a fresh process") from err


def set_deterministic(on: bool) -> None:
    """Deterministic kernels on or off for this process. MindSpore takes the setting once per process, so the jobs of
    a sweep run one after another in one process (hydra/launcher=basic) keep the first job's setting: the same
    setting again is a no-op, and asking to turn it off again is refused rather than silently ignored."""
    if (ms.get_context("deterministic") == "ON") == on:
        return
    if not on:
        raise ConfigError("trainer.deterministic=false, but an earlier job in this process turned MindSpore's "
                          "deterministic kernels on, and they cannot be turned off again; run the sweep one process "
                          "per job (hydra/launcher=isolated) or give every job the same trainer.deterministic")
    ms.set_deterministic(True)


def set_cpu_threads(threads: int | None) -> None:
    """Run MindSpore's CPU kernels on `threads` threads; None: one per core this process may run on (its affinity:
    `hydra.launcher.max_parallel` and taskset pin jobs to fewer), not MindSpore's default 25 on any machine."""
    try:
        ms.device_context.cpu.op_tuning.threads_num(threads or len(os.sched_getaffinity(0)))
    except RuntimeError:  # set already in this process (it can be set once)
        pass


def context_summary(hw: HardwareCfg, precision_mode: str = KEEP_ORIGIN) -> dict[str, object]:
    """The MindSpore settings `apply` makes, for dry runs and logs."""
    summary: dict[str, object] = {"device_target": hw.device_target, "mode": f"{hw.mode} ({MODES[hw.mode]})",
                                  "jit_level": hw.jit_level or "backend default",
                                  "memory_optimize_level": hw.memory_optimize_level or "backend default",
                                  "overflow_check": overflow.describe(hw.overflow_check, hw.device_target, hw.chip)}
    if hw.device_target == "Ascend":
        summary["chip"] = hw.chip or "read from the card at start"
        summary["ascend_precision_mode"] = f"{precision_mode} (the amp policy's)"
    if hw.device_target == "CPU":
        summary["cpu_threads"] = hw.cpu_threads or f"{len(os.sched_getaffinity(0))} (one per core of this process)"
    summary["malloc"] = allocator.current()
    if hw.num_devices * hw.num_nodes > 1:
        summary.update({"communication": {"CPU": "MindSpore collective", "GPU": "NCCL", "Ascend": "HCCL"}[
            hw.device_target], "parallel_mode": "DATA_PARALLEL", "gradients_mean": True,
            "device_num": hw.num_devices * hw.num_nodes})
    return summary


def set_seed(seed: int) -> None:
    """Seed Python, numpy, MindSpore and its dataset engine alike."""
    random.seed(seed)
    np.random.seed(seed)
    ms.set_seed(seed)
    msds.config.set_seed(seed)
