"""swinexp: config-composed Swin Transformer experiments on MindSpore.

When components register (the rule): `import swinexp` registers the typed config schemas in Hydra's ConfigStore and the
resolvers, and imports no MindSpore, so `--help`, `--cfg job`, `python -m
swinexp.tracking.report` and `python -m swinexp.tracking sync` start fast. The component registries (`REGISTRIES`) fill
themselves the first time any of them is read — `MODELS.build(...)`, `"swin_tiny" in MODELS`, `sorted(MODELS)` —
by importing swinexp's component modules and then every installed plugin (entry-point group `swinexp.plugins`);
modules listed under `imports:` in a config are imported by `swinexp.build` before it builds. A registry is
therefore never read half filled, and nothing has to be imported "for its side effect" before a build.
`swinexp.create_model` (resolved lazily, `from swinexp import create_model` works) loads MindSpore on first use.
"""
from __future__ import annotations

from typing import Any

from swinexp.app.resolvers import register_resolvers, register_schemas
from swinexp.registry import AMP_POLICIES, AUGMENTS, DATASETS, MODELS, OPTIMIZERS, SCHEDULERS, TRACKERS, ConfigError

register_resolvers()
register_schemas()

REGISTRIES = {
    "model": MODELS,
    "data": DATASETS,
    "data/augment": AUGMENTS,
    "amp": AMP_POLICIES,
    "optimizer": OPTIMIZERS,
    "scheduler": SCHEDULERS,
    "tracking": TRACKERS,
}

_LAZY = {"create_model": "swinexp.models.factory"}  # public names whose modules import MindSpore


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'swinexp' has no attribute '{name}'")


__all__ = ["AMP_POLICIES", "AUGMENTS", "DATASETS", "MODELS", "OPTIMIZERS", "REGISTRIES", "SCHEDULERS", "TRACKERS",
           "ConfigError", "create_model"]
