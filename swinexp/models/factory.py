"""`create_model`: the Python entry point, built from the same registry and `conf/model/<name>.yaml` as `run.py`."""
from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from mindspore import nn

from swinexp.config import CONF_DIR, option_values
from swinexp.models.pretrained import LOAD_DEFAULTS, prepare
from swinexp.registry import MODELS, ConfigError

__all__ = ["MODEL_CONF_DIR", "build_model", "create_model", "model_defaults"]

MODEL_CONF_DIR = CONF_DIR / "model"


def model_defaults(name: str) -> dict[str, Any]:
    """The builder kwargs of `conf/model/<name>.yaml` (over the base it extends), without `name`.

    Keys that follow the data in a run (`img_size`, `num_classes`: `${oc.select:data.img_size,224}`) take the
    size's own default, the value after the comma.

    Args:
        name: A registered model name.

    Returns:
        Key to plain value (lists, not ListConfig).

    Raises:
        ConfigError: `name` is not registered (listing the choices) or, for swinexp's own models, has no YAML file.
    """
    builder = MODELS.get(name)  # unknown names fail here, with the choices and a close match
    path = MODEL_CONF_DIR / f"{name}.yaml"
    if not path.is_file():
        if not builder.__module__.startswith("swinexp."):
            return {}  # a plugin's model: its builder's own defaults (its YAML lives in the user's config dir)
        raise ConfigError(f"model '{name}' is registered but {path} is missing; add it (see conf/model/swin_tiny.yaml)")
    values = option_values(MODEL_CONF_DIR, name)
    return {k: v for k, v in values.items() if k != "name"}


def create_model(name: str, pretrained: str | None = None, num_classes: int = 1000, **overrides: Any) -> nn.Cell:
    """Build a registered model with its config-file defaults, optionally loading weights.

    Example: `swinexp.create_model("swin_tiny", pretrained="swin_tiny.safetensors", qkv="fused")`.

    Args:
        name: Registered model name, e.g. "swin_tiny" (the file name in conf/model).
        pretrained: A `.ckpt`, timm `.safetensors` or official `.pth`; its head is dropped if num_classes differs.
        num_classes: Classes of the head; 0 builds the backbone only.
        **overrides: Any other builder parameter (img_size, qkv, drop_path_rate, ...); they win over the file.

    Returns:
        The built model (an `nn.Cell`), in training mode as MindSpore builds it.

    Raises:
        ConfigError: Unknown name or parameter, invalid value, or a weight file that does not fit.
    """
    weights = {"pretrained": pretrained} if pretrained else {}
    kwargs = {**model_defaults(name), "num_classes": num_classes, **weights, **overrides}
    return build_model({"name": name, **kwargs})


def build_model(section: Mapping[str, Any]) -> nn.Cell:
    """`MODELS.build(section)`; the weight keys (`pretrained`, `pretrained_resize`, `head_init`, `freeze`) go to a
    builder that names them (swinexp's own), and are applied after the build for one that does not (a plugin's
    `def my_swin(**overrides)`: its SwinTransformer takes no such keys), so every model loads and freezes alike."""
    builder = MODELS.get(str(section["name"]))
    named = inspect.signature(builder).parameters
    after = {k: section[k] for k in LOAD_DEFAULTS if k in section and k not in named}
    model = MODELS.build({k: v for k, v in section.items() if k not in after})
    if after:
        prepare(model, **after)
    return model
