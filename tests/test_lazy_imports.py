"""Commands that need no MindSpore do not import it; the registries still fill before anything reads them."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from swinexp.app.resolvers import HIDDEN_GROUPS
from tests.conftest import CONF_DIR, ROOT

pytestmark = pytest.mark.slow

MINDSPORE_IMPORTED = re.compile(r"\|\s+mindspore$", re.MULTILINE)  # a `-X importtime` line of the mindspore package


def _python(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-X", "importtime", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300, check=False)


@pytest.mark.parametrize("command,expected", [
    (["-m", "swinexp", "--cfg", "job", "model=swin_tiny"], "name: swin_tiny"),
    (["-m", "swinexp.tracking", "sync", "--help"], "--from SOURCE"),  # imports all the command imports; a real
    (["-m", "swinexp.tracking.report", "--help"], "--tracking-uri"),           # report: tests/test_packaging.py (wheel)
], ids=["cfg-job", "tracking-sync", "report"])
def test_mindspore_free_commands_do_not_import_it(command: list[str], expected: str, tmp_path: Path) -> None:
    out = _python(*command, cwd=tmp_path)
    assert expected in out.stdout + out.stderr, out.stderr[-3000:]
    assert not MINDSPORE_IMPORTED.search(out.stderr), f"{' '.join(command)} imported MindSpore"


def test_help_lists_user_facing_groups_only_and_imports_no_mindspore(tmp_path: Path) -> None:
    user = tmp_path / "myconf"
    (user / "model").mkdir(parents=True)
    (user / "model" / "swin_mine.yaml").write_text("defaults:\n  - swin_micro\n  - _self_\n\nembed_dim: 16\n")
    (user / "trainer").mkdir()
    (user / "trainer" / "base_mine.yaml").write_text("epochs: 1\n")  # a schema-like name: not offered as an option
    out = _python("-m", "swinexp", "-cd", str(user), "--help", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert not MINDSPORE_IMPORTED.search(out.stderr), "--help imported MindSpore"
    section = out.stdout.split("== Configuration groups ==")[1].split("== Config ==")[0]
    groups = dict(line.split(": ", 1) for line in section.splitlines() if ": " in line)
    on_disk = {p.parent.relative_to(CONF_DIR).as_posix() for p in CONF_DIR.rglob("*.yaml") if p.parent != CONF_DIR}
    on_disk = {g for g in on_disk if not g.startswith("hydra/")}  # launcher presets: Hydra's own --hydra-help
    on_disk |= {"sweep"} if any((ROOT / "sweeps").glob("*.yaml")) else set()  # sweeps/, served as the group sweep
    assert set(groups) == on_disk - set(HIDDEN_GROUPS)
    assert "model/formulation" in on_disk and "model/formulation" not in groups
    assert not [o for options in groups.values() for o in options.split(", ") if o.startswith("base_")]
    assert "swin_mine" in groups["model"].split(", ") and "default" in groups["trainer"].split(", ")
    assert out.stdout.startswith("swinexp: train one configuration")


def test_registries_fill_on_their_first_read(tmp_path: Path) -> None:
    code = ("import json, sys, swinexp\n"
            "before = 'mindspore' in sys.modules\n"
            "datasets = len(swinexp.DATASETS)\n"  # one registry read fills all of them
            "print(json.dumps([before, datasets, 'swinexp.models.swin' in sys.modules, sorted(swinexp.MODELS._items),"
            " 'mindspore' in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                         check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    before, datasets, swin_imported, models, after = json.loads(out.stdout.splitlines()[-1])
    assert not before and datasets > 0 and swin_imported and after
    assert {"swin_micro", "swin_tiny"} <= set(models)  # read without `in`/iteration: filled by the DATASETS read
