"""Pure, strict name/shape conversion between Swin state dicts: timm, official PyTorch and swinexp (MindSpore).

Three layouts hold the same tensors under different names:

- `official` (microsoft/Swin-Transformer `.pth`): PyTorch names, `layers.i.downsample.*` ends stage i, `head.*`.
- `timm` (timm >= 0.9 `.safetensors`): the patch merging opens the next stage, so official `layers.i.downsample.*`
  is timm `layers.{i+1}.downsample.*`, and the classifier is `head.fc.*`.
- `mindspore` (swinexp `.ckpt`): the official names with LayerNorm `gamma`/`beta` for `weight`/`bias`.

Checkpoints carry the fused `attn.qkv.*` whatever the model's `qkv` switch; `match_qkv` slices or concatenates
the q/k/v rows when the target model has separate `attn.q/k/v.*`. Everything here maps
`Mapping[str, np.ndarray]` to a new dict and never touches a model, so it is tested without MindSpore.
"""
from __future__ import annotations

import re
from collections.abc import Collection, Mapping

import numpy as np

__all__ = [
    "LAYOUTS",
    "NON_PERSISTENT",
    "check_matches",
    "detect_layout",
    "fuse_qkv",
    "match_qkv",
    "num_classes_of",
    "split_qkv",
    "to_mindspore",
    "to_timm",
]

LAYOUTS = ("official", "timm", "mindspore")
# buffers that PyTorch checkpoints may hold but swinexp rebuilds from the config (never trained)
NON_PERSISTENT = ("relative_position_index", "attn_mask", "relative_coords_table")

_NORM = re.compile(r"^(.*(?:^|\.)norm\d?)\.(weight|bias|gamma|beta)$")  # patch_embed.norm, norm1, norm2, ...
_TORCH_TO_MS = {"weight": "gamma", "bias": "beta"}
_MS_TO_TORCH = {"gamma": "weight", "beta": "bias"}
_DOWNSAMPLE = re.compile(r"^layers\.(\d+)\.downsample\.")
_FUSED = re.compile(r"^(.*)\.qkv\.(weight|bias)$")
_PART = re.compile(r"^(.*)\.([qkv])\.(weight|bias)$")


def detect_layout(names: Collection[str]) -> str:
    """Which of LAYOUTS a state dict's keys follow.

    LayerNorm `gamma`/`beta` means swinexp's own layout. Otherwise a `layers.0.downsample` means the official
    layout (merging at the end of a stage) and a later-only downsample or a `head.fc` means timm's. A
    one-stage model without a head has the same keys in both PyTorch layouts; it is reported as official.

    Args:
        names: The state dict keys.

    Returns:
        One of "official", "timm", "mindspore".
    """
    if any(_NORM.match(n) and n.endswith((".gamma", ".beta")) for n in names):
        return "mindspore"
    stages = {int(m.group(1)) for n in names if (m := _DOWNSAMPLE.match(n))}
    if 0 in stages:
        return "official"
    if stages or any(n.startswith("head.fc.") for n in names):
        return "timm"
    return "official"


def _shift_downsample(name: str, by: int) -> str:
    return _DOWNSAMPLE.sub(lambda m: f"layers.{int(m.group(1)) + by}.downsample.", name)


def _rename_norm(name: str, table: Mapping[str, str]) -> str:
    m = _NORM.match(name)
    return f"{m.group(1)}.{table.get(m.group(2), m.group(2))}" if m else name


