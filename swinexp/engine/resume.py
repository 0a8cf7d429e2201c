"""Where a run stands (`Progress`, saved in every checkpoint) and where a restarted run continues from."""
from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from swinexp.registry import ConfigError
from swinexp.tracking import flatten

log = logging.getLogger("swinexp")

PROGRESS_KEY = "progress"      # meta key of the JSON progress record in a checkpoint
CLASSES_FILE = "classes.txt"  # in the run dir: one class name per line, label i on line i
NOT_COMPARED_GROUPS = ("hydra", "tracking")  # where a run is logged and launched, not what it trains
RUN_ID_FILE = "mlflow_run_id"  # in the run dir: the run a restart reopens, even before the first checkpoint
# may differ between a run and its resumption without a warning (a screen is continued with a later stop)
NOT_COMPARED = ("trainer.resume", "trainer.resume_force", "trainer.stop_after_epoch", "debug.phase_file",
                "debug.park_at", "seeds", "sweep.baseline", "sweep.margin")  # the last three: how a sweep reads


@dataclass
class Progress:
    """Everything beyond tensors that a resumed run needs to continue exactly where the checkpoint was taken."""

    epoch: int = 0                                   # 0-based epoch in progress
    batches_done: int = 0                            # micro-batches of `epoch` already trained (0: at its start)
    history: list[dict[str, float]] = field(default_factory=list)  # metrics of every finished epoch, in order
    losses: list[float] = field(default_factory=list)      # this epoch's micro-batch losses so far
    grad_norms: list[float] = field(default_factory=list)  # this epoch's finite update norms so far
    seen: int = 0                                    # images trained this epoch
    overflow_steps: int = 0                          # optimizer steps skipped for a non-finite gradient this epoch
    loss_scale: float = math.nan                     # the loss scale of the last optimizer step
    train_time_s: float = 0.0                        # time spent training in this epoch before the checkpoint
    mlflow_run_id: str = ""
    config: dict[str, Any] = field(default_factory=dict)   # the composed config (resolved) the run was started with
    choices: dict[str, str | None] = field(default_factory=dict)  # its Hydra group choices, e.g. {"amp": "o1_manual"}

    def start_epoch(self) -> None:
        self.batches_done, self.losses, self.grad_norms, self.seen = 0, [], [], 0
        self.overflow_steps, self.loss_scale, self.train_time_s = 0, math.nan, 0.0

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Progress:
        return cls(**json.loads(text))


@dataclass(frozen=True)
class ResumePoint:
    path: Path
    values: dict[str, Any]   # the checkpoint's tensors and meta, already read and CRC-checked
    progress: Progress


def locate(resume: str | None, run_dir: Path) -> ResumePoint | None:
    """The checkpoint a run continues from: `resume`=auto looks in `<run_dir>/checkpoints` (none there: a fresh
    run), a path names a checkpoint file or a run dir, null never resumes.

    Raises:
        ConfigError: a given path that holds no readable checkpoint.
    """
    from swinexp.engine import checkpoint  # MindSpore: not for a sweep's process, which only compares configs

    if resume is None or resume == "never":
        return None
    if resume == "auto":
        checkpointer = checkpoint.Checkpointer(run_dir / "checkpoints", keep_last=0)
        checkpointer.remove_partial_writes()  # this run's own writes start after locate
        found = checkpointer.latest_valid()
    else:
        path = Path(resume).expanduser()
        if path.is_dir():
            found = checkpoint.Checkpointer(path if path.name == "checkpoints" else path / "checkpoints",
                                            keep_last=0).latest_valid()
        elif path.is_file():
            try:
                found = path, checkpoint.read(path)
            except checkpoint.CheckpointError as err:
                raise ConfigError(f"trainer.resume='{resume}': {err}; name an intact checkpoint") from err
        else:
            found = None
        if found is None:
            raise ConfigError(f"trainer.resume='{resume}' holds no readable checkpoint; give a step-*.ckpt file or a "
                              "run dir with checkpoints/, or trainer.resume=auto to start fresh when there is none")
    if found is None:
        return None
    path, values = found
    meta = checkpoint.read_meta(values)
    if PROGRESS_KEY not in meta:
        raise ConfigError(f"trainer.resume: '{path}' has no progress record (it holds weights only, e.g. an export); "
                          "to start from its weights use model.pretrained=<it> with trainer.resume=null")
    return ResumePoint(path, values, Progress.from_json(meta[PROGRESS_KEY]))


