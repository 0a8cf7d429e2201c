"""docs/configuration.md's generated reference is what the schemas and conf/ say now: regenerated and compared, so a
field added to TrainerCfg or a key changed in a YAML file fails here until `python -m swinexp.app.config_reference`
rewrites the page."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from swinexp.app import config_reference
from swinexp.config import HardwareCfg, TrainerCfg
from tests.conftest import ROOT


def test_the_page_is_the_generated_reference() -> None:
    page = (ROOT / "docs" / "configuration.md").read_text()
    assert config_reference.updated(page) == page, "stale: run python -m swinexp.app.config_reference"


@pytest.mark.parametrize("schema,group", [(TrainerCfg, "trainer"), (HardwareCfg, "hardware")])
def test_every_schema_field_has_a_row(schema: type, group: str) -> None:
    text = config_reference.render()
    top = [f.name for f in dataclasses.fields(schema)]
    assert all(f"`{group}.{name}" in text for name in top)


def test_every_group_option_has_a_row() -> None:
    text = config_reference.render()
    for group, folder in config_reference._groups().items():
        for option in folder.glob("*.yaml"):
            assert f"| `{option.stem}` |" in text, f"{group}={option.stem} missing from the reference"


def test_check_fails_on_a_stale_page(tmp_path: Path) -> None:
    stale = tmp_path / "configuration.md"
    page = (ROOT / "docs" / "configuration.md").read_text()
    stale.write_text(page.replace("| `trainer.epochs` | `int` | `10` |", "| `trainer.epochs` | `int` | `11` |"))
    assert config_reference.main(["--check", "--page", str(stale)]) == 1
    assert config_reference.main(["--page", str(stale)]) == 0 and stale.read_text() == page
