"""The PyTorch reference: timm's SwinTransformer trained the way the official Swin `main.py` trains it.

Needs the `reference` extra (torch + timm); imports neither MindSpore nor the rest of swinexp, so
`tests/golden/make_golden.py` can use it too. Arrays cross the boundary as numpy.

What "the official way" means here (microsoft/Swin-Transformer main.py, optimizer.py, lr_scheduler.py, utils.py):
- AdamW over two groups: no weight decay for 1-d parameters, `*.bias`, `absolute_pos_embed` and every
  `relative_position_bias_table` (`set_weight_decay` with the model's skip list and keywords);
- timm's CosineLRScheduler per optimizer step: `warmup_t = int(warmup_epochs * steps_per_epoch)`, warmup as a
  prefix, `t_initial = total - warmup_t`, LRs scaled by total batch / 512 when the config says so;
- soft-target cross entropy on the (mixup / label-smoothing) targets of the data pipeline;
- gradient accumulation as `loss / accumulation_steps` per micro-batch, one optimizer step per window;
- torch.amp GradScaler: unscale, `clip_grad_norm_` (its norm is the logged grad norm), step (skipped on inf),
  update; the scheduler's `step_update` runs for every window, skipped or not;
- weights EMA (`Recipe.ema_decay`): timm's ModelEmaV3 updated after every optimizer step, skipped or not, as
  main.py's `model_ema.update(model)`; no step argument, so a constant decay from the first step (no warmup,
  no first-step copy), swinexp's rule: ema = decay * ema + (1 - decay) * weights, starting from the initial weights.
One difference is chosen, not copied: by default step k uses f(k) (timm's convention, as swinexp);
`lr_lag=True` reproduces main.py, which calls `step_update(k)` after step k, so step k uses f(k-1).
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from timm.models.swin_transformer import SwinTransformer
from timm.scheduler.cosine_lr import CosineLRScheduler
from timm.utils.model_ema import ModelEmaV3

NO_DECAY_NAMES = ("absolute_pos_embed",)
NO_DECAY_KEYWORDS = ("relative_position_bias_table",)
AUTOCAST_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}


def timm_swin(arch: Mapping[str, Any], random: bool = False) -> SwinTransformer:
    """timm's SwinTransformer with the architecture of a swinexp `model` config; dropout and drop path off unless
    `random` (then the config's drop_rate, attn_drop_rate and drop_path_rate).

    Raises:
        ValueError: an architecture timm's Swin cannot express (absolute position embedding).
    """
    if arch.get("ape"):
        raise ValueError("model.ape=true: timm's SwinTransformer has no absolute position embedding; "
                         "compare with model.ape=false")
    if not arch.get("patch_norm", True):
        raise ValueError("model.patch_norm=false: the timm reference always normalises the patch embedding; "
                         "compare with model.patch_norm=true")
    model = SwinTransformer(img_size=arch["img_size"], patch_size=arch["patch_size"], in_chans=arch["in_chans"],
                            num_classes=arch["num_classes"], embed_dim=arch["embed_dim"],
                            depths=tuple(arch["depths"]), num_heads=tuple(arch["num_heads"]),
                            window_size=arch["window_size"], mlp_ratio=arch["mlp_ratio"], qkv_bias=arch["qkv_bias"],
                            **(_drop_rates(arch) if random else _NO_DROP))
    return model.train()


_NO_DROP = {"drop_rate": 0.0, "proj_drop_rate": 0.0, "attn_drop_rate": 0.0, "drop_path_rate": 0.0}


def _drop_rates(arch: Mapping[str, Any]) -> dict[str, float]:
    return {"drop_rate": arch["drop_rate"], "attn_drop_rate": arch["attn_drop_rate"],
            "drop_path_rate": arch["drop_path_rate"]}


def official_resize(state: Mapping[str, torch.Tensor], model_state: Mapping[str, torch.Tensor]
                    ) -> dict[str, torch.Tensor]:
    """The resize part of microsoft/Swin-Transformer utils.py `load_pretrained` (f82860b), as written there: each
    relative position bias table of another window size by bicubic F.interpolate of its (nH, S, S) grid, and an
    absolute position embedding of another resolution the same way."""
    state = dict(state)
    for k in [k for k in state if "relative_position_bias_table" in k]:
        table, current = state[k], model_state[k]
        (L1, nH1), (L2, nH2) = table.size(), current.size()  # noqa: N806 - the official names
        if nH1 == nH2 and L1 != L2:
            S1, S2 = int(L1 ** 0.5), int(L2 ** 0.5)  # noqa: N806
            resized = F.interpolate(table.permute(1, 0).view(1, nH1, S1, S1), size=(S2, S2), mode="bicubic")
            state[k] = resized.view(nH2, L2).permute(1, 0)
    for k in [k for k in state if "absolute_pos_embed" in k]:
        (_, L1, C1), (_, L2, _) = state[k].size(), model_state[k].size()  # noqa: N806
        if L1 != L2:
            S1, S2 = int(L1 ** 0.5), int(L2 ** 0.5)  # noqa: N806
            grid = state[k].reshape(-1, S1, S1, C1).permute(0, 3, 1, 2)
            state[k] = F.interpolate(grid, size=(S2, S2), mode="bicubic").permute(0, 2, 3, 1).flatten(1, 2)
    return state


def reference_load(model: SwinTransformer, state: Mapping[str, np.ndarray], resize: str) -> None:
    """Load timm-named arrays of another window size or resolution into `model` the way the reference loaders do:
    timm's `checkpoint_filter_fn` (resize="timm") or the official `load_pretrained` resize (resize="official");
    "none" loads them as they are. The head must already fit `model`."""
    from timm.models.swin_transformer import checkpoint_filter_fn

    tensors = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in state.items()}
    if resize == "timm":
        tensors = checkpoint_filter_fn(tensors, model)
    elif resize == "official":
        tensors = official_resize(tensors, model.state_dict())
    model.load_state_dict(tensors, strict=False)  # the index/mask buffers are the model's own, as both loaders do
    left = set(dict(model.named_parameters())) - set(tensors)
    if left:
        raise ValueError(f"the reference loader set no value for {sorted(left)}")


def eval_logits(model: torch.nn.Module, images: np.ndarray) -> np.ndarray:
    """`model`'s logits on `images` in eval mode (the model is left in train mode, as the trainer keeps it)."""
    model.eval()
    try:
        with torch.no_grad():
            return model(torch.from_numpy(np.ascontiguousarray(images))).numpy()
    finally:
        model.train()


def load_numpy_state(model: torch.nn.Module, state: Mapping[str, np.ndarray]) -> None:
    """Set every parameter from timm-named arrays (convert.to_timm); every parameter must be given."""
    tensors = {k: torch.from_numpy(np.ascontiguousarray(v, dtype=np.float32)) for k, v in state.items()}
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    missing = [k for k in missing if not k.endswith(("relative_position_index", "attn_mask"))]
    if missing or unexpected:
        raise ValueError(f"weights do not fit the timm model: missing {missing[:5]}, unexpected {unexpected[:5]}")


def numpy_state(model: torch.nn.Module) -> dict[str, np.ndarray]:
    """Every parameter of `model` (no buffers) as float32 numpy, timm names."""
    return {k: v.detach().float().numpy().copy() for k, v in model.named_parameters()}


def official_param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """main.py's `set_weight_decay`: no decay for 1-d params, biases, the skip list and the skip keywords."""
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        skip = (param.ndim == 1 or name.endswith(".bias") or name in NO_DECAY_NAMES
                or any(k in name for k in NO_DECAY_KEYWORDS))
        (no_decay if skip else decay).append(param)
    return [{"params": decay}, {"params": no_decay, "weight_decay": 0.0}]


@dataclass(frozen=True)
class Recipe:
    """The official recipe's numbers, as swinexp's composed config states them (LRs already scaled)."""

    base_lr: float
    warmup_lr: float
    min_lr: float
    weight_decay: float
    betas: tuple[float, float]
    eps: float
    total_steps: int
    warmup_steps: int
    clip_grad: float | None = None
    accumulation_steps: int = 1
    amp_dtype: str | None = None      # None: fp32; "float16" / "bfloat16": torch.autocast + GradScaler
    init_scale: float = 2.0**16
    scale_factor: float = 2.0
    scale_window: int = 2000
    lr_lag: bool = False              # True: main.py's f(k-1) at step k
    ema_decay: float | None = None    # weights EMA per optimizer step (swinexp's trainer.ema.decay); None: off


def official_scheduler(optimizer: torch.optim.Optimizer, recipe: Recipe) -> CosineLRScheduler:
    """lr_scheduler.build_scheduler of the official repository, NAME=cosine, WARMUP_PREFIX=True."""
    return CosineLRScheduler(optimizer, t_initial=recipe.total_steps - recipe.warmup_steps, lr_min=recipe.min_lr,
                             warmup_lr_init=recipe.warmup_lr, warmup_t=recipe.warmup_steps, cycle_limit=1,
                             t_in_epochs=False, warmup_prefix=True)


def soft_target_cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """timm.loss.SoftTargetCrossEntropy; logits in fp32 (an fp16 log_softmax on CUDA accumulates in fp32 too)."""
    return torch.sum(-targets * F.log_softmax(logits.float(), dim=-1), dim=-1).mean()


@dataclass(frozen=True)
class StepRecord:
    """One optimizer step of the reference."""

    losses: tuple[float, ...]   # the unscaled loss of every micro-batch of the window
    lr: float                   # the LR this step used
    grad_norm: float            # global L2 norm of the unscaled, accumulated gradient before clipping
    skipped: bool               # inf/nan gradient: GradScaler skipped optimizer.step()
    loss_scale: float


class ReferenceTrainer:
    """Drive `model` through optimizer steps as the official train_one_epoch does."""

    def __init__(self, model: torch.nn.Module, recipe: Recipe) -> None:
        self.model, self.recipe = model, recipe
        self.optimizer = torch.optim.AdamW(official_param_groups(model, recipe.weight_decay), lr=recipe.base_lr,
                                           betas=recipe.betas, eps=recipe.eps, weight_decay=recipe.weight_decay)
        self.scheduler = official_scheduler(self.optimizer, recipe)
        enabled = recipe.amp_dtype == "float16"  # bf16 needs no loss scaling, as torch's own recipes
        self.scaler = torch.amp.GradScaler("cpu", init_scale=recipe.init_scale, growth_factor=recipe.scale_factor,
                                           backoff_factor=1.0 / recipe.scale_factor,
                                           growth_interval=recipe.scale_window, enabled=enabled)
        # built from the loaded weights: the EMA starts at them, as swinexp's (TrainStep.ema, init="same")
        self.ema = ModelEmaV3(model, decay=recipe.ema_decay) if recipe.ema_decay is not None else None
        self.step_index = 0

    def ema_state(self) -> dict[str, np.ndarray]:
        """The EMA weights (parameters only, timm names); empty without `Recipe.ema_decay`."""
        return numpy_state(self.ema.module) if self.ema is not None else {}

    def autocast(self) -> Any:
        dtype = AUTOCAST_DTYPES.get(self.recipe.amp_dtype or "", torch.float32)
        return torch.autocast("cpu", dtype=dtype, enabled=self.recipe.amp_dtype is not None)

    def step(self, window: Sequence[tuple[np.ndarray, np.ndarray]]) -> StepRecord:
        """One optimizer step over the `accumulation_steps` micro-batches (images, soft targets) of `window`."""
        if not self.recipe.lr_lag:
            self.scheduler.step_update(self.step_index)  # f(k) at step k, as timm's own train loop
        lr = float(self.optimizer.param_groups[0]["lr"])
        scale = float(self.scaler.get_scale()) if self.scaler.is_enabled() else 1.0
        losses = []
        for images, targets in window:
            with self.autocast():
                logits = self.model(torch.from_numpy(images))
            loss = soft_target_cross_entropy(logits, torch.from_numpy(targets))
            losses.append(float(loss.detach()))
            self.scaler.scale(loss / len(window)).backward()
        self.scaler.unscale_(self.optimizer)
        params = [p for p in self.model.parameters() if p.grad is not None]
        if self.recipe.clip_grad is not None:
            norm = float(torch.nn.utils.clip_grad_norm_(params, self.recipe.clip_grad))
        else:
            norm = float(torch.norm(torch.stack([torch.norm(p.grad.detach(), 2.0) for p in params]), 2.0))
        steps_before = self._update_count()
        self.scaler.step(self.optimizer)
        self.scaler.update()
        skipped = self._update_count() == steps_before
        self.optimizer.zero_grad(set_to_none=True)
        if self.ema is not None:
            self.ema.update(self.model)  # step=None: the constant decay; after a skipped step too, as main.py
        if self.recipe.lr_lag:
            self.scheduler.step_update(self.step_index)  # main.py: after the step, so step k+1 uses f(k)
        self.step_index += 1
        return StepRecord(tuple(losses), lr, norm, skipped, scale)

    def _update_count(self) -> int:
        state = self.optimizer.state.get(next(iter(self.model.parameters())), {})
        return int(state.get("step", 0))


def stage_names(model: SwinTransformer) -> dict[str, torch.nn.Module]:
    """swinexp's stage names (amp.report.stage_outputs) -> timm module; timm opens stage i+1 with stage i's merge."""
    names: dict[str, torch.nn.Module] = {"patch_embed": model.patch_embed}
    for i, layer in enumerate(model.layers):
        if i > 0:
            names[f"stage{i - 1}.downsample"] = layer.downsample
        for j, block in enumerate(layer.blocks):
            names[f"stage{i}.block{j}"] = block
    names["norm"] = model.norm
    names["logits"] = model.head
    return _in_forward_order(names)


def _in_forward_order(names: dict[str, torch.nn.Module]) -> dict[str, torch.nn.Module]:
    def key(item: tuple[str, torch.nn.Module]) -> tuple[float, float, float]:
        name = item[0]
        if name == "patch_embed":
            return (-1, 0, 0)
        if name in ("norm", "logits"):
            return (math.inf, name == "logits", 0)
        stage, part = name.split(".")
        return (int(stage[5:]), part == "downsample", int(part[5:]) if part.startswith("block") else 0)

    return dict(sorted(names.items(), key=key))


def stage_activations(model: SwinTransformer, images: np.ndarray, targets: np.ndarray,
                      amp_dtype: str | None = None) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], float]:
    """Per stage: the output (as (B, L, C) tokens) and the loss gradient with respect to it, plus the loss.

    The gradient with respect to a stage's output is the input gradient of the stage after it; "images" holds
    the gradient with respect to the input batch. Parameter gradients are cleared again.
    """
    outputs: dict[str, torch.Tensor] = {}

    def keep(name: str):
        def hook(_module: torch.nn.Module, _inputs: Any, output: torch.Tensor) -> None:
            output.retain_grad()
            outputs[name] = output
        return hook

    handles = [module.register_forward_hook(keep(name)) for name, module in stage_names(model).items()]
    try:
        x = torch.from_numpy(images).requires_grad_(True)
        dtype = AUTOCAST_DTYPES.get(amp_dtype or "", torch.float32)
        with torch.autocast("cpu", dtype=dtype, enabled=amp_dtype is not None):
            logits = model(x)
        loss = soft_target_cross_entropy(logits, torch.from_numpy(targets))
        loss.backward()
    finally:
        for handle in handles:
            handle.remove()
    model.zero_grad(set_to_none=True)
    values = {k: _tokens(v.detach()) for k, v in outputs.items()}
    grads = {k: _tokens(v.grad) for k, v in outputs.items() if v.grad is not None}
    grads["images"] = x.grad.numpy().copy()
    return values, grads, float(loss.detach())


