"""Every `python run.py ...` example in README.md and the pages of docs/ composes as written (the `--cfg job` of it,
through Hydra's compose API), names the data it needs, and builds a model that fits that data; every `python -m
swinexp...` line is understood by its module; every file, folder and module the docs name exists, and every link
between them resolves."""
from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from hydra import compose as compose_cfg
from hydra import initialize_config_dir
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.types import RunMode

from swinexp.build import check_trainer
from swinexp.config import read
from swinexp.models.swin import _resolution_problem
from swinexp.runtime import hardware
from tests.conftest import CONF_DIR, ROOT

README = ROOT / "README.md"
DOCS = (README, ROOT / "BENCHMARKS.md", *sorted((ROOT / "docs").glob("*.md")))  # what a user reads
PLACEHOLDER = re.compile(r"<[^>]*>|\[[^\]]*\]|\.\.\.")  # `<same overrides>`, `[overrides]`, `...`: a template
FLAGS = {"-m", "--multirun"}  # everything else after run.py must be an override


def readme_commands() -> list[str]:
    """The `python run.py` lines of the bash blocks (continuations joined, comments cut) and inline `code`."""
    text = "\n".join(doc.read_text() for doc in DOCS)
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in re.sub(r"\\\n\s*", " ", block).splitlines():
            line = line.split(" #")[0].strip()
            if line.startswith("python run.py"):
                commands.append(line)
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    commands += [" ".join(c.split()) for c in re.findall(r"`(python run\.py[^`]*)`", prose)]
    return [c for c in dict.fromkeys(commands) if not PLACEHOLDER.search(c)]


def _jobs(args: list[str]) -> list[list[str]]:
    """The override lists of the jobs a command runs: one, or one per combination of a sweep's values."""
    overrides = [a for a in args if a not in FLAGS]
    if FLAGS & set(args):
        return _split(overrides)
    single = [o.input_line for o in OverridesParser.create().parse_overrides(overrides) if not o.is_sweep_override()]
    with initialize_config_dir(version_base="1.3", config_dir=str(CONF_DIR)):  # a named sweep + seed=1,2,3 too
        hydra_cfg = compose_cfg("config", overrides=single, return_hydra_config=True).hydra
    if hydra_cfg.mode != RunMode.MULTIRUN:  # a named sweep (sweep=X) sets it, with its values in sweeper.params
        return [overrides]
    given = {o.split("=")[0] for o in overrides}
    return _split([f"{k}={v}" for k, v in hydra_cfg.sweeper.params.items() if k not in given] + overrides)


def _split(overrides: list[str]) -> list[list[str]]:
    (jobs,) = BasicSweeper.split_arguments(OverridesParser.create().parse_overrides(overrides), max_batch_size=None)
    return [list(job) for job in jobs]


def test_the_readme_has_the_examples_this_test_is_about() -> None:
    commands = readme_commands()
    assert len(commands) >= 20
    assert "python run.py experiment=swin_tiny_in1k hardware=ascend8 data.root=/data/imagenet" in commands


@pytest.mark.parametrize("command", readme_commands())
def test_readme_command_composes_and_its_model_fits_its_data(command: str) -> None:
    args = shlex.split(command)[2:]
    if args == ["--help"]:
        return
    if "--cfg" in args:  # `--cfg job` prints the composed config: compose what it would print
        at = args.index("--cfg")
        args = args[:at] + args[at + 2:]
    for job in _jobs(args):
        with initialize_config_dir(version_base="1.3", config_dir=str(CONF_DIR)):
            cfg = compose_cfg("config", overrides=job)
        plan = read(cfg)  # a `???` data.root fails here, naming the key
        check_trainer(plan.trainer)  # trainer keys valid (epochs, stop_after_epoch, ...)
        hardware.validate(plan.hardware)
        data, model = plan.section("data"), plan.section("model")
        assert data.get("root") is not None or data["name"] == "synthetic", f"{command}: needs data.root"
        problem = _resolution_problem(model["img_size"], model["patch_size"], model["window_size"],
                                      len(model["depths"]))
        assert problem is None, f"{command}: model {model['name']} at data.img_size={data['img_size']}: {problem}"


RUN_OVERRIDE_MODULES = {"swinexp.app.selfcheck", "swinexp.parity"}  # they take run.py's overrides


