"""`run(cfg)`: set up the process, build the experiment, fit it, and close the tracker whatever happens."""
from __future__ import annotations

import json
import logging
import math
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from hydra.types import RunMode
from mindspore import nn
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from swinexp import amp_report, checkpoint, hardware, launch
from swinexp.build import Experiment, build_experiment, node
from swinexp.config import HardwareCfg, TrainerCfg
from swinexp.evaluate import evaluate, make_eval_step
from swinexp.interrupt import Interrupted, stop_on_signals
from swinexp.registry import TRACKERS
from swinexp.resume import PROGRESS_KEY, Progress, ResumePoint, check_compatible, locate, remember_run_id, saved_run_id
from swinexp.step import TrainStep, make_train_step
from swinexp.sweep import SweepInfo, sweep_from_env
from swinexp.tracking import NullTracker, flatten

if TYPE_CHECKING:
    from swinexp.profiling import StepProfiler

log = logging.getLogger("swinexp")

@dataclass(frozen=True)
class JobInfo:
    """What Hydra knows about the job: where it writes, which overrides and group choices made it, its sweep."""

    run_dir: Path
    overrides: list[str] = field(default_factory=list)
    choices: dict[str, str] = field(default_factory=dict)
    sweep: SweepInfo | None = None

    @classmethod
    def from_hydra(cls, hydra_cfg: DictConfig) -> JobInfo:
        """From `HydraConfig.get()` inside a Hydra job."""
        in_sweep_process = hydra_cfg.mode == RunMode.MULTIRUN  # launcher=basic; isolated jobs run as single runs
        sweep = sweep_from_env(int(hydra_cfg.job.get("num", 0)) if in_sweep_process else None)
        return cls(Path(hydra_cfg.runtime.output_dir), list(hydra_cfg.overrides.task),
                   dict(hydra_cfg.runtime.choices), sweep)

    def run_name(self) -> str:
        if self.sweep is not None:
            return self.sweep.run_name(self.overrides)
        return " ".join(self.overrides) or "defaults"

    def tags(self) -> dict[str, str]:
        """Overrides, host and process, sweep membership, chosen group options and the code's git commit."""
        tags = {"overrides": " ".join(self.overrides), "host": socket.gethostname(), "pid": str(os.getpid()),
                **(self.sweep.tags() if self.sweep else {}),
                **{f"choice.{k.split('@')[0]}": str(v) for k, v in self.choices.items()  # no @package: MLflow
                   if v is not None and not k.startswith("hydra")}}                    # rejects '@' in names
        if commit := git_commit():
            tags["git_commit"] = commit
        return tags


class NonFiniteLoss(FloatingPointError):
    """trainer.max_nonfinite losses in a row were not finite; the last good state was checkpointed."""


