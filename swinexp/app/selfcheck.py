"""A minute's check of what a run on this machine's cards relies on, before a long training:

    python -m swinexp.app.selfcheck hardware=ascend amp=o1_manual       # on one card of the node; exit 1 on a failure

1. the backend and card: MindSpore sees the configured device (and, on Ascend, the configured chip);
2. precision mode: an fp32 MatMul whose result differs in fp16 comes out fp32 (Ascend's operator precision mode
   did not lower it) — the check behind `amp=o0` being fp32;
3. overflow: an fp16 step at a loss scale that overflows is skipped and the scale halved, with the overflow check
   this hardware config resolves to (on a first-generation 910: the float status register); a step at a small
   scale is not skipped, and updates the weights;
4. training: a few steps of the real train step of `model` (swin_micro by default) on the embedded data, with the
   amp policy asked for: finite losses.

`--simulate-saturation` runs check 3 against `amp.overflow.SaturatingDevice`, a stand-in for a card that saturates,
read through its status register: the logic of the 910's path, on any backend.
"""
from __future__ import annotations

import argparse
import itertools
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from swinexp.config import HardwareCfg, Plan

QUICK = ["trainer=smoke", "trainer.epochs=1", "trainer.limit_train_batches=3", "data.num_train=64",
         "data.num_val=16", "data.img_size=32", "data.batch_size=8", "model=swin_micro", "tracking=none"]


@dataclass(frozen=True)
class Check:
    name: str
    passed: bool
    detail: str


def _backend(hw: HardwareCfg) -> Check:
    import mindspore as ms

    from swinexp.runtime import hardware

    detail = f"MindSpore {ms.__version__}, device_target={ms.get_context('device_target')}"
    if hw.device_target == "Ascend":
        detail += f", card {hardware.detected_chip()} (hardware.chip={hw.chip})"
    return Check("backend and card", ms.get_context("device_target") == hw.device_target, detail)


def _precision_mode(policy_mode: str) -> Check:
    import mindspore as ms
    from mindspore import Tensor, ops

    # 1 + 2^-11 has no fp16 representation (10 mantissa bits): a MatMul computed in fp16 returns exactly 1
    a = Tensor(np.full((16, 16), 1 + 2.0**-11, np.float32))
    b = Tensor(np.eye(16, dtype=np.float32))

    @ms.jit
    def matmul(x: Tensor, y: Tensor) -> Tensor:
        return ops.matmul(x, y)

    got = float(matmul(a, b).asnumpy()[0, 0])
    fp32 = got == np.float32(1 + 2.0**-11)
    return Check("fp32 MatMul stays fp32", fp32, f"1 + 2^-11 @ I = {got!r} ({'fp32' if fp32 else 'lowered to 16 bits'})"
                 f"; precision mode {policy_mode}")


def _overflow(resolved: str, simulate: bool) -> Check:
    import mindspore as ms
    from mindspore import Tensor, nn

    from swinexp.amp import AmpPolicy, overflow
    from swinexp.engine.step import make_train_step

    def step_at(scale: float) -> tuple[float, bool, bool]:
        ms.set_seed(0)
        net = nn.SequentialCell(nn.Dense(8, 16), nn.ReLU(), nn.Dense(16, 4))
        policy = AmpPolicy("O3", ms.float16, loss_scale="dynamic", init_scale=scale)
        net = policy.apply(net)
        guard = overflow.SaturatingDevice() if simulate else overflow.make(resolved)
        step = make_train_step(net, nn.SGD(net.trainable_params(), 0.1), policy, None, True, overflow_check=guard)
        before = [p.asnumpy().copy() for p in net.trainable_params()]
        x = Tensor(np.random.default_rng(0).standard_normal((8, 8)).astype(np.float32))
        y = Tensor(np.eye(4, dtype=np.float32)[np.arange(8) % 4])
        step(x, y)
        out = step(x, y)
        changed = any(not np.array_equal(a, p.asnumpy()) for a, p in zip(before, net.trainable_params()))
        return out.loss_scale, out.overflow, changed

    big_scale, big_overflow, big_changed = step_at(2.0**40)
    small_scale, small_overflow, small_changed = step_at(2.0**4)
    passed = big_overflow and big_scale == 2.0**39 and not big_changed and not small_overflow and small_changed
    how = "status_register on a simulated saturating device" if simulate else resolved
    return Check("fp16 overflow is seen", passed,
                 f"{how}: at 2^40 overflow={big_overflow}, scale after 2 steps 2^{math.log2(big_scale):.0f}, weights "
                 f"{'changed' if big_changed else 'kept'}; at 2^4 overflow={small_overflow}, weights "
                 f"{'changed' if small_changed else 'kept'}")


def _training(plan: Plan) -> Check:
    from swinexp.build import build_experiment
    from swinexp.engine.step import make_train_step, read_all

    exp = build_experiment(plan)
    step = make_train_step(exp.model, exp.optimizer, exp.amp, exp.trainer.clip_grad, plan.hardware.mode == "graph",
                           exp.trainer.accumulation_steps)
    batches = itertools.islice(exp.train_loader.epoch(0), exp.steps_per_epoch * exp.trainer.accumulation_steps)
    outputs = [step(images, targets) for images, targets in batches]  # the LR schedule holds no more steps
    read_all(outputs)
    losses = [o.loss for o in outputs]
    return Check(f"{plan.get('model.name')} trains ({exp.amp.level})", all(map(math.isfinite, losses)),
                 "losses " + ", ".join(f"{v:.5f}" for v in losses))


def run_checks(overrides: Sequence[str], simulate_saturation: bool = False) -> list[Check]:
    """Compose `overrides` (plus quick settings), apply the hardware context, run the checks in order."""
    from swinexp.amp import overflow
    from swinexp.build import build_amp, configure_device, plan_for

    plan = plan_for([*QUICK, *overrides])
    hw = replace(plan.hardware, num_devices=1, num_nodes=1)  # one card: no msrun
    policy = build_amp(plan)
    configure_device(plan, one_process=True)
    resolved = overflow.resolve(hw.overflow_check, hw.device_target, hw.chip)
    checks: dict[str, Callable[[], Check]] = {
        "backend and card": lambda: _backend(hw),
        "fp32 MatMul stays fp32": lambda: _precision_mode(policy.ascend_precision_mode),
        "fp16 overflow is seen": lambda: _overflow(resolved, simulate_saturation),
        "training steps": lambda: _training(plan)}
    results = []
    for name, check in checks.items():
        try:
            results.append(check())
        except Exception as err:  # noqa: BLE001 - a check that cannot run has failed; say why and go on
            message = str(err).strip().splitlines()[0] if str(err).strip() else ""
            results.append(Check(name, False, f"{type(err).__name__}: {message}"))
    return results


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--simulate-saturation", action="store_true",
                        help="check overflow detection against a simulated saturating card (any backend)")
    parser.add_argument("overrides", nargs="*", help="config overrides, e.g. hardware=ascend amp=o1_manual")
    args = parser.parse_args(argv)
    results = run_checks(args.overrides, args.simulate_saturation)
    for result in results:
        print(f"{'PASS' if result.passed else 'FAIL'}  {result.name}: {result.detail}")
    failed = [r.name for r in results if not r.passed]
    print(f"self-check: {len(failed)} of {len(results)} checks failed ({', '.join(failed)})" if failed
          else f"self-check: all {len(results)} checks passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
