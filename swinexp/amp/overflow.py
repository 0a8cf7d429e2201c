"""How the train step learns that an fp16 step overflowed, per backend.

Two ways, chosen by `hardware.overflow_check` (`auto` picks per device):

- `isfinite`: overflow shows as inf/nan in the gradients (CPU, GPU, an Ascend 910B in its default INF_NAN mode).
  The step decides from the gradients' global norm (one pass it computes anyway) and, for accumulated
  micro-batches, `mindspore.amp.all_finite`.
- `status_register`: the first-generation Ascend 910 (and a 910B with MS_ASCEND_CHECK_OVERFLOW_MODE=SATURATION_MODE)
  *saturates*: an fp16 overflow becomes +-65504 and a nan becomes 0, so every gradient and their norm stay finite
  and `isfinite` never fires. The card records the overflow in a status register instead; the step clears it
  before the forward and reads it after the backward (NPUClearFloatStatusV2 / NPUGetFloatStatusV2), inside the
  jitted step, so reading it costs no host sync.

`SaturatingDevice` stands in for such a card on any backend (tests, `swinexp.app.selfcheck`): it saturates the
gradients the way the 910's arithmetic does and raises its own status register when it had to.
"""
from __future__ import annotations

import os

import mindspore as ms
from mindspore import Parameter, Tensor, nn, ops
from mindspore.amp import all_finite
from mindspore.ops.operations.math_ops import NPUClearFloatStatusV2, NPUGetFloatStatusV2

from swinexp.registry import ConfigError
from swinexp.runtime import chips, simulated_ascend

SATURATION_ENV = "MS_ASCEND_CHECK_OVERFLOW_MODE"  # an Atlas A2 card's switch: SATURATION_MODE | INFNAN_MODE
FP16_MAX = 65504.0
_STATUS_SHAPE = (8,)  # the register as MindSpore exposes it: int32 x 8, all zero when nothing overflowed


def resolve(check: str, device_target: str, chip: str | None, env: dict[str, str] | None = None) -> str:
    """`isfinite` or `status_register` for `hardware.overflow_check` on this device.

    Args:
        check: auto | isfinite | status_register.
        device_target: CPU | GPU | Ascend.
        chip: the Ascend card (runtime/chips.py); `auto` on Ascend needs it: read it first (`hardware.with_card`).
        env: the environment (default os.environ) for MS_ASCEND_CHECK_OVERFLOW_MODE.
    """
    env = os.environ if env is None else env
    chips.check_overflow(check, device_target)
    if check != "auto":
        return check
    if device_target != "Ascend":
        return "isfinite"
    if chip is None:
        raise ConfigError("hardware.overflow_check=auto on Ascend depends on the card, and it has not been read; "
                          "set hardware.chip (one of: " + ", ".join(chips.ASCEND_CHIPS) + ") or run on the card")
    if chips.CHIPS[chip].saturates or env.get(SATURATION_ENV) == "SATURATION_MODE":
        return "status_register"
    return "isfinite"


def describe(check: str, device_target: str, chip: str | None) -> str:
    """The resolved check with the reason, for the dry run and logs."""
    if check == "auto" and device_target == "Ascend" and chip is None:
        saturating = [c for c in chips.ASCEND_CHIPS if chips.CHIPS[c].saturates]
        return (f"decided from the card at start: status_register on {', '.join(saturating)} (saturates fp16 "
                "overflow), isfinite on the others unless " + f"{SATURATION_ENV}=SATURATION_MODE")
    resolved = resolve(check, device_target, chip)
    if resolved == "status_register":
        why = (f"{chip} saturates fp16 overflow" if check == "auto" and chip and chips.CHIPS[chip].saturates
               else f"{SATURATION_ENV}=SATURATION_MODE" if check == "auto"
               else "set explicitly")
        return f"status_register ({why}; NPUClear/GetFloatStatusV2 around each micro-batch)"
    return f"isfinite ({'gradient norm / all_finite' if check == 'auto' else 'set explicitly'})"