def fit(exp: Experiment, run_dir: Path, jit: bool, resume_from: ResumePoint | None = None,
        config: dict | None = None) -> list[dict[str, float]]:
    """Train for trainer.epochs, evaluating, checkpointing and logging after every epoch.

    An epoch is `exp.steps_per_epoch` optimizer steps of `trainer.accumulation_steps` micro-batches each; the LR
    schedule and every step counter count optimizer steps. With trainer.ema.decay set, the EMA weights are
    evaluated too (val_ema/*). Every checkpoint holds the whole training state and a `Progress` record, and is
    written before the epoch's metrics are logged, so a run resumed from it (`resume_from`) logs each epoch once.
    SIGINT/SIGTERM finish the current optimizer step, checkpoint and raise `Interrupted`.

    Returns:
        The metrics of every epoch, in order (those before a resumption included).
    """
    trainer, model, optimizer = exp.trainer, exp.model, exp.optimizer
    distributed, main_rank = launch.is_worker(), launch.rank() == 0
    train_step = make_train_step(model, optimizer, exp.amp, trainer.clip_grad, jit, trainer.accumulation_steps,
                                 trainer.accumulate_on, trainer.ema.decay, distributed)
    eval_step = make_eval_step(model, jit)
    progress = Progress(mlflow_run_id=exp.tracker.run_id or "", config=config or {})
    if resume_from is not None:
        checkpoint.load(resume_from.values, model, optimizer, train_step.state())
        progress = replace(resume_from.progress, mlflow_run_id=progress.mlflow_run_id,
                                       config=progress.config or resume_from.progress.config)
        _relog_missing_epochs(exp, progress.history)
        log.info("resumed from %s: epoch %d, %d batches done, optimizer step %d", resume_from.path,
                 progress.epoch + 1, progress.batches_done, _optimizer_step(optimizer))
    checkpointer = checkpoint.Checkpointer(run_dir / "checkpoints", trainer.checkpoint.keep_last)

    def save(best: bool = False) -> None:
        if main_rank:  # every rank holds the same weights; one copy on disk
            meta = {PROGRESS_KEY: progress.to_json(), "epoch": progress.epoch,
                    "mlflow_run_id": progress.mlflow_run_id}
            checkpointer.save(_optimizer_step(optimizer), model, optimizer, meta, train_step.state(), best)

    micro_batches = exp.steps_per_epoch * trainer.accumulation_steps
    profiler = _profiler(trainer, run_dir)
    with stop_on_signals() as stop:
        while progress.epoch < trainer.epochs:
            epoch = progress.epoch
            model.set_train(True)
            bar = tqdm(total=exp.steps_per_epoch, initial=progress.batches_done // trainer.accumulation_steps,
                       desc=f"epoch {epoch + 1}/{trainer.epochs}", leave=False, dynamic_ncols=True,
                       disable=not (trainer.progress_bar and main_rank))
            start, nonfinite_run, lr = time.perf_counter() - progress.train_time_s, 0, float("nan")
            batches = exp.train_loader.epoch(epoch, start_batch=progress.batches_done)
            for images, targets in _limit(batches, micro_batches - progress.batches_done):
                step_number = _optimizer_step(optimizer) + 1
                if profiler:
                    profiler.before_step(step_number)
                out = train_step(images, targets)
                progress.batches_done += 1
                progress.losses.append(out.loss)
                progress.seen += int(images.shape[0])
                nonfinite_run = 0 if math.isfinite(out.loss) else nonfinite_run + 1
                if not out.updated:
                    continue
                if profiler:
                    profiler.after_step(step_number)
                progress.overflow_steps += out.overflow
                progress.loss_scale = out.loss_scale
                if not out.overflow:
                    progress.grad_norms.append(out.grad_norm)
                bar.update()
                # the LR of the last optimizer step taken (an overflow skip does not advance the optimizer)
                lr = float(exp.lr_schedule[max(_optimizer_step(optimizer) - 1, 0)])
                bar.set_postfix(loss=f"{out.loss:.4f}", lr=f"{lr:.2e}",
                                img_s=f"{progress.seen / (time.perf_counter() - start):.1f}")
                if nonfinite_run >= trainer.max_nonfinite:
                    progress.train_time_s = time.perf_counter() - start
                    save()  # the updates of non-finite steps were skipped: these are the last good weights
                    raise NonFiniteLoss(
                        f"the train loss was not finite for {nonfinite_run} micro-batches in a row (trainer."
                        f"max_nonfinite={trainer.max_nonfinite}), up to epoch {epoch + 1}, batch "
                        f"{progress.batches_done}, optimizer step {_optimizer_step(optimizer)} (amp {exp.amp.level}). "
                        "The forward pass itself is not finite, which loss scaling cannot fix; the last good state is "
                        f"checkpointed in {run_dir / 'checkpoints'}. Try amp=o1_manual or o0, a lower optimizer.lr, "
                        "or trainer.clip_grad")
                last_of_epoch = progress.batches_done == micro_batches
                every = trainer.checkpoint.every_n_steps
                if stop.signum is not None or (every and _optimizer_step(optimizer) % every == 0
                                               and not last_of_epoch):
                    progress.train_time_s = time.perf_counter() - start
                    save()
                    if stop.signum is not None:
                        raise Interrupted(stop.signum)
            bar.close()
            metrics = _epoch_metrics(exp, train_step, eval_step, progress, time.perf_counter() - start, lr,
                                     distributed)
            best = metrics["val/top1"] > max((m["val/top1"] for m in progress.history), default=-math.inf)
            progress.history.append(metrics)
            progress.epoch += 1
            progress.start_epoch()
            save(best)
            exp.tracker.log_metrics(metrics, step=epoch + 1)  # step 10 = end of the tenth epoch
            _log_epoch(epoch, trainer.epochs, metrics)
            if stop.signum is not None:
                raise Interrupted(stop.signum)
    if profiler and (summary := profiler.finish()) is not None:
        exp.tracker.log_artifact(summary)
        log.info("profile of the train step (top ops by time): %s", summary)
    if distributed:  # a cheap cross-rank check that data parallelism kept the replicas identical
        (run_dir / f"weights_rank{launch.rank()}.sha256").write_text(checkpoint.weights_digest(model) + "\n")
    return progress.history


