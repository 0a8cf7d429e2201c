"""A minute's check of what a run on this machine's cards relies on, before a long training:

    python -m swinexp.app.selfcheck hardware=ascend amp=o1_manual       # on one card of the node; exit 1 on a failure

1. the backend and card: MindSpore sees the configured device and, on Ascend, reads the card's chip (a configured
   `hardware.chip` must be it); the chip's row of the capability table (runtime/chips.py) and the installed
   MindSpore/CANN are printed;
2. precision: the operator precision settings the amp policy resolves to on this chip (amp/precision.py) read back
   from MindSpore as set, and an fp32 MatMul, BatchMatMul and Conv2D whose results differ in fp16 compute as the
   chip table says (fp32 where the Cube unit has fp32 math, fp16 inputs on a first-generation 910);
3. overflow: an fp16 step at a loss scale that overflows is skipped and the scale halved, with the overflow check
   this hardware resolves to (on a first-generation 910: the float status register); a step at a small scale is not
   skipped, and updates the weights;
4. training: a few steps of the loop's own train step (`engine.step.train_step_for`: the resolved overflow check,
   EMA, accumulation) of `model` (swin_micro by default) on the embedded data: finite losses; and again with
   trainer.accumulation_steps=2.

Every failure, a card other than the configured one included, is a FAIL line with its fix. `--simulate-saturation`
runs check 3 against `amp.overflow.SaturatingDevice`; `--simulate-chip ascend910` runs every check on a stand-in
card that behaves as CANN documents that chip (runtime/simulated_ascend.py), on any machine.
"""
from __future__ import annotations

import argparse
import itertools
import math
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from swinexp.config import Plan

QUICK = ["trainer=smoke", "trainer.epochs=1", "trainer.limit_train_batches=4", "data.num_train=64",
         "data.num_val=16", "data.img_size=32", "data.batch_size=8", "model=swin_micro", "tracking=none"]
CANN_VERSION_FILES = ("version.cfg", "version.info", "compiler/version.info", "runtime/version.info")


@dataclass(frozen=True)
class Check:
    name: str
    passed: bool
    detail: str


def cann_version(env: dict[str, str] | None = None) -> str:
    """The installed CANN version as its toolkit's version file says it, or 'not found'."""
    env = os.environ if env is None else env
    for root in filter(None, (env.get("ASCEND_HOME_PATH"), env.get("ASCEND_TOOLKIT_HOME"),
                              "/usr/local/Ascend/ascend-toolkit/latest")):
        for name in CANN_VERSION_FILES:
            path = Path(root) / name
            if path.is_file():
                for line in path.read_text(errors="replace").splitlines():
                    key, _, value = line.partition("=")
                    if key.strip().lower() in ("version", "toolkit_version", "runtime_running_version"):
                        return value.strip().strip("[]")
    return "not found"


def _backend(plan: Plan) -> Check:
    import mindspore as ms

    from swinexp.runtime import chips, simulated_ascend

    hw = plan.hardware
    chip = chips.of(hw.device_target, hw.chip)
    running = ms.get_context("device_target")
    simulated = hw.device_target == "Ascend" and simulated_ascend.active() is not None
    detail = (f"MindSpore {ms.__version__}, device_target={running}"
              + (f" (a simulated {hw.chip} card)" if simulated else "")
              + (f", CANN {cann_version()}" if hw.device_target == "Ascend" else "")
              + (f"; chip {chip.row()}" if chip else ""))
    return Check("backend and card", running == hw.device_target or simulated, detail)


def _probes(dtype_fp32: bool) -> list[tuple[str, Callable[[], float]]]:
    """(name, run) of an fp32 MatMul, BatchMatMul and Conv2D whose first output is 1 + 2^-11 computed in fp32."""
    import mindspore as ms
    from mindspore import Tensor, ops
    from mindspore.ops.operations import nn_ops

    value = np.float32(1 + 2.0**-11)  # no fp16 (10 mantissa bits) nor HF32 representation: lowered, it reads 1
    eye = np.eye(16, dtype=np.float32)
    a = Tensor(np.full((16, 16), value, np.float32))

    def matmul() -> float:
        return float(ops.MatMul()(a, Tensor(eye)).asnumpy()[0, 0])

    def batch_matmul() -> float:
        return float(ops.BatchMatMul()(a.reshape(1, 16, 16), Tensor(eye[None])).asnumpy()[0, 0, 0])

    def conv2d() -> float:
        image = Tensor(np.full((1, 1, 4, 4), value, np.float32))
        kernel = Tensor(np.ones((1, 1, 1, 1), np.float32))
        return float(nn_ops.Conv2D(out_channel=1, kernel_size=1)(image, kernel).asnumpy()[0, 0, 0, 0])

    del ms, dtype_fp32
    return [("MatMul", matmul), ("BatchMatMul", batch_matmul), ("Conv2D", conv2d)]


