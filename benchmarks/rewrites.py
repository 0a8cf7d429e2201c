"""Moved to `python -m swinexp.bench step`; this wrapper keeps the commands in BENCHMARKS.md working.

    python benchmarks/rewrites.py --isolate --variants baseline split reshape onehot "all three"
    # runs: python -m swinexp.bench step --max-resident 2 --variants baseline qkv=split ...
"""
from __future__ import annotations

import argparse
import sys

from swinexp.bench.__main__ import main

# the old variant names -> presets (or overrides) of `swinexp.bench step --variants`
OLD_NAMES = {"baseline": "baseline", "split": "qkv=split", "fused_split": "model.qkv=fused_split",
             "reshape": "patch_merging=reshape", "onehot": "rel_pos_bias=onehot", "all three": "all three"}

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="swin_tiny")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--img-size", type=int, default=224)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--variants", nargs="+", default=list(OLD_NAMES), choices=list(OLD_NAMES))
    parser.add_argument("--isolate", action="store_true", help="now: the reference plus one variant per process")
    args = parser.parse_args()
    argv = ["step", f"--model={args.model}", f"--batch={args.batch_size}", f"--img-size={args.img_size}",
            f"--warmup={args.warmup}", f"--iters={args.steps}", *(["--max-resident=2"] if args.isolate else []),
            "--variants", *(OLD_NAMES[v] for v in args.variants)]
    print("benchmarks/rewrites.py: running python -m swinexp.bench " + " ".join(argv), file=sys.stderr)
    raise SystemExit(main(argv))