def _optimizer_step(optimizer: nn.Optimizer) -> int:
    return int(optimizer.global_step.asnumpy().reshape(-1)[0])


def _epoch_metrics(exp: Experiment, train_step: TrainStep, eval_step, progress: Progress, train_time: float,
                   lr: float, distributed: bool) -> dict[str, float]:
    epoch, optimizer, eval_start = progress.epoch, exp.optimizer, time.perf_counter()
    if math.isnan(lr):  # a resumed epoch whose last step was taken before the checkpoint
        lr = float(exp.lr_schedule[max(_optimizer_step(optimizer) - 1, 0)])
    val_batches = _limit(exp.val_loader.epoch(epoch), exp.trainer.limit_val_batches)
    metrics = {"train/loss": float(np.mean(progress.losses)),
               "train/grad_norm": float(np.mean(progress.grad_norms)) if progress.grad_norms else float("nan"),
               "train/overflow_steps": float(progress.overflow_steps), "train/loss_scale": progress.loss_scale,
               "train/optimizer_steps": float(_optimizer_step(optimizer)),
               "train/total_batch": float(exp.total_batch), "lr": lr,
               "train/images_per_s": progress.seen / train_time,
               **evaluate(exp.model, val_batches, eval_step, distributed)}
    if exp.trainer.ema.decay is not None:
        train_step.swap_ema()  # evaluate the EMA weights with the same compiled eval step, then swap back
        ema_batches = _limit(exp.val_loader.epoch(epoch), exp.trainer.limit_val_batches)
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
    from swinexp.profiling import StepProfiler  # imports mindspore's profiler only when asked for

    return StepProfiler(run_dir / "profile", trainer.profile.start_step, trainer.profile.num_steps)


def _limit(batches, limit: int | None):
    for index, batch in enumerate(batches):
        if limit is not None and index >= limit:
            return
        yield batch


def evaluate_only(exp: Experiment, jit: bool) -> dict[str, float]:
    """One validation pass over the whole val set, logged at step 0 (before any training)."""
    metrics = evaluate(exp.model, exp.val_loader.epoch(0), make_eval_step(exp.model, jit), launch.is_worker())
    exp.tracker.log_metrics(metrics, step=0)
    log.info("eval only  val/loss %.4f  val/top1 %.2f  val/top5 %.2f", metrics["val/loss"], metrics["val/top1"],
             metrics["val/top5"])
    return metrics


def log_amp_report(exp: Experiment, model_cfg: dict, run_dir: Path) -> None:
    """Save the policy's per-cell dtype table and its fp32 drift report on one val batch as run artifacts."""
    images, _ = next(iter(exp.val_loader.epoch(0)))
    for name, text in amp_report.artifacts(model_cfg, exp.model, exp.amp, images).items():
        (run_dir / name).write_text(text)
        exp.tracker.log_artifact(run_dir / name)


