"""Optimizers (`conf/optimizer`) and learning-rate schedules (`conf/scheduler`).

The schedule is a per-step array: MindSpore optimizers index it with their own step counter, so the LR follows
optimizer steps exactly, with no host-side callback.
"""
from __future__ import annotations

import logging
import math
import re
from collections.abc import Sequence
from typing import Any

import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor, nn, ops

from swinexp.models.fused_cpu import DTYPE, KERNEL_MODES, FusedAdamWUpdate, FusedAdamWUpdateAll, GlobalNorm
from swinexp.registry import OPTIMIZERS, SCHEDULERS, ConfigError
from swinexp.runtime.zero_pages import zeros_like_params

log = logging.getLogger("swinexp")
NO_DECAY_NAMES = ("absolute_pos_embed", "relative_position_bias_table")


_BLOCK = re.compile(r"^layers\.(\d+)\.blocks\.(\d+)\.")
_DOWNSAMPLE = re.compile(r"^layers\.(\d+)\.downsample\.")
_STEM = ("patch_embed.", "absolute_pos_embed")


def layer_ids(names: Sequence[str]) -> dict[str, int]:
    """The layer-decay depth of each Swin parameter, as timm's `param_groups_layer_decay` assigns it through
    SwinTransformer.group_matcher(coarse=False), in the official names: the patch embedding (and an absolute
    position embedding) 0; block j of stage i 1 + the blocks before it; the patch merging that ends stage i with
    the first block of stage i+1 (timm opens that stage with it); the final norm with the last block; the head and
    anything unmatched one deeper than that (timm's last group)."""
    depths: dict[int, int] = {}
    for name in names:
        if m := _BLOCK.match(name):
            depths[int(m.group(1))] = max(depths.get(int(m.group(1)), 0), int(m.group(2)) + 1)
    first = {i: 1 + sum(depths.get(j, 0) for j in range(i)) for i in range(max(depths, default=-1) + 2)}
    last_block = sum(depths.values())
    ids = {}
    for name in names:
        if name.startswith(_STEM):
            ids[name] = 0
        elif m := _BLOCK.match(name):
            ids[name] = first[int(m.group(1))] + int(m.group(2))
        elif m := _DOWNSAMPLE.match(name):
            ids[name] = first[int(m.group(1)) + 1]
        elif name.startswith("norm."):
            ids[name] = last_block
        else:
            ids[name] = last_block + 1
    return ids


def param_groups(model: nn.Cell, weight_decay: float, layer_decay: float = 1.0,
                 head_lr_scale: float = 1.0) -> list[dict[str, Any]]:
    """Split trainable params so biases, norm weights and position tables get no weight decay (Swin recipe), and,
    with `layer_decay` < 1 or a `head_lr_scale`, by layer (`layer_ids`): the LR of layer i of n is times
    layer_decay ** (n - 1 - i) (timm's param_groups_layer_decay; the head at the full LR, the patch embedding
    least), the head's also times head_lr_scale.

    Returns:
        Groups with `params`, `weight_decay`, `lr_scale` and a `name` (decay / no_decay, or layer_<i>.decay ...).
    """
    params = model.trainable_params()
    layered = layer_decay != 1.0 or head_lr_scale != 1.0
    ids = layer_ids([p.name for p in params]) if layered else {}
    deepest = max(ids.values(), default=0)
    groups: dict[str, dict[str, Any]] = {}
    for p in params:
        skip = p.ndim <= 1 or any(name in p.name for name in NO_DECAY_NAMES)
        kind = "no_decay" if skip else "decay"
        scale = 1.0
        if layered:
            layer = ids[p.name]
            scale = layer_decay ** (deepest - layer) * (head_lr_scale if p.name.startswith("head.") else 1.0)
            kind = f"layer_{layer}.{kind}"
        group = groups.setdefault(kind, {"params": [], "weight_decay": 0.0 if skip else weight_decay,
                                         "lr_scale": scale, "name": kind})
        group["params"].append(p)
    order = ("decay", "no_decay")  # without layers: the decay group first, as before
    return sorted(groups.values(), key=lambda g: order.index(g["name"])) if not layered else list(groups.values())


