"""`python -m swinexp.parity [key=value ...] [--steps K] [--locate] [--tol T] [--lr-lag] [--out DIR]`.

    python -m swinexp.parity                                   # swin_micro fp32, 5 steps, the run.py defaults
    python -m swinexp.parity --locate trainer.clip_grad=5.0    # + per-stage outputs and gradients on batch 1
    python -m swinexp.parity amp=o1_manual                     # reference in torch.autocast fp16 + GradScaler
    python -m swinexp.parity model=swin_tiny data.img_size=224 data.batch_size=4 --steps 3

Overrides are run.py's (Hydra); dropout and drop path are switched off (they cannot draw the same masks on both
sides). Prints the per-step table and the worst parameters, writes it to DIR/parity.txt and logs it as an
MLflow run (tracking.*) with the table as artifact. Exit status: 0 when the weights (and EMA weights) agree within
the tolerance, 1 when the check FAILED, 2 on a config error.
"""
from __future__ import annotations

import argparse
import logging
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from swinexp.registry import ConfigError
from swinexp.tracking import open_tracker


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m swinexp.parity", description=__doc__.split("\n\n")[0],
                                     epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="Hydra overrides, as for run.py")
    parser.add_argument("--steps", type=int, default=5, help="optimizer steps on both sides (default 5)")
    parser.add_argument("--locate", action="store_true",
                        help="compare every stage's output and input gradient on the first batch")
    parser.add_argument("--tol", type=float, default=None,
                        help="relative difference that counts as divergence (default 1e-4 fp32, 5e-2 amp)")
    parser.add_argument("--lr-lag", action="store_true",
                        help="drive the reference's scheduler exactly as main.py: f(k-1) at step k")
    parser.add_argument("--out", type=Path, default=None, help="where parity.txt goes (default outputs/parity/<time>)")
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error("--steps must be >= 1")
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        from swinexp.parity import compare  # imports torch and timm
    except ImportError as err:
        parser.exit(2, f"error: {err}. The reference needs torch and timm: see the README section 'Checking a "
                       "run against PyTorch' (pip install -e '.[reference]')\n")
    try:
        plan = compare.configured_plan(args.overrides)
        tracker = open_tracker(plan.section("tracking"), plan.hardware.shared_dir)
    except ConfigError as err:
        parser.exit(2, f"ConfigError: {err}\n")
    tracker.start(f"parity {' '.join(args.overrides) or 'defaults'}"[:250],
                  {"parity": "true", "overrides": " ".join(args.overrides), "parity.steps": str(args.steps)})
    status = "FAILED"
    try:
        report = compare.check(plan, tracker, args.steps, args.locate, args.tol, args.lr_lag)
        text = report.text()
        print(text)
        out = args.out or Path("outputs") / "parity" / time.strftime("%Y-%m-%d_%H-%M-%S")
        out.mkdir(parents=True, exist_ok=True)
        (out / "parity.txt").write_text(f"python -m swinexp.parity {shlex.join(sys.argv[1:] if argv is None else argv)}"
                                        f"\n\n{text}\n")
        tracker.log_artifact(out / "parity.txt")
        tracker.log_metrics(report.metrics(), step=len(report.steps))
        status = "FINISHED"
    except (ConfigError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    finally:
        tracker.close(status)
    return 1 if report.beyond_tolerance() else 0  # a script or CI job sees a failed check


if __name__ == "__main__":
    raise SystemExit(main())
