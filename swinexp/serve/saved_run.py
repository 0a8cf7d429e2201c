"""A trained run read back for inference: its config, a checkpoint and its class names, from a run dir, from the
run's MLflow artifacts downloaded to a folder (the same layout), or from a single checkpoint file.

`python -m swinexp.serve.export`, `.predict` and `.evaluate` start here; everything they build goes through build.py.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from mindspore import nn

from swinexp.build import (
    Experiment,
    Plan,
    build_eval_transform,
    build_experiment,
    build_model,
    configure_device,
    resolve,
    saved_plan,
)
from swinexp.data.transforms import EvalTransform
from swinexp.engine import checkpoint
from swinexp.engine.resume import CLASSES_FILE, PROGRESS_KEY, Progress
from swinexp.registry import ConfigError

CHECKPOINTS = ("best", "last")


@dataclass(frozen=True)
class SavedRun:
    plan: Plan                       # the run's config, typed, with the command line's overrides
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
        config = run_dir / "config.yaml"
    else:
        meta = checkpoint.read_meta(checkpoint.read(ckpt))
        if PROGRESS_KEY not in meta:
            raise ConfigError(f"'{ckpt}' holds weights only and there is no config.yaml beside it in {run_dir}; "
                              "give the run dir the checkpoint came from")
        config = Progress.from_json(meta[PROGRESS_KEY]).config
    classes_file = run_dir / CLASSES_FILE
    classes = tuple(classes_file.read_text().splitlines()) if classes_file.is_file() else None
    plan = saved_plan(config, overrides).with_values({"model.pretrained": None})  # the checkpoint has the weights
    return SavedRun(plan, ckpt, classes)


def setup(run: SavedRun) -> SavedRun:
    """The run's MindSpore context in this one process (a run trained on 8 workers is served by one); serve the
    returned run, whose plan names the card's chip (its amp policy resolves on it)."""
    return replace(run, plan=configure_device(run.plan, one_process=True))


def load_model(run: SavedRun) -> nn.Cell:
    """The run's model in fp32 with the checkpoint's weights, in eval mode (call `setup` first)."""
    model = build_model(run.plan)
    checkpoint.load(run.checkpoint, model)
    model.set_train(False)
    return model


def eval_transform(run: SavedRun) -> EvalTransform:
    """The run's validation transform (resize, center crop, normalize), without reading its data root."""
    return build_eval_transform(run.plan)


def experiment(run: SavedRun) -> Experiment:
    """The run's whole experiment under its (overridden) config, validated as a training's, tracked nowhere."""
    return build_experiment(resolve(run.plan))
