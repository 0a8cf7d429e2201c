"""Export a trained run's model for serving: `python -m swinexp.serve.export RUN_DIR_OR_CKPT --format mindir [--out F]`.

The model is built from the run's own config (fp32, eval mode) with the checkpoint's weights, and exported with a
fixed input of (batch, 3, data.img_size, data.img_size) float32 images, normalized as the run's eval transform
does; the graph returns the logits. Reload it with `mindspore.nn.GraphCell(mindspore.load(path))`.
Trailing `key=value` arguments override the run's config (e.g. hardware.device_target=CPU).
"""
from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

import mindspore as ms
import numpy as np

from swinexp.registry import ConfigError
from swinexp.serve.saved_run import CHECKPOINTS, SavedRun, load_model, open_run, setup

FORMATS = {"mindir": "MINDIR"}  # --format -> mindspore.export's file_format


def export(run: SavedRun, out: Path, file_format: str = "mindir", batch_size: int = 1) -> Path:
    """Write the run's model to `out` (its suffix is the format's) and return the path written."""
    if file_format not in FORMATS:
        raise ConfigError(f"--format {file_format} is not supported; choose one of: {', '.join(FORMATS)}")
    size = int(run.plan.get("data.img_size"))
    example = ms.Tensor(np.zeros((batch_size, 3, size, size), np.float32))
    out = Path(out).with_suffix(f".{file_format}")
    out.parent.mkdir(parents=True, exist_ok=True)
    ms.export(load_model(run), example, file_name=str(out.with_suffix("")), file_format=FORMATS[file_format])
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m swinexp.serve.export", description=__doc__.split("\n\n")[0])
    parser.add_argument("source", type=Path, help="a run dir (outputs/<date>/<time>) or a .ckpt file")
    parser.add_argument("overrides", nargs="*", help="key=value changes to the run's config")
    parser.add_argument("--format", default="mindir", choices=sorted(FORMATS))
    parser.add_argument("--out", type=Path, default=None, help="default: <run dir>/export/model.<format>")
    parser.add_argument("--checkpoint", default="best", choices=CHECKPOINTS, help="for a run dir: which checkpoint")
    parser.add_argument("--batch-size", type=int, default=1, help="the exported graph's fixed batch size")
    args = parser.parse_intermixed_args(argv)  # key=value overrides may follow the options
    try:
        run = open_run(args.source, args.overrides, args.checkpoint)
        run = setup(run)
        out = args.out or run.checkpoint.parent.parent / "export" / "model"
        path = export(run, out, args.format, args.batch_size)
    except ConfigError as err:
        parser.exit(2, f"error: {err}\n")
    size = int(run.plan.get("data.img_size"))
    print(f"{run.checkpoint} -> {path}: {run.plan.get('model.name')}, input ({args.batch_size}, 3, {size}, {size}) "
          "float32 "
          f"(the eval transform's normalized images), output ({args.batch_size}, {run.plan.get('model.num_classes')}) "
          f"logits; load it with mindspore.nn.GraphCell(mindspore.load('{path}'))")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
