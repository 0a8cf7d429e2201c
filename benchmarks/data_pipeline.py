"""Moved to `python -m swinexp.bench data`; this wrapper keeps the command in BENCHMARKS.md working.

    PYTHONPATH=. python benchmarks/data_pipeline.py --images 512
    # runs: python -m swinexp.bench data --images 512 --img-size 224 --batch 64 --workers 2
"""
from __future__ import annotations

import argparse
import sys

from swinexp.bench.__main__ import main

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=512)
    parser.add_argument("--src-size", type=int, default=224, help="now also the output size")
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args()
    argv = ["data", f"--images={args.images}", f"--img-size={args.src_size}", f"--batch={args.batch_size}",
            "--workers=2"]
    print("benchmarks/data_pipeline.py: running python -m swinexp.bench " + " ".join(argv), file=sys.stderr)
    raise SystemExit(main(argv))
