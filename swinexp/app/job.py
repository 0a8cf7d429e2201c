"""`run(cfg)`: set up the process, build the experiment, fit it, and close the tracker whatever happens."""
from __future__ import annotations

import getpass
import json
import logging
import os
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from mindspore import nn
from omegaconf import DictConfig, OmegaConf

from swinexp.amp import report as amp_report
from swinexp.app import recipe
from swinexp.app.sweep_callback import SweepInfo, override_key, sweep_of
from swinexp.build import (
    Experiment,
    build_amp,
    build_data_spec,
    build_experiment,
    build_model,
    build_tracker,
    check_config,
    hardware_cfg,
    trainer_cfg,
)
from swinexp.config import HardwareCfg
from swinexp.data.pipeline import EpochSampler
from swinexp.engine.loop import NonFiniteLoss, evaluate_only, fit  # noqa: F401  (swinexp.engine.loop.fit, documented)
from swinexp.engine.resume import check_compatible, locate, remember_run_id, saved_run_id
from swinexp.registry import ConfigError
from swinexp.runtime import compile_cache, hardware, launch, phases
from swinexp.runtime.interrupt import Interrupted
from swinexp.serve.saved_run import CLASSES_FILE
from swinexp.tracking import STOPPED_TAG, NullTracker, Tracker, flatten
from swinexp.tracking.dataset import split_records
from swinexp.tracking.study import StudyTrial, TrialPruning

log = logging.getLogger("swinexp")

INFRASTRUCTURE = ("tracking", "hydra", "hardware.master_")  # overrides that say where a run goes, not what it is
RUN_DIR_TAG = "swinexp.run_dir"
RUN_STATE_KEYS = ("trainer.stop_after_epoch",)  # not params: a continuation changes them; the tag tells instead

@dataclass(frozen=True)
class JobInfo:
    """What Hydra knows about the job: where it writes, which overrides and group choices made it, its sweep."""

    run_dir: Path
    overrides: list[str] = field(default_factory=list)
    choices: dict[str, str] = field(default_factory=dict)
    sweep: SweepInfo | None = None
    config_dirs: list[str] = field(default_factory=list)  # the user's -cd folders: msrun workers compose with them
    trial: StudyTrial | None = None  # the Optuna trial this job is, in a search (hydra/sweeper=swinexp_optuna)

    @classmethod
    def from_hydra(cls, hydra_cfg: DictConfig) -> JobInfo:
        """From `HydraConfig.get()` inside a Hydra job."""
        config_dirs = [s.path for s in hydra_cfg.runtime.config_sources if s.provider == "command-line"]
        return cls(Path(hydra_cfg.runtime.output_dir), list(hydra_cfg.overrides.task),
                   dict(hydra_cfg.runtime.choices), sweep_of(hydra_cfg), config_dirs, StudyTrial.of(hydra_cfg))

    def relaunch_args(self) -> list[str]:
        """The arguments that compose this job again in another process (an msrun worker)."""
        return [*(f"--config-dir={d}" for d in self.config_dirs), *self.overrides]

    def run_name(self) -> str:
        """The overrides that change the experiment (not where it is logged or how workers meet), or 'defaults'."""
        if self.sweep is not None:
            return self.sweep.run_name(self.overrides)
        return " ".join(o for o in self.overrides if not is_infrastructure(o)) or "defaults"

    def tags(self) -> dict[str, str]:
        """Overrides, host and process, sweep membership, chosen group options, the code's git commit, the run dir
        and MLflow's standard source tags (the UI's Source and User columns)."""
        tags = {"overrides": " ".join(self.overrides), "host": socket.gethostname(), "pid": str(os.getpid()),
                RUN_DIR_TAG: str(self.run_dir.resolve()), "mlflow.source.type": "LOCAL",
                "mlflow.source.name": str(Path(sys.argv[0]).resolve()) if sys.argv[0] else "python",
                "mlflow.user": _user(),
                **(self.sweep.tags() if self.sweep else {}), **(self.trial.tags() if self.trial else {}),
                **{f"choice.{k.split('@')[0]}": str(v) for k, v in self.choices.items()  # no @package: MLflow
                   if v is not None and not k.startswith("hydra")}}                    # rejects '@' in names
        if commit := git_commit():
            tags["git_commit"] = tags["mlflow.source.git.commit"] = commit
        return tags


