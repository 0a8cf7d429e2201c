"""Weight files in and out of a Swin model: read `.safetensors`/`.pth`/`.ckpt`, load them strictly, write them back.

`load_pretrained` is what `model.pretrained=PATH` (and `create_model(..., pretrained=PATH)`) calls at build time:
every backbone tensor must match by name and shape, except the position tensors of another window size or
resolution, which are resized as `model.pretrained_resize` says (resize.py), and the classifier: a 21,841-class
ImageNet-22k head becomes a 1,000-class one through the official row map (map22kto1k.txt), any other mismatch is
dropped and keeps its fresh initialisation (`model.head_init` chooses otherwise). `prepare` adds `model.freeze`.
"""
from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor, nn

from swinexp.models.convert import check_matches, detect_layout, fuse_qkv, to_mindspore
from swinexp.models.resize import RESIZE_MODES, resize_positions
from swinexp.registry import ConfigError

__all__ = [
    "HEAD_INITS",
    "LOAD_DEFAULTS",
    "LoadReport",
    "assign",
    "freeze_params",
    "load_pretrained",
    "load_weights",
    "map22kto1k",
    "model_state",
    "prepare",
    "read_weights",
    "write_ckpt",
    "write_safetensors",
]

log = logging.getLogger("swinexp")

SUFFIXES = (".ckpt", ".safetensors", ".pth", ".pt", ".bin")
# top-level cells of SwinTransformer; other .ckpt entries are optimizer state (adam_m.*, global_step) or meta.*
MODEL_ROOTS = ("patch_embed", "absolute_pos_embed", "layers", "norm", "head")
# auto: the file's head if it fits, 21841 -> 1000 rows by the official map, else dropped (fresh init) |
# reset: never the file's (fresh init) | zeros: never the file's, zero weights and bias (the official loader's
# answer to another label set)
HEAD_INITS = ("auto", "reset", "zeros")
# the model keys a Swin builder takes besides SwinTransformer's (conf/model/base_swin.yaml), with their defaults
LOAD_DEFAULTS: dict[str, Any] = {"pretrained": None, "pretrained_resize": "official", "head_init": "auto",
                                 "freeze": ()}
IN22K_CLASSES, IN1K_CLASSES = 21841, 1000
MAP_22K_TO_1K = Path(__file__).with_name("map22kto1k.txt")  # shipped as package data (pyproject.toml)


@dataclass(frozen=True)
class LoadReport:
    """What `load_pretrained` did.

    Attributes:
        path: The file read.
        layout: The layout detected in it, one of convert.LAYOUTS.
        loaded: Number of model tensors set from the file.
        missing: Model parameters left at their initial values (only the head, when it was dropped).
        unexpected: File entries not loaded (only the file's head, when it was dropped).
        resized: One line per position tensor resized to the model's window size or resolution
            ("<name> (169, 3) -> (529, 3) official").
        head: How the classifier was set: loaded | map22kto1k | dropped | reset | zeros | none (no head).
    """

    path: Path
    layout: str
    loaded: int
    missing: tuple[str, ...] = ()
    unexpected: tuple[str, ...] = ()
    resized: tuple[str, ...] = ()
    head: str = "loaded"


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


@cache
def map22kto1k() -> np.ndarray:
    """The ImageNet-22k head row of each ImageNet-1k class (1000 ints, 1k label order), from the official file."""
    lines = [line for line in MAP_22K_TO_1K.read_text().splitlines() if line.strip() and not line.startswith("#")]
    rows = np.array([int(line) for line in lines], np.int64)
    assert rows.shape == (IN1K_CLASSES,) and rows.max() < IN22K_CLASSES, MAP_22K_TO_1K
    return rows


def _check_choice(key: str, value: str, allowed: Sequence[str]) -> None:
    if value not in allowed:
        raise ConfigError(f"{key}={value!r} is not one of: {', '.join(allowed)}")


def _head(state: dict[str, np.ndarray], expected: dict[str, tuple[int, ...]],
          head_init: str) -> tuple[dict[str, np.ndarray], str]:
    """The file's head as `head_init` wants it, and how it was set (LoadReport.head); a dropped head is not in
    the returned state."""
    head_file = sorted(k for k in state if k.startswith("head."))
    head_model = sorted(k for k in expected if k.startswith("head."))
    if not head_model:
        return {k: v for k, v in state.items() if k not in head_file}, "none"
    if head_init != "auto":
        return {k: v for k, v in state.items() if k not in head_file}, head_init
    rows = {k: state[k].shape[0] for k in head_file}
    if head_file == head_model and set(rows.values()) == {IN22K_CLASSES} and expected[head_model[0]][0] == IN1K_CLASSES:
        return {**state, **{k: state[k][map22kto1k()] for k in head_file}}, "map22kto1k"
    if head_file != head_model or any(tuple(state[k].shape) != expected[k] for k in head_model):
        return {k: v for k, v in state.items() if k not in head_file}, "dropped"
    return state, "loaded"


