"""A sweep's record and lock in its directory: what lets the same command continue a sweep whose process died.

`sweep.json` holds what the sweep was started with: its identity (`swinexp.app.sweep_identity`), the config keys that
change results, its group choices, its jobs and its MLflow parent run. `open_sweep` (SweepCallback, when -m starts)
continues the sweep if this command composes the same, and refuses it with the differences otherwise; `sweep.lock`
keeps a second command out while one runs (the kernel drops it with its process, however that ends). Which jobs are
kept, continued or started is the sweeper's (hydra/sweeper=swinexp_grid).
"""
from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from swinexp.app.sweep_identity import FRESH_KEY, changes_results, identity_of_config, normalised
from swinexp.engine.resume import changed_choices, config_differences
from swinexp.registry import ConfigError
from swinexp.tracking import flatten

RECORD_FILE = "sweep.json"
LOCK_FILE = "sweep.lock"
OWNER_FILE = "sweep.owner"  # who holds the lock (the lock file itself is truncated by every process that tries it)
SWEEPER_TARGET = "hydra_plugins.swinexp_launcher.grid_sweeper.ContinuingBasicSweeper"


@dataclass
class SweepRecord:
    identity: list[str]                  # the normalised overrides (SweepIdentity.overrides)
    command: list[str]                   # the overrides as given, for messages
    config: dict[str, Any]               # dotted key -> value, the keys that change results
    choices: dict[str, str | None]       # Hydra's group choices
    jobs: list[list[str]] | None         # each job's normalised overrides, in job number order (None: not expandable)
    parent_run_id: str | None = None     # the MLflow parent run every attempt logs into
    started: str = field(default_factory=lambda: time.strftime("%Y-%m-%d %H:%M:%S"))
    attempts: int = 1                    # commands that ran the sweep, this one included

    @classmethod
    def of(cls, config: DictConfig) -> SweepRecord:
        """What the multirun `config` (the sweep's, with its `hydra` node) would record."""
        return cls(list(identity_of_config(config).overrides), list(config.hydra.overrides.task),
                   compared_config(config), dict(config.hydra.runtime.choices), expand_jobs(config))

    @classmethod
    def load(cls, sweep_dir: Path) -> SweepRecord | None:
        path = sweep_dir / RECORD_FILE
        return cls(**json.loads(path.read_text())) if path.is_file() else None

    def save(self, sweep_dir: Path) -> None:
        path = sweep_dir / RECORD_FILE
        path.with_suffix(".tmp").write_text(json.dumps(asdict(self), indent=1, default=str) + "\n")
        path.with_suffix(".tmp").replace(path)  # a kill mid-write leaves the previous record


@dataclass
class OpenSweep:
    dir: Path
    record: SweepRecord | None           # None for a search: its Optuna study records it
    lock: FileLock
    continued: bool                      # an earlier command's sweep, continued


def compared_config(config: DictConfig) -> dict[str, Any]:
    """The composed config without `hydra`, resolved and flattened, but for the keys that do not change results."""
    body = OmegaConf.masked_copy(config, [k for k in config if k != "hydra"])
    try:
        tree = OmegaConf.to_container(body, resolve=True)
    except Exception:  # noqa: BLE001 - a value only a job can resolve: compare it as written
        tree = OmegaConf.to_container(body, resolve=False)
    return {k: v for k, v in flatten(tree).items() if changes_results(k)}


def expand_jobs(config: DictConfig) -> list[list[str]] | None:
    """Each job's overrides (normalised, sorted, those that change results), numbered as Hydra's grid sweeper does."""
    params = OmegaConf.select(config, "hydra.sweeper.params")
    given = [f"{k}={v}" for k, v in (OmegaConf.to_container(params, resolve=True) if params else {}).items()]
    try:
        parser = OverridesParser.create()
        (jobs,) = BasicSweeper.split_arguments(parser.parse_overrides(given + list(config.hydra.overrides.task)), None)
    except Exception:  # noqa: BLE001 - e.g. glob(), which needs the config loader: the sweeper expands it
        return None
    return [sorted(normalised(o) for o in parser.parse_overrides(list(job)) if changes_results(o.get_key_element()))
            for job in jobs]


