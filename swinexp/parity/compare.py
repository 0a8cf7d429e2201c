"""`check(plan)`: train swinexp and the PyTorch reference side by side from the same weights and batches.

Everything on the swinexp side comes from `build_experiment(plan)` and the run's own train step; the reference
side is `reference.ReferenceTrainer` configured from the same composed config.
"""
from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
from mindspore import Tensor

from swinexp.build import Experiment, Plan, build_experiment, configure_device, plan_for
from swinexp.engine.step import make_train_step
from swinexp.models.convert import to_mindspore, to_timm
from swinexp.models.pretrained import map22kto1k, model_state, read_weights
from swinexp.parity import reference, stages
from swinexp.registry import ConfigError
from swinexp.tracking import Tracker

STOCHASTIC_KEYS = ("drop_rate", "attn_drop_rate", "drop_path_rate")
OPTIMIZERS = ("adamw", "adamw_swin")
SCHEDULERS = ("warmup_cosine", "constant")


def rel_diff(a: np.ndarray | float, b: np.ndarray | float) -> float:
    """||a - b|| / ||b|| in float64 (0 when both are 0)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    denom = np.linalg.norm(b)
    return float(np.linalg.norm(a - b) / denom) if denom > 0 else float(np.linalg.norm(a - b) > 0)


@dataclass
class StepRow:
    step: int
    loss: tuple[float, float]
    lr: tuple[float, float]
    grad_norm: tuple[float, float]
    skipped: tuple[bool, bool]


@dataclass
class StageRow:
    name: str
    forward: float               # swinexp vs reference (the reference in autocast under an amp policy)
    grad: float                  # d loss / d stage output, same pair
    forward_fp32: float = math.nan  # amp only: swinexp vs the fp32 reference
    ref_amp: float = math.nan       # amp only: torch autocast vs torch fp32: PyTorch's own mixed-precision drift


@dataclass
class Report:
    header: list[str]
    steps: list[StepRow] = field(default_factory=list)
    params: list[tuple[str, float]] = field(default_factory=list)   # worst first
    ema: list[tuple[str, float]] = field(default_factory=list)      # the EMA weights (trainer.ema.decay), worst first
    stages: list[StageRow] = field(default_factory=list)
    first_divergent: str | None = None
    tolerance: float = 0.0
    pretrained: tuple[str, float] | None = None  # model.pretrained: what was compared, logits rel diff


    @property
    def max_param_rel_diff(self) -> float:
        return self.params[0][1] if self.params else math.nan

    @property
    def max_ema_rel_diff(self) -> float:
        return self.ema[0][1] if self.ema else math.nan

    def beyond_tolerance(self) -> list[str]:
        """What failed the check: the weights or the EMA weights further apart than `tolerance`."""
        worst = (("parameters", self.max_param_rel_diff), ("EMA weights", self.max_ema_rel_diff),
                 ("pretrained logits", self.pretrained[1] if self.pretrained else math.nan))
        return [what for what, value in worst if value > self.tolerance]  # NaN (no EMA) is never beyond

    def metrics(self) -> dict[str, float]:
        """The run's final metrics (per-step ones are logged by step)."""
        out = {"parity/max_param_rel_diff": self.max_param_rel_diff,
               "parity/max_loss_rel_diff": max((rel_diff(*r.loss) for r in self.steps), default=math.nan)}
        if self.ema:
            out["parity/max_ema_rel_diff"] = self.max_ema_rel_diff
        if self.pretrained:
            out["parity/pretrained_logits_rel_diff"] = self.pretrained[1]
        if self.stages:
            out["parity/max_stage_forward_rel_diff"] = max(s.forward for s in self.stages)
            out["parity/max_stage_grad_rel_diff"] = max(s.grad for s in self.stages)
        return out

    def text(self, worst: int = 5) -> str:
        lines = list(self.header)
        if self.pretrained:
            lines.append(f"{self.pretrained[0]}: logits relative difference {self.pretrained[1]:.2e}")
        if self.stages:
            amp = not math.isnan(self.stages[0].forward_fp32)
            lines.append("")
            head = f"{'stage':<20}  {'fwd rel':>9}  {'grad rel':>9}"
            head += f"  {'fwd vs fp32 ref':>15}  {'torch amp vs fp32':>17}" if amp else ""
            lines += [head, "-" * len(head)]
            for s in self.stages:
                row = f"{s.name:<20}  {s.forward:>9.2e}  {s.grad:>9.2e}"
                lines.append(row + (f"  {s.forward_fp32:>15.2e}  {s.ref_amp:>17.2e}" if amp else ""))
            verdict = (f"first stage beyond {self.tolerance:g}: {self.first_divergent}" if self.first_divergent
                       else f"every stage within {self.tolerance:g}")
            lines.append(verdict)
        lines.append("")
        head = (f"{'step':>4}  {'loss':>10} {'ref loss':>10} {'rel':>8}  {'lr':>10} {'ref lr':>10} {'rel':>8}  "
                f"{'grad norm':>10} {'ref norm':>10} {'rel':>8}  skipped")
        lines += [head, "-" * len(head)]
        for r in self.steps:
            lines.append(f"{r.step:>4}  {r.loss[0]:>10.6f} {r.loss[1]:>10.6f} {rel_diff(*r.loss):>8.1e}  "
                         f"{r.lr[0]:>10.3e} {r.lr[1]:>10.3e} {rel_diff(*r.lr):>8.1e}  "
                         f"{r.grad_norm[0]:>10.5f} {r.grad_norm[1]:>10.5f} {rel_diff(*r.grad_norm):>8.1e}  "
                         f"{'/'.join('yes' if s else 'no' for s in r.skipped)}")
        if self.params:
            lines += ["", (f"after {len(self.steps)} steps: max relative parameter difference "
                          f"{self.max_param_rel_diff:.2e} (||p - p_ref|| / ||p_ref|| per tensor); worst:")]
            lines += [f"  {name:<48} {d:.2e}" for name, d in self.params[:worst]]
        if self.ema:
            lines += ["", (f"EMA weights (timm ModelEmaV3 on the reference): max relative difference "
                           f"{self.max_ema_rel_diff:.2e}; worst:")]
            lines += [f"  {name:<48} {d:.2e}" for name, d in self.ema[:worst]]
        if self.params:
            failed = self.beyond_tolerance()
            lines.append(f"FAILED: {' and '.join(failed)} beyond {self.tolerance:g}" if failed
                         else f"weights{' and EMA weights' if self.ema else ''} within {self.tolerance:g}")
        return "\n".join(lines)