OPTIMIZER_KERNELS = KERNEL_MODES  # the model's choices: MindSpore's kernels, or fused_cpu.cc's


def _adamw_update_graph(fused: bool) -> ops.MultitypeFuncGraph:
    """The per-parameter update `AdamW` maps over its parameters: MindSpore's AdamWeightDecay kernel, or (`fused`)
    swinexp's C++ one for float32 parameters (the same arguments and expression, vectorized; `models.fused_cpu`).
    """
    primitive = ops.AdamWeightDecay()
    fused_op = FusedAdamWUpdate() if fused else None
    graph = ops.MultitypeFuncGraph("adamw_update_fused" if fused else "adamw_update")

    @graph.register("Tensor", "Tensor", "Tensor", "Tensor", "Tensor", "Tensor", "Tensor", "Tensor", "Tensor",
                    "Tensor", "Tensor")
    def update(beta1: Tensor, beta2: Tensor, adam_eps: Tensor, lr_factor: Tensor, decay_factor: Tensor,
               lr: Tensor, weight_decay: Tensor, param: Parameter, m: Parameter, v: Parameter,
               grad: Tensor) -> Tensor:
        # one fused kernel per parameter (m, v and the parameter in one pass; see AdamW for the arguments): written
        # as ~20 elementwise ops per parameter, the update alone compiled for 21 s on swin_tiny (BENCHMARKS.md)
        args = (param, m, v, lr * lr_factor, beta1, beta2, adam_eps, weight_decay * decay_factor,
                ops.cast(grad, param.dtype))
        if fused_op is not None and param.dtype == DTYPE:
            return fused_op(*args)
        return primitive(*args)

    return graph


_scale_lr = ops.MultitypeFuncGraph("scale_lr")


@_scale_lr.register("Tensor", "Tensor")
def _scaled(lr: Tensor, scale: Tensor) -> Tensor:
    return lr * scale


UPDATE_STEPS = "adam_update_steps"
MINDSPORE_GROUP_KEYS = ("params", "weight_decay", "lr", "grad_centralization", "order_params")


