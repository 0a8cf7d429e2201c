"""The one place that writes MindSpore's global state: execution context, determinism and seeds."""
from __future__ import annotations

import logging
import os
import random
from collections.abc import Callable
from dataclasses import replace
from typing import Protocol

import mindspore as ms
import mindspore.dataset as msds
import numpy as np
from mindspore._c_expression import MSContext
from mindspore.communication import get_group_size, init

from swinexp.config import HardwareCfg
from swinexp.registry import ConfigError
from swinexp.runtime import allocator, chips, simulated_ascend
from swinexp.runtime.modelarts import PLATFORMS

log = logging.getLogger("swinexp")

MODES = {"graph": ms.GRAPH_MODE, "pynative": ms.PYNATIVE_MODE}
DEVICE_TARGETS = ("CPU", "GPU", "Ascend")
MEMORY_LEVELS = ("O0", "O1")
JIT_LEVELS = ("O0", "O1", "O2")  # ms.jit(jit_level=...): kernel by kernel, + graph kernel fusion, whole graph sink


class Precision(Protocol):
    """The precision settings `set_precision` makes: an amp policy resolved on a chip (amp/precision.py's
    Precision; passed down, since amp sits above this room)."""

    precision_mode: str | None
    matmul_hf32: bool | None
    conv_hf32: bool | None
    effective: str


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
    chips.check_name(hw.chip, hw.device_target)
    chips.check_overflow(hw.overflow_check, hw.device_target)
    if hw.platform not in (None, *PLATFORMS):
        raise ConfigError(f"hardware.platform='{hw.platform}' is not known; choose one of: {', '.join(PLATFORMS)} "
                          "(or null)")
    if hw.node_sync_timeout_s <= 0:
        raise ConfigError(f"hardware.node_sync_timeout_s={hw.node_sync_timeout_s} must be > 0 (seconds)")
    if hw.jit_level not in (None, *JIT_LEVELS):
        raise ConfigError(f"hardware.jit_level='{hw.jit_level}' is not valid; choose one of: {', '.join(JIT_LEVELS)} "
                          "(or null for ms.jit's default, O0)")
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
    if hw.device_target == "Ascend" and simulated_ascend.active() is not None:
        simulated_ascend.check_mode(hw.mode)
        return
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


def apply(hw: HardwareCfg, seed: int, deterministic: bool = False,
          precision: Callable[[chips.Chip | None], Precision] | None = None) -> HardwareCfg:
    """Set the MindSpore context and seed every random source; call once per process, before building.

    On Ascend the card is read first (`hardware.chip=null` becomes it; another configured chip is refused), then the
    precision for it (the run's amp policy resolved on that chip, amp/precision.py) is set and read back.

    Args:
        deterministic: trainer.deterministic: also ask the backend for deterministic kernels.
        precision: the chip's precision settings (operator precision mode, HF32/TF32 switches) from the card's
            chip (`build.configure_device` passes `amp.precision.resolve` of the run's policy); None leaves the
            backend's own (a CPU run has none to set).

    Returns:
        `hw` with `chip` the card's (Ascend).
    """
    validate(hw)
    check_backend(hw)
    simulated = simulated_ascend.active() if hw.device_target == "Ascend" else None
    ms.set_device("CPU" if simulated else hw.device_target)
    ms.set_context(mode=MODES[hw.mode])
    hw = with_card(hw, required=True)
    settings = precision(chips.of(hw.device_target, hw.chip)) if precision is not None else None
    if simulated:
        simulated_ascend.install(simulated)
    if settings is not None:
        set_precision(settings, hw.device_target)
    if hw.device_target == "CPU":
        set_cpu_threads(hw.cpu_threads)
    if hw.memory_optimize_level is not None:
        ms.runtime.set_memory(optimize_level=hw.memory_optimize_level)
    set_deterministic(deterministic)
    if hw.num_devices * hw.num_nodes > 1:
        init()  # inside an msrun worker: join the collective group (HCCL, NCCL or MindSpore's own on CPU)
        ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True,
                                     device_num=get_group_size())
    set_seed(seed)  # the same seed on every rank: identical initial weights, rank-specific data via the shard
    return hw


def card_present(device_target: str) -> bool:
    """An Ascend card can be read in this process: MindSpore's Ascend backend is installed, or one is simulated."""
    if device_target != "Ascend":
        return False
    return simulated_ascend.active() is not None or MSContext.get_instance().is_pkg_support_device("Ascend")


def detected_chip() -> str:
    """The Ascend card MindSpore runs on, in its own naming (ascend910, ascend910b, ascend910_93); "" when MindSpore
    has not read it (no card, or its device not initialised yet)."""
    simulated = simulated_ascend.active()
    if simulated is not None:
        return simulated.name
    try:
        return MSContext.get_instance().get_ascend_soc_version().lower()
    except RuntimeError:  # not readable before the device is up on some builds: `apply` reads it again after
        return ""