DETERMINISTIC = ["model.drop_path_rate=0.0", "model.drop_rate=0.0", "model.attn_drop_rate=0.0",
                 "trainer.amp_report=false"]


def parity_plan(overrides: Sequence[str]) -> Plan:
    """run.py's plan for `overrides`, dropout and drop path off unless overridden."""
    return plan_for([*DETERMINISTIC, *overrides])


def configured_plan(overrides: Sequence[str]) -> Plan:
    """`parity_plan`, with this process's device configured as run.py configures it (the same precision mode and
    kernels as the run it checks); once per process."""
    return configure_device(parity_plan(overrides))


def recipe_of(plan: Plan, exp: Experiment, lr_lag: bool = False) -> reference.Recipe:
    """The reference's recipe from the plan, with the LRs scaled as swinexp scales them."""
    opt, sched, trainer = plan.section("optimizer"), plan.section("scheduler"), exp.trainer
    if opt["name"] not in OPTIMIZERS:
        raise ConfigError(f"optimizer={opt['name']}: the reference drives AdamW only; use optimizer=adamw or "
                          "optimizer=adamw_swin")
    if sched["name"] not in SCHEDULERS:
        raise ConfigError(f"scheduler={sched['name']}: the reference knows {', '.join(SCHEDULERS)}")
    scale = exp.lr_scale
    base = float(opt["lr"]) * scale
    total = trainer.epochs * exp.steps_per_epoch
    if sched["name"] == "constant":
        warmup_lr = min_lr = base
        warmup = 0
    else:
        warmup_lr, min_lr = float(sched["warmup_lr"]) * scale, float(sched["min_lr"]) * scale
        warmup = min(int(float(sched["warmup_epochs"]) * exp.steps_per_epoch), total)
    amp = exp.amp
    low = None if amp.level == "O0" else ("bfloat16" if "bfloat16" in str(amp.dtype).lower() else "float16")
    return reference.Recipe(base_lr=base, warmup_lr=warmup_lr, min_lr=min_lr, weight_decay=float(opt["weight_decay"]),
                            betas=tuple(opt["betas"]), eps=float(opt["eps"]), total_steps=total,
                            warmup_steps=warmup, clip_grad=trainer.clip_grad,
                            accumulation_steps=trainer.accumulation_steps, amp_dtype=low,
                            init_scale=amp.init_scale, scale_factor=float(amp.scale_factor),
                            scale_window=amp.scale_window, lr_lag=lr_lag, ema_decay=trainer.ema.decay)