class AdamW(nn.Optimizer):
    """torch.optim.AdamW, bias correction included, on MindSpore's fused AdamWeightDecay kernel (which has none).

    Two counters, as in the official loop: `global_step` counts optimizer steps attempted and indexes the LR
    schedule (the train step advances it on an fp16-overflow skip too), `update_steps` counts the updates taken
    and drives the bias correction (torch's GradScaler skips `optimizer.step()`, so AdamW's `step` stays).
    """

    def __init__(self, params: list[dict[str, Any]], learning_rate: float | Sequence[float],
                 beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8, kernel: str = "mindspore") -> None:
        super().__init__(learning_rate, [{k: v for k, v in g.items() if k in MINDSPORE_GROUP_KEYS} for g in params])
        # a group's `lr_scale` (layer decay) multiplies the scheduled LR of each of its parameters at every step
        scale_of = {p.name: float(g.get("lr_scale", 1.0)) for g in params for p in g["params"]}
        self.lr_scales = np.array([scale_of[p.name] for p in self._parameters], np.float32)  # per parameter
        self.group_scales = {g.get("name", str(i)): float(g.get("lr_scale", 1.0)) for i, g in enumerate(params)}
        self.scaled_lr = bool((self.lr_scales != 1.0).any())
        self.lr_scale_tensors = tuple(Tensor(s, ms.float32) for s in self.lr_scales)
        self.update = _adamw_update_graph(kernel == "fused_cpu")
        self.beta1, self.beta2, self.eps = (Tensor(x, ms.float32) for x in (beta1, beta2, eps))
        self.moments1 = zeros_like_params(self._parameters, "adam_m")
        self.moments2 = zeros_like_params(self._parameters, "adam_v")
        self.update_steps = Parameter(Tensor([0], ms.int32), name=UPDATE_STEPS, requires_grad=False)
        # fused_cpu with one LR and float32 parameters (every CPU run): the whole update as one C++ call over all
        # parameters, which also takes the train step's unscale and clip factors (`takes_gradient_factors`), and
        # the global norm as another: two graph nodes where a map over the parameters compiled ~2 s on swin_tiny
        self.takes_gradient_factors = (kernel == "fused_cpu" and not self.is_group_lr and not self.scaled_lr
                                       and all(p.dtype == DTYPE for p in self._parameters))
        if self.takes_gradient_factors:
            self.update_all = FusedAdamWUpdateAll(len(self._parameters))
            self.norm_all = GlobalNorm()
            self.decays = Tensor(np.array([g["weight_decay"] for g in params for _ in g["params"]], np.float32))
            self.one = Tensor(1.0, ms.float32)

    def gradient_norm(self, gradients: tuple[Tensor, ...], unscale: Tensor | None = None) -> Tensor:
        """The global L2 norm of `unscale` x gradients (1 when None), fp32 scalar (`takes_gradient_factors` only)."""
        return self.norm_all(self.one if unscale is None else unscale, *gradients).reshape(())

    def construct(self, gradients: tuple[Tensor, ...], unscale: Tensor | None = None, clip: Tensor | None = None,
                  apply: Tensor | None = None) -> Tensor:
        """One update from `gradients`; when `takes_gradient_factors`, each gradient is used times `unscale`, then
        times `clip` (scalars, 1 when None), as if the caller had scaled them, and a False `apply` (a bool scalar:
        the gradients overflowed) leaves parameters, moments and `update_steps` as they were, `global_step` advanced.
        """
        lr = self.get_lr()
        weight_decay = self.get_weight_decay()
        self.assignadd(self.global_step, self.global_step_increase_tensor)
        if self.takes_gradient_factors:
            apply = self.one if apply is None else ops.cast(apply, ms.float32)
            self.assignadd(self.update_steps, ops.cast(apply, ms.int32).reshape((1,)))
        else:
            self.assignadd(self.update_steps, self.global_step_increase_tensor)
        step = ops.cast(self.update_steps, ms.float32).reshape(())
        bias_c1, sqrt_bias_c2 = 1.0 - ops.pow(self.beta1, step), ops.sqrt(1.0 - ops.pow(self.beta2, step))
        # MindSpore's AdamWeightDecay: p -= lr' * (m / (sqrt(v) + eps') + wd' * p), no bias correction. With
        # lr' = lr * sqrt(bc2) / bc1, eps' = eps * sqrt(bc2) and wd' = wd * bc1 / sqrt(bc2) that is torch's
        # AdamW: p *= 1 - lr * wd; p -= lr / bc1 * m / (sqrt(v / bc2) + eps)
        lr_factor = sqrt_bias_c2 * ops.reciprocal(bias_c1)
        adam_eps, decay_factor = self.eps * sqrt_bias_c2, ops.reciprocal(lr_factor)
        if self.takes_gradient_factors:
            unscale = self.one if unscale is None else unscale
            clip = self.one if clip is None else clip
            return self.update_all(lr * lr_factor, self.beta1, self.beta2, adam_eps, decay_factor, unscale, clip,
                                   apply, self.decays, *self._parameters, *self.moments1, *self.moments2, *gradients)
        if self.scaled_lr:
            lr = self.hyper_map(ops.partial(_scale_lr, lr), self.lr_scale_tensors)  # one LR per parameter
        if self.is_group_lr or self.scaled_lr:
            update = ops.partial(self.update, self.beta1, self.beta2, adam_eps, lr_factor, decay_factor)
            return self.hyper_map(update, lr, weight_decay, self._parameters, self.moments1, self.moments2,
                                  gradients)
        update = ops.partial(self.update, self.beta1, self.beta2, adam_eps, lr_factor, decay_factor, lr)
        return self.hyper_map(update, weight_decay, self._parameters, self.moments1, self.moments2, gradients)


