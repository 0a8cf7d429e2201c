"""`fit(exp)`: the epoch loop around the jitted train step: evaluate, checkpoint and log after every epoch."""
from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import numpy as np
from mindspore import nn
from tqdm import tqdm

from swinexp.config import TrainerCfg
from swinexp.engine import checkpoint
from swinexp.engine.evaluate import EvalStep, evaluate, make_eval_step
from swinexp.engine.experiment import Experiment
from swinexp.engine.rank_times import StepClock, StragglerWatch, rank_file
from swinexp.engine.resume import PROGRESS_KEY, Progress, ResumePoint
from swinexp.engine.step import StepOutput, TrainStep, read_all, train_step_for
from swinexp.runtime import compile_cache, launch, phases
from swinexp.runtime.interrupt import Interrupted, StopRequest, stop_on_signals

if TYPE_CHECKING:
    from swinexp.engine.profiling import StepProfiler

log = logging.getLogger("swinexp")

# fit's `should_stop`: called after each epoch's checkpoint and log with (epoch number from 1, its metrics); True
# ends the training there, as trainer.stop_after_epoch would (e.g. an Optuna trial its pruner stops).
EpochCheck = Callable[[int, dict[str, float]], bool]


class NonFiniteLoss(FloatingPointError):
    """trainer.max_nonfinite losses in a row were not finite, or trainer.max_overflow_at_min_scale optimizer steps in
    a row overflowed at the smallest loss scale; the last good state was checkpointed."""


@dataclass
class _Streaks:
    """Runs of bad steps, across epochs: a run that diverges at an epoch's end is still diverged after it."""

    nonfinite: int = 0  # non-finite micro-batch losses in a row, up to the last read
    overflow: int = 0   # overflow-skipped optimizer steps in a row at the smallest loss scale


@dataclass
class _Checkpoints:
    """Writes the whole training state with its `Progress` record; only rank 0 writes (the ranks hold the same)."""

    checkpointer: checkpoint.Checkpointer
    exp: Experiment
    train_step: TrainStep
    main_rank: bool

    def save(self, progress: Progress, best: bool = False) -> None:
        if self.main_rank:
            meta = {PROGRESS_KEY: progress.to_json(), "epoch": progress.epoch, "mlflow_run_id": progress.mlflow_run_id}
            self.checkpointer.save(_optimizer_step(self.exp.optimizer), self.exp.model, self.exp.optimizer, meta,
                                   self.train_step.state(), best)


