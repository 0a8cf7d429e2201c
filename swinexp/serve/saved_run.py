"""A trained run read back for inference: its config, a checkpoint and its class names, from a run dir, from the
run's MLflow artifacts downloaded to a folder (the same layout), or from a single checkpoint file.

`python -m swinexp.serve.export`, `.predict` and `.evaluate` start here; everything they build goes through build.py.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from mindspore import nn
from omegaconf import DictConfig, OmegaConf

from swinexp.build import build_model, saved_config
from swinexp.config import HardwareCfg
from swinexp.engine import checkpoint
from swinexp.engine.resume import PROGRESS_KEY, Progress
from swinexp.registry import ConfigError
from swinexp.runtime import hardware

CLASSES_FILE = "classes.txt"  # in the run dir: one class name per line, label i on line i
CHECKPOINTS = ("best", "last")


@dataclass(frozen=True)
class SavedRun:
    config: DictConfig               # the run's config, typed, with the command line's overrides
    checkpoint: Path
    classes: tuple[str, ...] | None  # None: the run dir has no classes.txt (labels are printed as numbers)

    def class_name(self, label: int) -> str:
        return self.classes[label] if self.classes and label < len(self.classes) else str(label)


def open_run(source: Path, overrides: Sequence[str] = (), which: str = "best") -> SavedRun:
    """Read a run dir (`config.yaml`, `checkpoints/<which>.ckpt`, `classes.txt`) or a checkpoint file (the config
    of its run dir, else the one saved inside it).

    Raises:
        ConfigError: nothing readable at `source`, naming what was looked for.
    """
    if which not in CHECKPOINTS:
        raise ConfigError(f"--checkpoint {which} is not valid; choose one of: {', '.join(CHECKPOINTS)}")
    source = Path(source).expanduser()
    if source.is_dir():
        run_dir, ckpt = source, source / "checkpoints" / f"{which}.ckpt"
        if not ckpt.is_file():
            raise ConfigError(f"'{source}' has no checkpoints/{which}.ckpt; give a run dir written by run.py (or its "
                              "MLflow artifacts, downloaded), a .ckpt file, or --checkpoint "
                              f"{'last' if which == 'best' else 'best'}")
    elif source.is_file():
        ckpt = source
        run_dir = source.parent.parent if source.parent.name == "checkpoints" else source.parent
    else:
        raise ConfigError(f"'{source}' does not exist; give a run dir (outputs/<date>/<time>) or a .ckpt file")
    if (run_dir / "config.yaml").is_file():
        saved = OmegaConf.load(run_dir / "config.yaml")
    else:
        meta = checkpoint.read_meta(checkpoint.read(ckpt))
        if PROGRESS_KEY not in meta:
            raise ConfigError(f"'{ckpt}' holds weights only and there is no config.yaml beside it in {run_dir}; "
                              "give the run dir the checkpoint came from")
        saved = OmegaConf.create(Progress.from_json(meta[PROGRESS_KEY]).config)
    classes_file = run_dir / CLASSES_FILE
    classes = tuple(classes_file.read_text().splitlines()) if classes_file.is_file() else None
    config = saved_config(saved, overrides)
    OmegaConf.update(config, "model.pretrained", None)  # the weights come from the checkpoint, not the start point
    return SavedRun(config, ckpt, classes)


def setup(run: SavedRun) -> None:
    """The run's MindSpore context in this one process (a run trained on 8 workers is served by one)."""
    hw: HardwareCfg = OmegaConf.to_object(run.config.hardware)
    hardware.apply(replace(hw, num_devices=1, num_nodes=1), int(run.config.seed))


def load_model(run: SavedRun) -> nn.Cell:
    """The run's model in fp32 with the checkpoint's weights, in eval mode (call `setup` first)."""
    model = build_model(run.config)
    checkpoint.load(run.checkpoint, model)
    model.set_train(False)
    return model