def check_deterministic(plan: Plan) -> None:
    """Dropout and drop path draw different random numbers on the two sides: parity needs them off."""
    on = {k: v for k, v in plan.section("model").items() if k in STOCHASTIC_KEYS and v}
    if on:
        keys = " ".join(f"model.{k}=0" for k in on)
        raise ConfigError(f"{on} draw different random masks in MindSpore and PyTorch; parity runs without them: "
                          f"add {keys} (python -m swinexp.parity adds them unless you override them)")


def _windows(exp: Experiment) -> Iterator[list[tuple[np.ndarray, np.ndarray]]]:
    epoch = 0
    while True:
        batches = ((i.asnumpy(), t.asnumpy()) for i, t in exp.train_loader.epoch(epoch))
        limit = exp.steps_per_epoch
        for index, window in enumerate(reference.batches_to_windows(batches, exp.trainer.accumulation_steps)):
            if index >= limit:
                break
            yield window
        epoch += 1


def compare_stages(exp: Experiment, ref_model, images: np.ndarray, targets: np.ndarray,
                   amp_dtype: str | None, tolerance: float) -> tuple[list[StageRow], str | None]:
    """Stage outputs and output gradients of both sides on one batch; the first stage beyond `tolerance`."""
    values, grads, _ = stages.stage_activations(exp.model, images, targets)
    ref_values, ref_grads, _ = reference.stage_activations(ref_model, images, targets, amp_dtype)
    fp32_values = reference.stage_activations(ref_model, images, targets)[0] if amp_dtype else None
    rows, first = [], None
    for name in [*values, "images"]:
        forward = rel_diff(values[name], ref_values[name]) if name in values else 0.0
        row = StageRow(name, forward, rel_diff(grads[name], ref_grads[name]))
        if fp32_values is not None and name in values:
            row.forward_fp32 = rel_diff(values[name], fp32_values[name])
            row.ref_amp = rel_diff(ref_values[name], fp32_values[name])
        rows.append(row)
        if first is None and (row.forward > tolerance or row.grad > tolerance):
            first = name
    exp.model.set_train(True)
    return rows, first


def compare_pretrained(exp: Experiment, arch: dict, images: np.ndarray) -> tuple[str, float]:
    """swinexp's model as `model.pretrained` loaded it (resized, head mapped) against a timm model loaded from the
    same file by the reference loader of `model.pretrained_resize` (`reference.reference_load`): their logits on
    `images`, before any step. A head swinexp did not take from the file (reset, zeros, dropped) is copied over."""
    loaded = exp.model.pretrained_report
    resize = str(exp.plan.get("model.pretrained_resize"))
    ours = model_state(exp.model)
    state = to_mindspore(read_weights(loaded.path), set(ours))  # the file in swinexp's names, at its own size
    head = {k for k in state if k.startswith("head.")}
    if loaded.head == "map22kto1k":
        state.update({k: state[k][map22kto1k()] for k in head})
    elif loaded.head != "loaded":
        state = {**{k: v for k, v in state.items() if k not in head},
                 **{k: v for k, v in ours.items() if k.startswith("head.")}}
    ref_model = reference.timm_swin(arch)
    reference.reference_load(ref_model, to_timm(state), resize)
    exp.model.set_train(False)
    try:
        logits = exp.model(Tensor(images)).asnumpy().astype(np.float32)
    finally:
        exp.model.set_train(True)
    expected = reference.eval_logits(ref_model, images)
    loader = {"official": "the official load_pretrained resize", "timm": "timm's checkpoint_filter_fn",
              "none": "no resize"}[resize]
    return (f"model.pretrained={loaded.path.name} (head {loaded.head}, {len(loaded.resized)} tensors resized) vs "
            f"the reference loader ({loader})", rel_diff(logits, expected))


