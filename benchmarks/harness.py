"""What a timed train step needs, built from the composed config the way `swinexp.build` builds it for training."""
from __future__ import annotations

import atexit
import gc
import math
from collections.abc import Callable, Sequence

import mindspore as ms
import numpy as np
from mindspore import Tensor, nn

from benchmarks.worker import IMPORT_ROOT
from swinexp.amp import overflow
from swinexp.build import (
    Plan,
    build_amp,
    build_experiment,
    build_optimization,
    configure_device,
    plan_for,
    total_batch_size,
)
from swinexp.config import CONF_DIR
from swinexp.engine.step import StepOutput, TrainStep, train_step_with
from swinexp.models.summary import summarize
from swinexp.models.swin import SwinTransformer

__all__ = ["CONF_DIR", "IMPORT_ROOT", "build_experiment", "build_optimization", "build_train_step", "compose",
           "configure_device", "forward_flops", "make_step_call", "quiet_cell_teardown", "random_batch",
           "release_compiled"]



def compose(overrides: Sequence[str]) -> Plan:
    """The plan of `python run.py <overrides>`: composed, resolved and validated as a run's."""
    return plan_for(overrides)


def build_train_step(plan: Plan, model: nn.Cell, total_steps: int) -> TrainStep:
    """`model` under the config's amp policy, optimizer and LR schedule, in the train step `fit` uses.

    Args:
        plan: The run's plan (amp, optimizer, scheduler, trainer, hardware.mode are read).
        model: The network, not yet cast (any nn.Cell: a peer's model too).
        total_steps: Calls the step will get; the LR schedule is made at least this long (per epoch of
            trainer.epochs), its LRs scaled by trainer.lr_batch_size as in training.
    """
    trainer, amp = plan.trainer, build_amp(plan)
    model = amp.apply(model)
    model.set_train(True)
    batch = int(plan.get('data.batch_size'))
    optimizer, _ = build_optimization(plan, model, total_steps, total_batch_size(plan, batch))
    hw = plan.hardware
    return train_step_with(model, optimizer, amp, trainer, overflow.resolve(hw.overflow_check, hw.device_target,
                                                                            hw.chip), hw.mode == "graph", hw.jit_level)


def random_batch(plan: Plan, seed: int) -> tuple[Tensor, Tensor]:
    """Images (B, 3, S, S) and one-hot targets (B, K) at data.batch_size, data.img_size, data.num_classes."""
    rng = np.random.default_rng(seed)
    b, s, k = int(plan.get('data.batch_size')), int(plan.get('data.img_size')), int(plan.get('data.num_classes'))
    images = rng.standard_normal((b, 3, s, s)).astype(np.float32)
    return Tensor(images), Tensor(np.eye(k, dtype=np.float32)[rng.integers(0, k, b)])


def forward_flops(model: SwinTransformer) -> int:
    """Forward FLOPs of one image, official Swin count (a multiply-add is one FLOP; swin_tiny at 224: 4.5 G)."""
    return sum(row.flops for row in summarize(model))


def make_step_call(step: TrainStep, images: Tensor, targets: Tensor) -> Callable[[], StepOutput]:
    """A zero-argument call that runs one step and fails on a non-finite loss (a broken variant, not a timing)."""

    def call() -> StepOutput:
        out = step(images, targets)  # reading its loss waits for the device: the step has finished
        if not math.isfinite(out.loss):
            raise FloatingPointError(f"train loss {out.loss}: this variant does not train; check its overrides")
        return out

    return call


def release_compiled() -> None:
    """Free what MindSpore can of the graphs compiled so far (about a third of their host memory, measured)."""
    ms.ms_memory_recycle()
    gc.collect()


def _skip_cell_del(self: nn.Cell) -> None:
    pass


def quiet_cell_teardown() -> None:
    """Keep interpreter exit free of MindSpore's "Exception ignored in Cell.__del__" tracebacks.

    MindSpore's compile cache holds every jitted step's network until the interpreter tears its modules down;
    Cell.__del__ then reads module globals that are already None and prints a traceback per cell (MindCV's cells
    show it). At that point there is nothing left to release, so the hook makes __del__ a no-op just before.
    """
    atexit.register(setattr, nn.Cell, "__del__", _skip_cell_del)
