"""A stand-in Ascend card on MindSpore's CPU backend, for tests and `python -m swinexp.app.selfcheck --simulate-chip`.

`SWINEXP_SIMULATE_CHIP=ascend910` (or ascend910b, ascend910_93) in the environment — inherited by msrun workers and
subprocesses — makes this process behave, where swinexp meets the card, as CANN documents that chip (runtime/chips.py):

- it reports the chip as its SoC (`runtime.hardware.detected_chip`) and runs on the CPU backend;
- `op_precision` takes the operator precision mode and the HF32 switches once each, as MindSpore's does, and reads
  them back;
- every Cube primitive (MatMul, BatchMatMul, Conv2D and their *Ext forms) called eagerly picks its cubeMathType from
  those settings as MindSpore's op_api_util.cc does; fp32 inputs under KEEP_DTYPE raise on a chip without fp32 Cube
  math, as aclnnMatmul does on the Atlas training series, and fp32 inputs the chip lowers are rounded to fp16 (or
  HF32) before an fp32-accumulating product, which is what the Cube unit computes;
- fp16 overflow saturates and is seen only through the float status register (`amp.overflow.SaturatingDevice`).

Cube primitives inside a compiled graph run as CPU kernels and are not checked: the simulation asks for
hardware.mode=pynative (`check_mode`).
"""
from __future__ import annotations

import os
from collections import Counter
from typing import Any, Callable

import mindspore as ms
import numpy as np
from mindspore import Tensor, ops

from swinexp.registry import ConfigError
from swinexp.runtime.chips import ASCEND_CHIPS, CHIPS, Chip

SIMULATE_ENV = "SWINEXP_SIMULATE_CHIP"
KEEP_DTYPE, ALLOW_FP32_DOWN_PRECISION, FORCE_FP16, FORCE_HF32 = ("KEEP_DTYPE", "ALLOW_FP32_DOWN_PRECISION",
                                                                 "FORCE_FP16", "FORCE_HF32")
# MindSpore's op_api_util.cc kCubeMathType: the precision modes with a fixed cubeMathType
CUBE_MATH_TYPE = {"force_fp16": FORCE_FP16, "allow_fp32_to_fp16": ALLOW_FP32_DOWN_PRECISION,
                  "allow_mix_precision": ALLOW_FP32_DOWN_PRECISION, "must_keep_origin_dtype": KEEP_DTYPE,
                  "allow_fp32_to_bf16": ALLOW_FP32_DOWN_PRECISION,
                  "allow_mix_precision_fp16": ALLOW_FP32_DOWN_PRECISION,
                  "allow_mix_precision_bf16": ALLOW_FP32_DOWN_PRECISION}
# ... and kSelectMoreMathType for any other mode (force_fp32): (HF32 allowed, the SoC keeps dtypes) -> type
SELECT_MATH_TYPE = {(False, True): KEEP_DTYPE, (False, False): FORCE_FP16, (True, True): FORCE_HF32,
                    (True, False): ALLOW_FP32_DOWN_PRECISION}
CONV_PRIMITIVES = ("Conv2D", "Convolution", "Conv2DExt")
CUBE_PRIMITIVES = ("MatMul", "BatchMatMul", "MatMulExt", "BatchMatMulExt", "Dense", *CONV_PRIMITIVES)


def active() -> Chip | None:
    """The simulated chip, when SWINEXP_SIMULATE_CHIP names one."""
    name = os.environ.get(SIMULATE_ENV)
    if not name:
        return None
    if name not in ASCEND_CHIPS:
        raise ConfigError(f"{SIMULATE_ENV}={name} is not an Ascend chip swinexp knows; choose one of: "
                          f"{', '.join(ASCEND_CHIPS)}, or unset it")
    return CHIPS[name]


def check_mode(mode: str) -> None:
    if active() is not None and mode != "pynative":
        raise ConfigError(f"{SIMULATE_ENV} checks Cube ops as they run eagerly, and hardware.mode={mode} compiles them "
                          "into CPU kernels it cannot see; add hardware.mode=pynative")


