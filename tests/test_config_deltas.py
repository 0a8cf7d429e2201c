"""Every config file holds only what differs from its base: no key restates the value its `defaults:` chain (a sibling
option, a typed schema, or an experiment's overridden group option) already gives it."""
from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from swinexp.config import HardwareCfg, TrainerCfg
from tests.conftest import CONF_DIR

SCHEMAS = {"base_trainer": TrainerCfg, "base_hardware": HardwareCfg}
HEADER_KEYS = {"defaults", "name"}


def _flat(node: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(node, dict):
        return {prefix: node}
    out: dict[str, Any] = {}
    for key, value in node.items():
        out.update(_flat(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def _own(path: Path) -> tuple[dict[str, Any], list[Any]]:
    raw = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    return {k: v for k, v in raw.items() if k not in HEADER_KEYS}, raw.get("defaults", [])


def _values(path: Path, prefix: str = "") -> dict[str, Any]:
    """Everything `path` gives once composed: its bases' values, then its own."""
    own, defaults = _own(path)
    return {**_base_values(path, defaults, prefix), **_flat(own, prefix)}


def _base_values(path: Path, defaults: list[Any], prefix: str = "") -> dict[str, Any]:
    """The values this file's defaults list gives before its own `_self_`: a typed schema, a sibling option, or an
    experiment's `override /group: option` (that option's values under `group.`)."""
    base: dict[str, Any] = {}
    for entry in defaults:
        if entry == "_self_":
            break
        if isinstance(entry, str) and entry in SCHEMAS:
            base.update(_flat(asdict(SCHEMAS[entry]()), prefix))
        elif isinstance(entry, str) and (path.parent / f"{entry}.yaml").is_file():
            base.update(_values(path.parent / f"{entry}.yaml", prefix))
        elif isinstance(entry, dict):
            for key, option in entry.items():
                group = key.replace("override", "").strip().lstrip("/")
                option_file = CONF_DIR / group / f"{option}.yaml"
                if option_file.is_file():
                    base.update(_values(option_file, group.replace("/", ".")))
    return base


def _files() -> list[Path]:
    return sorted(p for p in CONF_DIR.rglob("*.yaml") if p.parent != CONF_DIR)


@pytest.mark.parametrize("path", _files(), ids=lambda p: str(p.relative_to(CONF_DIR)))
def test_a_config_file_holds_only_its_differences(path: Path) -> None:
    own, defaults = _own(path)
    base = _base_values(path, defaults)
    restated = {key: value for key, value in _flat(own).items() if key in base and base[key] == value}
    assert not restated, f"{path.relative_to(CONF_DIR)} restates what its defaults give: {restated}"


def test_the_check_sees_a_restated_value(tmp_path: Path) -> None:
    (tmp_path / "base.yaml").write_text("name: base\nlr: 0.1\nwd: 0.05\n")
    (tmp_path / "child.yaml").write_text("defaults:\n  - base\n  - _self_\nname: child\nlr: 0.2\nwd: 0.05\n")
    own, defaults = _own(tmp_path / "child.yaml")
    base = _base_values(tmp_path / "child.yaml", defaults)
    assert {k for k, v in _flat(own).items() if base.get(k) == v} == {"wd"}
