"""The train step: forward, soft-target loss, backward, clipping, optimizer update — one closure, jitted once."""
from __future__ import annotations

from typing import Callable

import mindspore as ms
from mindspore import Tensor, nn, ops

from swinexp.amp import AmpPolicy

TrainStep = Callable[[Tensor, Tensor], tuple[Tensor, Tensor]]


def soft_target_cross_entropy(logits: Tensor, targets: Tensor) -> Tensor:
    """Mean over the batch of -sum(targets * log_softmax(logits)); targets are (B, K) probabilities."""
    return ops.mean(ops.sum(-targets * ops.log_softmax(ops.cast(logits, ms.float32), axis=-1), dim=-1))


def global_norm(grads: tuple[Tensor, ...]) -> Tensor:
    """L2 norm of all gradients together, in fp32."""
    return ops.sqrt(ops.addn([ops.sum(ops.square(ops.cast(g, ms.float32))) for g in grads]))


def make_train_step(model: nn.Cell, optimizer: nn.Optimizer, amp: AmpPolicy, clip_grad: float | None,
                    jit: bool) -> TrainStep:
    """(images, soft targets) -> (loss, global grad norm before clipping); updates `optimizer.parameters`."""

    def forward(images: Tensor, targets: Tensor) -> Tensor:
        return soft_target_cross_entropy(model(images), targets) * amp.loss_scale

    grad_fn = ms.value_and_grad(forward, None, optimizer.parameters)

    def step(images: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
        scaled_loss, grads = grad_fn(images, targets)
        grads = tuple(g / amp.loss_scale for g in grads)
        grad_norm = global_norm(grads)
        if clip_grad is not None:
            # torch.nn.utils.clip_grad_norm_: scale by max_norm / (norm + 1e-6) only when that is < 1
            factor = ops.minimum(clip_grad / (grad_norm + 1e-6), 1.0)
            grads = tuple(g * ops.cast(factor, g.dtype) for g in grads)
        optimizer(grads)
        return scaled_loss / amp.loss_scale, grad_norm

    return ms.jit(step) if jit else step