def load_weights(model: nn.Cell, raw: dict[str, np.ndarray], source: str | Path, key: str = "model.pretrained",
                 resize: str = "official", head_init: str = "auto") -> LoadReport:
    """Load a state dict of any layout and any qkv switch into `model`, strictly except for position tensors and
    the classifier.

    Relative position bias tables (and an absolute position embedding) of another window size or resolution are
    resized by `resize` (resize.py). With `head_init="auto"`, a 21,841-class head loads into a 1,000-class model
    through the official 22k -> 1k row map, and any other head whose shape differs from the model's (e.g.
    `num_classes` 10 vs 1000, or only one side has a head) is dropped and reported as missing/unexpected keys.

    Args:
        model: A built SwinTransformer (any switches).
        raw: Name to array as read by `read_weights`.
        source: Where `raw` came from, for messages.
        key: The config key named in errors.
        resize: One of resize.RESIZE_MODES; "none" refuses a window size or resolution change.
        head_init: One of HEAD_INITS.

    Returns:
        What was loaded, resized and dropped; the same is logged.

    Raises:
        ConfigError: `raw` does not fit the model, naming the keys or shapes.
    """
    _check_choice(f"{key.rpartition('.')[0] or 'model'}.pretrained_resize", resize, RESIZE_MODES)
    _check_choice(f"{key.rpartition('.')[0] or 'model'}.head_init", head_init, HEAD_INITS)
    expected = {p.name: tuple(p.shape) for p in model.get_parameters()}
    state, resized = resize_positions(to_mindspore(raw, expected), expected, resize)
    head_file = sorted(k for k in state if k.startswith("head."))
    state, head = _head(state, expected, head_init)
    dropped = head in ("dropped", "reset", "zeros")
    if dropped:
        expected = {k: v for k, v in expected.items() if not k.startswith("head.")}
    try:
        check_matches(state, expected)
    except ValueError as err:
        hint = (" (window_size and img_size may differ: set model.pretrained_resize=official or timm to resize "
                "the position tables)" if resize == "none" else " (window_size and img_size may differ: the "
                "position tables are resized)")
        raise ConfigError(
            f"{key}='{source}' does not fit this model: {err}. Use the model the file was trained with "
            f"(same embed_dim, depths, num_heads, patch_size, ape){hint}"
        ) from err
    if head == "zeros":
        state.update({p.name: np.zeros(p.shape, np.float32) for p in model.get_parameters()
                      if p.name.startswith("head.")})
    assign(model, state)
    head_model = tuple(sorted(p.name for p in model.get_parameters() if p.name.startswith("head.")))
    report = LoadReport(Path(source), detect_layout(raw), len(state), head_model if dropped else (),
                        tuple(head_file) if dropped else (), resized, head)
    log.info("loaded %d tensors from %s (%s layout); head: %s", report.loaded, source, report.layout, head)
    for line in resized:
        log.info("%s: resized %s", source, line)
    if dropped:
        log.warning("%s: classifier dropped (%s); missing keys (%s): %s; unexpected keys (ignored): %s", source,
                    "shapes differ" if head == "dropped" else f"model.head_init={head}",
                    "zeros" if head == "zeros" else "freshly initialised", list(report.missing),
                    list(report.unexpected))
    return report


def load_pretrained(model: nn.Cell, path: str | Path, key: str = "model.pretrained", resize: str = "official",
                    head_init: str = "auto") -> LoadReport:
    """Read a weight file (see `read_weights`) and load it with `load_weights`; what `model.pretrained` does.

    Raises:
        ConfigError: The file is missing, has an unknown suffix, or does not fit the model.
    """
    try:
        raw = read_weights(path)
    except (FileNotFoundError, ValueError) as err:
        raise ConfigError(f"{key}='{path}': {err}") from err
    return load_weights(model, raw, path, key, resize, head_init)


def freeze_params(model: nn.Cell, prefixes: Sequence[str]) -> tuple[str, ...]:
    """Stop training the parameters under each dotted prefix (`patch_embed`, `layers.0`, ...): they leave
    `trainable_params()`, so the optimizer and the gradients skip them.

    Returns:
        The frozen parameter names.

    Raises:
        ConfigError: A prefix names no parameter; the message lists the top-level ones.
    """
    if isinstance(prefixes, str):
        raise ConfigError(f"model.freeze={prefixes!r} must be a list of prefixes, e.g. [patch_embed, layers.0]")
    params = list(model.get_parameters())
    frozen = []
    for prefix in prefixes:
        hits = [p for p in params if p.name == prefix or p.name.startswith(f"{prefix}.")]
        if not hits:
            tops = sorted({".".join(p.name.split(".")[:2 if p.name.startswith("layers.") else 1]) for p in params})
            raise ConfigError(f"model.freeze: '{prefix}' names no parameter of this model; prefixes are dotted "
                              f"names such as {', '.join(tops)}")
        for p in hits:
            p.requires_grad = False
            frozen.append(p.name)
    return tuple(dict.fromkeys(frozen))


def prepare(model: nn.Cell, pretrained: str | None = None, pretrained_resize: str = "official",
            head_init: str = "auto", freeze: Sequence[str] = ()) -> LoadReport | None:
    """What a Swin builder does after init with the LOAD_DEFAULTS keys: load `pretrained` (resized, head mapped)
    and freeze the `freeze` prefixes. The report is kept as `model.pretrained_report` (None without a file) and
    the frozen names as `model.frozen`, for the run's MLflow params.
    """
    _check_choice("model.pretrained_resize", pretrained_resize, RESIZE_MODES)
    _check_choice("model.head_init", head_init, HEAD_INITS)
    report = load_pretrained(model, pretrained, resize=pretrained_resize, head_init=head_init) if pretrained else None
    model.pretrained_report = report
    model.frozen = freeze_params(model, freeze or ())
    return report


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
