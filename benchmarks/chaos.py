"""`chaos`: SIGKILL a small deterministic training N times, resume it after each kill, and compare the result with
an uninterrupted run of the same config: the final checkpoint's tensors byte for byte, every logged metric point.

Each kill hits a phase on purpose (`swinexp.runtime.phases`): the process is started with
`debug.park_at=<phase>:<n>`, stops at the n-th such moment (n drawn at random, `--seed`) and is SIGKILLed there
from outside; phases are drawn in shuffled rounds, so every 4 kills hit each phase once (a test passes its own
plan of moments instead, `run(..., plan=)`). Then the same command
runs again in the same run dir (trainer.resume=auto) and is killed again, until the last run finishes.
Wall-clock metrics (`epoch_time_s`, `train/images_per_s`) are counted but their values not compared.
"""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from benchmarks.harness import CONF_DIR
from benchmarks.options import Options
from benchmarks.table import BenchResult, Table
from benchmarks.timing import progress
from swinexp.runtime.phases import PHASES

__all__ = ["ChaosFailed", "compare", "run"]

STEPS_PER_EPOCH = 6       # data.num_train / data.batch_size
CHECKPOINT_EVERY = 2      # optimizer steps: checkpoints at steps 2 and 4 of each epoch, and at its end
TRAIN_OVERRIDES = ("model=swin_micro", "data=synthetic", f"data.num_train={8 * STEPS_PER_EPOCH}", "data.num_val=16",
                   "data.img_size=32", "data.batch_size=8", "data/augment=none", "trainer=smoke", "hardware=cpu",
                   "amp=o0", "trainer.limit_train_batches=null", "trainer.limit_val_batches=null",
                   "trainer.deterministic=true", f"trainer.checkpoint.every_n_steps={CHECKPOINT_EVERY}",
                   "trainer.checkpoint.keep_last=2", "tracking=mlflow", "tracking.experiment=chaos")
# how many times each phase happens in one epoch: a kill at occurrence 1..this lands within about an epoch
PER_EPOCH = {"step": STEPS_PER_EPOCH, "eval": 1, "checkpoint": STEPS_PER_EPOCH // CHECKPOINT_EVERY, "mlflow": 1}
WALL_CLOCK = ("epoch_time_s", "train/images_per_s")
RUN_TIMEOUT_S = 900


@dataclass(frozen=True)
class Kill:
    phase: str
    occurrence: int
    hit: bool            # the process reached the moment and was SIGKILLed there (False: it finished first)


class ChaosFailed(RuntimeError):
    """A training process failed on its own (not by our kill): the resume path itself is broken."""


def _command(work: Path, run_dir: Path, overrides: tuple[str, ...], epochs: int, *debug: str) -> list[str]:
    return [sys.executable, str(CONF_DIR.parent / "run.py"), *TRAIN_OVERRIDES, *overrides,
            f"trainer.epochs={epochs}", f"data.root={work / 'data'}", f"tracking.uri=sqlite:///{work / 'mlflow.db'}",
            f"hydra.run.dir={run_dir}", *debug]


def _train(command: list[str], log: Path) -> None:
    with log.open("w") as out:
        status = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, timeout=RUN_TIMEOUT_S,
                                check=False).returncode
    if status != 0:
        raise ChaosFailed(f"training exited with {status}; log {log}:\n{log.read_text()[-3000:]}")


