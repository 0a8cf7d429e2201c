"""Weight files in and out of a Swin model: read `.safetensors`/`.pth`/`.ckpt`, load them strictly, write them back.

`load_pretrained` is what `model.pretrained=PATH` (and `create_model(..., pretrained=PATH)`) calls at build time:
every backbone tensor must match by name and shape, and only the classifier may differ (it is then dropped and
keeps its fresh initialisation, as when fine-tuning an ImageNet-22k checkpoint on another label set).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor, nn

from swinexp.models.convert import check_matches, detect_layout, fuse_qkv, to_mindspore
from swinexp.registry import ConfigError

__all__ = [
    "LoadReport",
    "assign",
    "load_pretrained",
    "load_weights",
    "model_state",
    "read_weights",
    "write_ckpt",
    "write_safetensors",
]

log = logging.getLogger("swinexp")

SUFFIXES = (".ckpt", ".safetensors", ".pth", ".pt", ".bin")
# top-level cells of SwinTransformer; other .ckpt entries are optimizer state (adam_m.*, global_step) or meta.*
MODEL_ROOTS = ("patch_embed", "absolute_pos_embed", "layers", "norm", "head")


@dataclass(frozen=True)
class LoadReport:
    """What `load_pretrained` did.

    Attributes:
        path: The file read.
        layout: The layout detected in it, one of convert.LAYOUTS.
        loaded: Number of model tensors set from the file.
        missing: Model parameters left at their initial values (only the head, when it was dropped).
        unexpected: File entries not loaded (only the file's head, when it was dropped).
    """

    path: Path
    layout: str
    loaded: int
    missing: tuple[str, ...] = ()
    unexpected: tuple[str, ...] = ()


def _read_torch(path: Path) -> dict[str, np.ndarray]:
    try:
        import torch  # optional: only the official .pth files need it
    except ImportError as err:
        raise ImportError(
            f"reading '{path}' needs PyTorch, which is not installed. Run `pip install torch` (CPU build is enough), "
            "or convert the file once elsewhere to timm's .safetensors"
        ) from err
    obj = torch.load(path, map_location="cpu", weights_only=True)  # the safe loader: tensors and containers only
    for key in ("model", "state_dict"):  # official: {'model': state_dict, ...}; some trainers: {'state_dict': ...}
        if isinstance(obj, dict) and isinstance(obj.get(key), dict):
            obj = obj[key]
    # bfloat16 has no numpy type: widen floats to float32
    return {k: (v.float() if v.is_floating_point() else v).numpy() for k, v in obj.items() if torch.is_tensor(v)}


def _read_ckpt(path: Path) -> dict[str, np.ndarray]:
    values = ms.load_checkpoint(str(path))
    state = {k: v.asnumpy() for k, v in values.items()
             if isinstance(v, (Parameter, Tensor)) and k.split(".")[0] in MODEL_ROOTS}  # fmt: skip
    if skipped := len(values) - len(state):
        log.info("%s: skipped %d optimizer/meta entries", path, skipped)
    return state


def read_weights(path: str | Path) -> dict[str, np.ndarray]:
    """Read the tensors of a weight file as numpy arrays, keyed as in the file.

    Args:
        path: A swinexp/MindSpore `.ckpt` (model entries only), a timm `.safetensors` (read without torch), or an
            official `.pth`/`.pt`/`.bin` (needs torch; read with `weights_only=True`, unwrapping `{'model': ...}`).

    Returns:
        Name to array.

    Raises:
        FileNotFoundError: `path` does not exist.
        ValueError: The suffix is not one of SUFFIXES.
        ImportError: A PyTorch file and no torch installed; the message says how to install it.
    """
    path = Path(path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"weight file '{path}' does not exist")
    if path.suffix == ".safetensors":
        from safetensors.numpy import load_file

        return load_file(str(path))
    if path.suffix == ".ckpt":
        return _read_ckpt(path)
    if path.suffix in (".pth", ".pt", ".bin"):
        return _read_torch(path)
    raise ValueError(f"weight file '{path}' has an unknown suffix; use one of: {', '.join(SUFFIXES)}")


def model_state(model: nn.Cell) -> dict[str, np.ndarray]:
    """Every parameter of `model` as a numpy array, by name."""
    return {p.name: p.asnumpy() for p in model.get_parameters()}


def assign(model: nn.Cell, state: dict[str, np.ndarray]) -> None:
    """Set `model`'s parameters from `state` (already in its names and shapes), cast to each parameter's dtype."""
    for p in model.get_parameters():
        if p.name in state:
            p.set_data(Tensor(np.ascontiguousarray(state[p.name]), p.dtype))


def load_weights(model: nn.Cell, raw: dict[str, np.ndarray], source: str | Path,
                 key: str = "model.pretrained") -> LoadReport:
    """Load a state dict of any layout and any qkv switch into `model`, strictly except for the classifier.

    The head is dropped (and reported as missing/unexpected keys) when its shape differs from the file's, e.g.
    `num_classes` 10 vs 1000, or when only one side has a head.

    Args:
        model: A built SwinTransformer (any switches).
        raw: Name to array as read by `read_weights`.
        source: Where `raw` came from, for messages.
        key: The config key named in errors.

    Returns:
        What was loaded and dropped; the same is logged.

    Raises:
        ConfigError: `raw` does not fit the model, naming the keys or shapes.
    """
    expected = {p.name: tuple(p.shape) for p in model.get_parameters()}
    state = to_mindspore(raw, expected)
    head_file = sorted(k for k in state if k.startswith("head."))
    head_model = sorted(k for k in expected if k.startswith("head."))
    drop = head_file != head_model or any(tuple(state[k].shape) != expected[k] for k in head_model)
    if drop:
        state = {k: v for k, v in state.items() if k not in head_file}
        expected = {k: v for k, v in expected.items() if k not in head_model}
    try:
        check_matches(state, expected)
    except ValueError as err:
        raise ConfigError(
            f"{key}='{source}' does not fit this model: {err}. Use the model the file was trained with "
            "(same embed_dim, depths, num_heads, window_size, patch_size)"
        ) from err
    assign(model, state)
    report = LoadReport(Path(source), detect_layout(raw), len(state), tuple(head_model) if drop else (),
                        tuple(head_file) if drop else ())  # fmt: skip
    log.info("loaded %d tensors from %s (%s layout)", report.loaded, source, report.layout)
    if drop:
        log.warning("%s: classifier dropped (shapes differ); missing keys (freshly initialised): %s; "
                    "unexpected keys (ignored): %s", source, list(report.missing), list(report.unexpected))
    return report


def load_pretrained(model: nn.Cell, path: str | Path, key: str = "model.pretrained") -> LoadReport:
    """Read a weight file (see `read_weights`) and load it with `load_weights`; what `model.pretrained` does.

    Raises:
        ConfigError: The file is missing, has an unknown suffix, or does not fit the model.
    """
    try:
        raw = read_weights(path)
    except (FileNotFoundError, ValueError) as err:
        raise ConfigError(f"{key}='{path}': {err}") from err
    return load_weights(model, raw, path, key)


def write_ckpt(state: dict[str, np.ndarray], path: str | Path) -> Path:
    """Write `state` as a MindSpore checkpoint with the official fused q/k/v names; `path` must end in .ckpt."""
    path = Path(path)
    if path.suffix != ".ckpt":
        raise ValueError(f"'{path}' must end in .ckpt (MindSpore would append it)")
    path.parent.mkdir(parents=True, exist_ok=True)
    ms.save_checkpoint([{"name": k, "data": Tensor(v)} for k, v in fuse_qkv(state).items()], str(path))
    return path


def write_safetensors(state: dict[str, np.ndarray], path: str | Path) -> Path:
    """Write `state` (already renamed, e.g. by convert.to_timm) as a `.safetensors` file."""
    from safetensors.numpy import save_file

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # "format": "pt" is what Hugging Face tooling expects of PyTorch-layout safetensors
    save_file({k: np.ascontiguousarray(v) for k, v in state.items()}, str(path), metadata={"format": "pt"})
    return path