def split_qkv(state: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Replace every `*.qkv.{weight,bias}` by `*.{q,k,v}.{weight,bias}`; other entries pass through.

    The fused rows are [q; k; v] (the official reshape (B, N, 3, heads, hd) puts q first). Names may carry a
    prefix, so optimizer moments (`adam_m.layers.0...qkv.weight`) split the same way.

    Args:
        state: Name to array, e.g. `{p.name: p.asnumpy() for p in model.get_parameters()}`.

    Returns:
        A new dict with separate q/k/v entries, in the order of `state`.
    """
    out: dict[str, np.ndarray] = {}
    for name, value in state.items():
        m = _FUSED.match(name)
        if not m:
            out[name] = value
            continue
        if value.shape[0] % 3:
            raise ValueError(f"'{name}' has {value.shape[0]} rows, not a multiple of 3: it cannot hold q, k and v")
        for part, rows in zip("qkv", np.split(value, 3, axis=0)):
            out[f"{m.group(1)}.{part}.{m.group(2)}"] = rows
    return out


def fuse_qkv(state: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Inverse of `split_qkv`: concatenate the rows of `*.{q,k,v}.*` into `*.qkv.*`, as checkpoints store them.

    Args:
        state: Name to array with separate q/k/v entries (or none: then it is copied unchanged).

    Returns:
        A new dict with fused entries placed where the `q` entry was.

    Raises:
        ValueError: A q, k or v entry lacks one of its two partners.
    """
    out: dict[str, np.ndarray] = {}
    for name, value in state.items():
        m = _PART.match(name)
        if not m:
            out[name] = value
            continue
        prefix, part, leaf = m.groups()
        if part != "q":
            continue  # consumed with its q
        names = [f"{prefix}.{p}.{leaf}" for p in "qkv"]
        if missing := [n for n in names if n not in state]:
            raise ValueError(f"cannot fuse '{name}' into '{prefix}.qkv.{leaf}': {missing} missing")
        out[f"{prefix}.qkv.{leaf}"] = np.concatenate([state[n] for n in names], axis=0)
    if orphans := [n for n in state if (m := _PART.match(n)) and f"{m.group(1)}.q.{m.group(3)}" not in state]:
        raise ValueError(f"k/v entries without a q entry cannot be fused: {orphans[:5]}")
    return out


def match_qkv(state: Mapping[str, np.ndarray], names: Collection[str]) -> dict[str, np.ndarray]:
    """Split or fuse q/k/v entries so they follow the target `names` (a model's or optimizer's parameters).

    Args:
        state: Name to array, fused or split.
        names: The names the result should use; their q/k/v entries decide the direction.

    Returns:
        A new dict; unchanged when both sides already agree.
    """
    if any(_PART.match(n) for n in names):
        return split_qkv(state)
    if any(_FUSED.match(n) for n in names):
        return fuse_qkv(state)
    return dict(state)


def num_classes_of(state: Mapping[str, np.ndarray]) -> int:
    """Rows of the classifier in a state dict of any layout; 0 when it has none (a backbone-only file)."""
    for name in ("head.weight", "head.fc.weight"):
        if name in state:
            return int(state[name].shape[0])
    return 0


def to_mindspore(state: Mapping[str, np.ndarray], names: Collection[str]) -> dict[str, np.ndarray]:
    """Rename a state dict of any layout to the target model's parameter names (no checks; see `check_matches`).

    Drops the NON_PERSISTENT buffers, undoes timm's stage shift and `head.fc`, renames LayerNorm
    `weight`/`bias` to `gamma`/`beta`, and splits or fuses q/k/v to follow `names`.

    Args:
        state: Name to array in one of LAYOUTS.
        names: The target model's parameter names.

    Returns:
        A new dict keyed like the model.
    """
    kept = {k: v for k, v in state.items() if k.rpartition(".")[2] not in NON_PERSISTENT}
    layout = detect_layout(kept)
    out: dict[str, np.ndarray] = {}
    for name, value in kept.items():
        if layout == "timm":
            name = re.sub(r"^head\.fc\.", "head.", _shift_downsample(name, -1))
        if layout != "mindspore":
            name = _rename_norm(name, _TORCH_TO_MS)
        out[name] = value
    return match_qkv(out, names)


def to_timm(state: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Rename a swinexp state dict (any qkv switch) to timm's layout: fused qkv, `weight`/`bias` norms.

    Args:
        state: Model parameter name to array, as `{p.name: p.asnumpy() for p in model.get_parameters()}`.

    Returns:
        A new dict that timm's `SwinTransformer.load_state_dict` accepts (its buffers are not persistent).
    """
    out: dict[str, np.ndarray] = {}
    for name, value in fuse_qkv(state).items():
        name = _shift_downsample(_rename_norm(name, _MS_TO_TORCH), +1)
        out[re.sub(r"^head\.", "head.fc.", name)] = value
    return out


def check_matches(state: Mapping[str, np.ndarray], expected: Mapping[str, tuple[int, ...]]) -> None:
    """Raise unless `state` has exactly the `expected` names with the expected shapes.

    Args:
        state: Converted name to array.
        expected: The model's parameter name to shape.

    Raises:
        ValueError: Naming up to five unexpected keys, missing keys and shape mismatches each, with counts.
    """
    problems = []
    if unexpected := [k for k in state if k not in expected]:
        problems.append(f"{len(unexpected)} unexpected keys (no such parameter), e.g. {unexpected[:5]}")
    if missing := [k for k in expected if k not in state]:
        problems.append(f"{len(missing)} missing keys, e.g. {missing[:5]}")
    wrong = [f"{k}: file {tuple(state[k].shape)} vs model {tuple(expected[k])}" for k in expected
             if k in state and tuple(state[k].shape) != tuple(expected[k])]  # fmt: skip
    if wrong:
        problems.append(f"{len(wrong)} shape mismatches, e.g. {wrong[:5]}")
    if problems:
        raise ValueError("; ".join(problems))
