"""`run(cfg)`: set up the process, build the experiment, fit it, and close the tracker whatever happens."""
from __future__ import annotations

import logging
import math
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from swinexp import checkpoint, hardware
from swinexp.build import Experiment, build_experiment
from swinexp.config import HardwareCfg
from swinexp.evaluate import evaluate, make_eval_step
from swinexp.step import make_train_step
from swinexp.tracking import flatten

log = logging.getLogger("swinexp")

@dataclass(frozen=True)
class JobInfo:
    """What Hydra knows about the job: where it writes and which overrides and group choices made it."""

    run_dir: Path
    overrides: list[str] = field(default_factory=list)
    choices: dict[str, str] = field(default_factory=dict)


def fit(exp: Experiment, run_dir: Path, jit: bool) -> list[dict[str, float]]:
    """Train for trainer.epochs, evaluating, logging and checkpointing after every epoch.

    Returns:
        The metrics of every epoch, in order.
    """
    trainer, model = exp.trainer, exp.model
    train_step = make_train_step(model, exp.optimizer, exp.amp, trainer.clip_grad, jit)
    eval_step = make_eval_step(model, jit)
    history: list[dict[str, float]] = []
    for epoch in range(trainer.epochs):
        model.set_train(True)
        start, losses, seen = time.perf_counter(), [], 0
        bar = tqdm(total=exp.steps_per_epoch, desc=f"epoch {epoch + 1}/{trainer.epochs}", leave=False,
                   disable=not trainer.progress_bar, dynamic_ncols=True)
        for index, (images, targets) in enumerate(exp.train_loader.epoch(epoch)):
            if index == exp.steps_per_epoch:
                break
            loss, grad_norm = train_step(images, targets)
            losses.append(float(loss))
            seen += int(images.shape[0])
            lr = float(exp.lr_schedule[epoch * exp.steps_per_epoch + index])
            bar.set_postfix(loss=f"{losses[-1]:.4f}", lr=f"{lr:.2e}", img_s=f"{seen / (time.perf_counter() - start):.1f}")
            bar.update()
            if not math.isfinite(losses[-1]):
                raise FloatingPointError(f"train loss is {losses[-1]} at epoch {epoch + 1}, step {index + 1}")
        bar.close()
        train_time = time.perf_counter() - start
        val_batches = _limit(exp.val_loader.epoch(epoch), trainer.limit_val_batches)
        metrics = {"train/loss": float(np.mean(losses)), "train/grad_norm": float(grad_norm), "lr": lr,
                   "epoch_time_s": time.perf_counter() - start, "train/images_per_s": seen / train_time,
                   **evaluate(model, val_batches, eval_step)}
        exp.tracker.log_metrics(metrics, step=epoch + 1)  # step 10 = end of the tenth epoch
        meta = {"epoch": epoch + 1, "val_top1": metrics["val/top1"], "mlflow_run_id": exp.tracker.run_id or ""}
        checkpoint.save(run_dir / "checkpoints" / "last.ckpt", model, exp.optimizer, meta)
        if metrics["val/top1"] > max((m["val/top1"] for m in history), default=-math.inf):
            checkpoint.save(run_dir / "checkpoints" / "best.ckpt", model, exp.optimizer, meta)
        log.info("epoch %d/%d  train/loss %.4f  val/loss %.4f  val/top1 %.2f  val/top5 %.2f  lr %.2e  %.1f s  %.1f img/s",
                 epoch + 1, trainer.epochs, metrics["train/loss"], metrics["val/loss"], metrics["val/top1"],
                 metrics["val/top5"], lr, metrics["epoch_time_s"], metrics["train/images_per_s"])
        history.append(metrics)
    return history


def _limit(batches, limit: int | None):
    for index, batch in enumerate(batches):
        if limit is not None and index >= limit:
            return
        yield batch


def git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).resolve().parent, capture_output=True,
                             text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def run(cfg: DictConfig, job: JobInfo) -> dict[str, float]:
    """Apply the hardware settings, build everything, train, and end the tracker run with the right status."""
    hw: HardwareCfg = OmegaConf.to_object(cfg.hardware)
    hardware.apply(hw, int(cfg.seed))
    exp = build_experiment(cfg)
    job.run_dir.mkdir(parents=True, exist_ok=True)
    run_name = " ".join(job.overrides) or "defaults"
    tags = {"overrides": run_name, **{f"choice.{k}": str(v) for k, v in job.choices.items() if v is not None
                                       and not k.startswith("hydra")}}
    if commit := git_commit():
        tags["git_commit"] = commit
    exp.tracker.start(run_name[:250], tags)
    try:
        exp.tracker.log_params(flatten(OmegaConf.to_container(cfg, resolve=True)))
        (job.run_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
        (job.run_dir / "overrides.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(list(job.overrides))))
        exp.tracker.log_artifact(job.run_dir / "config.yaml")
        exp.tracker.log_artifact(job.run_dir / "overrides.yaml")
        history = fit(exp, job.run_dir, jit=hw.mode == "graph")
    except KeyboardInterrupt:
        exp.tracker.close("KILLED")
        raise
    except BaseException:
        exp.tracker.close("FAILED")
        raise
    exp.tracker.close("FINISHED")
    return {**history[-1], "val/top1_best": max(m["val/top1"] for m in history)}
