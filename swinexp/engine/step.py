"""The train step: forward, soft-target loss, scaled backward, accumulation, overflow skip, clipping, update, EMA.

One optimizer step per `accumulation_steps` micro-batches. Per micro-batch the scaled gradient is added to a
persistent buffer; the last micro-batch of a window then unscales the sum (divided by N), checks it is finite,
clips its global norm, updates the optimizer (and EMA), adjusts the loss scale, and clears the buffer by
subtraction. All of that runs inside one jitted function per micro-batch kind; the host only counts micro-batches
and optimizer steps, and reads the step's outputs when it needs them (`StepOutput`, `read_all`): no device sync per
step. How overflow is seen depends on the device (`amp/overflow.py`: the gradients' norm, or an Ascend 910's float
status register, cleared before each forward and read after its backward).

The model's random decisions (stochastic depth, dropout) are inputs of the step, drawn on the host per micro-batch
from counters (seed, rank, optimizer step, micro-batch, site; models/randomness.py): no kernel RNG state, so a
resumed or repeated run draws exactly what the original drew.
"""
from __future__ import annotations

import logging
from typing import Callable

import mindspore as ms
import numpy as np
from mindspore import Parameter, ParameterTuple, Tensor, nn, ops
from mindspore.amp import DynamicLossScaler

from swinexp.amp import AmpPolicy, overflow
from swinexp.amp.overflow import FiniteCheck
from swinexp.config import ACCUMULATE_ON, TrainerCfg
from swinexp.engine.experiment import Experiment
from swinexp.models.randomness import RandomSites, draw, philox_key
from swinexp.registry import ConfigError
from swinexp.runtime.zero_pages import zeros_like_params

log = logging.getLogger("swinexp")

TRAIN_GRAPH = "the train step"                # the graph that ends an optimizer step
ACCUMULATION_GRAPH = "the accumulation step"  # the graph of the other micro-batches of a window


class StepOutput:
    """What one micro-batch reports, kept on the device until it is read.

    The step packs (loss, grad norm, overflow, loss scale) into one fp32 vector inside the jitted graph; nothing is
    copied to the host until a field is read, so the host can queue the next step while the device runs this one.
    `read_all` copies many outputs with one transfer (the loop does that every trainer.log_every_n_steps). The
    update fields are meaningful only when `updated` is True (nan / False otherwise).
    """

    __slots__ = ("packed", "updated", "_values")

    def __init__(self, packed: Tensor, updated: bool) -> None:
        self.packed = packed    # fp32 (4,): loss, grad_norm, overflow (0/1), loss_scale
        self.updated = updated  # this micro-batch closed an accumulation window (an optimizer step was attempted)
        self._values: np.ndarray | None = None

    def values(self) -> np.ndarray:
        if self._values is None:
            self._values = self.packed.asnumpy()
        return self._values

    @property
    def loss(self) -> float:
        """This micro-batch's unscaled loss."""
        return float(self.values()[0])

    @property
    def grad_norm(self) -> float:
        """Global L2 norm of the unscaled, accumulated gradient before clipping."""
        return float(self.values()[1])

    @property
    def overflow(self) -> bool:
        """The gradient overflowed (not finite, or the device's status register said so): the update was skipped."""
        return bool(self.values()[2])

    @property
    def loss_scale(self) -> float:
        """The scale the window's gradients were computed with."""
        return float(self.values()[3])


def read_all(outputs: list[StepOutput]) -> None:
    """Copy every unread output to the host in one transfer (one device sync instead of one per output)."""
    unread = [o for o in outputs if o._values is None]
    if not unread:
        return
    values = (ops.stack([o.packed for o in unread]) if len(unread) > 1 else unread[0].packed[None]).asnumpy()
    for output, row in zip(unread, values):
        output._values = row


def _pack(loss: Tensor, norm: Tensor, overflow: Tensor, scale: Tensor) -> Tensor:
    return ops.stack([ops.cast(v, ms.float32).reshape(()) for v in (loss, norm, overflow, scale)])


