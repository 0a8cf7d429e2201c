"""Mixed-precision policies (`conf/amp/*.yaml`): how the network is cast and how the loss is scaled.

Five levels, each a registered builder with a YAML of the same name:

- `o0`: pure fp32, the reference.
- `o1`: MindSpore's O1: only its white list (Dense, Conv*, MatMul, ...) computes in low precision.
- `o1_manual`: the whole network in low precision, except a configurable list of cell types kept in fp32 whose
  outputs are cast back to low precision (the Swin/NVIDIA-apex style recipe: norms, softmax, GELU in fp32).
- `o2`: MindSpore's O2: low precision except its black list (BatchNorm*, LayerNorm).
- `o3`: everything in low precision.

The train step is the only consumer of an AmpPolicy: it calls `apply` once on the model (at build) and
`make_scaler` once per train step for the loss scaler state.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from difflib import get_close_matches

import mindspore as ms
from mindspore import nn
from mindspore.amp import DynamicLossScaler, LossScaler, StaticLossScaler

from swinexp.registry import AMP_POLICIES, ConfigError

DTYPES = {"float16": ms.float16, "bfloat16": ms.bfloat16}
LOSS_SCALES = ("dynamic", "static", "none")
# Ascend's operator precision mode (mindspore.device_context.ascend.op_precision.precision_mode): what CANN may do to
# an operator's dtype behind the graph's back. `auto` (every policy's default) resolves per chip to the mode that
# keeps fp32 ops as fp32 as the chip can (amp/precision.py, runtime/chips.py); the others are deliberate ablations.
AUTO = "auto"
KEEP_ORIGIN = "must_keep_origin_dtype"
ASCEND_PRECISION_MODES = (AUTO, "must_keep_origin_dtype", "force_fp32", "allow_fp32_to_fp16", "force_fp16",
                          "allow_mix_precision", "allow_mix_precision_fp16", "allow_fp32_to_bf16",
                          "allow_mix_precision_bf16")
# o1_manual's default: everything whose fp16 result is fragile (exp/erf/variance) stays fp32; on a chip without fp32
# Cube math the convolutions compute in fp16 all the same (amp/precision.py drops them there and says so)
MANUAL_FP32_CELLS = ("GELU", "Softmax", "Conv2d", "Conv1d", "BatchNorm2d", "LayerNorm")


@dataclass(frozen=True)
class AmpPolicy:
    """A named precision policy.

    Attributes:
        level: "O0", "O1", "O1_manual", "O2" or "O3"; shown in logs and tables.
        dtype: the low-precision compute type (ms.float32 for O0).
        fp32_cells: O1_manual only: cell types kept in fp32, outputs cast back to `dtype`.
        loss_scale: "dynamic", "static" or "none".
        init_scale: initial (dynamic) or constant (static) loss scale.
        scale_factor: dynamic: the scale is divided by this on overflow, multiplied after `scale_window` clean steps.
        scale_window: dynamic: clean optimizer steps before the scale grows.
        ascend_precision_mode: the Ascend operator precision mode; `auto` resolves per chip (amp/precision.py) and
            `runtime.hardware.apply` sets the result on Ascend.
    """

    level: str
    dtype: ms.Type = ms.float32
    fp32_cells: tuple[type[nn.Cell], ...] = ()
    loss_scale: str = "none"
    init_scale: float = 2.0**16
    scale_factor: int = 2
    scale_window: int = 2000
    ascend_precision_mode: str = AUTO

    @property
    def low_precision(self) -> bool:
        """True when some of the network computes in fp16/bf16 (every level but O0)."""
        return self.level != "O0"

    def apply(self, network: nn.Cell) -> nn.Cell:
        """Return `network` cast for this policy; parameter names are unchanged, parameters stay fp32."""
        if self.level == "O0":
            return network
        if self.level == "O1_manual":
            # MindSpore's black-list mechanism: to_float(dtype) on all, then each listed cell to_float(fp32) inside
            # a wrapper casting its output back to dtype; the whole net's output is cast to fp32 for the loss
            return ms.amp.custom_mixed_precision(network, black_list=list(self.fp32_cells), dtype=self.dtype)
        return ms.amp.auto_mixed_precision(network, self.level, dtype=self.dtype)

    def make_scaler(self) -> LossScaler:
        """A fresh loss scaler; its scale and counter are Parameters updated inside the jitted step."""
        if self.loss_scale == "dynamic":
            return DynamicLossScaler(float(self.init_scale), int(self.scale_factor), int(self.scale_window))
        # "none" is a scale of exactly 1 so the step has one code path; the overflow check still skips updates
        return StaticLossScaler(float(self.init_scale) if self.loss_scale == "static" else 1.0)


def _dtype(dtype: str) -> ms.Type:
    if dtype not in DTYPES:
        raise ConfigError(f"amp.dtype='{dtype}' is not supported; choose one of: {', '.join(DTYPES)}")
    return DTYPES[dtype]


def _cell_types(names: Sequence[str]) -> tuple[type[nn.Cell], ...]:
    """Resolve cell class names from mindspore.nn (e.g. 'LayerNorm'), with a close-match hint."""
    cells = sorted(n for n in dir(nn) if isinstance(getattr(nn, n), type) and issubclass(getattr(nn, n), nn.Cell))
    types = []
    for name in names:
        if name not in cells:
            hint = get_close_matches(str(name), cells, n=1)
            raise ConfigError(
                f"amp.fp32_cells: '{name}' is not a cell class of mindspore.nn (e.g. LayerNorm, GELU, Softmax)"
                + (f". Did you mean '{hint[0]}'?" if hint else "")
            )
        types.append(getattr(nn, name))
    return tuple(types)


def _precision_mode(mode: str) -> str:
    """A known mode name; what the chip makes of it is checked where the chip is known (amp/precision.py)."""
    if mode not in ASCEND_PRECISION_MODES:
        hint = get_close_matches(str(mode), ASCEND_PRECISION_MODES, n=1)
        raise ConfigError(f"amp.ascend_precision_mode='{mode}' is not an Ascend precision mode; choose one of: "
                          f"{', '.join(ASCEND_PRECISION_MODES)}" + (f". Did you mean '{hint[0]}'?" if hint else ""))
    return mode


def _policy(level: str, dtype: str, loss_scale: str, init_scale: float, scale_factor: int, scale_window: int,
            fp32_cells: tuple[type[nn.Cell], ...] = (), ascend_precision_mode: str = AUTO) -> AmpPolicy:
    if loss_scale not in LOSS_SCALES:
        raise ConfigError(f"amp.loss_scale='{loss_scale}' is not valid; choose one of: {', '.join(LOSS_SCALES)}")
    if init_scale < 1:
        raise ConfigError(f"amp.init_scale={init_scale} must be >= 1 (2^16 = 65536 is the usual start)")
    if int(scale_factor) != scale_factor or scale_factor < 2:
        raise ConfigError(f"amp.scale_factor={scale_factor} must be an integer >= 2 (MindSpore's DynamicLossScaler)")
    if int(scale_window) != scale_window or scale_window < 1:
        raise ConfigError(f"amp.scale_window={scale_window} must be an integer >= 1 (optimizer steps)")
    return AmpPolicy(level, _dtype(dtype), fp32_cells, loss_scale, float(init_scale), int(scale_factor),
                     int(scale_window), _precision_mode(ascend_precision_mode))


@AMP_POLICIES.register("o0")
def o0(ascend_precision_mode: str = AUTO) -> AmpPolicy:
    """fp32 as far as the chip has it: the reference every other policy is compared with; no loss scaling.

    Args:
        ascend_precision_mode: auto (per chip: must_keep_origin_dtype with HF32 off on a 910B; on a first-generation
            910, whose Cube unit has no fp32, allow_fp32_to_fp16) or that chip's mode; anything else is refused.
    """
    return AmpPolicy(level="O0", ascend_precision_mode=_precision_mode(ascend_precision_mode))


def _mindspore_level(level: str, doc: str) -> Callable[..., AmpPolicy]:
    """The builder of one of MindSpore's own AMP levels (O1, O2, O3): they take the same arguments, documented once.

    Args:
        dtype: "float16" or "bfloat16" (bfloat16 is not available on CPU).
        loss_scale: "dynamic", "static" or "none".
        init_scale: initial (dynamic) or constant (static) loss scale.
        scale_factor: dynamic: divide by this on overflow, multiply after `scale_window` clean steps.
        scale_window: dynamic: clean optimizer steps before the scale grows.
        ascend_precision_mode: Ascend's operator precision mode; `auto` keeps every dtype the policy's casts chose
            as far as the chip can, so the ablation measures the policy and not CANN's own lowering.
    """
    def policy(dtype: str = "float16", loss_scale: str = "dynamic", init_scale: float = 2.0**16,
               scale_factor: int = 2, scale_window: int = 2000,
               ascend_precision_mode: str = AUTO) -> AmpPolicy:
        return _policy(level, dtype, loss_scale, init_scale, scale_factor, scale_window,
                       ascend_precision_mode=ascend_precision_mode)

    policy.__name__ = policy.__qualname__ = level.lower()
    policy.__doc__ = doc + " The arguments: see `_mindspore_level`."
    return policy


o1 = AMP_POLICIES.register("o1")(_mindspore_level(
    "O1", "MindSpore O1: white-list cells and primitives (Dense, Conv*, MatMul, ...) in `dtype`, the rest fp32."))
o2 = AMP_POLICIES.register("o2")(_mindspore_level(
    "O2", "MindSpore O2: everything in `dtype` except its black list (BatchNorm1d/2d/3d, LayerNorm) in fp32."))
o3 = AMP_POLICIES.register("o3")(_mindspore_level(
    "O3", "MindSpore O3: every cell in `dtype`, LayerNorm and softmax included (the stress case for drift)."))


@AMP_POLICIES.register("o1_manual")
def o1_manual(dtype: str = "float16", fp32_cells: Sequence[str] = MANUAL_FP32_CELLS, loss_scale: str = "dynamic",
              init_scale: float = 2.0**16, scale_factor: int = 2, scale_window: int = 2000,
              ascend_precision_mode: str = AUTO) -> AmpPolicy:
    """The network in `dtype`, except cells of the types named in `fp32_cells`, kept fp32 with outputs cast back.

    Args:
        dtype: "float16" or "bfloat16" (bfloat16 is not available on CPU).
        fp32_cells: mindspore.nn class names, e.g. [GELU, Softmax, LayerNorm]; subclasses match too.

    The other arguments are those of `o1` (`_mindspore_level`).
    """
    return _policy("O1_manual", dtype, loss_scale, init_scale, scale_factor, scale_window, _cell_types(fp32_cells),
                   ascend_precision_mode)