def fit(exp: Experiment, run_dir: Path, jit: bool, resume_from: ResumePoint | None = None,
        config: dict | None = None, choices: dict[str, str | None] | None = None,
        should_stop: EpochCheck | None = None) -> list[dict[str, float]]:
    """Train up to trainer.stop_after_epoch (null: trainer.epochs) or until `should_stop` says so, evaluating,
    checkpointing and logging after every epoch; the LR schedule always spans trainer.epochs, so a run stopped early
    continues it unchanged.

    An epoch is `exp.steps_per_epoch` optimizer steps of `trainer.accumulation_steps` micro-batches each; the LR
    schedule and every step counter count optimizer steps. With trainer.ema.decay set, the EMA weights are
    evaluated too (val_ema/*). Every checkpoint holds the whole training state and a `Progress` record, and is
    written before the epoch's metrics are logged, so a run resumed from it (`resume_from`) logs each epoch once.
    SIGINT/SIGTERM finish the current optimizer step, checkpoint and raise `Interrupted`.

    Returns:
        The metrics of every epoch, in order (those before a resumption included).
    """
    trainer, distributed = exp.trainer, launch.is_worker()
    train_step = train_step_for(exp, jit, distributed, launch.rank())
    eval_step = make_eval_step(exp.model, jit, exp.jit_level)
    progress = _starting_progress(exp, train_step, resume_from, config, choices)
    checkpoints = _Checkpoints(checkpoint.Checkpointer(run_dir / "checkpoints", trainer.checkpoint.keep_last), exp,
                               train_step, launch.rank() == 0)
    profiler = _profiler(trainer, run_dir)
    last_epoch = trainer.stop_after_epoch or trainer.epochs
    streaks = _Streaks()
    clock, watch = _rank_times(exp, run_dir, distributed)
    with stop_on_signals() as stop:
        while progress.epoch < last_epoch:
            epoch = progress.epoch
            start = time.perf_counter() - progress.train_time_s
            lr = _train_epoch(exp, train_step, progress, checkpoints, stop, profiler, start, run_dir, streaks, clock,
                              watch)
            metrics = _epoch_metrics(exp, train_step, eval_step, progress, time.perf_counter() - start, lr,
                                     distributed)
            best = metrics["val/top1"] > max((m["val/top1"] for m in progress.history), default=-math.inf)
            progress.history.append(metrics)
            progress.epoch += 1
            progress.start_epoch()
            checkpoints.save(progress, best)
            phases.mark("mlflow")
            exp.tracker.log_metrics(metrics, step=epoch + 1)  # step 10 = end of the tenth epoch
            if watch is not None and (rank_metrics := watch.end_epoch()):  # the ranks met in evaluate's all-reduce
                exp.tracker.log_metrics(rank_metrics, step=epoch + 1)
            _log_epoch(epoch, trainer.epochs, metrics)
            if stop.signum is not None:
                raise Interrupted(stop.signum)
            if should_stop is not None and should_stop(progress.epoch, metrics):
                break
    if progress.epoch < trainer.epochs:
        log.info("stopped after epoch %d of %d; continue with the same command and trainer.stop_after_epoch=null "
                 "(or a later epoch) in this run dir", progress.epoch, trainer.epochs)
    if profiler and (summary := profiler.finish()) is not None:
        exp.tracker.log_artifact(summary)
        log.info("profile of the train step (top ops by time): %s", summary)
    if distributed:  # a cheap cross-rank check that data parallelism kept the replicas identical
        (run_dir / f"weights_rank{launch.rank()}.sha256").write_text(checkpoint.weights_digest(exp.model) + "\n")
    return progress.history


def _starting_progress(exp: Experiment, train_step: TrainStep, resume_from: ResumePoint | None,
                       config: dict | None, choices: dict[str, str | None] | None) -> Progress:
    """A fresh record, or the checkpoint's: its state loaded into model, optimizer and step, missing epochs relogged."""
    progress = Progress(mlflow_run_id=exp.tracker.run_id or "", config=config or {}, choices=choices or {})
    if resume_from is None:
        return progress
    checkpoint.load(resume_from.values, exp.model, exp.optimizer, train_step.state())
    progress = replace(resume_from.progress, mlflow_run_id=progress.mlflow_run_id,
                       config=progress.config or resume_from.progress.config,
                       choices=progress.choices or resume_from.progress.choices)
    _relog_missing_epochs(exp, progress.history)
    log.info("resumed from %s: epoch %d, %d batches done, optimizer step %d", resume_from.path, progress.epoch + 1,
             progress.batches_done, _optimizer_step(exp.optimizer))
    stop = exp.trainer.stop_after_epoch
    if stop is not None and progress.epoch > stop:
        log.warning("trainer.stop_after_epoch=%d but the checkpoint is already at the end of epoch %d: nothing to "
                    "train", stop, progress.epoch)
    return progress


def _rank_times(exp: Experiment, run_dir: Path, distributed: bool) -> tuple[StepClock, StragglerWatch | None]:
    """This rank's step clock (recording only with several ranks) and, on rank 0 of several, the straggler watch."""
    if not distributed:
        return StepClock(None), None
    world, trainer = launch.world_size(exp.plan.hardware), exp.trainer
    watch = (StragglerWatch(run_dir, world, trainer.straggler_factor, trainer.straggler_patience, exp.tracker)
             if launch.rank() == 0 else None)
    return StepClock(rank_file(run_dir, launch.rank())), watch


