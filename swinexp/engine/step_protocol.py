"""`TrainStepLike`: what the training loop (engine/loop.py) uses of a train step.

`step.TrainStep` is the real one; a stand-in (the stub device step of `benchmarks.host_overhead`) implements the
same members with the same signatures. tests/test_step_protocol.py checks each against this protocol by name and
signature, and checks that the loop uses no member of its train step that is not declared here, so a member the
loop starts to use breaks the stand-in's test rather than a user's command.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from mindspore import Parameter, Tensor

    from swinexp.engine.step import StepOutput


class TrainStepLike(Protocol):
    """A train step as the loop drives it: one micro-batch per call, its outputs read later."""

    @property
    def optimizer_step(self) -> int:
        """Optimizer steps taken so far (overflow-skipped ones included)."""
        ...

    def next_compile(self) -> str | None:
        """The graph the next call compiles, or None: what the progress bar says while the host waits."""
        ...

    def __call__(self, images: Tensor, targets: Tensor) -> StepOutput:
        """Queue one micro-batch; the outputs stay on the device until read."""
        ...

    def state(self) -> dict[str, Parameter]:
        """What a checkpoint holds beside model and optimizer (loss scale, EMA weights)."""
        ...

    def swap_ema(self) -> None:
        """Exchange model and EMA weights (twice restores them)."""
        ...
