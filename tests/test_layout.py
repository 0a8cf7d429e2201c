"""The layout holds: config -> plan -> build -> engine -> tracking, read from the code's own imports (lazy ones too).

Hydra and OmegaConf stay at the door (`swinexp/app/`, and `config.py`, which turns a composed config into a Plan);
no room imports one above it in the docs' layout list (docs/development.md, read from there, so the two cannot drift
apart); no two
modules import each other, directly or round a longer loop.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.conftest import ROOT

PACKAGE = ROOT / "swinexp"
MARK = "Layout, in the order a run flows"  # the layout list follows this phrase in the README or a page of docs/
LAYOUT_DOC = next(doc for doc in (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))) if MARK in doc.read_text())
PACKAGE_FACE = {"__init__", "__main__"}  # `import swinexp` registers the resolvers; `python -m swinexp` runs the cli
HYDRA_ALLOWED = ("app", "config")


def readme_levels(text: str) -> dict[str, int]:
    """Room -> level from the layout list (the text block after "Layout, in the order a run flows"): one level
    per entry, the first entry highest; rooms named on one entry's first line ("swinexp/data/ models/") share it."""
    block = text.split(MARK, 1)[1].split("```text\n", 1)[1].split("```", 1)[0]
    entries = [line.split("  ", 1)[0] for line in block.splitlines() if line[:1].strip()]  # not a continuation
    rooms = [re.findall(r"([a-z_]+)(?:/|\.py)", entry.split("swinexp/", 1)[1]) for entry in entries
             if "swinexp/" in entry]
    return {room: len(rooms) - i for i, names in enumerate(rooms) for room in names}


LEVELS = readme_levels(LAYOUT_DOC.read_text())


def _modules() -> dict[str, Path]:
    return {".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): p
            for p in sorted(PACKAGE.rglob("*.py"))}


def _imports(path: Path) -> set[str]:
    """Every module `path` names in an import statement, at the top or inside a function."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def _room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _internal(imported: set[str], modules: dict[str, Path]) -> set[str]:
    return {name for name in imported if name in modules and name != "swinexp"}


def test_no_room_imports_a_room_above_it() -> None:
    modules = _modules()
    unlisted = sorted({_room(m) for m in modules} - LEVELS.keys() - PACKAGE_FACE)
    assert not unlisted, (f"rooms {unlisted} are not in {LAYOUT_DOC.relative_to(ROOT)}'s layout list; add each there, "
                          "on the line of the rooms it may import from, or above the rooms it imports")
    upward = []
    for module, path in modules.items():
        room = _room(module)
        if room in PACKAGE_FACE:
            continue
        for target in _internal(_imports(path), modules):
            if LEVELS[_room(target)] > LEVELS[room]:
                upward.append(f"{module} -> {target}")
    assert not upward, "imports that run back up (pass the value down instead):\n" + "\n".join(sorted(upward))


def test_no_module_imports_itself_round_a_loop() -> None:
    modules = _modules()
    graph = {m: _internal(_imports(p), modules) - {m} for m, p in modules.items()}
    graph = {m: {t for t in targets if not m.startswith(f"{t}.")} for m, targets in graph.items()}  # a package's
    state: dict[str, int] = {}                                                                   # own __init__

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                pytest.fail("import circle: " + " -> ".join([*trail[trail.index(nxt):], nxt]))
            if nxt not in state:
                visit(nxt, [*trail, nxt])
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])


def test_hydra_and_omegaconf_stay_at_the_door() -> None:
    outside = [f"{module}: {name}" for module, path in _modules().items()
               if _room(module) not in (*HYDRA_ALLOWED, *PACKAGE_FACE)
               for name in sorted(_imports(path)) if name.split(".")[0] in ("hydra", "omegaconf")]
    assert not outside, "Hydra/OmegaConf below the door (take a Plan instead):\n" + "\n".join(outside)


def test_the_readme_list_is_the_order() -> None:
    """What the layout list states, as the test reads it: every room on its own level, data and models share one."""
    order = sorted(LEVELS, key=lambda room: -LEVELS[room])
    assert order == ["app", "serve", "parity", "build", "engine", "amp", "optim", "data", "models", "tracking",
                     "runtime", "config", "registry"]
    assert LEVELS["serve"] == LEVELS["parity"] and LEVELS["data"] == LEVELS["models"]
    assert len(set(LEVELS.values())) == len(LEVELS) - 2


def test_the_checks_see_what_they_guard_against(tmp_path: Path) -> None:
    """The readers above would pass on anything if they found no imports: they find the ones a layer must have."""
    job = _imports(PACKAGE / "app" / "job.py")
    assert "swinexp.build" in job and "omegaconf" in job
    lazy = tmp_path / "lazy.py"
    lazy.write_text("def f():\n    from swinexp.app.job import run\n    import omegaconf\n")
    assert {"swinexp.app.job", "swinexp.app.job.run", "omegaconf"} <= _imports(lazy)