def git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).resolve().parent, capture_output=True,
                             text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def run(cfg: DictConfig, job: JobInfo) -> dict[str, float]:
    """Apply the hardware settings, open (or reopen) the tracker run, build, train, and end the run with the status
    that matches what happened: FINISHED, FAILED, or KILLED (a signal; then the process exits non-zero).

    The run is opened before the rest is built, so a job whose config fails still shows up as a FAILED run. A run
    dir that holds checkpoints (trainer.resume=auto) or a trainer.resume path continues that run: same MLflow run,
    same place in the data, the LR schedule and every state where the checkpoint left them.
    """
    hw: HardwareCfg = OmegaConf.to_object(cfg.hardware)
    hardware.validate(hw)
    if cfg.get("dry_run"):
        print(launch.dry_run_report(cfg, hw, job.overrides, job.run_dir))
        return {}
    hardware.check_backend(hw)  # before msrun starts workers that would each fail the same way
    if launch.needs_launch(hw):  # this process only starts the workers under msrun and waits for them
        status = launch.launch(hw, Path(sys.argv[0]).resolve(), job.overrides, job.run_dir)
        if status != 0:
            raise RuntimeError(f"{launch.world_size(hw)} msrun workers failed with exit status {status}")
        return {}
    hardware.apply(hw, int(cfg.seed), bool(OmegaConf.select(cfg, "trainer.deterministic")))
    if launch.is_scheduler():  # msrun's scheduler has served the cluster inside init(); nothing else to do
        return {}
    if cfg.get("inspect"):  # +inspect=amp | +inspect=drift: print the precision report and stop
        print(amp_report.inspect(cfg))
        return {}
    if launch.rank() != 0:  # the other ranks train the same steps silently: one log, one run, one checkpoint
        log.setLevel(logging.WARNING)
    fail_rank = OmegaConf.select(cfg, "debug.fail_rank")
    if fail_rank is not None and int(fail_rank) == launch.rank():
        raise RuntimeError(f"debug.fail_rank={fail_rank}: this worker fails on purpose (to test failure handling)")
    config = OmegaConf.to_container(cfg, resolve=True)
    resume_from = locate(OmegaConf.select(cfg, "trainer.resume"), job.run_dir)
    if resume_from is not None:
        check_compatible(resume_from.progress.config, config)
    run_id = (resume_from.progress.mlflow_run_id or None) if resume_from else saved_run_id(job.run_dir)
    tracker = TRACKERS.build(node(cfg, "tracking")) if launch.rank() == 0 else NullTracker()
    tracker.start(job.run_name()[:250], job.tags(), run_id=run_id)
    if launch.rank() == 0:
        remember_run_id(job.run_dir, tracker.run_id)
    try:
        job.run_dir.mkdir(parents=True, exist_ok=True)
        (job.run_dir / "overrides.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(list(job.overrides))))
        tracker.log_artifact(job.run_dir / "overrides.yaml")
        exp = build_experiment(cfg, tracker)
        if resume_from is None:  # a resumed run has its params already
            tracker.log_params(flatten(config))
        (job.run_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
        tracker.log_artifact(job.run_dir / "config.yaml")
        if exp.trainer.amp_report and launch.rank() == 0 and resume_from is None:
            log_amp_report(exp, node(cfg, "model"), job.run_dir)
        jit = hw.mode == "graph"
        history = ([evaluate_only(exp, jit)] if exp.trainer.eval_only
                   else fit(exp, job.run_dir, jit, resume_from, config))
    except (Interrupted, KeyboardInterrupt):
        tracker.close("KILLED")
        raise
    except BaseException:
        tracker.close("FAILED")
        raise
    tracker.close("FINISHED")
    result = {**history[-1], "val/top1_best": max(m["val/top1"] for m in history)}
    (job.run_dir / "metrics.json").write_text(json.dumps(result, indent=1) + "\n")  # read by hydra/launcher=isolated
    return result