def log_softmax(logits: Tensor) -> Tensor:
    """log_softmax over the last axis in fp32, as z - max - log1p(sum(exp(z - max)) - 1).

    Two MindSpore 2.10 CPU kernels are avoided (BENCHMARKS.md, 2026-12-07, with their reproducers): LogSoftmax
    returned the result of an earlier call from about its 13th call on under a malloc other than glibc's, and Log
    differs in the last bit while it tunes its parallel split (its 6th to 15th call) at some batch sizes (4, 5, 9,
    12, 20, ...). Log1p did not, at any size tried. The sum is at least 1 (its max term is exp(0)), so sum - 1 is
    exact up to 2 and within an ulp of the sum beyond. The max is a constant of the gradient, as in any log-sum-exp.
    """
    z = ops.cast(logits, ms.float32)
    shifted = z - ops.stop_gradient(ops.amax(z, -1, True))
    return shifted - ops.log1p(ops.sum(ops.exp(shifted), dim=-1, keepdim=True) - 1.0)


def soft_target_cross_entropy(logits: Tensor, targets: Tensor) -> Tensor:
    """Mean over the batch of -sum(targets * log_softmax(logits)); targets are (B, K) probabilities."""
    return ops.mean(ops.sum(-targets * log_softmax(logits), dim=-1))


# Per-parameter work is written as MultitypeFuncGraphs mapped over the gradient tuple, not as Python loops or
# comprehensions: a loop is unrolled into one graph node per parameter when the step is parsed, and compiling
# those nodes dominated the first step (swin_micro: 21 s -> 8 s, swin_tiny: see BENCHMARKS.md); the HyperMap
# computes the same ops.
_map = ops.HyperMap()
_square_sum = ops.MultitypeFuncGraph("square_sum")
_times = ops.MultitypeFuncGraph("times")
_ema_update = ops.MultitypeFuncGraph("ema_update")
_accumulate = ops.MultitypeFuncGraph("accumulate")
_clear = ops.MultitypeFuncGraph("clear")


_dot_square_sum = ops.MultitypeFuncGraph("dot_square_sum")
_dot_self = ops.MatMul(transpose_b=True)


@_square_sum.register("Tensor")
def _square_sum_tensor(grad: Tensor) -> Tensor:
    return ops.sum(ops.square(ops.cast(grad, ms.float32)))


@_dot_square_sum.register("Tensor")
def _dot_square_sum_tensor(grad: Tensor) -> Tensor:
    """sum(grad ** 2) in fp32 as a (1, 1) tensor: a (1, n) x (n, 1) MatMul."""
    flat = ops.reshape(ops.cast(grad, ms.float32), (1, -1))
    return _dot_self(flat, flat)


@_times.register("Tensor", "Tensor")
def _times_tensor(factor: Tensor, grad: Tensor) -> Tensor:
    return grad * ops.cast(factor, grad.dtype)


@_ema_update.register("Number", "Tensor", "Tensor")
def _ema_update_tensor(decay: float, ema: Parameter, param: Parameter) -> Tensor:
    return ops.assign(ema, ema * decay + ops.cast(param, ema.dtype) * (1.0 - decay))


@_accumulate.register("Function", "Tensor", "Tensor")
def _accumulate_tensor(assign_add: ops.Primitive, buf: Parameter, grad: Tensor) -> Tensor:
    return assign_add(buf, ops.cast(grad, buf.dtype))


@_clear.register("Function", "Tensor")
def _clear_tensor(assign_sub: ops.Primitive, buf: Parameter) -> Tensor:
    return assign_sub(buf, buf)  # clear by subtraction: no second, all-zeros buffer


def global_norm(grads: tuple[Tensor, ...], dot: bool = False) -> Tensor:
    """L2 norm of all gradients together, in fp32.

    Args:
        grads: The gradients.
        dot: Square sums as dot products (MatMuls) kept (1, 1) until the total, for CPUs: on MindSpore 2.10's CPU
            backend ReduceSum(Square(g)) over swin_tiny's gradients took ~160 ms per step, these ~26 ms, and
            compile as fast (BENCHMARKS.md). Not on accelerators, whose fp32 MatMuls may compute in lower precision.
    """
    square_sum = _dot_square_sum if dot else _square_sum
    return ops.reshape(ops.sqrt(ops.addn(_map(square_sum, grads))), ())


def scale_all(grads: tuple[Tensor, ...], factor: Tensor) -> tuple[Tensor, ...]:
    """Every gradient times the scalar `factor` (cast to each gradient's dtype)."""
    return _map(ops.partial(_times, factor), grads)