def changed_choices(saved: Mapping[str, str | None], current: Mapping[str, str | None]) -> dict[str, tuple]:
    """Config groups (not Hydra's own, nor tracking) whose option differs: {group: (saved option, current option)}."""
    if not saved or not current:  # a checkpoint from before choices were saved, or a run outside Hydra
        return {}
    keys = sorted(k for k in saved.keys() | current.keys() if not k.startswith(NOT_COMPARED_GROUPS))
    return {k: (saved.get(k), current.get(k)) for k in keys if saved.get(k) != current.get(k)}


def restoring_overrides(changed: Mapping[str, tuple], current: Mapping[str, str | None]) -> list[str]:
    """The command-line overrides that bring back the saved choices. Groups chosen inside another group's defaults
    (`model/formulation@hardware.model.formulation`) follow their parent and get none of their own."""
    out = []
    for key, (was, _) in changed.items():
        if "@" in key:
            continue
        out.append(f"~{key}" if was is None else f"{key}={was}" if key in current else f"+{key}={was}")
    return out


def config_differences(saved: Mapping[str, Any], current: Mapping[str, Any]) -> dict[str, tuple[Any, Any]]:
    """Dotted keys whose values differ, but for those a continuation may change (NOT_COMPARED):
    {key: (saved value, current value)}, sorted by key."""
    old, new = flatten(dict(saved)), flatten(dict(current))
    return {k: (old.get(k), new.get(k)) for k in sorted(old.keys() | new.keys())
            if old.get(k) != new.get(k) and k not in NOT_COMPARED}


def check_compatible(saved: dict[str, Any], current: dict[str, Any],
                     saved_choices: Mapping[str, str | None] | None = None,
                     choices: Mapping[str, str | None] | None = None, force: bool = False) -> None:
    """A resumed run must build the same model from the same config group choices; other differences (e.g. more
    epochs) are allowed with a warning. `force` (trainer.resume_force=true) allows other choices, with a warning.

    Raises:
        ConfigError: a group choice differs (unless `force`), naming each and the overrides that restore them;
            or a model key differs, naming each with both values.
    """
    choices = choices or {}
    if groups := changed_choices(saved_choices or {}, choices):
        listed = ", ".join(f"{k}: {a} -> {b}" for k, (a, b) in groups.items())
        if not force:
            restore = " ".join(restoring_overrides(groups, choices))
            raise ConfigError(
                f"the checkpoint was written by a run with other config group choices ({listed}); to continue it, "
                f"rerun with `{restore}`. To continue with the new choices anyway set trainer.resume_force=true; "
                "to start over, use a new run dir (hydra.run.dir=...) or trainer.resume=null")
        log.warning("trainer.resume_force=true: resuming with other config group choices than the checkpoint's: %s",
                    listed)
    changed = config_differences(saved, current)
    model = {k: v for k, v in changed.items() if k.startswith("model.") and k != "model.pretrained"}
    if model:
        listed = ", ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in model.items())
        raise ConfigError(f"the checkpoint was written for another model ({listed}); resume with the model config it "
                          "was trained with, or start a new run dir (hydra.run.dir=...) / trainer.resume=null")
    if changed:
        log.warning("resuming with settings that differ from the checkpoint's: %s",
                    ", ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in changed.items()))


def saved_run_id(run_dir: Path) -> str | None:
    path = run_dir / RUN_ID_FILE
    return path.read_text().strip() or None if path.is_file() else None


def remember_run_id(run_dir: Path, run_id: str | None) -> None:
    if run_id:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / RUN_ID_FILE).write_text(run_id + "\n")
