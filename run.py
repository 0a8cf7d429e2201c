"""Train one configuration: `python run.py [group=option ...] [key=value ...]`, or a sweep with `-m`."""
from __future__ import annotations

from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

import swinexp  # noqa: F401  (registers components and config schemas before Hydra composes)
from swinexp.registry import ConfigError
from swinexp.train import JobInfo, run


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> float | None:
    hydra_cfg = HydraConfig.get()
    job = JobInfo(
        run_dir=Path(hydra_cfg.runtime.output_dir),
        overrides=list(hydra_cfg.overrides.task),
        choices=dict(hydra_cfg.runtime.choices),
    )
    try:
        metrics = run(cfg, job)
    except ConfigError as err:  # a user mistake: say what to fix, without a traceback
        raise SystemExit(f"ConfigError: {err}") from None
    return metrics.get(cfg.optimized_metric) if cfg.get("optimized_metric") else None


if __name__ == "__main__":
    main()
