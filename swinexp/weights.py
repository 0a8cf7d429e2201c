"""Convert Swin weights between timm/official PyTorch files and swinexp checkpoints.

    python -m swinexp.weights import swin_tiny.safetensors swin_tiny.ckpt --model swin_tiny
    python -m swinexp.weights import swin_tiny_patch4_window7_224.pth swin_tiny.ckpt --model swin_tiny  # needs torch
    python -m swinexp.weights export swin_tiny.ckpt swin_tiny.safetensors --model swin_tiny

`import` reads a timm `.safetensors` (no torch needed), an official `.pth` or a `.ckpt`, detects its layout, checks
every tensor against `--model` and writes a MindSpore checkpoint with the official names (fused qkv, LayerNorm
gamma/beta). `export` writes timm's layout back, so `import` then `export` reproduces the file exactly.
"""
from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from swinexp.models import create_model
from swinexp.models.convert import num_classes_of, to_timm
from swinexp.models.pretrained import (
    LoadReport,
    load_weights,
    model_state,
    read_weights,
    write_ckpt,
    write_safetensors,
)
from swinexp.registry import ConfigError

__all__ = ["export_weights", "import_weights", "main"]


def _load(src: Path, model_name: str, num_classes: int | None) -> tuple[dict[str, np.ndarray], LoadReport]:
    raw = read_weights(src)
    classes = num_classes_of(raw) if num_classes is None else num_classes
    model = create_model(model_name, num_classes=classes)
    report = load_weights(model, raw, src, key="SRC")
    return {k: v for k, v in model_state(model).items() if k not in report.missing}, report


def import_weights(src: str | Path, out: str | Path, model: str, num_classes: int | None = None) -> LoadReport:
    """Convert a weight file of any layout to a swinexp `.ckpt`, checked against `model`.

    Args:
        src: A timm `.safetensors`, an official `.pth` (needs torch) or a `.ckpt`.
        out: The `.ckpt` to write.
        model: A registered model name whose architecture the file must match.
        num_classes: Keep a head of this size; default: the file's. A different size drops the head.

    Returns:
        What was loaded (and dropped).
    """
    state, report = _load(Path(src), model, num_classes)
    write_ckpt(state, out)
    return report


def export_weights(ckpt: str | Path, out: str | Path, model: str, num_classes: int | None = None) -> LoadReport:
    """Write a checkpoint (any layout, any qkv switch) as a timm-layout `.safetensors`.

    Args:
        ckpt: The weights to export, usually a swinexp `.ckpt`.
        out: The `.safetensors` to write.
        model: A registered model name whose architecture the file must match.
        num_classes: As in `import_weights`.

    Returns:
        What was loaded (and dropped).
    """
    state, report = _load(Path(ckpt), model, num_classes)
    write_safetensors(to_timm(state), out)
    return report


def main(argv: Sequence[str] | None = None) -> int:
    """Command line entry point; see the module docstring."""
    parser = argparse.ArgumentParser(prog="python -m swinexp.weights", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    for name, src_help, out_help in (
        ("import", "timm .safetensors, official .pth or .ckpt", "MindSpore .ckpt to write"),
        ("export", ".ckpt (or any file import reads)", "timm-layout .safetensors to write"),
    ):
        sub = commands.add_parser(name, help=f"{src_help} -> {out_help}")
        sub.add_argument("src", type=Path, help=src_help)
        sub.add_argument("out", type=Path, help=out_help)
        sub.add_argument("--model", required=True, help="registered model name, e.g. swin_tiny (conf/model/*.yaml)")
        sub.add_argument("--num-classes", type=int, default=None,
                         help="head size to keep; default: the file's (a different size drops the head)")
    args = parser.parse_args(argv)
    run = import_weights if args.command == "import" else export_weights
    try:
        report = run(args.src, args.out, args.model, args.num_classes)
    except (ConfigError, FileNotFoundError, ImportError, ValueError) as err:
        parser.exit(2, f"error: {err}\n")
    dropped = f"; dropped head {list(report.unexpected)}" if report.unexpected else ""
    print(f"{args.src} ({report.layout} layout) -> {args.out}: {report.loaded} tensors{dropped}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
