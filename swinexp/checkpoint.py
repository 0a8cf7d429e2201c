"""Checkpoints: model weights, optimizer state and progress, written atomically (temp file + rename)."""
from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any, Mapping

import mindspore as ms
from mindspore import Parameter, Tensor, nn

from swinexp.models.convert import fuse_qkv, match_qkv

META_PREFIX = "meta."  # progress values (epoch, run id) stored beside the tensors


def state_of(model: nn.Cell, optimizer: nn.Optimizer | None = None) -> list[dict[str, Any]]:
    """Named tensors to save: every model parameter, then the optimizer's own state (moments, step counter)."""
    entries = [{"name": p.name, "data": p} for p in model.get_parameters()]
    if optimizer is not None:
        model_names = {e["name"] for e in entries}
        entries += [{"name": p.name, "data": p} for p in optimizer.get_parameters()
                    if p.name not in model_names and p.name != "learning_rate"]
    return entries


def weights_digest(model: nn.Cell) -> str:
    """SHA-256 over every model parameter's name and bytes: equal digests mean bit-identical weights."""
    digest = hashlib.sha256()
    for p in model.get_parameters():
        digest.update(p.name.encode())
        digest.update(p.asnumpy().tobytes())
    return digest.hexdigest()


def save(path: Path, model: nn.Cell, optimizer: nn.Optimizer | None = None,
         meta: Mapping[str, int | float | str] | None = None) -> Path:
    """Write `path` atomically (a crash mid-write leaves the previous file intact), under the official names:
    split q/k/v (and their optimizer moments) are stored as the fused `qkv`, so any variant can load it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.tmp-{os.getpid()}.ckpt")  # MindSpore appends .ckpt to other names
    arrays = fuse_qkv({e["name"]: e["data"].asnumpy() for e in state_of(model, optimizer)})
    meta = {f"{META_PREFIX}{k}": v for k, v in (meta or {}).items()}
    ms.save_checkpoint([{"name": k, "data": Tensor(v)} for k, v in arrays.items()], str(tmp), append_dict=meta)
    os.replace(tmp, path)
    return path


def load(path: Path, model: nn.Cell, optimizer: nn.Optimizer | None = None) -> dict[str, Any]:
    """Load weights (and optimizer state) from `path` into any qkv variant; return the saved meta values.

    Raises:
        ValueError: the file lacks parameters the model has, naming a few of them.
    """
    values = ms.load_checkpoint(str(path))
    meta = {k[len(META_PREFIX):]: v if isinstance(v, str) else v.asnumpy().item() for k, v in values.items()
            if k.startswith(META_PREFIX)}
    targets = [e["name"] for e in state_of(model, optimizer)]
    arrays = match_qkv({k: v.asnumpy() for k, v in values.items() if not k.startswith(META_PREFIX)}, targets)
    wanted = {p.name for p in model.get_parameters()}
    missing = sorted(wanted - arrays.keys())
    if missing:
        raise ValueError(f"checkpoint '{path}' lacks {len(missing)} model parameters, e.g. {missing[:5]}; "
                         "was it written for another model config?")
    as_params = {k: Parameter(Tensor(v), name=k) for k, v in arrays.items()}
    ms.load_param_into_net(model, {k: v for k, v in as_params.items() if k in wanted}, strict_load=True)
    if optimizer is not None:
        names = set(targets) - wanted
        ms.load_param_into_net(optimizer, {k: v for k, v in as_params.items() if k in names}, strict_load=True)
    return meta