def clip_coefficient(norm: Tensor, max_norm: float) -> Tensor:
    """torch.nn.utils.clip_grad_norm_'s factor: max_norm / (norm + 1e-6) when that is < 1, else 1."""
    return ops.minimum(max_norm / (norm + 1e-6), 1.0)


def clip_by_global_norm(grads: tuple[Tensor, ...], norm: Tensor, max_norm: float) -> tuple[Tensor, ...]:
    """torch.nn.utils.clip_grad_norm_: every gradient times `clip_coefficient`."""
    return scale_all(grads, clip_coefficient(norm, max_norm))


class GraphStep(nn.Cell):
    """A step function compiled as the construct of a Cell that owns every Parameter the function touches.

    MindSpore binds a compiled graph to the values of its Cell's parameters (`parameters_dict`); a graph loaded from
    its compile cache (`hardware.compile_cache`) is bound to nothing else. A plain `ms.jit` function that closes
    over the model ran a cached graph on uninitialized weights (NaN losses on CPU; BENCHMARKS.md has the minimal
    reproduction), so the step's functions are compiled as this Cell, with `owners` registered under it.

    Args:
        fn: The step function (images, targets, *draws) -> outputs.
        owners: The cells and parameters `fn` reads or writes; they keep their names (no prefix is added).
    """

    def __init__(self, fn: Callable[..., object], owners: dict[str, nn.Cell | ParameterTuple]) -> None:
        super().__init__(auto_prefix=False)
        self.fn = fn
        for name, owner in owners.items():
            setattr(self, name, owner)

    def construct(self, *inputs: Tensor) -> object:
        return self.fn(*inputs)


def random_sites(model: nn.Cell) -> RandomSites | None:
    """The `RandomSites` of the network inside `model` (an AMP wrapper's backbone too), or None: it draws nothing."""
    for _, cell in model.cells_and_names():
        sites = getattr(cell, "random_sites", None)
        if isinstance(sites, RandomSites):
            return sites
    return None