def _tokens(t: torch.Tensor) -> np.ndarray:
    """(B, H, W, C) timm feature maps as swinexp's (B, H*W, C) tokens; logits pass through."""
    t = t.float()
    return (t.reshape(t.shape[0], -1, t.shape[-1]) if t.ndim == 4 else t).numpy().copy()


def autocast_note(amp_dtype: str) -> str | None:
    """None when torch.autocast runs `amp_dtype` on this CPU, else what the reference falls back to and why."""
    try:
        with torch.autocast("cpu", dtype=AUTOCAST_DTYPES[amp_dtype]):
            y = torch.nn.functional.linear(torch.ones(2, 4), torch.ones(3, 4))
        if y.dtype != AUTOCAST_DTYPES[amp_dtype]:
            return f"torch.autocast on this CPU computes {y.dtype} instead of {amp_dtype}"
    except RuntimeError as err:
        return f"torch.autocast(cpu, {amp_dtype}) is not supported here ({err})"
    return None


def batches_to_windows(batches: Iterable[tuple[np.ndarray, np.ndarray]],
                       size: int) -> Iterable[list[tuple[np.ndarray, np.ndarray]]]:
    """Group micro-batches into accumulation windows of `size` (a last incomplete window is dropped)."""
    window: list[tuple[np.ndarray, np.ndarray]] = []
    for batch in batches:
        window.append(batch)
        if len(window) == size:
            yield window
            window = []