def _precision(plan: Plan) -> Check:
    import mindspore as ms

    from swinexp.build import build_precision
    from swinexp.runtime import chips, hardware

    hw = plan.hardware
    precision, chip = build_precision(plan), chips.of(hw.device_target, hw.chip)
    read_back = ""
    if hw.device_target == "Ascend":
        got = hardware.read_precision(hardware.op_precision())
        intended = {"precision_mode": precision.precision_mode, "matmul_allow_hf32": precision.matmul_hf32,
                    "conv_allow_hf32": precision.conv_hf32}
        wrong = [f"{k}={got.get(k)!r} (set {v!r})" for k, v in intended.items() if v is not None and got.get(k) != v]
        if not got or wrong:
            return Check("precision as the chip table says", False,
                         ("MindSpore reports no operator precision settings" if not got else "read back "
                          + ", ".join(wrong)) + "; run in a fresh process, and report this MindSpore/CANN pair")
        read_back = "read back " + ", ".join(f"{k}={v}" for k, v in got.items()) + "; "
    expect_fp32 = chip is None or chip.cube_fp32_as == "fp32"
    previous = ms.get_context("mode")
    ms.set_context(mode=ms.PYNATIVE_MODE)  # the probes run as single ops, as a simulated card checks them
    try:
        results = {name: run() for name, run in _probes(expect_fp32)}
    finally:
        ms.set_context(mode=previous)
    exact = {name: got == np.float32(1 + 2.0**-11) for name, got in results.items()}
    passed = all(v == expect_fp32 for v in exact.values())
    return Check("precision as the chip table says", passed,
                 read_back + f"amp {precision.effective}: fp32 Cube ops expected "
                 + ("fp32" if expect_fp32 else "with fp16 inputs") + "; "
                 + ", ".join(f"{n} {'fp32' if e else 'lowered'}" for n, e in exact.items()))


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
        jit = ms.get_context("mode") == ms.GRAPH_MODE
        step = make_train_step(net, nn.SGD(net.trainable_params(), 0.1), policy, None, jit, overflow_check=guard)
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
    how = "status_register on a simulated saturating device" if simulate else overflow_name(resolved)
    return Check("fp16 overflow is seen", passed,
                 f"{how}: at 2^40 overflow={big_overflow}, scale after 2 steps 2^{math.log2(big_scale):.0f}, weights "
                 f"{'changed' if big_changed else 'kept'}; at 2^4 overflow={small_overflow}, weights "
                 f"{'changed' if small_changed else 'kept'}")


def overflow_name(resolved: str) -> str:
    """The resolved check as the step runs it (the simulated card's register is named as such)."""
    from swinexp.amp import overflow

    return overflow.make(resolved).name


def _training(plan: Plan, accumulation: int) -> Check:
    from swinexp.build import build_experiment
    from swinexp.engine.step import read_all, train_step_for

    plan = plan.with_values({"trainer.accumulation_steps": accumulation})
    exp = build_experiment(plan)
    step = train_step_for(exp, plan.hardware.mode == "graph")
    batches = itertools.islice(exp.train_loader.epoch(0), exp.steps_per_epoch * exp.trainer.accumulation_steps)
    outputs = [step(images, targets) for images, targets in batches]  # the LR schedule holds no more steps
    read_all(outputs)
    losses = [o.loss for o in outputs]
    return Check(f"{plan.get('model.name')} trains ({exp.amp_effective}, accumulation {accumulation})",
                 all(map(math.isfinite, losses)) and step.optimizer_step == exp.steps_per_epoch,
                 f"{step.overflow_check.name}: losses " + ", ".join(f"{v:.5f}" for v in losses)
                 + f"; {step.optimizer_step} optimizer steps")


def run_checks(overrides: Sequence[str], simulate_saturation: bool = False) -> list[Check]:
    """Compose `overrides` (plus quick settings), apply the hardware context, run the checks in order; a check that
    cannot run is a failed check that says why, and the checks after a failed backend are not run."""
    from swinexp.amp import overflow
    from swinexp.build import configure_device, plan_for

    try:
        plan = configure_device(plan_for([*QUICK, *overrides]), one_process=True)
    except Exception as err:  # noqa: BLE001 - a card that is not the configured one, a missing backend: say so
        return [Check("backend and card", False, _first_line(err))]
    hw = plan.hardware
    checks: dict[str, Callable[[], Check]] = {
        "backend and card": lambda: _backend(plan),
        "precision as the chip table says": lambda: _precision(plan),
        "fp16 overflow is seen": lambda: _overflow(overflow.resolve(hw.overflow_check, hw.device_target, hw.chip),
                                                   simulate_saturation),
        "training steps": lambda: _training(plan, 1),
        "training steps, accumulation 2": lambda: _training(plan, 2)}
    results = []
    for name, check in checks.items():
        try:
            results.append(check())
        except Exception as err:  # noqa: BLE001 - a check that cannot run has failed; say why and go on
            results.append(Check(name, False, _first_line(err)))
    return results


def _first_line(err: BaseException) -> str:
    message = str(err).strip().splitlines()[0] if str(err).strip() else ""
    return f"{type(err).__name__}: {message}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--simulate-saturation", action="store_true",
                        help="check overflow detection against a simulated saturating card (any backend)")
    parser.add_argument("--simulate-chip", choices=["ascend910", "ascend910b", "ascend910_93"],
                        help="run every check on a stand-in Ascend card of this chip (runtime/simulated_ascend.py)")
    parser.add_argument("overrides", nargs="*", help="config overrides, e.g. hardware=ascend amp=o1_manual")
    args = parser.parse_args(argv)
    overrides = list(args.overrides)
    from swinexp.runtime.simulated_ascend import SIMULATE_ENV

    before = os.environ.get(SIMULATE_ENV)
    if args.simulate_chip:  # for these checks only: a caller's process is not left simulating a card
        os.environ[SIMULATE_ENV] = args.simulate_chip
        overrides = ["hardware=ascend", "hardware.mode=pynative", *overrides]
    try:
        results = run_checks(overrides, args.simulate_saturation)
    finally:
        if before is None:
            os.environ.pop(SIMULATE_ENV, None)
        else:
            os.environ[SIMULATE_ENV] = before
    for result in results:
        print(f"{'PASS' if result.passed else 'FAIL'}  {result.name}: {result.detail}")
    failed = [r.name for r in results if not r.passed]
    print(f"self-check: {len(failed)} of {len(results)} checks failed ({', '.join(failed)})" if failed
          else f"self-check: all {len(results)} checks passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