def _train_epoch(exp: Experiment, train_step: TrainStep, progress: Progress, checkpoints: _Checkpoints,
                 stop: StopRequest, profiler: StepProfiler | None, start: float, run_dir: Path,
                 streaks: _Streaks, clock: StepClock, watch: StragglerWatch | None) -> float:
    """Train the rest of epoch `progress.epoch`; return the LR of its last optimizer step (nan: none taken here).

    The host never waits for the device between read points: step outputs stay on the device and are read in one
    transfer every trainer.log_every_n_steps optimizer steps, before a checkpoint and at the epoch's end
    (`_Readback`); the optimizer step and the LR are counted on the host. `clock` times the intervals between those
    reads on the host; `watch` (rank 0 of several) reads every rank's at them (engine/rank_times.py).

    Raises:
        Interrupted: a signal arrived (checkpointed after the current optimizer step).
        NonFiniteLoss: trainer.max_nonfinite non-finite losses in a row, or trainer.max_overflow_at_min_scale
            overflow-skipped optimizer steps in a row at the smallest loss scale (the state at that read point
            checkpointed).
    """
    trainer = exp.trainer
    micro_batches = exp.steps_per_epoch * trainer.accumulation_steps
    exp.model.set_train(True)
    bar = tqdm(total=exp.steps_per_epoch, initial=progress.batches_done // trainer.accumulation_steps,
               desc=f"epoch {progress.epoch + 1}/{trainer.epochs}", leave=False, dynamic_ncols=True,
               disable=not (trainer.progress_bar and checkpoints.main_rank))
    readback = _Readback(exp, progress, bar, start, streaks, clock)
    clock.restart()
    lr = float("nan")
    batches = exp.train_loader.epoch(progress.epoch, start_batch=progress.batches_done)
    for images, targets in _limit(batches, micro_batches - progress.batches_done):
        step_number = train_step.optimizer_step + 1
        if profiler:
            profiler.before_step(step_number)
        if graph := train_step.next_compile():
            bar.set_postfix_str(compile_cache.compiling(graph))
        with clock.waiting(), compile_cache.first_call(graph):
            out = train_step(images, targets)
        if graph:
            bar.set_postfix_str("")
            clock.exclude()
        phases.mark("step")
        progress.batches_done += 1
        progress.seen += int(images.shape[0])
        # the optimizer step's place in the epochs (overflow skips count), so a resume logs no step twice
        readback.add(out, progress.epoch * exp.steps_per_epoch + progress.batches_done // trainer.accumulation_steps)
        if not out.updated:
            continue
        if profiler:
            profiler.after_step(step_number)
        bar.update()
        # the LR of the last optimizer step (an overflow-skipped step advances the schedule too)
        lr = float(exp.lr_schedule[max(train_step.optimizer_step - 1, 0)])
        every = trainer.checkpoint.every_n_steps
        mid_epoch_due = every and train_step.optimizer_step % every == 0 and progress.batches_done < micro_batches
        if (stop.signum is not None or mid_epoch_due or progress.batches_done == micro_batches
                or train_step.optimizer_step % trainer.log_every_n_steps == 0):
            readback.read(lr)
            if watch is not None:
                watch.poll()
        if readback.tripped is not None:
            progress.train_time_s = time.perf_counter() - start
            checkpoints.save(progress)  # the updates of non-finite steps were skipped: these are the last good weights
            raise _diverged_error(exp, progress, readback, train_step.optimizer_step, run_dir)
        if stop.signum is not None or mid_epoch_due:
            progress.train_time_s = time.perf_counter() - start
            checkpoints.save(progress)
            clock.restart()
            if stop.signum is not None:
                raise Interrupted(stop.signum)
    readback.read(lr)  # a resumed epoch with nothing left to train, or a limit that ended it early
    bar.close()
    return lr


class _Readback:
    """The step outputs the host has not looked at yet, and what it does with them once read in one transfer."""

    def __init__(self, exp: Experiment, progress: Progress, bar: tqdm, start: float, streaks: _Streaks,
                 clock: StepClock) -> None:
        self.exp, self.progress, self.bar, self.start, self.streaks = exp, progress, bar, start, streaks
        self.clock = clock
        self.pending: list[tuple[StepOutput, int, int]] = []
        self.tripped: tuple[int, int] | None = None  # (batch, optimizer step) where a run reached its limit
        self.overflowed = False  # the limit reached was the overflow run's (a saturating card hides nan/inf)
        self.min_scale = exp.amp.init_scale if exp.amp.loss_scale == "static" else 1.0

    def add(self, out: StepOutput, step: int) -> None:
        self.pending.append((out, step, self.progress.batches_done))

    def read(self, lr: float) -> None:
        """Copy the pending outputs to the host (one sync) and account for them: epoch sums, step metrics, bar."""
        if not self.pending:
            return
        with self.clock.waiting():
            read_all([out for out, _, _ in self.pending])
        progress, accumulation = self.progress, self.exp.trainer.accumulation_steps
        for out, step, batch in self.pending:
            progress.losses.append(out.loss)
            streaks = self.streaks
            streaks.nonfinite = 0 if math.isfinite(out.loss) else streaks.nonfinite + 1
            if streaks.nonfinite >= self.exp.trainer.max_nonfinite and self.tripped is None:
                self.tripped = (batch, step)
            if not out.updated:
                continue
            at_floor = out.overflow and out.loss_scale <= self.min_scale
            streaks.overflow = streaks.overflow + 1 if at_floor else 0
            if streaks.overflow >= self.exp.trainer.max_overflow_at_min_scale and self.tripped is None:
                self.tripped, self.overflowed = (batch, step), True
            progress.overflow_steps += out.overflow
            progress.loss_scale = out.loss_scale
            if not out.overflow:
                progress.grad_norms.append(out.grad_norm)
            self.exp.tracker.log_step_metrics({
                "step/train/loss": float(np.mean(progress.losses[-accumulation:])),
                "step/train/loss_scale": out.loss_scale, "step/train/overflow": float(out.overflow)}, step=step)
        self.clock.mark(progress.epoch, self.pending[-1][1], sum(out.updated for out, _, _ in self.pending))
        self.pending = []
        self.bar.set_postfix(loss=f"{progress.losses[-1]:.4f}", lr=f"{lr:.2e}",
                             img_s=f"{progress.seen / (time.perf_counter() - self.start):.1f}")


def _diverged_error(exp: Experiment, progress: Progress, readback: _Readback, optimizer_step: int,
                    run_dir: Path) -> NonFiniteLoss:
    batch, step = readback.tripped or (progress.batches_done, optimizer_step)
    trainer = exp.trainer
    read_later = (f"; the host saw it at its next read of the step outputs, batch {progress.batches_done}, optimizer "
                  f"step {optimizer_step} (trainer.log_every_n_steps={trainer.log_every_n_steps})"
                  if progress.batches_done != batch else "")
    where = f"by epoch {progress.epoch + 1}, batch {batch}, optimizer step {step}{read_later} (amp {exp.amp.level})"
    what = (f"the gradients overflowed in {trainer.max_overflow_at_min_scale} optimizer steps in a row at the smallest "
            f"loss scale ({readback.min_scale:g}; trainer.max_overflow_at_min_scale="
            f"{trainer.max_overflow_at_min_scale}) {where}. Lowering the scale further cannot help: the training has "
            "diverged (on a card that saturates, such as a first-generation Ascend 910, this is how a non-finite "
            "loss shows)" if readback.overflowed else
            f"the train loss was not finite for {trainer.max_nonfinite} micro-batches in a row (trainer.max_nonfinite="
            f"{trainer.max_nonfinite}) {where}. The forward pass itself is not finite, which loss scaling cannot fix")
    return NonFiniteLoss(
        f"{what}; skipped steps update nothing, and the state is checkpointed in {run_dir / 'checkpoints'}. Try "
        "amp=o1_manual or o0, a lower optimizer.lr, or trainer.clip_grad")


def _optimizer_step(optimizer: nn.Optimizer) -> int:
    return int(optimizer.global_step.asnumpy().reshape(-1)[0])


def _epoch_metrics(exp: Experiment, train_step: TrainStep, eval_step, progress: Progress, train_time: float,
                   lr: float, distributed: bool) -> dict[str, float]:
    epoch, optimizer, eval_start = progress.epoch, exp.optimizer, time.perf_counter()
    if math.isnan(lr):  # a resumed epoch whose last step was taken before the checkpoint
        lr = float(exp.lr_schedule[max(_optimizer_step(optimizer) - 1, 0)])
    val_batches = _validation(exp, eval_step, epoch)
    metrics = {"train/loss": float(np.mean(progress.losses)),
               "train/grad_norm": float(np.mean(progress.grad_norms)) if progress.grad_norms else float("nan"),
               "train/overflow_steps": float(progress.overflow_steps), "train/loss_scale": progress.loss_scale,
               "train/optimizer_steps": float(_optimizer_step(optimizer)),
               "train/total_batch": float(exp.total_batch), "lr": lr,
               "train/images_per_s": progress.seen / train_time,
               **evaluate(exp.model, val_batches, eval_step, distributed)}
    if exp.trainer.ema.decay is not None:
        train_step.swap_ema()  # evaluate the EMA weights with the same compiled eval step, then swap back
        ema_batches = _validation(exp, eval_step, epoch, "EMA ")
        metrics.update({k.replace("val/", "val_ema/"): v
                        for k, v in evaluate(exp.model, ema_batches, eval_step, distributed).items()})
        train_step.swap_ema()
    metrics["epoch_time_s"] = train_time + time.perf_counter() - eval_start
    skipped = {"data/train_skipped_files": exp.train_loader.skipped_files,
               "data/val_skipped_files": exp.val_loader.skipped_files}
    metrics.update({k: float(v) for k, v in skipped.items()})
    if any(skipped.values()):
        log.warning("epoch %d: unreadable images were replaced by the next sample: %s (their names are in the "
                    "warnings above)", epoch + 1, skipped)
    return metrics


def _log_epoch(epoch: int, epochs: int, metrics: dict[str, float]) -> None:
    log.info("epoch %d/%d  train/loss %.4f  val/loss %.4f  val/top1 %.2f  val/top5 %.2f  lr %.2e  "
             "overflow %d  scale %g  %.1f s  %.1f img/s", epoch + 1, epochs, metrics["train/loss"],
             metrics["val/loss"], metrics["val/top1"], metrics["val/top5"], metrics["lr"],
             metrics["train/overflow_steps"], metrics["train/loss_scale"], metrics["epoch_time_s"],
             metrics["train/images_per_s"])


def _relog_missing_epochs(exp: Experiment, history: list[dict[str, float]]) -> None:
    """Log the checkpoint's epochs that the tracker lacks (the run died between checkpoint and log); no duplicates."""
    logged = exp.tracker.logged_steps("val/top1")
    for epoch, metrics in enumerate(history, start=1):
        if epoch not in logged:
            exp.tracker.log_metrics(metrics, step=epoch)


def _profiler(trainer: TrainerCfg, run_dir: Path) -> StepProfiler | None:
    if not trainer.profile.enabled:
        return None
    from swinexp.engine.profiling import StepProfiler  # imports mindspore's profiler only when asked for

    return StepProfiler(run_dir / "profile", trainer.profile.start_step, trainer.profile.num_steps)


def _validation(exp: Experiment, eval_step: EvalStep, epoch: int, weights: str = "") -> Iterator[tuple]:
    """The val batches of `epoch` behind a progress bar that says when the eval step compiles."""
    limit = exp.trainer.limit_val_batches
    total = len(exp.val_loader) if limit is None else min(limit, len(exp.val_loader))
    with tqdm(total=total, desc=f"validate {weights}{epoch + 1}/{exp.trainer.epochs}", leave=False,
              dynamic_ncols=True, disable=not (exp.trainer.progress_bar and launch.rank() == 0)) as bar:
        for batch in _limit(exp.val_loader.epoch(epoch), limit):
            if graph := eval_step.next_compile():
                bar.set_postfix_str(compile_cache.compiling(graph))
            with compile_cache.first_call(graph):
                yield batch  # evaluate() calls the step on it here
            if graph:
                bar.set_postfix_str("", refresh=False)
            bar.update()


def _limit(batches, limit: int | None):
    for index, batch in enumerate(batches):
        if limit is not None and index >= limit:
            return
        yield batch


def evaluate_only(exp: Experiment, jit: bool) -> dict[str, float]:
    """One validation pass over the whole val set, logged at step 0 (before any training)."""
    metrics = evaluate(exp.model, exp.val_loader.epoch(0), make_eval_step(exp.model, jit, exp.jit_level),
                       launch.is_worker())
    exp.tracker.log_metrics(metrics, step=0)
    log.info("eval only  val/loss %.4f  val/top1 %.2f  val/top5 %.2f", metrics["val/loss"], metrics["val/top1"],
             metrics["val/top5"])
    return metrics