class TrainStep:
    """Callable `(images, soft targets) -> StepOutput`, one micro-batch per call.

    A model with `random_sites` (SwinTransformer) is called as `model(images, drop_scales, dropout_keys)` with the
    draws of `randomness.draw` for (seed, rank, optimizer step, micro-batch in the window); the optimizer step is
    read from `optimizer.global_step`, so a step restored from a checkpoint continues the same draws. (A window
    skipped for overflow leaves the step where it was and the next window reuses its draws; only the losses of
    the skipped window saw them.)

    Args:
        model: the (AMP-cast) network; its output is cast to fp32 for the loss.
        optimizer: updated once per `accumulation_steps` calls; its `global_step` counts optimizer steps, an
            overflow-skipped one included (it indexes the LR schedule).
        amp: the policy whose loss scaler (and overflow skip) the step uses.
        clip_grad: max global L2 norm of the unscaled, accumulated gradient; None disables clipping.
        jit: compile the step functions with `ms.jit` (graph mode) or run them eagerly.
        accumulation_steps: micro-batches per optimizer step; gradients are averaged over them.
        accumulate_on: "device" or "cpu": where the accumulate/clear ops run (primitive_target, graph mode only).
        ema_decay: keep an exponential moving average of the weights, updated per optimizer step; None disables.
        distributed: data parallel under msrun: average the accumulated gradient over ranks at the update only
            (not per micro-batch), before unscaling, the overflow check and clipping. Each rank draws its own masks.
        seed: keys the draws; None takes the process seed (`mindspore.get_seed()`, set by `hardware.apply`).
        rank: this worker's rank (distributed only): each rank draws its own masks.
        overflow_check: how overflow is seen on this device (amp/overflow.py); None: `isfinite`.
        jit_level: hardware.jit_level for `ms.jit` (O0, O1, O2); None: ms.jit's own default, O0.
    """

    def __init__(self, model: nn.Cell, optimizer: nn.Optimizer, amp: AmpPolicy, clip_grad: float | None = None,
                 jit: bool = True, accumulation_steps: int = 1, accumulate_on: str = "device",
                 ema_decay: float | None = None, distributed: bool = False, seed: int | None = None,
                 overflow_check: FiniteCheck | None = None, rank: int = 0, jit_level: str | None = None) -> None:
        if accumulation_steps < 1:
            raise ConfigError(f"trainer.accumulation_steps={accumulation_steps} must be >= 1")
        if accumulate_on not in ACCUMULATE_ON:
            raise ConfigError(f"trainer.accumulate_on='{accumulate_on}' is not valid; choose one of: "
                              f"{', '.join(ACCUMULATE_ON)}")
        self.accumulation_steps = accumulation_steps
        self.scaler = amp.make_scaler()
        self.params = optimizer.parameters
        self.ema = self.params.clone(prefix="ema", init="same") if ema_decay is not None else None
        self._micro = 0  # micro-batches seen in the current window (host-side: it picks the function to call)
        self.sites = random_sites(model)
        self.global_step = optimizer.global_step
        self._host_step: int | None = None  # optimizer steps so far, counted on the host after one first read
        guard = self.overflow_check = overflow_check if overflow_check is not None else FiniteCheck()
        seed = (ms.get_seed() or 0) if seed is None else seed
        self.key = philox_key(int(seed), rank if distributed else 0)
        grad_fn = ms.value_and_grad(self._forward_fn(model), None, self.params, has_aux=True)
        apply_update = self._update_fn(optimizer, clip_grad, ema_decay, distributed, amp.loss_scale == "none")
        owners = {"model": model, "optimizer": optimizer, "state": ParameterTuple(self.state().values()),
                  "overflow_check": guard}
        self._not_compiled = {TRAIN_GRAPH, ACCUMULATION_GRAPH} if jit else set()  # graphs not yet called here

        def compile_(fn: Callable[..., object]) -> Callable[..., object]:
            return ms.jit(GraphStep(fn, owners), jit_level=jit_level or "O0") if jit else fn

        if accumulation_steps == 1:
            # no buffer at all: the update consumes this micro-batch's gradient directly
            def fused(images: Tensor, targets: Tensor, *draws: Tensor) -> Tensor:
                (_, loss), grads = grad_fn(guard.clear(images), targets, *draws)
                grads = guard.saturate(grads)
                return _pack(loss, *apply_update(grads, 1.0, guard.window_clean(grads)))

            self._last = compile_(fused)
            return
        # locals, not attributes: ms.jit reads a plain object's attributes as constants, so writes would be lost
        accum = self.accum = zeros_like_params(self.params, "grad_accum")
        # a non-finite micro-batch is not added (the buffer must stay finite to clear by subtraction: inf-inf=nan);
        # this flag remembers it so the whole window's update is skipped
        window_overflow = self.window_overflow = Parameter(Tensor(False, ms.bool_), name="grad_accum_window_overflow",
                                                           requires_grad=False)
        owners["buffers"] = ParameterTuple([*accum, window_overflow])
        assign_add, assign_sub = ops.AssignAdd(), ops.AssignSub()
        if accumulate_on == "cpu":
            assign_add.set_device("CPU")
            assign_sub.set_device("CPU")
            _explain_cpu_placement(jit)

        def accumulate_one(images: Tensor, targets: Tensor, *draws: Tensor) -> Tensor:
            (_, loss), grads = grad_fn(guard.clear(images), targets, *draws)
            grads = guard.saturate(grads)
            if guard.micro_clean(grads):
                _map(ops.partial(_accumulate, assign_add), accum, grads)
            else:
                ops.assign(window_overflow, ops.ones((), ms.bool_))
            return loss

        def accumulate(images: Tensor, targets: Tensor, *draws: Tensor) -> Tensor:
            loss = accumulate_one(images, targets, *draws)
            nan = ops.fill(ms.float32, (), float("nan"))
            return _pack(loss, nan, ops.zeros((), ms.float32), nan)

        def accumulate_and_update(images: Tensor, targets: Tensor, *draws: Tensor) -> Tensor:
            loss = accumulate_one(images, targets, *draws)
            clean = ops.logical_not(window_overflow)
            out = apply_update(tuple(accum), float(accumulation_steps), clean)
            _map(ops.partial(_clear, assign_sub), accum)
            ops.assign(window_overflow, ops.zeros((), ms.bool_))
            return _pack(loss, *out)

        self._accumulate = compile_(accumulate)
        self._last = compile_(accumulate_and_update)

    def _forward_fn(self, model: nn.Cell) -> Callable[..., tuple[Tensor, Tensor]]:
        scaler = self.scaler

        def forward(images: Tensor, targets: Tensor, *draws: Tensor) -> tuple[Tensor, Tensor]:
            loss = soft_target_cross_entropy(model(images, *draws), targets)
            return scaler.scale(loss), loss  # grads follow the first (scaled) output; the second is aux

        return forward

    def _update_fn(self, optimizer: nn.Optimizer, clip_grad: float | None, ema_decay: float | None,
                   distributed: bool, unscaled: bool) -> Callable[..., tuple[Tensor, Tensor, Tensor]]:
        scaler, params, ema = self.scaler, self.params, self.ema
        adjusts_scale = isinstance(scaler, DynamicLossScaler)  # a static scaler's adjust() does nothing
        advance = ops.AssignAdd()
        dot_norm = ms.get_context("device_target") == "CPU"  # see global_norm
        fold_factors = getattr(optimizer, "takes_gradient_factors", False)  # optim.AdamW, optimizer.kernel=fused_cpu
        if distributed:
            reduce_grads = nn.DistributedGradReducer(params, mean=True)
            all_sum = ops.AllReduce(ops.ReduceOp.SUM)

        def apply_update(grads: tuple[Tensor, ...], count: float,
                         clean: Tensor) -> tuple[Tensor, Tensor, Tensor]:
            """Average `grads` (a sum over `count` micro-batches), unscale, skip if not finite, clip, step."""
            scale = scaler.scale_value + 0.0  # the scale these grads carry, before adjust() changes it
            if distributed:
                grads = reduce_grads(grads)  # mean over ranks, once per optimizer step
                # a rank that dropped an overflowing micro-batch makes every rank skip, so weights stay equal
                clean = all_sum(ops.cast(ops.logical_not(clean), ms.float32)) == 0
            # decided when the graph is built: no pass of x1.0 over every grad
            unscale = None if unscaled and count == 1.0 else 1.0 / (scale * count)
            if fold_factors:  # the optimizer's kernels apply unscale and clip as they read the gradients
                norm = optimizer.gradient_norm(grads, unscale)
            else:
                if unscale is not None:
                    grads = scale_all(grads, unscale)
                norm = global_norm(grads, dot_norm)
            # finite norm <=> finite gradients on an IEEE device (short of a norm above 1.8e19, a diverged run), and
            # no second pass over every gradient: all_finite's per-parameter checks cost ~1.5 s of compile and
            # ~0.15 s per step. A saturating Ascend keeps the norm finite: there `clean` carries its status register.
            finite = ops.logical_and(ops.isfinite(norm), clean)
            if fold_factors:
                # no branch in the graph (it split the step into four kernel graphs and compiled ~0.5 s longer): the
                # kernel updates nothing when not finite, and the optimizer advances global_step either way
                optimizer(grads, unscale, None if clip_grad is None else clip_coefficient(norm, clip_grad), finite)
            elif finite:
                if clip_grad is not None:
                    grads = clip_by_global_norm(grads, norm, clip_grad)
                optimizer(grads)
            else:
                # a skipped step still advances the LR schedule, as the official loop's step_update on every
                # iteration; the update count behind AdamW's bias correction stays (optim.AdamW.update_steps)
                advance(optimizer.global_step, optimizer.global_step_increase_tensor)
            if ema_decay is not None:
                # every optimizer step, skipped or not, as the official main.py and timm's train.py call
                # model_ema.update(model) after the loss scaler: a skipped one pulls the EMA toward unchanged weights
                _map(ops.partial(_ema_update, ema_decay), ema, params)
            if adjusts_scale:  # a no-op adjust left in the graph made MindSpore warn that it eliminated it
                scaler.adjust(finite)
            return norm, ops.logical_not(finite), scale

        return apply_update

    @property
    def optimizer_step(self) -> int:
        """Optimizer steps taken (overflow-skipped ones included, as `optimizer.global_step` counts them).

        Read from the device once, the first time (after a checkpoint was loaded into the optimizer), then counted
        on the host: every window advances `global_step` by one, skipped or not, so no read is needed per step.
        """
        if self._host_step is None:
            self._host_step = int(self.global_step.asnumpy().reshape(-1)[0])
        return self._host_step

    def draws(self, batch: int) -> tuple[Tensor, ...]:
        """The random inputs of the next micro-batch (empty for a model without random sites)."""
        if self.sites is None:
            return ()
        return tuple(Tensor(a) for a in draw(self.sites, self.key, self.optimizer_step, self._micro, batch))

    def next_compile(self) -> str | None:
        """The graph the next call compiles (its first call in this process), or None: what a progress bar says
        while the host waits."""
        graph = ACCUMULATION_GRAPH if self._micro + 1 < self.accumulation_steps else TRAIN_GRAPH
        return graph if graph in self._not_compiled else None

    def __call__(self, images: Tensor, targets: Tensor) -> StepOutput:
        step = self.optimizer_step
        draws = self.draws(int(images.shape[0]))
        self._micro += 1
        if self._micro < self.accumulation_steps:
            self._not_compiled.discard(ACCUMULATION_GRAPH)
            return StepOutput(self._accumulate(images, targets, *draws), False)
        self._not_compiled.discard(TRAIN_GRAPH)
        self._micro = 0
        packed = self._last(images, targets, *draws)
        self._host_step = step + 1
        return StepOutput(packed, True)

    def state(self) -> dict[str, Parameter]:
        """What a checkpoint must hold beside model and optimizer to resume exactly: the loss scaler's scale and
        counter, and the EMA weights. (The accumulation buffer is empty at every optimizer-step boundary.)"""
        scaler = {f"loss_scale.{k}": v for k, v in vars(self.scaler).items() if isinstance(v, Parameter)}
        return {**scaler, **({p.name: p for p in self.ema} if self.ema is not None else {})}

    def swap_ema(self) -> None:
        """Exchange the model weights and the EMA weights (call twice to restore); evaluation uses it."""
        if self.ema is None:
            raise RuntimeError("swap_ema() needs ema_decay (trainer.ema.decay) set")
        for p, e in zip(self.params, self.ema):
            current = p.asnumpy().copy()
            p.set_data(Tensor(e.asnumpy()))
            e.set_data(Tensor(current))


