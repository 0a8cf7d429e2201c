"""The one place that writes MindSpore's global state: execution context, determinism and seeds."""
from __future__ import annotations

import random

import mindspore as ms
import mindspore.dataset as msds
import numpy as np

from swinexp.config import HardwareCfg
from swinexp.registry import ConfigError

MODES = {"graph": ms.GRAPH_MODE, "pynative": ms.PYNATIVE_MODE}
DEVICE_TARGETS = ("CPU", "GPU", "Ascend")


def validate(hw: HardwareCfg) -> None:
    """Reject impossible hardware settings before anything is built."""
    if hw.mode not in MODES:
        raise ConfigError(f"hardware.mode='{hw.mode}' is not valid; choose one of: {', '.join(MODES)}")
    if hw.device_target not in DEVICE_TARGETS:
        raise ConfigError(
            f"hardware.device_target='{hw.device_target}' is not valid; choose one of: {', '.join(DEVICE_TARGETS)}"
        )
    if hw.num_devices * hw.num_nodes != 1:
        raise ConfigError(
            f"hardware.num_devices={hw.num_devices} x hardware.num_nodes={hw.num_nodes}: multi-process runs "
            "through msrun are not available yet; use hardware=cpu (one process)"
        )


def apply(hw: HardwareCfg, seed: int) -> None:
    """Set the MindSpore context and seed every random source; call once per process, before building."""
    validate(hw)
    ms.set_device(hw.device_target)
    ms.set_context(mode=MODES[hw.mode])
    if hw.jit_level is not None:
        ms.set_context(jit_config={"jit_level": hw.jit_level})
    if hw.deterministic:
        ms.set_deterministic(True)
    set_seed(seed)


def set_seed(seed: int) -> None:
    """Seed Python, numpy, MindSpore and its dataset engine alike."""
    random.seed(seed)
    np.random.seed(seed)
    ms.set_seed(seed)
    msds.config.set_seed(seed)
