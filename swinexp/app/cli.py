"""The `swinexp` command (also `python -m swinexp` and `python run.py`): train one configuration, or a sweep with `-m`.

`swinexp [group=option ...] [key=value ...]`; `--help` lists the config groups, `--cfg job` prints the composed
config, `-cd DIR` adds the user's own config directory (e.g. `DIR/model/my_model.yaml`) to swinexp's `conf/`.
"""
from __future__ import annotations

import os
import sys
from collections.abc import Sequence

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from swinexp.config import CONF_DIR
from swinexp.registry import ConfigError
from swinexp.runtime.gc_pause import long_lived_imports

GRID_SWEEPER = "hydra/sweeper=swinexp_grid"  # Hydra's grid sweeper, continuing a sweep whose process died


def main() -> None:
    """The command: the checks Hydra's own errors would word misleadingly, then Hydra (with swinexp's sweeper)."""
    if (line := misplaced_seeds(sys.argv[1:])) is not None:
        raise SystemExit(f"ConfigError: {line}")
    sys.argv = [sys.argv[0], *with_default_sweeper(sys.argv[1:])]
    _main()


def with_default_sweeper(args: Sequence[str]) -> list[str]:
    """`args` choosing swinexp's grid sweeper, unless they choose a sweeper or a search themselves.

    On the command line, not in conf/config.yaml's defaults: Hydra keeps the first override of a group it meets,
    and the root config comes before `hparams_search/*`, whose own override to the Optuna sweeper would lose."""
    if any(a.lstrip("+~").startswith(("hydra/sweeper=", "hparams_search=")) for a in args):
        return list(args)
    at = next((i for i, a in enumerate(args) if "=" in a and not a.startswith("-")
               and (i == 0 or args[i - 1] not in VALUE_FLAGS)), len(args))
    return [*args[:at], GRID_SWEEPER, *args[at:]]  # beside the user's overrides: argparse reads them as one list


VALUE_FLAGS = {"-cd", "--config-dir", "-cn", "--config-name", "-cp", "--config-path", "-c", "--cfg", "-p",
               "--package", "--info", "--experimental-rerun"}  # Hydra's flags that take the next word as their value


def misplaced_seeds(args: Sequence[str]) -> str | None:
    """`seeds=N` without a named sweep: Hydra would suggest `+seeds=N`, which would change nothing."""
    given = [a for a in args if a.startswith("seeds=")]
    if not given or any(a.startswith("sweep=") for a in args):
        return None
    return (f"{given[0]} sets how many paired seeds each arm of a named sweep runs (e.g. python run.py "
            f"sweep=amp_ablation {given[0]}); for your own -m sweep list the seeds, e.g. seed=0,1,2")


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")
def _main(cfg: DictConfig) -> float | None:
    if (line := _leaves_launch_to_another_copy(cfg)) is not None:
        print(line, flush=True)
        return None
    with long_lived_imports("swinexp.app.job"):  # MindSpore and the rest, only once a job runs (not --help / --cfg)
        from swinexp.app.job import run
        from swinexp.app.job_info import JobInfo
        from swinexp.engine.checkpoint import CheckpointWriteError
        from swinexp.runtime import launch

    try:
        metrics = run(cfg, JobInfo.from_hydra(HydraConfig.get()))
    except ConfigError as err:  # a user mistake: say what to fix, without a traceback
        if HydraConfig.get().mode == RunMode.MULTIRUN:
            raise  # the sweep records this job as failed and goes on with the next
        raise launch.exit_for_config_error(err) from None  # under msrun: a line the launching process finds
    except CheckpointWriteError as err:  # disk full, read-only run dir: one line that names the file and the cause
        if HydraConfig.get().mode == RunMode.MULTIRUN:
            raise
        raise SystemExit(f"CheckpointWriteError: {err}") from None
    return metrics.get(cfg.optimized_metric) if cfg.get("optimized_metric") else None


def _leaves_launch_to_another_copy(cfg: DictConfig) -> str | None:
    """hardware.platform=modelarts starts this command once per card: all copies but one leave at once, before
    MindSpore is imported or a card is touched (runtime/modelarts.py)."""
    from omegaconf import OmegaConf

    from swinexp.runtime.launch import not_the_launcher

    if cfg.dry_run or os.environ.get("MS_ROLE"):  # a dry run reports it; msrun's own processes always run
        return None
    return not_the_launcher(OmegaConf.to_object(cfg.hardware))
