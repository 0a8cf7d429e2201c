"""The job a composed config asks for, one function per mode: a dry run, an msrun launch, a precision inspection,
or a training (a new run, a continued one, or an evaluation only). `run(cfg, job)` is the switch; everything it
calls below `swinexp.app` receives the Plan, not the config."""
from __future__ import annotations

import json
import logging
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from swinexp.app.dry_run import dry_run, inspect_precision, warn_embedded_data
from swinexp.app.job_info import JobInfo
from swinexp.build import Experiment, Plan, build_experiment, configure_device, resolve
from swinexp.config import read, thaw
from swinexp.engine.loop import evaluate_only, fit
from swinexp.engine.resume import CLASSES_FILE, check_compatible, locate, remember_run_id, saved_run_id
from swinexp.runtime import compile_cache, hardware, launch, phases
from swinexp.runtime.interrupt import Interrupted
from swinexp.tracking import STOPPED_TAG, NullTracker, Tracker, flatten, open_tracker
from swinexp.tracking.dataset import split_records
from swinexp.tracking.study import TrialPruning

log = logging.getLogger("swinexp")

RUN_STATE_KEYS = ("trainer.stop_after_epoch",)  # not params: a continuation changes them; the tag tells instead


def run(cfg: DictConfig, job: JobInfo) -> dict[str, float]:
    """What the command line asked for: a dry run, an msrun launch, a precision inspection, or a training.

    Before an msrun launch, every check that needs no model or data runs in this process: a config error never
    waits for workers to start.

    Returns:
        The final metrics of a training (with `val/top1_best`); {} for the other actions.
    """
    plan = read(cfg)
    hardware.validate(plan.hardware)
    if cfg.dry_run:  # a combination that cannot run fails here, on any machine
        print(dry_run(resolve(plan, backend=False), job.relaunch_args(), job.run_dir))
        return {}
    hardware.check_backend(plan.hardware)
    if not launch.is_worker():
        warn_embedded_data(plan)
    if launch.needs_launch(plan.hardware):
        return _launch_workers(resolve(plan), job)  # a config error never waits for msrun
    if launch.is_extra_scheduler():  # several "nodes" on one host: node 0's scheduler serves them all
        return {}
    plan = configure_device(plan)  # on Ascend, hardware.chip is the card's from here on
    if launch.is_scheduler():  # msrun's scheduler has served the cluster inside init(); nothing else to do
        return {}
    if cfg.inspect:  # inspect=amp | inspect=drift: print the precision report and stop
        print(inspect_precision(resolve(plan), cfg.inspect))
        return {}
    if launch.rank() != 0:  # the other ranks train the same steps silently: one log, one run, one checkpoint
        log.setLevel(logging.WARNING)
    phases.configure(plan.get("debug"))
    fail_rank = plan.get("debug.fail_rank")
    if fail_rank is not None and int(fail_rank) == launch.rank():
        raise RuntimeError(f"debug.fail_rank={fail_rank}: this worker fails on purpose (to test failure handling)")
    compile_cache.enable(plan)
    try:
        return train(plan, job)
    finally:
        compile_cache.end_job()


def _launch_workers(plan: Plan, job: JobInfo) -> dict[str, float]:
    """This process only starts the workers under msrun and waits for them."""
    hw = launch.prepare(plan.hardware, job.run_dir)  # rank table, shared run dir of all nodes
    status = launch.launch(hw, launch.entry_script(), job.relaunch_args(), job.run_dir)
    if status != 0:
        raise RuntimeError(f"{launch.world_size(hw)} msrun workers failed with exit status {status}")
    return {}


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


def log_amp_report(exp: Experiment, run_dir: Path) -> None:
    """Save the policy's per-cell dtype table and its fp32 drift report on one val batch as run artifacts."""
    for name, text in (exp.amp_report or {}).items():
        (run_dir / name).write_text(text)
        exp.tracker.log_artifact(run_dir / name)


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


def train(plan: Plan, job: JobInfo) -> dict[str, float]:
    """Open (or reopen) the tracker run, build, fit, and end the run with the status that matches what happened:
    FINISHED, FAILED, or KILLED (a signal; then the process exits non-zero).

    The run is opened before the plan is validated and the rest is built, so a job whose config fails still shows
    up as a FAILED run. A run dir that holds checkpoints (trainer.resume=auto) or a trainer.resume path continues
    that run: same MLflow run, same place in the data, the LR schedule and every state where the checkpoint left
    them.
    """
    resume_from = locate(plan.trainer.resume, job.run_dir)
    saved_classes = resume_from.progress.config.get("data", {}).get("num_classes") if resume_from else None
    if saved_classes is not None and "num_classes" in plan.section("data") and plan.get("data.num_classes") is None:
        plan = plan.with_values({"data.num_classes": saved_classes})  # counted when the run started
    if resume_from is not None:
        check_compatible(resume_from.progress.config, thaw(plan.values), resume_from.progress.choices, job.choices,
                         plan.trainer.resume_force)
    run_id = (resume_from.progress.mlflow_run_id or None) if resume_from else saved_run_id(job.run_dir)
    tracker = (open_tracker(plan.section("tracking"), plan.hardware.shared_dir) if launch.rank() == 0
               else NullTracker())
    tracker.start(job.run_name()[:250], job.tags(), run_id=run_id)
    if launch.rank() == 0:
        remember_run_id(job.run_dir, tracker.run_id)
    try:
        job.run_dir.mkdir(parents=True, exist_ok=True)
        (job.run_dir / "overrides.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(list(job.overrides))))
        tracker.log_artifact(job.run_dir / "overrides.yaml")
        exp = build_experiment(resolve(plan), tracker,
                               amp_report=plan.trainer.amp_report and launch.rank() == 0 and resume_from is None)
        plan = exp.plan  # with the class count a folder dataset found
        config = thaw(plan.values)
        if resume_from is None:  # a resumed run has its params and inputs already
            tracker.log_params({**{k: v for k, v in flatten(config).items() if k not in RUN_STATE_KEYS},
                                "hardware.overflow_check_resolved": exp.overflow_check})
            log_data(tracker, exp, str(plan.get("data.name")), job.run_dir)
        tracker.set_tags({"amp.effective": exp.amp_effective})
        (job.run_dir / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(config)))
        tracker.log_artifact(job.run_dir / "config.yaml")
        log_amp_report(exp, job.run_dir)
        jit = plan.hardware.mode == "graph"
        pruning = _trial_pruning(job, str(plan.get("optimized_metric")),
                                 exp.trainer.stop_after_epoch or exp.trainer.epochs)
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
