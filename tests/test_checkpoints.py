"""The checkpoint series (keep last K, last/best links, damaged-file fallback), resume lookup, non-finite stops."""
from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Callable

import mindspore as ms
import numpy as np
import pytest
from omegaconf import DictConfig, OmegaConf

from swinexp.build import build_experiment, resolve
from swinexp.engine import checkpoint
from swinexp.engine.loop import NonFiniteLoss, fit
from swinexp.engine.resume import Progress, check_compatible, locate
from swinexp.optim import adamw
from swinexp.registry import MODELS, ConfigError
from swinexp.runtime import hardware


@pytest.fixture
def model(compose: Callable[..., DictConfig]) -> ms.nn.Cell:
    return MODELS.build(resolve(compose("model.depths=[1,1]")).section("model"))


def _save_series(directory: Path, model: ms.nn.Cell, steps: list[int], keep_last: int = 5) -> checkpoint.Checkpointer:
    saver, optimizer = checkpoint.Checkpointer(directory, keep_last), adamw(model, lr=1e-3)
    for step in steps:
        progress = Progress(epoch=step)  # a recognisable value per file
        saver.save(step, model, optimizer, {"progress": progress.to_json()}, {}, best=step == steps[0])
    return saver


def test_keeps_the_last_k_and_links_last_and_best(model: ms.nn.Cell, tmp_path: Path) -> None:
    saver = _save_series(tmp_path, model, [1, 2, 3, 4], keep_last=2)
    assert [p.name for p in saver.series()] == ["step-00000004.ckpt", "step-00000003.ckpt"]
    assert (tmp_path / "last.ckpt").samefile(tmp_path / "step-00000004.ckpt")
    best = checkpoint.read_meta(checkpoint.read(tmp_path / "best.ckpt"))  # step 1's file is gone, its link stays
    assert Progress.from_json(best["progress"]).epoch == 1


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_a_damaged_newest_checkpoint_falls_back_to_the_previous(damage: str, model: ms.nn.Cell, tmp_path: Path,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    saver = _save_series(tmp_path / "checkpoints", model, [1, 2])
    newest = saver.series()[0]
    data = bytearray(newest.read_bytes())
    if damage == "truncate":
        newest.write_bytes(data[: len(data) // 2])
    else:
        data[len(data) // 2] ^= 0xFF  # one flipped byte inside a tensor: only the CRC notices
        newest.write_bytes(bytes(data))
    with pytest.raises(checkpoint.CheckpointError, match="cannot be read"):
        checkpoint.read(newest)
    with caplog.at_level(logging.WARNING, logger="swinexp"):
        point = locate("auto", tmp_path)
    assert point is not None and point.path.name == "step-00000001.ckpt" and point.progress.epoch == 1
    assert "falling back to the previous checkpoint" in caplog.text


def test_locate_starts_fresh_or_names_a_bad_path(model: ms.nn.Cell, tmp_path: Path) -> None:
    assert locate("auto", tmp_path / "new_run") is None
    assert locate(None, tmp_path) is None
    with pytest.raises(ConfigError, match="trainer.resume='.*missing' holds no readable checkpoint"):
        locate(str(tmp_path / "missing"), tmp_path)
    weights_only = checkpoint.save(tmp_path / "export.ckpt", model)
    with pytest.raises(ConfigError, match="no progress record .* model.pretrained="):
        locate(str(weights_only), tmp_path)
    _save_series(tmp_path / "other" / "checkpoints", model, [7])
    assert locate(str(tmp_path / "other"), tmp_path).progress.epoch == 7  # a run dir given as the path


def test_resume_removes_partial_writes_and_keeps_whole_files(model: ms.nn.Cell, tmp_path: Path,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    saver = _save_series(tmp_path / "checkpoints", model, [1, 2])
    whole = sorted(p.name for p in saver.directory.iterdir())
    partial = [".step-00000003.tmp-4242.ckpt", ".step-00000003.tmp-4242.tmp", ".last.ckpt.tmp-4242"]
    for name in partial:  # save's file, MindSpore's own, _link's: each name a killed writer leaves
        (saver.directory / name).write_bytes(b"half a checkpoint")
    with caplog.at_level(logging.WARNING, logger="swinexp"):
        point = locate("auto", tmp_path)
    assert point is not None and point.path.name == "step-00000002.ckpt"
    assert sorted(p.name for p in saver.directory.iterdir()) == whole
    assert caplog.text.count("a killed run left unfinished") == 3 and ".last.ckpt.tmp-4242" in caplog.text
    assert saver.remove_partial_writes() == []
    assert checkpoint.Checkpointer(tmp_path / "none", 1).remove_partial_writes() == []  # no folder yet


# A writer whose fsync never returns: SIGKILLed there, its temporary file is fully written but never renamed.
_STALLED_WRITER = """
import os, sys, time
import mindspore as ms
from swinexp.engine import checkpoint
os.fsync = lambda fd: (print("writing", flush=True), time.sleep(600))
net = ms.nn.Dense(4, 2)
checkpoint.save(sys.argv[1], net)
"""


def test_a_write_killed_midway_leaves_a_tmp_file_that_resume_removes(model: ms.nn.Cell, tmp_path: Path) -> None:
    import signal
    import subprocess
    import sys

    from tests.conftest import ROOT

    directory = tmp_path / "checkpoints"
    _save_series(directory, model, [1])
    writer = subprocess.Popen([sys.executable, "-c", _STALLED_WRITER, str(directory / "step-00000002.ckpt")],
                              cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout.readline().strip() == "writing"
    finally:
        writer.send_signal(signal.SIGKILL)
        writer.wait(timeout=30)
    left = sorted(p.name for p in directory.glob(".*"))
    assert left == [f".step-00000002.tmp-{writer.pid}.ckpt"]
    point = locate("auto", tmp_path)
    assert point is not None and point.path.name == "step-00000001.ckpt"
    assert not list(directory.glob(".*"))


def test_resume_refuses_another_model_and_warns_on_other_settings(compose: Callable[..., DictConfig],
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    saved = OmegaConf.to_container(compose(), resolve=True)
    with pytest.raises(ConfigError, match=r"another model \(model.embed_dim: 32 -> 48\)"):
        check_compatible(saved, OmegaConf.to_container(compose("model.embed_dim=48"), resolve=True))
    with caplog.at_level(logging.WARNING, logger="swinexp"):
        check_compatible(saved, OmegaConf.to_container(compose("trainer.epochs=5"), resolve=True))
    assert "trainer.epochs: 2 -> 5" in caplog.text


class _PoisonedLoader:
    """The real train loader, with NaN images from micro-batch `after` on."""

    def __init__(self, loader, after: int) -> None:
        self.loader, self.after, self.skipped_files = loader, after, 0

    def epoch(self, epoch: int, start_batch: int = 0) -> Iterator[tuple]:
        for index, (images, targets) in enumerate(self.loader.epoch(epoch, start_batch), start=start_batch):
            yield (images * float("nan") if index >= self.after else images), targets


def _fit_into_nans(compose: Callable[..., DictConfig], run_dir: Path, log_every: int,
                   stops: str) -> tuple[dict, Progress]:
    """Train with NaN images from micro-batch 2 on (trainer.max_nonfinite=3), expecting NonFiniteLoss matching
    `stops`; returns the last checkpoint's values and progress."""
    cfg = compose("trainer.limit_train_batches=null", "data.num_train=96", "trainer.max_nonfinite=3",
                  f"trainer.log_every_n_steps={log_every}")
    hardware.apply(OmegaConf.to_object(cfg.hardware), int(cfg.seed))
    exp = build_experiment(resolve(cfg))
    exp = dataclasses.replace(exp, train_loader=_PoisonedLoader(exp.train_loader, after=2))
    with pytest.raises(NonFiniteLoss, match=stops):
        fit(exp, run_dir, jit=True)
    values = checkpoint.read(run_dir / "checkpoints" / "last.ckpt")
    return values, Progress.from_json(checkpoint.read_meta(values)["progress"])


def _all_finite(values: dict) -> bool:
    return all(np.isfinite(v.asnumpy()).all() for k, v in values.items() if not k.startswith("meta."))


def test_non_finite_losses_stop_the_run_with_the_last_good_state(compose: Callable[..., DictConfig],
                                                                 tmp_path: Path) -> None:
    # trainer.log_every_n_steps=1: the host reads every step's loss, and stops right at the third non-finite one
    values, progress = _fit_into_nans(compose, tmp_path, log_every=1, stops=r"not finite for 3 micro-batches in a "
                                      r"row .* batch 5, optimizer step 5 \(amp O0\)")
    assert progress.batches_done == 5 and progress.epoch == 0
    # 5 optimizer steps on the LR schedule (the 3 skipped ones too), 2 AdamW updates
    assert int(values["global_step"].asnumpy()[0]) == 5 and int(values["adam_update_steps"].asnumpy()[0]) == 2
    assert _all_finite(values)  # the skipped updates left the weights as they were


def test_non_finite_losses_between_read_points_stop_the_run_at_the_next_read(compose: Callable[..., DictConfig],
                                                                          tmp_path: Path) -> None:
    # the default cadence reads the step outputs every 4 optimizer steps here: the run of non-finite losses that
    # reaches 3 at batch 5 is seen at the read after batch 8; the skipped steps changed no weight meanwhile
    values, progress = _fit_into_nans(compose, tmp_path, log_every=4,
                                      stops=r"by epoch 1, batch 5, optimizer step 5; the host saw it at its next "
                                            r"read of the step outputs, batch 8, optimizer step 8 "
                                            r"\(trainer.log_every_n_steps=4\)")
    assert progress.batches_done == 8 and len(progress.losses) == 8
    assert int(values["adam_update_steps"].asnumpy()[0]) == 2  # only the two finite steps updated
    assert _all_finite(values)