class FiniteCheck(nn.Cell):
    """Overflow is inf/nan in the gradients: nothing to clear, the update's norm test decides (`isfinite`)."""

    name = "isfinite"

    def clear(self, anchor: Tensor) -> Tensor:
        """Before the forward: returns `anchor` (nothing to reset)."""
        return anchor

    def saturate(self, grads: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
        """What the device's arithmetic did to the gradients: nothing here."""
        return grads

    def window_clean(self, grads: tuple[Tensor, ...]) -> Tensor:
        """True when this (fused) micro-batch may update: the update's isfinite(norm) decides, so always True."""
        return ops.ones((), ms.bool_)

    def micro_clean(self, grads: tuple[Tensor, ...]) -> Tensor:
        """True when this accumulated micro-batch's gradients are finite."""
        return all_finite(grads)


class StatusRegister(FiniteCheck):
    """An Ascend card in saturation mode: overflow is read from the float status register (`status_register`)."""

    name = "status_register"

    def __init__(self) -> None:
        super().__init__()
        self.clear_status = NPUClearFloatStatusV2()
        self.get_status = NPUGetFloatStatusV2()

    def clear(self, anchor: Tensor) -> Tensor:
        status = ops.depend(ops.zeros(_STATUS_SHAPE, ms.int32), anchor)
        return ops.depend(anchor, self.clear_status(status))

    def _clean(self, grads: tuple[Tensor, ...]) -> Tensor:
        status = self.get_status(ops.depend(ops.zeros(_STATUS_SHAPE, ms.int32), grads))
        return ops.all(ops.equal(status, 0))

    def window_clean(self, grads: tuple[Tensor, ...]) -> Tensor:
        return self._clean(grads)

    def micro_clean(self, grads: tuple[Tensor, ...]) -> Tensor:
        return self._clean(grads)


_saturate = ops.MultitypeFuncGraph("saturate")


@_saturate.register("Tensor")
def _saturate_tensor(grad: Tensor) -> Tensor:
    nan_to_zero = ops.select(ops.isnan(grad), ops.zeros_like(grad), grad)
    return ops.clip_by_value(nan_to_zero, -FP16_MAX, FP16_MAX)


class SaturatingDevice(StatusRegister):
    """A stand-in for an Ascend 910 in saturation mode, on any backend.

    `saturate` turns what an IEEE device computes into what the 910 would have: +-inf -> +-65504, nan -> 0, and
    sets this object's status register when any element needed it; `clear` and the clean checks read that register
    instead of the card's. The step therefore sees gradients whose norm is finite however badly they overflowed:
    only a check that reads the register can skip the step.
    """

    name = "status_register (simulated saturating device)"

    def __init__(self, read_register: bool = True) -> None:
        """Args:
            read_register: False simulates the defect this module exists for: a saturating card whose step
                decides by `isfinite` alone (it never sees the overflow).
        """
        nn.Cell.__init__(self)
        self.read_register = read_register
        self.status = Parameter(Tensor([0] * _STATUS_SHAPE[0], ms.int32), name="simulated_float_status",
                                requires_grad=False)

    def clear(self, anchor: Tensor) -> Tensor:
        cleared = ops.assign(self.status, ops.depend(ops.zeros(_STATUS_SHAPE, ms.int32), anchor))
        return ops.depend(anchor, cleared)

    def saturate(self, grads: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
        overflowed = ops.cast(ops.logical_not(all_finite(grads)), ms.int32)
        raised = ops.assign(self.status, ops.maximum(self.status, ops.ones(_STATUS_SHAPE, ms.int32) * overflowed))
        return ops.depend(ops.HyperMap()(_saturate, grads), raised)

    def _clean(self, grads: tuple[Tensor, ...]) -> Tensor:
        return ops.all(ops.equal(ops.depend(self.status, grads), 0))

    def window_clean(self, grads: tuple[Tensor, ...]) -> Tensor:
        return self._clean(grads) if self.read_register else FiniteCheck.window_clean(self, grads)

    def micro_clean(self, grads: tuple[Tensor, ...]) -> Tensor:
        return self._clean(grads) if self.read_register else FiniteCheck.micro_clean(self, grads)


def make(resolved: str) -> FiniteCheck:
    """The check object for a resolved name (see `resolve`); on a simulated card (runtime/simulated_ascend.py) the
    status register is `SaturatingDevice`'s."""
    if resolved != "status_register":
        return FiniteCheck()
    return SaturatingDevice() if simulated_ascend.active() is not None else StatusRegister()