def readme_module_commands() -> list[str]:
    """The `python -m swinexp...` and `swinexp ...` lines of the docs' bash blocks and inline `code`."""
    text = "\n".join(doc.read_text() for doc in DOCS)
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in re.sub(r"\\\n\s*", " ", block).splitlines():
            line = line.split(" #")[0].strip()
            if line.startswith(("python -m swinexp", "swinexp ")):
                commands.append(line)
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    commands += [" ".join(c.split()) for c in re.findall(r"`((?:python -m swinexp|swinexp )[^`]*)`", prose)]
    return [c for c in dict.fromkeys(commands) if not PLACEHOLDER.search(c)]


def _module_and_args(command: str) -> tuple[str, list[str]]:
    words = shlex.split(command)
    if words[0] == "swinexp":
        return "swinexp", words[1:]
    return words[2], words[3:]


HYDRA_FLAGS = {"-cd", "--config-dir", "-cn", "--config-name", "-cp", "--config-path", "--cfg", "--help", "-h",
               "--info", "-c"}  # flags of the Hydra app itself (`swinexp --help` lists them)


def _help_text(module: str, capsys: pytest.CaptureFixture[str], subcommand: list[str]) -> str:
    """What `python -m <module> [subcommand] --help` prints, run in this process (argparse exits 0)."""
    import runpy
    import sys

    argv = sys.argv
    sys.argv = [module, *subcommand, "--help"]
    try:
        with pytest.raises(SystemExit) as done:
            runpy.run_module(module, run_name="__main__", alter_sys=False)
    finally:
        sys.argv = argv
    assert done.value.code in (0, None), f"python -m {module} --help exited {done.value.code}"
    return capsys.readouterr().out


def test_the_readme_has_module_commands() -> None:
    modules = {_module_and_args(c)[0] for c in readme_module_commands()}
    assert {"swinexp.app.selfcheck", "swinexp.parity", "swinexp.tracking.report", "swinexp.serve.predict"} <= modules