def with_card(hw: HardwareCfg, required: bool = False) -> HardwareCfg:
    """`hw` with `chip` read from the card where one is present (null becomes the card's; another is refused).

    Args:
        required: the card must be readable now (after `ms.set_device`): a chip MindSpore does not report is an error
            naming the setting that replaces the query.
    """
    if not card_present(hw.device_target):
        return hw
    detected = detected_chip()
    if not detected:
        if required and hw.chip is None:
            raise ConfigError("MindSpore did not report this card's SoC (MSContext.get_ascend_soc_version() is empty), "
                              f"so its precision and overflow behaviour are unknown; set hardware.chip to one of: "
                              f"{', '.join(chips.ASCEND_CHIPS)}")
        return hw
    if detected not in chips.ASCEND_CHIPS:
        raise ConfigError(f"this machine's card is {detected}, which swinexp has no capability entry for "
                          f"(runtime/chips.py knows {', '.join(chips.ASCEND_CHIPS)}); it cannot tell how this card "
                          "computes fp32 or sees fp16 overflow")
    check_chip(hw.chip, detected)
    return replace(hw, chip=detected)


def check_chip(configured: str | None, detected: str) -> None:
    """Refuse to run when hardware.chip names another card than the one present: overflow detection, precision
    mode and the bf16 check depend on it."""
    if configured is not None and configured != detected:
        raise ConfigError(f"hardware.chip={configured} but this machine's card is {detected}; run with "
                          f"hardware.chip={detected} (or null to follow the card), so that overflow detection and "
                          "the precision mode match the card")


def op_precision() -> object:
    """The Ascend operator precision settings of this process: MindSpore's module, or the simulated card's."""
    if simulated_ascend.active() is not None:
        return simulated_ascend.OP_PRECISION
    return ms.device_context.ascend.op_precision


def set_precision(precision: Precision, device_target: str, op: object | None = None) -> None:
    """Set the resolved precision (Ascend operator precision mode and HF32 switches; GPU TF32 switches) and, on
    Ascend, read it back: a setting that did not take effect stops the run here.

    Args:
        op: the module with `precision_mode`, `matmul_allow_hf32`, `conv_allow_hf32` (default `op_precision()`).
    """
    if device_target == "GPU":
        gpu = ms.device_context.gpu.op_precision
        for switch, value in (("matmul_allow_tf32", precision.matmul_hf32), ("conv_allow_tf32", precision.conv_hf32)):
            if value is not None:
                _set_once(getattr(gpu, switch), value, f"GPU {switch}")
        return
    if device_target != "Ascend":
        return
    op = op if op is not None else op_precision()
    intended = {"precision_mode": precision.precision_mode, "matmul_allow_hf32": precision.matmul_hf32,
                "conv_allow_hf32": precision.conv_hf32}
    for switch, value in intended.items():
        if value is not None:
            _set_once(getattr(op, switch), value, f"Ascend's {switch}")
    got = read_precision(op)
    wrong = {k: (v, got.get(k)) for k, v in intended.items() if v is not None and k in got and got[k] != v}
    if wrong:
        raise ConfigError("Ascend's operator precision did not take the values set: " + ", ".join(
            f"{k} is {have!r}, not {want!r}" for k, (want, have) in wrong.items()) + "; start a fresh process (these "
            "settings are taken once per process) and run `python -m swinexp.app.selfcheck` with the same overrides")
    log.info("Ascend operator precision: %s (amp %s)", ", ".join(f"{k}={v}" for k, v in got.items()),
             precision.effective)


def read_precision(op: object) -> dict[str, object]:
    """The operator precision settings the card computes with, as MindSpore (or the simulated card) reports them."""
    if isinstance(op, simulated_ascend.OpPrecision):
        simulated = simulated_ascend.active()
        return op.read(simulated) if simulated is not None else dict(op.settings)
    try:
        from mindspore._c_expression import AscendOpPrecisionConf  # the Ascend build's own record of the settings
    except ImportError:
        return {}
    conf = AscendOpPrecisionConf.get_instance()
    return {"precision_mode": conf.precision_mode(), "matmul_allow_hf32": conf.matmul_allow_hf32() == "1",
            "conv_allow_hf32": conf.conv_allow_hf32() == "1"}


def _set_once(setter, value: object, what: str) -> None:  # noqa: ANN001
    try:
        setter(value)
    except RuntimeError as err:  # set already in this process with another value
        raise ConfigError(f"{what} is already set in this process and cannot become {value} ({err}); start a fresh "
                          "process") from err


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


def set_seed(seed: int) -> None:
    """Seed Python, numpy, MindSpore and its dataset engine alike."""
    random.seed(seed)
    np.random.seed(seed)
    ms.set_seed(seed)
    msds.config.set_seed(seed)
