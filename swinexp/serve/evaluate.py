"""Score a trained run again: `python -m swinexp.serve.evaluate RUN_DIR_OR_CKPT [key=value ...] [--checkpoint last]`.

Reads the run's config.yaml, applies the overrides (e.g. data.root=/elsewhere, trainer.limit_val_batches=null),
builds the experiment as a training does and runs the validation pass of training on the checkpoint's weights with
the same compiled eval step, loader and trainer.limit_val_batches; prints val/loss, val/top1 and val/top5.
Nothing is logged to a tracker.
"""
from __future__ import annotations

import argparse
import itertools
import json
from collections.abc import Sequence
from pathlib import Path

from swinexp.engine import checkpoint
from swinexp.engine.evaluate import evaluate, make_eval_step
from swinexp.registry import ConfigError
from swinexp.serve.saved_run import CHECKPOINTS, SavedRun, experiment, open_run, setup


def evaluate_run(run: SavedRun) -> dict[str, float]:
    """The validation metrics of the run's checkpoint under its (overridden) config (call `setup` first)."""
    exp = experiment(run)
    checkpoint.load(run.checkpoint, exp.model)
    batches = itertools.islice(exp.val_loader.epoch(0), exp.trainer.limit_val_batches)
    return evaluate(exp.model, batches, make_eval_step(exp.model, run.plan.hardware.mode == "graph"))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m swinexp.serve.evaluate", description=__doc__.split("\n\n")[0])
    parser.add_argument("source", type=Path, help="a run dir (outputs/<date>/<time>) or a .ckpt file")
    parser.add_argument("overrides", nargs="*", help="key=value changes to the run's config, e.g. data.root=...")
    parser.add_argument("--checkpoint", default="best", choices=CHECKPOINTS, help="for a run dir: which checkpoint")
    args = parser.parse_intermixed_args(argv)  # key=value overrides may follow the options
    try:
        run = open_run(args.source, args.overrides, args.checkpoint)
        run = setup(run)
        metrics = evaluate_run(run)
    except ConfigError as err:
        parser.exit(2, f"error: {err}\n")
    print(f"{run.checkpoint}  val/loss {metrics['val/loss']:.4f}  val/top1 {metrics['val/top1']:.2f}  "
          f"val/top5 {metrics['val/top5']:.2f}")
    print(json.dumps(metrics))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
