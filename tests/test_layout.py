"""The layout holds: config -> plan -> build -> engine -> tracking, read from the code's own imports (lazy ones too).

Hydra and OmegaConf stay at the door (`swinexp/app/`, and `config.py`, which turns a composed config into a Plan);
no room imports one above it; no two modules import each other, directly or round a longer loop.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.conftest import ROOT

PACKAGE = ROOT / "swinexp"
# rooms from the top down; a room may import rooms at its own level or below, never above. serve and parity are
# entry points of their own (python -m swinexp.serve.predict, python -m swinexp.parity): they build from a Plan.
LEVELS = {"app": 5, "serve": 4, "parity": 4, "build": 3, "engine": 2,
          "runtime": 1, "tracking": 1, "amp": 1, "models": 1, "data": 1, "optim": 1,
          "config": 0, "registry": 0}
PACKAGE_FACE = {"__init__", "__main__"}  # `import swinexp` registers the resolvers; `python -m swinexp` runs the cli
HYDRA_ALLOWED = ("app", "config")


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
    upward = []
    for module, path in modules.items():
        room = _room(module)
        if room in PACKAGE_FACE:
            continue
        assert room in LEVELS, f"{module}: room '{room}' has no level in tests/test_layout.py; give it one"
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


def test_the_checks_see_what_they_guard_against(tmp_path: Path) -> None:
    """The readers above would pass on anything if they found no imports: they find the ones a layer must have."""
    job = _imports(PACKAGE / "app" / "job.py")
    assert "swinexp.build" in job and "omegaconf" in job
    lazy = tmp_path / "lazy.py"
    lazy.write_text("def f():\n    from swinexp.app.job import run\n    import omegaconf\n")
    assert {"swinexp.app.job", "swinexp.app.job.run", "omegaconf"} <= _imports(lazy)
