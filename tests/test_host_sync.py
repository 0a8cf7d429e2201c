"""No device->host copy between the loop's read points, counted where no read can go around: the C++ methods of
MindSpore's tensor (`TensorPy`) that copy data to the host — `asnumpy`, `_item` (float/int/bool/item), `_tolist`,
`data_sync`, `_numpy_non_blocking`, `__repr__`/`__str__` — not the Python conveniences above them. Every caller
counts, the data pipeline's device prologue included; only the rows MindSpore's dataset iterator hands over (host
memory: labels, sample indices, skipped flags) are not device reads. The card path (optimizer.kernel=mindspore),
accumulation, EMA and a mid-epoch checkpoint cadence each run."""
from __future__ import annotations

import traceback
from pathlib import Path
from typing import Callable

import numpy as np
import pytest
from mindspore.common.tensor import TensorPy_
from mindspore.dataset.engine.iterators import TupleIterator
from omegaconf import DictConfig

from swinexp.build import build_experiment, resolve
from swinexp.engine import loop
from swinexp.engine.step import TrainStep

READS = ("asnumpy", "_item", "_tolist", "data_sync", "_numpy_non_blocking", "__repr__", "__str__")
LOG_EVERY = 4


@pytest.fixture
def device_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every device->host read from here on: one entry (the caller's frame) per call of a TensorPy read method."""
    reads: list[str] = []
    host_rows: dict[int, TensorPy_] = {}  # the dataset iterator's tensors, held so that their ids stay theirs

    def counted(name: str, original: Callable[..., object]) -> Callable[..., object]:
        def read(self: TensorPy_, *args: object, **kwargs: object) -> object:
            if host_rows.get(id(self)) is not self:
                frame = traceback.extract_stack(limit=3)[0]
                reads.append(f"{name} from {Path(frame.filename).name}:{frame.lineno}")
            return original(self, *args, **kwargs)
        return read

    original_next = TupleIterator.__next__

    def next_row(self: TupleIterator) -> list:
        row = original_next(self)
        host_rows.update((id(t), t) for t in row)
        return row

    monkeypatch.setattr(TupleIterator, "__next__", next_row)
    for name in READS:
        monkeypatch.setattr(TensorPy_, name, counted(name, TensorPy_.__dict__[name]))
    return reads


CASES = {
    "cpu preset": [],
    "card path": ["optimizer.kernel=mindspore"],
    "accumulation 2": ["trainer.accumulation_steps=2"],
    "ema": ["trainer.ema.decay=0.99"],
    "checkpoint cadence": ["trainer.checkpoint.every_n_steps=3"],
}


@pytest.mark.parametrize("case", list(CASES))
def test_reads_the_device_only_at_read_points(compose: Callable[..., DictConfig], tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch, device_reads: list[str],
                                              case: str) -> None:
    """Between read points (every trainer.log_every_n_steps optimizer steps, a checkpoint, the epoch's end) a
    micro-batch causes no device->host copy: the host can queue the next step while the device runs this one."""
    overrides = CASES[case]
    accumulation = 2 if "trainer.accumulation_steps=2" in overrides else 1
    exp = build_experiment(resolve(compose(f"trainer.limit_train_batches={10 * accumulation}",
                                           f"trainer.log_every_n_steps={LOG_EVERY}", "trainer.epochs=1",
                                           "model.drop_path_rate=0.1", *overrides)))
    before_call: list[int] = []
    compiles: list[bool] = []
    original_call = TrainStep.__call__

    def counting_call(self: TrainStep, images, targets):  # noqa: ANN001, ANN202
        before_call.append(len(device_reads))
        compiles.append(self.next_compile() is not None)
        return original_call(self, images, targets)

    monkeypatch.setattr(TrainStep, "__call__", counting_call)
    history = loop.fit(exp, tmp_path / "run", jit=True)
    before_call.append(len(device_reads))
    every = 3 if "checkpoint" in case else None
    last = exp.steps_per_epoch  # the epoch's end is a read point too
    read_points = {s for s in range(1, last + 1) if s % LOG_EVERY == 0 or (every and s % every == 0) or s == last}
    # reads between the call of micro-batch k and of k+1; a call that compiles a graph is not judged (the compiler
    # reads host constants)
    for k in range(len(before_call) - 1):
        step, closes = (k + 1) // accumulation, (k + 1) % accumulation == 0
        between = device_reads[before_call[k]:before_call[k + 1]]
        if compiles[k]:
            continue
        if closes and step in read_points:
            assert between, f"{case}: the read point after optimizer step {step} read nothing"
        else:
            assert not between, f"{case}: micro-batch {k + 1} (optimizer step {step}) read the device: {between[:8]}"
    assert np.isfinite(history[-1]["train/loss"])


def test_a_read_inside_the_step_is_caught(compose: Callable[..., DictConfig], tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch, device_reads: list[str]) -> None:
    """The counter sees a read the old test could not: `repr` of a device tensor, straight into C++."""
    exp = build_experiment(resolve(compose("trainer.limit_train_batches=3", "trainer.epochs=1")))
    original_call = TrainStep.__call__

    def chatty_call(self: TrainStep, images, targets):  # noqa: ANN001, ANN202
        out = original_call(self, images, targets)
        repr(out.packed)
        return out

    monkeypatch.setattr(TrainStep, "__call__", chatty_call)
    loop.fit(exp, tmp_path / "run", jit=True)
    assert sum("__repr__" in r for r in device_reads) == 3
