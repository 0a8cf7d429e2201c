"""Train one configuration: `python run.py [group=option ...] [key=value ...]`, or a sweep with `-m`."""
from __future__ import annotations

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

import swinexp  # noqa: F401  (registers components and config schemas before Hydra composes)
from swinexp.registry import ConfigError
from swinexp.runtime import launch
from swinexp.train import JobInfo, run


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> float | None:
    try:
        metrics = run(cfg, JobInfo.from_hydra(HydraConfig.get()))
    except ConfigError as err:  # a user mistake: say what to fix, without a traceback
        if HydraConfig.get().mode == RunMode.MULTIRUN:
            raise  # the sweep records this job as failed and goes on with the next
        raise launch.exit_for_config_error(err) from None  # under msrun: a line the launching process finds
    return metrics.get(cfg.optimized_metric) if cfg.get("optimized_metric") else None


if __name__ == "__main__":
    main()