@OPTIMIZERS.register("adamw")
def adamw(model: nn.Cell, lr: float | Sequence[float], weight_decay: float = 0.05,
          betas: Sequence[float] = (0.9, 0.999), eps: float = 1e-8, kernel: str = "mindspore",
          layer_decay: float = 1.0, head_lr_scale: float = 1.0) -> nn.Optimizer:
    """AdamW over `model`'s trainable params with the no-decay groups; `lr` is a constant or one value per
    optimizer step, times each group's layer-decay scale (`param_groups`); `kernel` computes the update
    (`OPTIMIZER_KERNELS`)."""
    if weight_decay < 0:
        raise ConfigError(f"optimizer.weight_decay={weight_decay} must be >= 0")
    if kernel not in OPTIMIZER_KERNELS:
        raise ConfigError(f"optimizer.kernel={kernel!r} is not one of {', '.join(OPTIMIZER_KERNELS)}; fused_cpu is "
                          "swinexp's C++ update for CPU runs, mindspore the framework's kernel for any device")
    if not 0 < layer_decay <= 1:
        raise ConfigError(f"optimizer.layer_decay={layer_decay} must be in (0, 1]: each earlier layer's LR is times "
                          "it (e.g. 0.9); 1.0 = one LR for all layers")
    if head_lr_scale <= 0:
        raise ConfigError(f"optimizer.head_lr_scale={head_lr_scale} must be > 0 (1.0 = the head at the base LR)")
    groups = param_groups(model, weight_decay, layer_decay, head_lr_scale)
    if not groups:
        raise ConfigError("the model has no trainable parameter left: model.freeze covers all of them")
    return AdamW(groups, lr, beta1=betas[0], beta2=betas[1], eps=eps, kernel=kernel)


@OPTIMIZERS.register("adamw_swin")
def adamw_swin(model: nn.Cell, lr: float | Sequence[float], weight_decay: float = 0.05,
               betas: Sequence[float] = (0.9, 0.999), eps: float = 1e-8, kernel: str = "mindspore",
               layer_decay: float = 1.0, head_lr_scale: float = 1.0) -> nn.Optimizer:
    """The official Swin recipe's AdamW; its YAML quotes lr 5e-4 at total batch 512 (trainer.lr_batch_size)."""
    return adamw(model, lr, weight_decay, betas, eps, kernel, layer_decay, head_lr_scale)


def lr_scale(total_batch: int, lr_batch_size: int | None) -> float:
    """Swin's linear scaling rule: every LR of the schedule times total_batch / lr_batch_size (1 when None)."""
    if lr_batch_size is None:
        return 1.0
    if lr_batch_size <= 0:
        raise ConfigError(f"trainer.lr_batch_size={lr_batch_size} must be > 0, or null to use the LRs as given")
    return total_batch / lr_batch_size


@SCHEDULERS.register("warmup_cosine")
def warmup_cosine(base_lr: float, epochs: int, steps_per_epoch: int, warmup_epochs: float = 0.0,
                  warmup_lr: float = 5e-7, min_lr: float = 5e-6) -> np.ndarray:
    """Per-step LR: linear from warmup_lr to base_lr over warmup, then cosine from base_lr to min_lr (timm's)."""
    if base_lr <= 0:
        raise ConfigError(f"optimizer.lr={base_lr} must be > 0")
    if warmup_epochs < 0:
        raise ConfigError(f"scheduler.warmup_epochs={warmup_epochs} must be >= 0")
    total = epochs * steps_per_epoch
    warmup = int(warmup_epochs * steps_per_epoch)  # truncated, as the official build_scheduler does
    if warmup >= total > 0:
        log.warning("scheduler.warmup_epochs=%g covers the whole run (trainer.epochs=%d): the warmup is cut to the "
                    "run's %d steps and the LR stops short of optimizer.lr", warmup_epochs, epochs, total)
        warmup = total
    steps = np.arange(total, dtype=np.float64)
    warm = warmup_lr + (base_lr - warmup_lr) * steps[:warmup] / max(warmup, 1)
    progress = (steps[warmup:] - warmup) / max(total - warmup, 1)
    cosine = min_lr + 0.5 * (base_lr - min_lr) * (1 + np.cos(math.pi * progress))
    return np.concatenate([warm, cosine]).astype(np.float32)


@SCHEDULERS.register("constant")
def constant(base_lr: float, epochs: int, steps_per_epoch: int) -> np.ndarray:
    """The optimizer's lr at every step."""
    return np.full(epochs * steps_per_epoch, base_lr, np.float32)
