"""swinexp: config-composed Swin Transformer experiments on MindSpore.

Importing the package registers every component (models, datasets, augmentations, amp policies, optimizers,
schedulers, trackers) and the typed config schemas, so `python run.py` and tests see the same registries.
"""
from swinexp import amp, data, models, optim, tracking  # noqa: F401  (register amp/, optimizer/, scheduler/, tracking/)  # noqa: F401  (register data/, data/augment/, model/)
from swinexp.config import register_resolvers, register_schemas, register_sweeps
from swinexp.models import create_model  # noqa: F401  (swinexp.create_model(name, pretrained, ...))
from swinexp.registry import AMP_POLICIES, AUGMENTS, DATASETS, MODELS, OPTIMIZERS, SCHEDULERS, TRACKERS, ConfigError

register_resolvers()
register_schemas()
register_sweeps()

REGISTRIES = {
    "model": MODELS,
    "data": DATASETS,
    "data/augment": AUGMENTS,
    "amp": AMP_POLICIES,
    "optimizer": OPTIMIZERS,
    "scheduler": SCHEDULERS,
    "tracking": TRACKERS,
}

__all__ = ["AMP_POLICIES", "AUGMENTS", "ConfigError", "DATASETS", "MODELS", "OPTIMIZERS", "REGISTRIES", "SCHEDULERS",
           "TRACKERS"]