def _explain_cpu_placement(jit: bool) -> None:
    """Say when trainer.accumulate_on=cpu cannot take effect, instead of silently ignoring it."""
    device = ms.get_context("device_target")
    if device == "CPU":
        log.info("trainer.accumulate_on=cpu: the device is already the CPU; accumulation runs there as usual")
    elif not jit or ms.get_context("mode") != ms.GRAPH_MODE:
        log.warning("trainer.accumulate_on=cpu: primitive_target is honoured only in graph mode; in pynative the "
                    "accumulate/clear ops run on %s. Use hardware.mode=graph to place them on the CPU", device)


def make_train_step(model: nn.Cell, optimizer: nn.Optimizer, amp: AmpPolicy, clip_grad: float | None,
                    jit: bool, accumulation_steps: int = 1, accumulate_on: str = "device",
                    ema_decay: float | None = None, distributed: bool = False, seed: int | None = None,
                    overflow_check: FiniteCheck | None = None, rank: int = 0,
                    jit_level: str | None = None) -> TrainStep:
    """Build the train step; see TrainStep for the arguments."""
    return TrainStep(model, optimizer, amp, clip_grad, jit, accumulation_steps, accumulate_on, ema_decay,
                     distributed, seed, overflow_check, rank, jit_level)


def train_step_for(exp: Experiment, jit: bool, distributed: bool = False, rank: int = 0) -> TrainStep:
    """The train step of `exp` exactly as `fit` runs it, for the loop and the self-check (see `train_step_with`).

    Args:
        jit: compile the step (hardware.mode=graph).
        distributed: under msrun (data parallel); `rank` is this worker's.
    """
    return train_step_with(exp.model, exp.optimizer, exp.amp, exp.trainer, exp.overflow_check, jit,
                           exp.jit_level, distributed, rank)


def train_step_with(model: nn.Cell, optimizer: nn.Optimizer, amp: AmpPolicy, trainer: TrainerCfg,
                    overflow_check: str, jit: bool, jit_level: str | None = None, distributed: bool = False,
                    rank: int = 0) -> TrainStep:
    """The one factory of the train step as a run uses it — the overflow check resolved for the card
    (`amp.overflow.resolve`), EMA, accumulation and its placement, clipping, the jit level — for the loop, the
    self-check and the benchmarks (whose peers' models are no Experiment) alike."""
    return make_train_step(model, optimizer, amp, trainer.clip_grad, jit, trainer.accumulation_steps,
                           trainer.accumulate_on, trainer.ema.decay, distributed,
                           overflow_check=overflow.make(overflow_check), rank=rank, jit_level=jit_level)
