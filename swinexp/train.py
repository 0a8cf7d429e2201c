"""`run(cfg)`: set up the process, build the experiment, fit it, and close the tracker whatever happens."""
from __future__ import annotations

import logging
import math
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from swinexp import amp_report, checkpoint, hardware, launch
from swinexp.build import Experiment, build_experiment, node
from swinexp.config import HardwareCfg
from swinexp.evaluate import evaluate, make_eval_step
from swinexp.step import make_train_step
from swinexp.sweep import SweepInfo, sweep_from_env
from swinexp.registry import TRACKERS
from swinexp.tracking import NullTracker, flatten

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
        sweep = sweep_from_env(int(hydra_cfg.job.get("num", 0))) if hydra_cfg.mode == RunMode.MULTIRUN else None
        return cls(Path(hydra_cfg.runtime.output_dir), list(hydra_cfg.overrides.task),
                   dict(hydra_cfg.runtime.choices), sweep)

    def run_name(self) -> str:
        if self.sweep is not None:
            return self.sweep.run_name(self.overrides)
        return " ".join(self.overrides) or "defaults"

    def tags(self) -> dict[str, str]:
        """Overrides, sweep membership, chosen group options and the code's git commit."""
        tags = {"overrides": " ".join(self.overrides), **(self.sweep.tags() if self.sweep else {}),
                **{f"choice.{k}": str(v) for k, v in self.choices.items()
                   if v is not None and not k.startswith("hydra")}}
        if commit := git_commit():
            tags["git_commit"] = commit
        return tags


