"""Parameters, FLOPs and per-stage shapes of a Swin model.

    python -m swinexp.models.summary model=swin_tiny
    python -m swinexp.models.summary model=swin_base img_size=384 window_size=12 qkv=fused

FLOPs are counted analytically per layer exactly as the official `flops()` methods of microsoft/Swin-Transformer
do: multiply-adds of every Linear/Conv and of the two attention matmuls, plus one per element for each LayerNorm,
for one image. The switches compute the same function, so the count does not depend on them.
"""
from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass

import yaml
from mindspore import nn

from swinexp.models.factory import create_model
from swinexp.models.swin import BasicLayer, PatchMerging, SwinTransformer, SwinTransformerBlock
from swinexp.registry import ConfigError

__all__ = ["StageSummary", "block_flops", "format_summary", "main", "merging_flops", "summarize"]

Shape = tuple[int, ...]


@dataclass(frozen=True)
class StageSummary:
    """One row of the summary.

    Attributes:
        name: "patch_embed", "layers.i" or "norm+head".
        depth: Blocks in the stage (0 for the other rows).
        heads: Attention heads (0 for the other rows).
        window: Window side actually used (0 for the other rows).
        in_shape: Input of one image: (C, H, W) for the image, (H, W, C) for token maps.
        out_shape: Output of one image, (H, W, C) or (num_classes,).
        params: Parameters owned by the row.
        flops: Multiply-adds for one image, official convention.
    """

    name: str
    depth: int
    heads: int
    window: int
    in_shape: Shape
    out_shape: Shape
    params: int
    flops: int


def block_flops(block: SwinTransformerBlock) -> int:
    """Official `SwinTransformerBlock.flops()`: two LayerNorms, (S)W-MSA over all windows, and the MLP."""
    dim, r, ws = block.dim, block.input_resolution, block.window_size
    n, heads = ws * ws, block.attn.num_heads
    hidden = block.mlp.fc1.weight.shape[0]
    attn = n * dim * 3 * dim + 2 * heads * n * (dim // heads) * n + n * dim * dim  # qkv, q@k^T, attn@v, proj
    return 2 * dim * r * r + (r * r // n) * attn + 2 * r * r * dim * hidden


def merging_flops(merge: PatchMerging) -> int:
    """Official `PatchMerging.flops()`: LayerNorm-ish term over the input map, then the 4C -> 2C reduction."""
    r, dim = merge.input_resolution, merge.dim
    return r * r * dim + (r // 2) * (r // 2) * 4 * dim * 2 * dim


def _params(model: nn.Cell, *prefixes: str) -> int:
    owned = [p for p in model.get_parameters() if any(p.name == x or p.name.startswith(f"{x}.") for x in prefixes)]
    return sum(p.size for p in owned)


def _stage(model: SwinTransformer, i: int, layer: BasicLayer) -> StageSummary:
    first = layer.blocks[0]
    r, dim = first.input_resolution, first.dim
    flops = sum(block_flops(b) for b in layer.blocks)
    out: Shape = (r, r, dim)
    if layer.downsample is not None:
        flops += merging_flops(layer.downsample)
        out = (r // 2, r // 2, 2 * dim)
    return StageSummary(f"layers.{i}", len(layer.blocks), first.attn.num_heads, first.window_size, (r, r, dim), out,
                        _params(model, f"layers.{i}"), flops)  # fmt: skip


def summarize(model: SwinTransformer) -> list[StageSummary]:
    """Per-stage parameters, shapes and FLOPs of a built SwinTransformer; the rows sum to the totals.

    Args:
        model: Any SwinTransformer (switches do not change the result).

    Returns:
        patch_embed, one row per stage, then norm+head.
    """
    embed = model.patch_embed
    c_out, c_in, p, _ = embed.proj.weight.shape
    r = embed.patches_resolution
    flops = r * r * c_out * c_in * p * p + (r * r * c_out if embed.norm is not None else 0)
    rows = [StageSummary("patch_embed", 0, 0, 0, (c_in, embed.img_size, embed.img_size), (r, r, c_out),
                         _params(model, "patch_embed", "absolute_pos_embed"), flops)]  # fmt: skip
    rows += [_stage(model, i, layer) for i, layer in enumerate(model.layers)]
    c, last = model.num_features, rows[-1].out_shape
    # the official final-norm term divides by 2**num_layers, not by the 4**(num_layers-1) of the last map (kept)
    flops = c * r * r // 2**model.num_layers + c * model.num_classes
    out = (model.num_classes,) if model.num_classes else (c,)
    rows.append(StageSummary("norm+head", 0, 0, 0, last, out, _params(model, "norm", "head"), flops))
    return rows


def _shape(shape: Shape) -> str:
    return "x".join(map(str, shape))


def format_summary(title: str, rows: Sequence[StageSummary]) -> str:
    """A fixed-width table of `rows` with a total line."""
    header = f"{'stage':<12}{'depth':>6}{'heads':>6}{'window':>7}  {'in':<12}{'out':<12}{'params':>13}{'GFLOPs':>9}"
    lines = [title, header, "-" * len(header)]
    for row in rows:
        lines.append(f"{row.name:<12}{row.depth or '':>6}{row.heads or '':>6}{row.window or '':>7}  "
                     f"{_shape(row.in_shape):<12}{_shape(row.out_shape):<12}{row.params:>13,}{row.flops / 1e9:>9.3f}")
    params, flops = sum(r.params for r in rows), sum(r.flops for r in rows)
    lines += ["-" * len(header), f"{'total':<55}{params:>13,}{flops / 1e9:>9.3f}"]
    return "\n".join(lines)


def _parse(argv: Sequence[str]) -> tuple[str, dict[str, object]]:
    args: dict[str, object] = {}
    for arg in argv:
        key, sep, value = arg.partition("=")
        if not sep:
            raise ConfigError(f"'{arg}' is not key=value, e.g. model=swin_tiny qkv=split")
        args[key.removeprefix("model.")] = yaml.safe_load(value)
    if "model" not in args:
        raise ConfigError("name the model: python -m swinexp.models.summary model=swin_tiny [key=value ...]")
    return str(args.pop("model")), args


def main(argv: Sequence[str] | None = None) -> int:
    """Print the summary of `model=<name>` built with `key=value` overrides (builder parameters)."""
    try:
        name, overrides = _parse(sys.argv[1:] if argv is None else argv)
        model = create_model(name, **overrides)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    switches = ", ".join(f"{k}={v}" for k, v in overrides.items())
    print(format_summary(f"{name}" + (f" ({switches})" if switches else ""), summarize(model)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
