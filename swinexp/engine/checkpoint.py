"""Checkpoint files: model weights, optimizer state, extra state and progress values, written atomically.

`save`/`load` handle one file; `Checkpointer` keeps a run's series of them (the last K, `last.ckpt`, `best.ckpt`) and
finds the newest one that reads back intact.
"""
from __future__ import annotations

import hashlib
import logging
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import mindspore as ms
from mindspore import Parameter, Tensor, nn

from swinexp.models.convert import fuse_qkv, match_qkv
from swinexp.runtime import phases

META_PREFIX = "meta."  # progress values (epoch, run id) stored beside the tensors

log = logging.getLogger("swinexp")


class CheckpointError(ValueError):
    """A checkpoint file that cannot be read back (truncated, corrupted) or does not fit the model."""


class CheckpointWriteError(OSError):
    """A checkpoint could not be written (disk full, file size limit, read-only folder); the previous one is kept."""


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
         meta: Mapping[str, int | float | str] | None = None, extra: Mapping[str, Parameter] | None = None) -> Path:
    """Write `path` atomically (a crash mid-write leaves the previous file intact), under the official names:
    split q/k/v (and their optimizer moments) are stored as the fused `qkv`, so any variant can load it.

    Args:
        extra: More state under names of its own (loss scale, EMA weights), restored by `load(..., extra=)`.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.stem}.tmp-{os.getpid()}.ckpt")  # MindSpore appends .ckpt to other names
    arrays = fuse_qkv({**{e["name"]: e["data"].asnumpy() for e in state_of(model, optimizer)},
                       **{k: p.asnumpy() for k, p in (extra or {}).items()}})
    meta = {f"{META_PREFIX}{k}": v for k, v in (meta or {}).items()}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        ms.save_checkpoint([{"name": k, "data": Tensor(v)} for k, v in arrays.items()], str(tmp), append_dict=meta,
                           crc_check=True)
        with open(tmp, "rb") as f:  # on disk before the rename makes it visible
            os.fsync(f.fileno())
    except (OSError, RuntimeError) as err:
        for partial in (tmp, tmp.with_suffix(".tmp")):  # ours, and the one MindSpore writes before its own rename
            partial.unlink(missing_ok=True)
        cause = f"{err.strerror} (errno {err.errno})" if isinstance(err, OSError) and err.strerror else str(err)
        raise CheckpointWriteError(f"cannot write checkpoint '{path}': {cause}; the previous checkpoint is kept "
                                   "intact. Free disk space or make the run dir writable, then rerun the same "
                                   "command to resume from it") from err
    phases.mark("checkpoint")
    os.replace(tmp, path)
    return path


def read(path: Path) -> dict[str, Any]:
    """All tensors and meta values of a checkpoint file, its CRC checked.

    Raises:
        CheckpointError: the file is missing, truncated or corrupted.
    """
    try:
        return ms.load_checkpoint(str(path), crc_check=True)
    except (ValueError, RuntimeError, OSError) as err:
        raise CheckpointError(f"checkpoint '{path}' cannot be read ({err})") from err


def read_meta(values: Mapping[str, Any]) -> dict[str, Any]:
    return {k[len(META_PREFIX):]: v if isinstance(v, str) else v.asnumpy().item() for k, v in values.items()
            if k.startswith(META_PREFIX)}


def load(path: Path | Mapping[str, Any], model: nn.Cell, optimizer: nn.Optimizer | None = None,
         extra: Mapping[str, Parameter] | None = None) -> dict[str, Any]:
    """Load weights (optimizer state, extra state) from `path` into any qkv variant; return the saved meta values.

    Args:
        path: a checkpoint file, or what `read` returned for one.

    Raises:
        CheckpointError: the file cannot be read, or lacks parameters the model (or `extra`) has, naming a few.
    """
    values = read(path) if isinstance(path, (str, Path)) else path
    meta = read_meta(values)
    targets = [e["name"] for e in state_of(model, optimizer)] + list(extra or {})
    arrays = match_qkv({k: v.asnumpy() for k, v in values.items() if not k.startswith(META_PREFIX)}, targets)
    wanted = {p.name for p in model.get_parameters()}
    missing = sorted(wanted - arrays.keys())
    if missing:
        raise CheckpointError(f"checkpoint lacks {len(missing)} model parameters, e.g. {missing[:5]}; "
                              "was it written for another model config?")
    as_params = {k: Parameter(Tensor(v), name=k) for k, v in arrays.items()}
    ms.load_param_into_net(model, {k: v for k, v in as_params.items() if k in wanted}, strict_load=True)
    if optimizer is not None:
        names = set(targets) - wanted
        ms.load_param_into_net(optimizer, {k: v for k, v in as_params.items() if k in names}, strict_load=True)
        counter = getattr(optimizer, "update_steps", None)
        if counter is not None and counter.name not in arrays and "global_step" in arrays:
            # written before AdamW counted its updates apart: until then both counters were always equal
            counter.set_data(Tensor(arrays["global_step"]).astype(counter.dtype))
    for name, param in (extra or {}).items():
        if name not in arrays:
            raise CheckpointError(f"checkpoint lacks '{name}' (the run that wrote it had other trainer settings, "
                                  "e.g. no trainer.ema.decay); resume with the same trainer config")
        param.set_data(Tensor(arrays[name]).astype(param.dtype))
    return meta


class Checkpointer:
    """A run's checkpoints in one folder: `step-<optimizer step>.ckpt` files (the newest `keep_last` kept), and
    `last.ckpt` / `best.ckpt` as hard links to the newest and to the best by the monitored metric."""

    def __init__(self, directory: Path, keep_last: int) -> None:
        self.directory, self.keep_last = Path(directory), keep_last

    def save(self, step: int, model: nn.Cell, optimizer: nn.Optimizer, meta: Mapping[str, int | float | str],
             extra: Mapping[str, Parameter], best: bool = False) -> Path:
        path = save(self.directory / f"step-{step:08d}.ckpt", model, optimizer, meta, extra)
        self._link(path, "last.ckpt")
        if best:
            self._link(path, "best.ckpt")
        for old in self.series()[self.keep_last:]:
            old.unlink()
        return path

    def _link(self, target: Path, name: str) -> None:
        tmp = self.directory / f".{name}.tmp-{os.getpid()}"
        tmp.unlink(missing_ok=True)
        try:
            os.link(target, tmp)
        except OSError:  # a file system without hard links
            shutil.copyfile(target, tmp)
        os.replace(tmp, self.directory / name)  # atomic: `name` is always a whole file

    def remove_partial_writes(self) -> list[Path]:
        """Delete what a writer killed mid-write left behind: `save`'s `.<stem>.tmp-<pid>.ckpt`, MindSpore's own
        `.<stem>.tmp-<pid>.tmp` and `_link`'s `.<name>.tmp-<pid>`. Only call it before this run writes here (resume).

        Returns:
            The files removed, each logged with a warning.
        """
        removed = sorted(self.directory.glob(".*.tmp-*")) if self.directory.is_dir() else []
        for path in removed:
            path.unlink(missing_ok=True)
            log.warning("removed '%s', a checkpoint write that a killed run left unfinished", path)
        return removed

    def series(self) -> list[Path]:
        """The step files, newest first."""
        return sorted(self.directory.glob("step-*.ckpt"), reverse=True)

    def latest_valid(self) -> tuple[Path, dict[str, Any]] | None:
        """The newest step file that reads back intact and its contents; a damaged one is skipped with a warning."""
        for path in self.series():
            try:
                return path, read(path)
            except CheckpointError as err:
                log.warning("%s; falling back to the previous checkpoint", err)
        return None
