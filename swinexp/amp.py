"""Mixed-precision policies (`conf/amp/*.yaml`): how the network is cast and how the loss is scaled.

The train step is the only consumer of an AmpPolicy.
"""
from __future__ import annotations

from dataclasses import dataclass

from mindspore import nn

from swinexp.registry import AMP_POLICIES


@dataclass(frozen=True)
class AmpPolicy:
    """A named precision policy.

    Attributes:
        level: MindSpore-style level name, shown in logs (O0 = fp32 everywhere).
        loss_scale: constant factor the loss is multiplied by before backward and the gradients divided by after.
    """

    level: str
    loss_scale: float = 1.0

    def apply(self, network: nn.Cell) -> nn.Cell:
        """Cast `network` for this policy (in place where MindSpore allows); O0 leaves it fp32."""
        return network


@AMP_POLICIES.register("o0")
def o0() -> AmpPolicy:
    """Pure fp32: the reference every other policy is compared with."""
    return AmpPolicy(level="O0")