class OpPrecision:
    """`mindspore.device_context.ascend.op_precision` of the simulated card: each setting once per process."""

    def __init__(self) -> None:
        self.settings: dict[str, Any] = {}

    def _set(self, key: str, value: Any) -> None:
        if key in self.settings and self.settings[key] != value:
            raise RuntimeError(f"The '{key}' can not be set repeatedly.")
        self.settings[key] = value

    def precision_mode(self, mode: str) -> None:
        self._set("precision_mode", mode)

    def matmul_allow_hf32(self, value: bool) -> None:
        self._set("matmul_allow_hf32", bool(value))

    def conv_allow_hf32(self, value: bool) -> None:
        self._set("conv_allow_hf32", bool(value))

    def read(self, chip: Chip) -> dict[str, Any]:
        """What the card computes with: the settings made, the chip's defaults for the rest."""
        return {"precision_mode": self.settings.get("precision_mode", chip.default_precision_mode),
                "matmul_allow_hf32": self.settings.get("matmul_allow_hf32", chip.hf32_defaults[0]),
                "conv_allow_hf32": self.settings.get("conv_allow_hf32", chip.hf32_defaults[1])}


OP_PRECISION = OpPrecision()
CUBE_CALLS: Counter[tuple[str, str]] = Counter()  # (primitive, cubeMathType) of every fp32 Cube call, for tests
_installed: dict[str, Callable[..., Any]] = {}


def cube_math_type(chip: Chip, primitive: str) -> str:
    """The cubeMathType MindSpore hands aclnn for `primitive` under the settings made so far."""
    settings = OP_PRECISION.read(chip)
    mode = settings["precision_mode"]
    if mode in CUBE_MATH_TYPE:
        return CUBE_MATH_TYPE[mode]
    hf32 = settings["conv_allow_hf32" if primitive in CONV_PRIMITIVES else "matmul_allow_hf32"]
    return SELECT_MATH_TYPE[(hf32, chip.fp32_cube)]


def _round_fp16(x: Tensor) -> Tensor:
    return ops.cast(ops.cast(x, ms.float16), ms.float32)


def _round_hf32(x: Tensor) -> Tensor:
    """fp32 with its mantissa rounded to 11 bits, the precision of HF32's mantissa (10 stored bits, as TF32)."""
    bits = (x.asnumpy().view(np.int32) + (1 << 12)) & ~0x1FFF  # round to nearest (ties away) on the 13 low bits
    return Tensor(bits.view(np.float32))


def _cube_inputs(chip: Chip, primitive: str, args: tuple[Any, ...]) -> tuple[Any, ...]:
    tensors = [a for a in args[:2] if isinstance(a, Tensor)]
    if not tensors or any(t.dtype != ms.float32 for t in tensors):
        return args
    math = cube_math_type(chip, primitive)
    CUBE_CALLS[(primitive, math)] += 1
    if math == KEEP_DTYPE and not chip.fp32_cube:
        raise RuntimeError(f"simulated {chip.name}: {primitive} with FLOAT inputs and cubeMathType=KEEP_DTYPE "
                           f"(precision mode {OP_PRECISION.read(chip)['precision_mode']}) is not supported on the "
                           f"{chip.product}: its Cube unit has no fp32 math (CANN aclnnMatmul)")
    if math == KEEP_DTYPE:
        return args
    lower = (_round_fp16 if math == FORCE_FP16 or not chip.fp32_cube
             else _round_hf32)  # ALLOW_FP32_DOWN_PRECISION / FORCE_HF32 on a chip with fp32 Cube math: HF32
    return tuple(lower(a) if i < 2 and isinstance(a, Tensor) else a for i, a in enumerate(args))


def install(chip: Chip) -> None:
    """Route every Cube primitive's eager call through the simulated Cube unit (once per process)."""
    from mindspore.ops.auto_generate import gen_ops_prim
    from mindspore.ops.operations import nn_ops

    for name in CUBE_PRIMITIVES:
        cls = getattr(gen_ops_prim, name, None) or getattr(nn_ops, name, None)
        if cls is None or name in _installed:
            continue
        original = _installed[name] = cls.__call__

        def call(self: Any, *args: Any, _original: Callable[..., Any] = original, _name: str = name,
                 **kwargs: Any) -> Any:
            simulated = active()
            if simulated is not None:
                args = _cube_inputs(simulated, _name, args)
            return _original(self, *args, **kwargs)

        cls.__call__ = call