def is_infrastructure(override: str) -> bool:
    """'tracking.uri=...', 'hydra.run.dir=...', 'hardware.master_addr=...' (and their +/~ forms)."""
    key = override_key(override)
    return any(key == p or key.startswith((f"{p}.", f"{p}/")) or (p.endswith("_") and key.startswith(p))
               for p in INFRASTRUCTURE)


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # a container user without a passwd entry
        return str(os.getuid())


def log_data(tracker: Tracker, exp: Experiment, data_name: str, run_dir: Path) -> None:
    """The train and val splits as run inputs, and the class names beside the checkpoints (for predict)."""
    spec = exp.data
    (run_dir / CLASSES_FILE).write_text("".join(f"{name}\n" for name in spec.classes))
    tracker.log_artifact(run_dir / CLASSES_FILE)
    for record in split_records(data_name, spec.root, spec.classes, spec.train, spec.val):
        tracker.log_dataset(record)


def log_checkpoint_artifacts(tracker: Tracker, run_dir: Path, finished: bool = True) -> None:
    """tracking.log_checkpoints: best.ckpt / last.ckpt under checkpoints/, and config.yaml, so the artifacts alone
    are a run dir that `swinexp.serve.export`, `.predict`, `.evaluate` and a resume accept. A run that did not finish
    also logs last.ckpt (unless `none`): it is what continues it. Never raises: the run's own ending matters more."""
    names = {"best": ["best.ckpt"], "last": ["last.ckpt"], "both": ["best.ckpt", "last.ckpt"], "none": []}
    chosen = names.get(tracker.log_checkpoints, [])
    if chosen and not finished and "last.ckpt" not in chosen:
        chosen = [*chosen, "last.ckpt"]
    files = [run_dir / "checkpoints" / n for n in chosen]
    try:
        for path in (p for p in files if p.is_file()):
            tracker.log_artifact(path, "checkpoints")
        if files and (run_dir / "config.yaml").is_file():
            tracker.log_artifact(run_dir / "config.yaml")
    except Exception as err:  # noqa: BLE001 - whatever the store raises, the run ends as it would have
        log.warning("the checkpoint was not logged to the tracker (%s); it is in %s", err, run_dir / "checkpoints")


def log_amp_report(exp: Experiment, reference: nn.Cell, run_dir: Path) -> None:
    """Save the policy's per-cell dtype table and its fp32 drift report on one val batch as run artifacts."""
    images, _ = next(iter(exp.val_loader.epoch(0)))
    for name, text in amp_report.artifacts(reference, exp.model, exp.amp, images).items():
        (run_dir / name).write_text(text)
        exp.tracker.log_artifact(run_dir / name)


def git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).resolve().parent, capture_output=True,
                             text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def run(cfg: DictConfig, job: JobInfo) -> dict[str, float]:
    """What the command line asked for: a dry run, an msrun launch, a precision inspection, or a training.

    Before an msrun launch, every check that needs no model or data runs in this process: a config error never
    waits for workers to start.

    Returns:
        The final metrics of a training (with `val/top1_best`); {} for the other actions.
    """
    hw = hardware_cfg(cfg)
    if cfg.dry_run:
        check_config(cfg, backend=False)  # a combination that cannot run fails here, on any machine
        warn_embedded_data(cfg, hw)
        print(dry_run_report(cfg, hw, job.relaunch_args(), job.run_dir))
        print(recipe.describe(cfg, hw))
        return {}
    hardware.check_backend(hw)
    if not launch.is_worker():
        warn_embedded_data(cfg, hw)
    if launch.needs_launch(hw):  # this process only starts the workers under msrun and waits for them
        check_config(cfg)  # a config error never waits for msrun (a single run logs it as a FAILED run)
        hw = launch.prepare(hw, job.run_dir)  # rank table, shared run dir of all nodes
        status = launch.launch(hw, launch.entry_script(), job.relaunch_args(), job.run_dir)
        if status != 0:
            raise RuntimeError(f"{launch.world_size(hw)} msrun workers failed with exit status {status}")
        return {}
    if launch.is_extra_scheduler():  # several "nodes" on one host: node 0's scheduler serves them all
        return {}
    hardware.apply(hw, int(cfg.seed), bool(cfg.trainer.deterministic), build_amp(cfg).ascend_precision_mode)
    if launch.is_scheduler():  # msrun's scheduler has served the cluster inside init(); nothing else to do
        return {}
    if cfg.inspect:  # inspect=amp | inspect=drift: print the precision report and stop
        print(inspect_precision(cfg, hw))
        return {}
    if launch.rank() != 0:  # the other ranks train the same steps silently: one log, one run, one checkpoint
        log.setLevel(logging.WARNING)
    phases.configure(cfg.debug)
    if cfg.debug.fail_rank is not None and int(cfg.debug.fail_rank) == launch.rank():
        raise RuntimeError(f"debug.fail_rank={cfg.debug.fail_rank}: this worker fails on purpose (to test failure "
                           "handling)")
    compile_cache.enable(cfg)
    return train(cfg, job, hw)


