"""Convert Swin weights between timm/official PyTorch files and swinexp checkpoints.

    python -m swinexp.models.weights import swin_tiny.safetensors swin_tiny.ckpt --model swin_tiny
    # needs torch:
    python -m swinexp.models.weights import swin_tiny_patch4_window7_224.pth swin_tiny.ckpt --model swin_tiny
    python -m swinexp.models.weights export swin_tiny.ckpt swin_tiny.safetensors --model swin_tiny
    python -m swinexp.models.weights import micro.safetensors micro.ckpt --model swin_micro --set embed_dim=16

`import` reads a timm `.safetensors` (no torch needed), an official `.pth` or a `.ckpt`, detects its layout, checks
every tensor against `--model` and writes a MindSpore checkpoint with the official names (fused qkv, LayerNorm
gamma/beta). `export` writes timm's layout back, so `import` then `export` reproduces the file exactly.
`--set key=value` (repeatable, YAML values) overrides the architecture of `--model` (conf/model/<name>.yaml keys).
Both report the tensors they read from the source and the tensors they wrote.
"""
from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from swinexp.models import create_model
from swinexp.models.convert import NON_PERSISTENT, fuse_qkv, num_classes_of, to_timm
from swinexp.models.pretrained import (
    LoadReport,
    load_weights,
    model_state,
    read_weights,
    write_ckpt,
    write_safetensors,
)
from swinexp.registry import ConfigError

__all__ = ["Conversion", "export_weights", "import_weights", "main", "parse_sets"]


@dataclass(frozen=True)
class Conversion:
    """What `import_weights` / `export_weights` did.

    Attributes:
        load: What was loaded into the checked model (its `loaded` counts the model's parameters, which for a
            split-q/k/v model are more than the file's fused tensors).
        read: Tensors read from the source file, rebuilt buffers (relative_position_index, ...) included.
        skipped_buffers: Of those, buffers swinexp rebuilds from the config and never writes.
        written: Tensors written to the output file.
    """

    load: LoadReport
    read: int
    skipped_buffers: int
    written: int


def parse_sets(items: Sequence[str]) -> dict[str, Any]:
    """`["embed_dim=16", "depths=[2, 2]"]` -> `{"embed_dim": 16, "depths": [2, 2]}` (values parsed as YAML)."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set '{item}' is not key=value; e.g. --set embed_dim=16 --set depths=[2,2]")
        out[key.strip()] = yaml.safe_load(value)
    return out


def _load(src: Path, model_name: str, num_classes: int | None,
          overrides: dict[str, Any]) -> tuple[dict[str, np.ndarray], LoadReport, dict[str, np.ndarray]]:
    raw = read_weights(src)
    classes = num_classes_of(raw) if num_classes is None else num_classes
    model = create_model(model_name, num_classes=classes, **overrides)
    report = load_weights(model, raw, src, key="SRC")
    return {k: v for k, v in model_state(model).items() if k not in report.missing}, report, raw


def _buffers(raw: dict[str, np.ndarray]) -> int:
    return sum(k.rpartition(".")[2] in NON_PERSISTENT for k in raw)


def import_weights(src: str | Path, out: str | Path, model: str, num_classes: int | None = None,
                   overrides: dict[str, Any] | None = None) -> Conversion:
    """Convert a weight file of any layout to a swinexp `.ckpt`, checked against `model`.

    Args:
        src: A timm `.safetensors`, an official `.pth` (needs torch) or a `.ckpt`.
        out: The `.ckpt` to write.
        model: A registered model name whose architecture the file must match.
        num_classes: Keep a head of this size; default: the file's. A different size drops the head.
        overrides: Architecture keys that replace those of conf/model/<model>.yaml, e.g. {"embed_dim": 16}.

    Returns:
        What was read, loaded (and dropped) and written.
    """
    state, report, raw = _load(Path(src), model, num_classes, overrides or {})
    fused = fuse_qkv(state)  # what write_ckpt stores: the official fused q/k/v names
    write_ckpt(fused, out)
    return Conversion(report, len(raw), _buffers(raw), len(fused))


def export_weights(ckpt: str | Path, out: str | Path, model: str, num_classes: int | None = None,
                   overrides: dict[str, Any] | None = None) -> Conversion:
    """Write a checkpoint (any layout, any qkv switch) as a timm-layout `.safetensors`.

    Args:
        ckpt: The weights to export, usually a swinexp `.ckpt`.
        out: The `.safetensors` to write.
        model: A registered model name whose architecture the file must match.
        num_classes, overrides: As in `import_weights`.

    Returns:
        What was read, loaded (and dropped) and written.
    """
    state, report, raw = _load(Path(ckpt), model, num_classes, overrides or {})
    timm = to_timm(state)
    write_safetensors(timm, out)
    return Conversion(report, len(raw), _buffers(raw), len(timm))


def main(argv: Sequence[str] | None = None) -> int:
    """Command line entry point; see the module docstring."""
    parser = argparse.ArgumentParser(prog="python -m swinexp.models.weights", description=__doc__.split("\n\n")[0])
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
        sub.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="sets",
                         help="architecture override of --model, repeatable, e.g. --set embed_dim=16")
    args = parser.parse_args(argv)
    run = import_weights if args.command == "import" else export_weights
    try:
        result = run(args.src, args.out, args.model, args.num_classes, parse_sets(args.sets))
    except (ConfigError, FileNotFoundError, ImportError, ValueError) as err:
        parser.exit(2, f"error: {err}\n")
    report = result.load
    buffers = f", {result.skipped_buffers} rebuilt buffers skipped" if result.skipped_buffers else ""
    dropped = f"; dropped head {list(report.unexpected)}" if report.unexpected else ""
    print(f"{args.src} ({report.layout} layout): read {result.read} tensors{buffers} -> {args.out}: "
          f"wrote {result.written} tensors{dropped}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