def differences(saved: SweepRecord, current: SweepRecord) -> list[str]:
    """Each way `current` would run other jobs than `saved` ran, one line each; [] when it continues it. Keys only
    one of them has (added to swinexp or removed since) are not compared."""
    lines = []
    gone, new = sorted(set(saved.identity) - set(current.identity)), sorted(set(current.identity) - set(saved.identity))
    if gone or new:
        lines.append(f"the command: it gave {' '.join(gone) or '(nothing else)'}; this one gives "
                     f"{' '.join(new) or '(nothing else)'}")
    groups = {k: v for k, v in changed_choices(saved.choices, current.choices).items() if changes_results(k)}
    lines += [f"{k}: {a} -> {b}" for k, (a, b) in groups.items()]
    both = saved.config.keys() & current.config.keys()
    changed = config_differences({k: saved.config[k] for k in both}, {k: current.config[k] for k in both})
    lines += [f"{k}: {a!r} -> {b!r}" for k, (a, b) in changed.items()
              if changes_results(k) and k.split(".")[0] not in groups]
    if saved.jobs is not None and current.jobs is not None and not lines:  # same overrides, another order
        lines += [f"job #{n}: it ran {' '.join(a)}; this command numbers {' '.join(b)} #{n}"
                  for n, (a, b) in enumerate(zip(saved.jobs, current.jobs)) if a != b]
    return lines


def open_sweep(config: DictConfig) -> OpenSweep:
    """Fix the sweep's dir for this command and its jobs, take the sweep's lock, and continue the sweep recorded
    there or record a new one.

    Raises:
        ConfigError: another command runs the sweep; or the dir holds a sweep this command would not continue
            (the differences listed); or sweep.fresh=true with a hydra.sweep.dir that holds a sweep.
    """
    explicit = any(o.startswith("hydra.sweep.dir=") for o in config.hydra.overrides.hydra)
    sweep_dir = Path(str(config.hydra.sweep.dir))  # resolved once, here: a fresh generation must not move on
    _pin(config, sweep_dir)
    lock = _lock(sweep_dir)
    if OmegaConf.select(config, "hydra.sweeper._target_") != SWEEPER_TARGET:
        return OpenSweep(sweep_dir, None, lock, False)
    current, saved = SweepRecord.of(config), SweepRecord.load(sweep_dir)
    if saved is None:
        current.save(sweep_dir)
        return OpenSweep(sweep_dir, current, lock, False)
    if OmegaConf.select(config, FRESH_KEY, default=False) and explicit:
        raise ConfigError(f"{FRESH_KEY}=true starts a new sweep in a new dir, but hydra.sweep.dir={sweep_dir} holds "
                          f"the sweep of `{' '.join(saved.command)}`; give another hydra.sweep.dir, or leave it out")
    if lines := differences(saved, current):
        listed = "\n  ".join(lines)
        if saved.identity != current.identity:
            raise ConfigError(f"hydra.sweep.dir={sweep_dir} holds the sweep of another command, which this one would "
                              f"not continue:\n  {listed}\nContinue that sweep with its own command "
                              f"(`{' '.join(saved.command)}`), or give this one another hydra.sweep.dir")
        raise ConfigError(f"the sweep in {sweep_dir} (started {saved.started}) cannot be continued: this command "
                          "composes a config that differs from the sweep's where it changes results (a config file "
                          f"or a default changed since):\n  {listed}\nRestore them to continue the sweep, or start a "
                          f"new one with {FRESH_KEY}=true")
    current.parent_run_id, current.started, current.attempts = saved.parent_run_id, saved.started, saved.attempts + 1
    current.command = saved.command
    current.save(sweep_dir)
    return OpenSweep(sweep_dir, current, lock, True)


def _pin(config: DictConfig, sweep_dir: Path) -> None:
    """Every job composes the sweep's dir from this command's overrides, not from its own."""
    quoted = "'" + str(sweep_dir).replace("\\", "\\\\").replace("'", "\\'") + "'"
    with read_write(config.hydra), open_dict(config.hydra):
        config.hydra.sweep.dir = str(sweep_dir)
        config.hydra.overrides.hydra.append(f"hydra.sweep.dir={quoted}")


def _lock(sweep_dir: Path) -> FileLock:
    sweep_dir.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(sweep_dir / LOCK_FILE), timeout=0)
    try:
        lock.acquire()
    except Timeout:
        owner = sweep_dir / OWNER_FILE
        who = owner.read_text().strip() if owner.is_file() else "another process"
        raise ConfigError(
            f"the sweep in {sweep_dir} is being run by another command ({who}); "
            "two commands on one sweep would run its jobs twice. Wait for it to end, or stop it: its unfinished "
            "jobs continue when you rerun the command") from None
    (sweep_dir / OWNER_FILE).write_text(f"pid {os.getpid()} on {socket.gethostname()}, since "
                                        f"{time.strftime('%Y-%m-%d %H:%M:%S')}\n")
    return lock