def dry_run_report(cfg: DictConfig, hw: HardwareCfg, overrides: list[str], run_dir: Path) -> str:
    """What a launch would do, without the hardware: msrun call per node, MindSpore settings, shard sizes."""
    world = launch.world_size(hw)
    spec = build_data_spec(cfg)
    accumulation = trainer_cfg(cfg).accumulation_steps
    lines = [f"dry run: {world} worker(s) = {hw.num_devices} per node x {hw.num_nodes} node(s), "
             f"device_target={hw.device_target}", *launch.launch_plan(hw, overrides, run_dir)]
    lines.append("mindspore context: " + ", ".join(
        f"{k}={v}" for k, v in hardware.context_summary(hw, build_amp(cfg).ascend_precision_mode).items()))
    train = [len(EpochSampler(len(spec.train), 0, True, world, r)) for r in range(world)]
    val = [len(EpochSampler(len(spec.val), 0, False, world, r)) for r in range(world)]
    lines.append(f"train shard per rank: {train} samples, {train[0] // spec.batch_size} batches of "
                 f"{spec.batch_size} per epoch")
    lines.append(f"val shard per rank: {val} samples")
    lines.append(f"total batch: {spec.batch_size} per device x {world} devices x {accumulation} accumulation "
                 f"= {spec.batch_size * world * accumulation}")
    return "\n".join(lines)


def warn_embedded_data(cfg: DictConfig, hw: HardwareCfg) -> None:
    """One line when an accelerator preset would train on the embedded synthetic shapes (the default data)."""
    if hw.device_target != "CPU" and cfg.data.name == "synthetic":
        log.warning("hardware=%s trains on the embedded synthetic dataset (%d px shapes, the laptop default); for "
                    "ImageNet use experiment=swin_tiny_in1k data.root=/path/to/imagenet (or data=imagenet)",
                    hw.device_target, int(cfg.data.img_size))


def inspect_precision(cfg: DictConfig, hw: HardwareCfg) -> str:
    """The text `inspect=amp|drift` prints: per-cell compute dtypes, or the policy's drift against fp32."""
    what = cfg.get("inspect")
    if what not in amp_report.INSPECTIONS:
        raise ConfigError(f"inspect={what} is not valid; choose one of: {', '.join(amp_report.INSPECTIONS)}, "
                          f"e.g. python run.py amp=o2 inspect=drift")
    policy = build_amp(cfg)
    header = ("hardware: " + ", ".join(f"{k}={v}" for k, v in hardware.context_summary(
        hw, policy.ascend_precision_mode).items() if k in ("device_target", "chip", "overflow_check",
                                                           "ascend_precision_mode")))
    if what == "amp":  # no data needed: build only the model and the policy
        return header + "\n" + amp_report.dtype_table(policy.apply(build_model(cfg)), policy)
    exp = build_experiment(cfg, tracker=NullTracker())  # an inspection is not a tracked run
    images, _ = next(iter(exp.val_loader.epoch(0)))
    return header + "\n" + amp_report.artifacts(build_model(cfg), exp.model, exp.amp, images)["amp_drift.txt"]