def _kill_at(command: list[str], phase: str, occurrence: int, phase_file: Path, log: Path) -> Kill:
    """Run until the process parks at `phase`:`occurrence`, then SIGKILL it; or let it finish if it never does."""
    phase_file.unlink(missing_ok=True)
    debug = [f"debug.phase_file={phase_file}", f"debug.park_at={phase}:{occurrence}"]
    with log.open("w") as out:
        proc = subprocess.Popen([*command, *debug], stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + RUN_TIMEOUT_S
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            if phase_file.exists() and " parked " in phase_file.read_text():
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
                return Kill(phase, occurrence, hit=True)
            time.sleep(0.02)
    finally:  # also when this driver is interrupted: never leave the training running
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if proc.returncode < 0:
        raise ChaosFailed(f"no '{phase} {occurrence}' after {RUN_TIMEOUT_S} s; log {log}")
    if proc.returncode != 0:
        raise ChaosFailed(f"training exited with {proc.returncode} before the kill; log {log}:\n"
                          f"{log.read_text()[-3000:]}")
    return Kill(phase, occurrence, hit=False)


def _plan(kills: int, rng: random.Random) -> list[tuple[str, int]]:
    """(phase, occurrence) per kill: phases in shuffled rounds of all four, occurrences within about an epoch."""
    plan: list[tuple[str, int]] = []
    while len(plan) < kills:
        round_ = list(PHASES)
        rng.shuffle(round_)
        plan += [(phase, rng.randint(1, PER_EPOCH[phase])) for phase in round_]
    return plan[:kills]


def _tensors(run_dir: Path) -> dict[str, np.ndarray]:
    import mindspore as ms

    from swinexp.engine import checkpoint

    values = checkpoint.read(run_dir / "checkpoints" / "last.ckpt")
    return {k: v.asnumpy() for k, v in values.items() if isinstance(v, (ms.Parameter, ms.Tensor))}


def _metric_points(client, run_id: str) -> dict[str, list[tuple[int, float]]]:
    # system/* are samples of the machine (CPU, memory), taken by time: no two runs share them, killed or not
    keys = [key for key in client.get_run(run_id).data.metrics if not key.startswith("system/")]
    return {key: [(m.step, m.value) for m in client.get_metric_history(run_id, key)] for key in keys}


def compare(reference: Path, chaos: Path, store_uri: str) -> dict[str, float]:
    """Figures of the chaos run against the reference: tensors/bytes and metric points lost, duplicated, changed."""
    from mlflow.tracking import MlflowClient

    from swinexp.engine.resume import saved_run_id

    want, got = _tensors(reference), _tensors(chaos)
    differing = [k for k in want if k not in got or not np.array_equal(want[k], got[k])]
    client = MlflowClient(store_uri)
    ref_points = _metric_points(client, saved_run_id(reference))
    chaos_run = client.get_run(saved_run_id(chaos))
    points = _metric_points(client, chaos_run.info.run_id)
    # an epoch's metrics, logged once by the run that trained it or by the resume that found them missing
    epochs = [step for step, _ in ref_points.get("val/top1", [])]
    chaos_epochs = [step for step, _ in points.get("val/top1", [])]
    lost = duplicated = changed = 0
    for key, ref in ref_points.items():
        values: dict[int, list[float]] = {}
        for step, value in points.get(key, []):
            values.setdefault(step, []).append(value)
        for step, value in ref:
            if step not in values:
                lost += 1
            elif key not in WALL_CLOCK and values[step][0] != value:
                changed += 1
        duplicated += sum(len(v) - 1 for v in values.values())
    duplicated += sum(1 for key, got_ in points.items() for step, _ in got_ if key not in ref_points
                      or step not in {s for s, _ in ref_points[key]})  # points the reference never logged
    experiment = client.get_experiment_by_name("chaos").experiment_id
    return {"tensors": float(len(want)), "bytes": float(sum(a.nbytes for a in want.values())),
            "tensors_differing": float(len(differing) + len(got.keys() - want.keys())),
            "bytes_lost": float(sum(want[k].nbytes for k in differing)),
            "metric_points": float(sum(len(v) for v in ref_points.values())),
            "metric_points_lost": float(lost), "metric_points_duplicated": float(duplicated),
            "metric_values_changed": float(changed), "epochs": float(len(epochs)),
            "epochs_logged_once": float(sum(chaos_epochs.count(step) == 1 for step in epochs)),
            "mlflow_runs": float(len(client.search_runs([experiment]))),
            "chaos_run_finished": float(chaos_run.info.status == "FINISHED")}


def run(opts: Options, plan: list[tuple[str, int]] | None = None) -> BenchResult:
    """The `chaos` sub-benchmark: `opts.kills` SIGKILLs, `opts.seed` draws their moments.

    Args:
        plan: the moments instead, (phase, n) per kill in order: each kill parks at the n-th mark of that phase in
            the process it kills (the count starts again in each resumed process).
    """
    drawn = f"seed {opts.seed}" if plan is None else "moments " + " ".join(f"{p}:{n}" for p, n in plan)
    plan = _plan(opts.kills, random.Random(opts.seed)) if plan is None else plan
    if unknown := [phase for phase, _ in plan if phase not in PHASES]:
        raise ValueError(f"chaos plan names {unknown}, not phases; choose from {', '.join(PHASES)}")
    epochs = len(plan) + 2  # each kill lands within about one epoch of where the last one resumed
    with tempfile.TemporaryDirectory(prefix="swinexp-chaos-") as tmp:
        work = Path(tmp)
        reference, chaos = work / "reference", work / "chaos"
        progress(f"chaos: uninterrupted reference run, {epochs} epochs of {STEPS_PER_EPOCH} steps, in {work}")
        _train(_command(work, reference, opts.overrides, epochs), work / "reference.log")
        kills = []
        for i, (phase, occurrence) in enumerate(plan):
            kill = _kill_at(_command(work, chaos, opts.overrides, epochs), phase, occurrence,
                            work / f"phases-{i}.log", work / f"chaos-{i}.log")
            progress(f"chaos: kill {i + 1}/{len(plan)} at {phase} #{occurrence}: "
                     f"{'SIGKILLed there' if kill.hit else 'the run finished first'}")
            kills.append(kill)
            if not kill.hit:
                break
        if kills[-1].hit:
            _train(_command(work, chaos, opts.overrides, epochs), work / "chaos-final.log")
        figures = compare(reference, chaos, f"sqlite:///{work / 'mlflow.db'}")
    survived = [k for k in kills if k.hit]
    by_phase = {phase: sum(k.phase == phase for k in survived) for phase in PHASES}
    figures.update({"kills": float(len(survived)), **{f"kills_{p}": float(n) for p, n in by_phase.items()}})
    rows = [("SIGKILLs survived (resumed after each)", str(len(survived))),
            *[(f"  of them in phase '{p}'", str(n)) for p, n in by_phase.items()],
            ("MLflow runs (reference + chaos; 2 = every resume reopened its run)", f"{figures['mlflow_runs']:.0f}"),
            ("chaos run ended FINISHED", "yes" if figures["chaos_run_finished"] else "no"),
            ("checkpoint tensors compared", f"{figures['tensors']:.0f}"),
            ("checkpoint bytes compared", f"{figures['bytes']:.0f}"),
            ("checkpoint bytes lost or different", f"{figures['bytes_lost']:.0f}"),
            ("metric points compared", f"{figures['metric_points']:.0f}"),
            ("metric points lost", f"{figures['metric_points_lost']:.0f}"),
            ("metric points duplicated", f"{figures['metric_points_duplicated']:.0f}"),
            ("metric values different (wall-clock keys not compared)", f"{figures['metric_values_changed']:.0f}"),
            ("epochs whose metrics the chaos run logged exactly once",
             f"{figures['epochs_logged_once']:.0f} of {figures['epochs']:.0f}")]
    table = Table(f"chaos: {len(plan)} SIGKILLs ({drawn}) into swin_micro, {epochs} epochs x "
                  f"{STEPS_PER_EPOCH} steps, checkpoint every {CHECKPOINT_EVERY} steps, deterministic, stochastic "
                  "depth on (its drop_path 0.1), sqlite MLflow",
                  ("", "value"), tuple(rows),
                  notes=("Each kill parks the process at a phase (debug.park_at) and SIGKILLs it from outside; "
                         "phases: " + ", ".join(PHASES) + " (see swinexp/runtime/phases.py).",
                         f"Overrides: {' '.join(TRAIN_OVERRIDES + opts.overrides)}"))
    return BenchResult("chaos", table, {f"chaos/{k}": v for k, v in figures.items()})