def fit(exp: Experiment, run_dir: Path, jit: bool) -> list[dict[str, float]]:
    """Train for trainer.epochs, evaluating, logging and checkpointing after every epoch.

    An epoch is `exp.steps_per_epoch` optimizer steps of `trainer.accumulation_steps` micro-batches each; the LR
    schedule and every step counter count optimizer steps. With trainer.ema.decay set, the EMA weights are
    evaluated too (val_ema/*).

    Returns:
        The metrics of every epoch, in order.
    """
    trainer, model, optimizer = exp.trainer, exp.model, exp.optimizer
    distributed, main_rank = launch.is_worker(), launch.rank() == 0
    train_step = make_train_step(model, optimizer, exp.amp, trainer.clip_grad, jit, trainer.accumulation_steps,
                                 trainer.accumulate_on, trainer.ema.decay, distributed)
    eval_step = make_eval_step(model, jit)
    micro_batches = exp.steps_per_epoch * trainer.accumulation_steps
    history: list[dict[str, float]] = []
    for epoch in range(trainer.epochs):
        model.set_train(True)
        start, losses, grad_norms, seen = time.perf_counter(), [], [], 0
        overflow_steps, loss_scale = 0, float("nan")
        bar = tqdm(total=exp.steps_per_epoch, desc=f"epoch {epoch + 1}/{trainer.epochs}", leave=False,
                   disable=not (trainer.progress_bar and main_rank), dynamic_ncols=True)
        for index, (images, targets) in enumerate(exp.train_loader.epoch(epoch)):
            if index == micro_batches:
                break
            out = train_step(images, targets)
            losses.append(out.loss)
            seen += int(images.shape[0])
            if not math.isfinite(out.loss):
                raise FloatingPointError(
                    f"train loss is {out.loss} at epoch {epoch + 1}, batch {index + 1} (amp {exp.amp.level}): the "
                    "forward pass itself is not finite, which loss scaling cannot fix; try amp=o1_manual or o0, "
                    "a lower optimizer.lr, or trainer.clip_grad"
                )
            if out.updated:
                overflow_steps += out.overflow
                loss_scale = out.loss_scale
                if not out.overflow:
                    grad_norms.append(out.grad_norm)
                bar.update()
            # the LR of the last optimizer step taken (an overflow skip does not advance the optimizer)
            lr = float(exp.lr_schedule[max(int(optimizer.global_step.asnumpy()[0]) - 1, 0)])
            bar.set_postfix(loss=f"{out.loss:.4f}", lr=f"{lr:.2e}", img_s=f"{seen / (time.perf_counter() - start):.1f}")
        bar.close()
        train_time = time.perf_counter() - start
        val_batches = _limit(exp.val_loader.epoch(epoch), trainer.limit_val_batches)
        metrics = {"train/loss": float(np.mean(losses)),
                   "train/grad_norm": float(np.mean(grad_norms)) if grad_norms else float("nan"),
                   "train/overflow_steps": float(overflow_steps), "train/loss_scale": loss_scale,
                   "train/optimizer_steps": float(optimizer.global_step.asnumpy()[0]),
                   "train/total_batch": float(exp.total_batch), "lr": lr,
                   "epoch_time_s": time.perf_counter() - start, "train/images_per_s": seen / train_time,
                   **evaluate(model, val_batches, eval_step, distributed)}
        if trainer.ema.decay is not None:
            train_step.swap_ema()  # evaluate the EMA weights with the same compiled eval step, then swap back
            ema_batches = _limit(exp.val_loader.epoch(epoch), trainer.limit_val_batches)
            metrics.update({k.replace("val/", "val_ema/"): v
                            for k, v in evaluate(model, ema_batches, eval_step, distributed).items()})
            train_step.swap_ema()
        metrics["epoch_time_s"] = time.perf_counter() - start
        skipped = {"data/train_skipped_files": exp.train_loader.skipped_files,
                   "data/val_skipped_files": exp.val_loader.skipped_files}
        metrics.update({k: float(v) for k, v in skipped.items()})
        if any(skipped.values()):
            log.warning("epoch %d: unreadable images were replaced by the next sample: %s (their names are in the "
                        "warnings above)", epoch + 1, skipped)
        exp.tracker.log_metrics(metrics, step=epoch + 1)  # step 10 = end of the tenth epoch
        meta = {"epoch": epoch + 1, "val_top1": metrics["val/top1"], "mlflow_run_id": exp.tracker.run_id or ""}
        if main_rank:  # every rank holds the same weights; one copy on disk
            checkpoint.save(run_dir / "checkpoints" / "last.ckpt", model, optimizer, meta)
            if metrics["val/top1"] > max((m["val/top1"] for m in history), default=-math.inf):
                checkpoint.save(run_dir / "checkpoints" / "best.ckpt", model, optimizer, meta)
        log.info("epoch %d/%d  train/loss %.4f  val/loss %.4f  val/top1 %.2f  val/top5 %.2f  lr %.2e  "
                 "overflow %d  scale %g  %.1f s  %.1f img/s", epoch + 1, trainer.epochs, metrics["train/loss"],
                 metrics["val/loss"], metrics["val/top1"], metrics["val/top5"], lr, overflow_steps, loss_scale,
                 metrics["epoch_time_s"], metrics["train/images_per_s"])
        history.append(metrics)
    if distributed:  # a cheap cross-rank check that data parallelism kept the replicas identical
        (run_dir / f"weights_rank{launch.rank()}.sha256").write_text(checkpoint.weights_digest(model) + "\n")
    return history


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
    """Apply the hardware settings, open the tracker run, build, train, and end the run with the right status.

    The run is opened before the rest is built, so a job whose config fails still shows up as a FAILED run.
    """
    hw: HardwareCfg = OmegaConf.to_object(cfg.hardware)
    hardware.validate(hw)
    if cfg.get("dry_run"):
        print(launch.dry_run_report(cfg, hw, job.overrides, job.run_dir))
        return {}
    if launch.needs_launch(hw):  # this process only starts the workers under msrun and waits for them
        status = launch.launch(hw, Path(sys.argv[0]).resolve(), job.overrides, job.run_dir)
        if status != 0:
            raise RuntimeError(f"{launch.world_size(hw)} msrun workers failed with exit status {status}")
        return {}
    hardware.apply(hw, int(cfg.seed))
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
    tracker = TRACKERS.build(node(cfg, "tracking")) if launch.rank() == 0 else NullTracker()
    tracker.start(job.run_name()[:250], job.tags())
    try:
        job.run_dir.mkdir(parents=True, exist_ok=True)
        (job.run_dir / "overrides.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(list(job.overrides))))
        tracker.log_artifact(job.run_dir / "overrides.yaml")
        exp = build_experiment(cfg, tracker)
        tracker.log_params(flatten(OmegaConf.to_container(cfg, resolve=True)))
        (job.run_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
        tracker.log_artifact(job.run_dir / "config.yaml")
        if exp.trainer.amp_report and launch.rank() == 0:
            log_amp_report(exp, node(cfg, "model"), job.run_dir)
        jit = hw.mode == "graph"
        history = [evaluate_only(exp, jit)] if exp.trainer.eval_only else fit(exp, job.run_dir, jit)
    except KeyboardInterrupt:
        tracker.close("KILLED")
        raise
    except BaseException:
        tracker.close("FAILED")
        raise
    tracker.close("FINISHED")
    return {**history[-1], "val/top1_best": max(m["val/top1"] for m in history)}