def check(plan: Plan, tracker: Tracker, steps: int = 5, locate: bool = False, tolerance: float | None = None,
          lr_lag: bool = False) -> Report:
    """Run `steps` optimizer steps of swinexp and of the reference on the same batches; see the package docstring.

    Args:
        tracker: where the run's metrics go (started by the caller; build_experiment gets it).
        locate: also compare every stage's output and gradient on the first batch (always done under amp).
        tolerance: relative difference that counts as divergence (of a stage, the final weights, the EMA
            weights); default 1e-4 in fp32, 5e-2 under amp.
    """
    check_deterministic(plan)
    exp = build_experiment(plan, tracker)
    hw = plan.hardware
    arch = exp.plan.section("model")
    ref_model = reference.timm_swin(arch)
    reference.load_numpy_state(ref_model, to_timm(model_state(exp.model)))
    recipe = recipe_of(plan, exp, lr_lag)
    tolerance = tolerance if tolerance is not None else (1e-4 if recipe.amp_dtype is None else 5e-2)
    trainer = exp.trainer
    header = [(f"parity: swinexp ({exp.amp.level}, {hw.mode}, qkv={arch['qkv']}, "
              f"patch_merging={arch['patch_merging']}, rel_pos_bias={arch['rel_pos_bias']}, "
              f"custom_bprop={arch['custom_bprop']}, permute={arch['permute']}, patch_embed={arch['patch_embed']}, "
              f"kernels={arch.get('kernels', 'mindspore')}) "
              f"vs timm SwinTransformer driven as the official main.py"),
              (f"model {arch['name']} img {arch['img_size']} classes {arch['num_classes']}; batch "
              f"{exp.data.batch_size} x accumulation {trainer.accumulation_steps}; clip_grad {trainer.clip_grad}; "
              f"{steps} steps of {trainer.epochs * exp.steps_per_epoch}, warmup {recipe.warmup_steps}; "
              f"LR convention {'official main.py: f(k-1) at step k' if lr_lag else 'f(k) at step k (timm, swinexp)'}")]
    if recipe.amp_dtype is not None:
        note = reference.autocast_note(recipe.amp_dtype)
        scaler = " + GradScaler" if recipe.amp_dtype == "float16" else ""
        header.append(f"reference precision: torch.autocast(cpu, {recipe.amp_dtype}){scaler}"
                      + (f"; NOTE: {note}" if note else ""))
    report = Report(header, tolerance=tolerance)
    windows = _windows(exp)
    first_window = next(windows)
    if exp.plan.get("model.pretrained"):
        report.pretrained = compare_pretrained(exp, arch, first_window[0][0])
    if locate or recipe.amp_dtype is not None:
        images, targets = first_window[0]
        report.stages, report.first_divergent = compare_stages(exp, ref_model, images, targets, recipe.amp_dtype,
                                                               tolerance)
    train_step = make_train_step(exp.model, exp.optimizer, exp.amp, trainer.clip_grad, hw.mode == "graph",
                                 trainer.accumulation_steps, trainer.accumulate_on, trainer.ema.decay)
    ref = reference.ReferenceTrainer(ref_model, recipe)
    exp.model.set_train(True)
    window = first_window
    for k in range(1, steps + 1):
        outs = [train_step(Tensor(i), Tensor(t)) for i, t in window]
        last = outs[-1]
        step_index = int(exp.optimizer.global_step.asnumpy().reshape(-1)[0]) - 1
        ref_record = ref.step(window)
        row = StepRow(k, (float(np.mean([o.loss for o in outs])), float(np.mean(ref_record.losses))),
                      (float(exp.lr_schedule[step_index]), ref_record.lr), (last.grad_norm, ref_record.grad_norm),
                      (last.overflow, ref_record.skipped))
        report.steps.append(row)
        tracker.log_metrics({"parity/loss": row.loss[0], "parity/ref_loss": row.loss[1],
                             "parity/loss_rel_diff": rel_diff(*row.loss), "parity/lr_rel_diff": rel_diff(*row.lr),
                             "parity/grad_norm_rel_diff": rel_diff(*row.grad_norm)}, step=k)
        if k < steps:
            window = next(windows)
    ours, theirs = to_timm(model_state(exp.model)), reference.numpy_state(ref_model)
    report.params = sorted(((name, rel_diff(ours[name], value)) for name, value in theirs.items()),
                           key=lambda item: -item[1])
    if train_step.ema is not None:
        ema = to_timm({**model_state(exp.model), **{p.name: e.asnumpy() for p, e in zip(train_step.params,
                                                                                      train_step.ema)}})
        report.ema = sorted(((name, rel_diff(ema[name], value)) for name, value in ref.ema_state().items()),
                            key=lambda item: -item[1])
    return report