def _trial_pruning(job: JobInfo, metric: str, last_epoch: int) -> TrialPruning | None:
    """The Optuna trial's report-and-prune check for `fit`, in a search; a trial of several msrun workers is not
    pruned (the workers would each ask the study, and could disagree)."""
    if job.trial is None:
        return None
    if launch.is_worker():
        log.warning("optuna: trial %d runs on msrun workers and is not pruned (pruning needs one process)",
                    job.trial.number)
        return None
    return job.trial.pruning(metric, job.run_dir, last_epoch)


def train(cfg: DictConfig, job: JobInfo, hw: HardwareCfg) -> dict[str, float]:
    """Open (or reopen) the tracker run, build, fit, and end the run with the status that matches what happened:
    FINISHED, FAILED, or KILLED (a signal; then the process exits non-zero).

    The run is opened before the rest is built, so a job whose config fails still shows up as a FAILED run. A run
    dir that holds checkpoints (trainer.resume=auto) or a trainer.resume path continues that run: same MLflow run,
    same place in the data, the LR schedule and every state where the checkpoint left them.
    """
    resume_from = locate(cfg.trainer.resume, job.run_dir)
    saved_classes = resume_from.progress.config.get("data", {}).get("num_classes") if resume_from else None
    if saved_classes is not None and "num_classes" in cfg.data and cfg.data.num_classes is None:
        cfg.data.num_classes = saved_classes  # counted when the run started; the build checks the folders agree
    config = OmegaConf.to_container(cfg, resolve=True)
    if resume_from is not None:
        check_compatible(resume_from.progress.config, config, resume_from.progress.choices, job.choices,
                         bool(OmegaConf.select(cfg, "trainer.resume_force")))
    run_id = (resume_from.progress.mlflow_run_id or None) if resume_from else saved_run_id(job.run_dir)
    tracker = build_tracker(cfg) if launch.rank() == 0 else NullTracker()
    tracker.start(job.run_name()[:250], job.tags(), run_id=run_id)
    if launch.rank() == 0:
        remember_run_id(job.run_dir, tracker.run_id)
    try:
        job.run_dir.mkdir(parents=True, exist_ok=True)
        (job.run_dir / "overrides.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(list(job.overrides))))
        tracker.log_artifact(job.run_dir / "overrides.yaml")
        exp = build_experiment(cfg, tracker)
        config = OmegaConf.to_container(cfg, resolve=True)  # with the class count a folder dataset found
        if resume_from is None:  # a resumed run has its params and inputs already
            tracker.log_params({**{k: v for k, v in flatten(config).items() if k not in RUN_STATE_KEYS},
                                "hardware.overflow_check_resolved": exp.overflow_check})
            log_data(tracker, exp, str(cfg.data.name), job.run_dir)
        (job.run_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
        tracker.log_artifact(job.run_dir / "config.yaml")
        if exp.trainer.amp_report and launch.rank() == 0 and resume_from is None:
            log_amp_report(exp, build_model(cfg), job.run_dir)
        jit = hw.mode == "graph"
        pruning = _trial_pruning(job, str(cfg.optimized_metric), exp.trainer.stop_after_epoch or exp.trainer.epochs)
        history = ([evaluate_only(exp, jit)] if exp.trainer.eval_only
                   else fit(exp, job.run_dir, jit, resume_from, config, job.choices, pruning))
        stopped = not exp.trainer.eval_only and len(history) < exp.trainer.epochs
        tracker.set_tags({STOPPED_TAG: str(len(history)) if stopped else None, **(pruning.tags() if pruning else {})})
    except (Interrupted, KeyboardInterrupt):
        log_checkpoint_artifacts(tracker, job.run_dir, finished=False)
        tracker.close("KILLED")
        raise
    except BaseException as err:
        log_checkpoint_artifacts(tracker, job.run_dir, finished=False)
        tracker.close("FAILED", reason=f"{type(err).__name__}: {err}")
        raise
    log_checkpoint_artifacts(tracker, job.run_dir)
    tracker.close("FINISHED")
    result = {**history[-1], "val/top1_best": max(m["val/top1"] for m in history)}
    (job.run_dir / "metrics.json").write_text(json.dumps(result, indent=1) + "\n")  # read by hydra/launcher=isolated
    return result