@pytest.mark.parametrize("command", readme_module_commands())
def test_readme_module_command_is_understood_as_written(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    """The module exists and answers --help; every option the line uses is one it lists; run.py's overrides of the
    tools that take them compose."""
    module, args = _module_and_args(command)
    if module in ("swinexp", "swinexp.__main__"):  # the same command as run.py
        flags = [a for a in args if a.startswith("-") and a not in FLAGS]
        assert set(flags) <= HYDRA_FLAGS, f"{command}: {set(flags) - HYDRA_FLAGS} is no flag of the Hydra app"
        if flags:  # another config dir or name, --help, --cfg: Hydra's own handling, nothing of ours to compose
            return
        for job in _jobs(args):
            with initialize_config_dir(version_base="1.3", config_dir=str(CONF_DIR)):
                compose_cfg("config", overrides=job)
        return
    subcommand = args[:1] if module == "swinexp.tracking" and args and not args[0].startswith("-") else []
    args = args[len(subcommand):]  # `python -m swinexp.tracking sync ...`
    text = _help_text(module, capsys, subcommand)
    options = [a.split("=")[0] for a in args if a.startswith("--")]
    assert all(o in text for o in options), f"{command}: {[o for o in options if o not in text]} not in its --help"
    if module in RUN_OVERRIDE_MODULES:
        overrides = [a for a in args if "=" in a and not a.startswith("-")]
        with initialize_config_dir(version_base="1.3", config_dir=str(CONF_DIR)):
            compose_cfg("config", overrides=overrides)


ROOTS = ("swinexp", "conf", "sweeps", "tests", "benchmarks", "docs", "hydra_plugins", ".ci")
PATH = re.compile(rf"`((?:{'|'.join(re.escape(r) for r in ROOTS)})/[^`\s:()]*)")  # `swinexp/runtime/chips.py`
MODULE = re.compile(r"`(?:python -m )?(swinexp(?:\.\w+)+)")  # `swinexp.tracking.report`, `swinexp.create_model(...)`
NOT_MODULES = {"swinexp.plugins",  # the entry-point group plugins declare: a name, no module
               "swinexp.malloc", "swinexp.run_dir", "swinexp.failure"}  # MLflow tags a run carries
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _prose(doc: Path) -> str:
    """A page without its fenced blocks (their paths are commands' arguments and examples, checked by running)."""
    return re.sub(r"```.*?```", "", doc.read_text(), flags=re.S)


def _named(pattern: re.Pattern[str]) -> list[tuple[str, str]]:
    return [(doc.relative_to(ROOT).as_posix(), m) for doc in DOCS for m in dict.fromkeys(pattern.findall(_prose(doc)))]


def _slugs(doc: Path) -> set[str]:
    """GitHub's anchors for a page's headings: lower case, punctuation dropped, spaces to hyphens, repeats numbered."""
    slugs: set[str] = set()
    for heading in re.findall(r"^#{1,6} (.+)$", _prose(doc), flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        n, unique = 0, slug
        while unique in slugs:
            n += 1
            unique = f"{slug}-{n}"
        slugs.add(unique)
    return slugs


@pytest.mark.parametrize("doc,path", _named(PATH))
def test_every_path_the_docs_name_exists(doc: str, path: str) -> None:
    assert (ROOT / path.rstrip(".,;")).exists(), f"{doc} names {path}, which does not exist"


@pytest.mark.parametrize("doc,dotted", _named(MODULE))
def test_every_module_the_docs_name_exists(doc: str, dotted: str) -> None:
    """The longest prefix that is a module file, and the name after it defined or imported there."""
    if dotted in NOT_MODULES:
        return
    parts = dotted.split(".")
    for n in range(len(parts), 0, -1):
        base = ROOT.joinpath(*parts[:n])
        source = base.with_suffix(".py") if base.with_suffix(".py").is_file() else base / "__init__.py"
        if source.is_file():
            break
    else:
        pytest.fail(f"{doc} names {dotted}: no such module")
    rest = parts[n:]
    if rest:
        text = source.read_text()
        assert re.search(rf"^\s*(def|class)\s+{rest[0]}\b|^{rest[0]}\s*[:=]|\bimport\b.*\b{rest[0]}\b|\"{rest[0]}\"",
                         text, re.M), f"{doc} names {dotted}: {'.'.join(parts[:n])} defines no {rest[0]}"


@pytest.mark.parametrize("doc,target", _named(LINK))
def test_every_link_resolves(doc: str, target: str) -> None:
    if re.match(r"[a-z]+:", target):  # https://..., mailto:
        return
    path, _, anchor = target.partition("#")
    page = (ROOT / doc).parent / path if path else ROOT / doc
    assert page.exists(), f"{doc} links to {target}: {page.relative_to(ROOT)} does not exist"
    if anchor and page.suffix == ".md":
        assert anchor in _slugs(page), f"{doc} links to {target}: no heading of {path or doc} has that anchor"


def test_the_checks_read_what_they_guard() -> None:
    """The readers find what the README names: its paths, its modules, its links into docs/."""
    paths = {p for doc, p in _named(PATH) if doc == "README.md"}
    links = {t for doc, t in _named(LINK) if doc == "README.md"}
    assert {"swinexp/runtime/simulated_ascend.py", "swinexp/runtime/chips.py"} <= paths
    assert {"docs/configuration.md", "docs/ascend.md", "#install"} <= links
    assert ("README.md", "swinexp.app.selfcheck") in _named(MODULE)


DESIGN_CARD = ("python run.py model=swin_tiny amp=o1_manual hardware=ascend8",
               "python run.py -m amp=o0,o2,o1_manual",
               "mlflow ui")


def test_the_readme_opens_with_the_design_cards_three_commands_word_for_word() -> None:
    first_block = re.search(r"```bash\n(.*?)```", README.read_text(), re.S).group(1)
    assert tuple(line.split(" #")[0].strip() for line in first_block.splitlines()) == DESIGN_CARD


@pytest.mark.slow
def test_the_main_command_dry_runs_as_typed_on_8_cards_at_the_models_resolution(tmp_path: Path) -> None:
    import subprocess
    import sys

    out = subprocess.run([sys.executable, str(ROOT / "run.py"), *shlex.split(DESIGN_CARD[0])[2:], "dry_run=true"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "dry run: 8 worker(s) = 8 per node x 1 node(s), device_target=Ascend" in out.stdout
    assert "model: swin_tiny, 224 px" in out.stdout and "amp o1_manual" in out.stdout
    assert "trains on the embedded synthetic dataset (224 px shapes" in out.stderr + out.stdout
