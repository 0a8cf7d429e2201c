"""swinexp as a user installs it: a wheel installed outside the checkout, plus a plugin package from README.

One wheel of the checkout and one of the README's plugin (`swinexp_nano`, entry-point group `swinexp.plugins`) are
built offline (`pip wheel --no-build-isolation`) and installed with `--no-deps` into a temporary target; every
command runs with only that target on PYTHONPATH, from a directory outside the checkout.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose as compose_cfg
from hydra import initialize_config_dir
from mlflow.tracking import MlflowClient

from swinexp import create_model
from swinexp.build import build_model, resolve
from swinexp.registry import ConfigError
from tests.conftest import CONF_DIR, ROOT, SMOKE

SOURCES = ("swinexp", "hydra_plugins", "conf", "sweeps", "pyproject.toml", "setup.py", "README.md")
MINDSPORE_IMPORTED = re.compile(r"\|\s+mindspore$", re.MULTILINE)  # a `-X importtime` line of the mindspore package


def _readme_block(lang: str, first_line: str) -> str:
    """The README's fenced `lang` block that starts with `first_line` (the plugin example is tested as written)."""
    blocks = re.findall(rf"```{lang}\n(.*?)```", (ROOT / "README.md").read_text(), re.DOTALL)
    (block,) = [b for b in blocks if b.startswith(first_line)]
    return block


def _pip(*args: str, cwd: Path) -> str:
    out = subprocess.run([sys.executable, "-m", "pip", *args], check=False, cwd=cwd, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    return out.stdout + out.stderr


def _plugin_source(root: Path) -> Path:
    """The README's `swinexp_nano` as a package of its own, its entry point declared in its pyproject.toml."""
    module = _readme_block("python", "# swinexp_nano.py")
    entry = re.search(r'\[project.entry-points."swinexp.plugins"\]\n#\s+(\w+ = "\w+")', module)
    assert entry, "the README example declares its entry point"
    root.mkdir()
    (root / "swinexp_nano.py").write_text(module)
    (root / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools>=64"]\nbuild-backend = "setuptools.build_meta"\n\n'
        '[project]\nname = "swinexp-nano"\nversion = "0.1"\n\n'
        f'[project.entry-points."swinexp.plugins"]\n{entry.group(1)}\n\n'
        '[tool.setuptools]\npy-modules = ["swinexp_nano"]\n'
    )
    return root


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """{"site": the --target folder holding swinexp and the plugin, "conf": a user config dir, "cwd": outside}."""
    root = tmp_path_factory.mktemp("wheel")
    src = root / "src"  # a copy: the build's build/ and *.egg-info stay out of the checkout
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(ROOT / name, src / name)
    plugin = _plugin_source(root / "plugin")
    built = _pip("wheel", "--no-deps", "--no-build-isolation", "-w", str(root / "dist"), str(src), str(plugin),
                 cwd=root)
    # what a user's `pip install` prints: setuptools warns once per conf/ folder that setup.py does not list
    assert "is absent from the `packages` configuration" not in built, built[-3000:]
    wheels = sorted((root / "dist").glob("*.whl"))
    assert [w.name.split("-")[0] for w in wheels] == ["swinexp", "swinexp_nano"]
    _pip("install", "--no-deps", "--no-compile", "-q", "--target", str(root / "site"), *map(str, wheels), cwd=root)
    conf = root / "myconf" / "model"
    conf.mkdir(parents=True)
    yaml = _readme_block("yaml", "# myconf/model/swin_nano.yaml")
    (conf / "swin_nano.yaml").write_text(yaml)
    (root / "user" / "user_pico.py").parent.mkdir()
    (root / "user" / "user_pico.py").write_text(  # registered only by `imports: [user_pico]`, no entry point
        "from swinexp.models import SwinTransformer\nfrom swinexp.registry import MODELS\n\n"
        "@MODELS.register('swin_pico')\ndef swin_pico(pretrained=None, **overrides):\n"
        "    return SwinTransformer(**overrides)\n")
    (root / "cwd").mkdir()
    return {"site": root / "site", "conf": root / "myconf", "user": root / "user", "cwd": root / "cwd"}


def _run(installed: dict[str, Path], *args: str, importtime: bool = False) -> subprocess.CompletedProcess:
    """`args` (a console script under site/bin, or python arguments) with only the installed target importable."""
    env = {**os.environ, "PYTHONPATH": f"{installed['site']}{os.pathsep}{installed['user']}"}
    env.pop("MLFLOW_TRACKING_URI", None)
    script = installed["site"] / "bin" / args[0]
    command = [str(script), *args[1:]] if script.is_file() else [sys.executable, *(["-X", "importtime"] if
                                                                                  importtime else []), *args]
    out = subprocess.run(command, check=False, cwd=installed["cwd"], env=env, capture_output=True, text=True,
                         timeout=900)
    assert out.returncode == 0, out.stderr[-4000:]
    return out


def test_imports_key_that_cannot_be_imported_names_the_key_and_the_fix() -> None:
    with initialize_config_dir(version_base="1.3", config_dir=str(CONF_DIR)):
        cfg = compose_cfg("config", overrides=[*SMOKE, "imports=[no_such_module_xyz]"])
    with pytest.raises(ConfigError, match=r"imports: cannot import 'no_such_module_xyz'.*install the package"):
        build_model(resolve(cfg))


@pytest.mark.slow
def test_wheel_carries_conf_and_runs_from_outside_the_checkout(installed: dict[str, Path]) -> None:
    where = _run(installed, "-c", "import json, swinexp, swinexp.config as c; "
                                  "print(json.dumps([swinexp.__file__, str(c.CONF_DIR)]))")
    package, conf = json.loads(where.stdout)
    site = installed["site"].resolve()
    assert Path(package) == site / "swinexp" / "__init__.py"
    assert Path(conf) == site / "swinexp" / "_conf"
    packaged = {p.relative_to(conf).as_posix() for p in Path(conf).rglob("*.yaml")}
    assert packaged == {p.relative_to(CONF_DIR).as_posix() for p in CONF_DIR.rglob("*.yaml")}

    job = _run(installed, "swinexp", "--cfg", "job", "model=swin_tiny", "sweep=seeds")  # the console script
    assert "name: swin_tiny" in job.stdout and "depths:\n  - 2\n  - 2\n  - 6\n  - 2" in job.stdout
    sweeps = {p.name for p in (site / "swinexp" / "_sweeps").glob("*.yaml")}
    assert sweeps == {p.name for p in (ROOT / "sweeps").glob("*.yaml")}  # the top-level sweeps/, no copy in conf/
    swept = _run(installed, "swinexp", "--cfg", "hydra", "sweep=amp_ablation")
    assert "amp: o0,o2,o1_manual" in swept.stdout

    helped = _run(installed, "-m", "swinexp", "-cd", str(installed["conf"]), "--help").stdout
    models = dict(line.split(": ", 1) for line in helped.splitlines() if ": " in line).get("model", "")
    assert "swin_micro" in models.split(", ") and "swin_nano" in models.split(", ")  # the user's -cd adds options


@pytest.mark.slow
def test_wheel_create_model_imports_key_and_weights_cli(installed: dict[str, Path]) -> None:
    code = ("import json, mindspore as ms, swinexp\n"
            "from hydra import compose, initialize_config_dir\nfrom swinexp.build import build_model, resolve\n"
            "from swinexp.config import CONF_DIR\n"
            "micro = swinexp.create_model('swin_micro', num_classes=10)\n"
            "nano = swinexp.create_model('swin_nano', num_classes=10)\n"  # the plugin's model, its builder defaults
            "ms.save_checkpoint(micro, 'micro.ckpt')\n"
            "before = 'swin_pico' in swinexp.MODELS\n"
            "with initialize_config_dir(version_base='1.3', config_dir=str(CONF_DIR)):\n"
            "    cfg = compose('config', ['imports=[user_pico]', 'model.name=swin_pico'])\n"
            "pico = build_model(resolve(cfg))\n"
            "fused = [c.fused is not None for _, c in pico.cells_and_names() if type(c).__name__ == 'ExactGELU']\n"
            "count = lambda m: sum(p.size for p in m.trainable_params())\n"
            "print(json.dumps([count(micro), count(nano), type(nano).__module__, before, count(pico), fused]))")
    micro, nano, module, pico_before, pico, fused = json.loads(_run(installed, "-c", code).stdout.splitlines()[-1])
    assert fused and all(fused)  # the CPU formulation's C++ GELU, compiled from the wheel's fused_cpu.cc
    assert micro == sum(p.size for p in create_model("swin_micro", num_classes=10).trainable_params())
    assert 0 < nano < micro and module == "swinexp.models.swin"
    assert not pico_before and pico == micro  # registered by `imports:`, built from conf/model/swin_micro.yaml keys

    exported = _run(installed, "-m", "swinexp.models.weights", "export", "micro.ckpt", "micro.safetensors",
                    "--model", "swin_micro").stdout
    assert "micro.ckpt" in exported and "micro.safetensors" in exported
    back = _run(installed, "-m", "swinexp.models.weights", "import", "micro.safetensors", "back.ckpt",
                "--model", "swin_micro")
    assert "(timm layout): read 63 tensors -> back.ckpt" in back.stdout and (installed["cwd"] / "back.ckpt").is_file()


@pytest.mark.slow
def test_wheel_sweep_of_a_plugin_model_then_report(installed: dict[str, Path]) -> None:
    """`python -m swinexp -m` re-runs itself per job (isolated launcher), with the sweep's -cd; one small job."""
    uri = f"sqlite:///{installed['cwd']}/mlflow.db"
    smoke = [o for o in SMOKE if not o.startswith(("tracking=", "model="))]
    _run(installed, "-m", "swinexp", "-m", "-cd", str(installed["conf"]), "model=swin_nano", *smoke,
         "trainer.epochs=1", "scheduler=constant", "hardware.mode=pynative", f"data.root={installed['cwd'] / 'data'}",
         "tracking=mlflow", f"tracking.uri={uri}", "tracking.experiment=wheel",
         f"hydra.sweep.dir={installed['cwd'] / 'multirun'}")
    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("wheel").experiment_id])
    (child,) = [r for r in runs if r.data.tags.get("sweep.role") != "parent"]
    assert child.data.tags["choice.model"] == "swin_nano" and child.info.status == "FINISHED"
    assert child.data.params["model.name"] == "swin_nano" and "val/top1" in child.data.metrics
    assert (installed["cwd"] / "multirun" / "0" / "run.log").is_file()  # hydra.job.name is run, whatever the entry

    report = _run(installed, "-m", "swinexp.tracking.report", "--tracking-uri", uri, "--experiment", "wheel",
                  "--epoch", "1",
                  importtime=True)
    assert f"| {child.info.run_name} |" in report.stdout and "written to" in report.stdout
    assert not MINDSPORE_IMPORTED.search(report.stderr), "the report imported MindSpore"


@pytest.mark.slow
def test_msrun_workers_compose_with_the_user_config_dir(tmp_path: Path) -> None:
    user = tmp_path / "myconf" / "model"
    user.mkdir(parents=True)
    (user / "swin_mine.yaml").write_text("defaults:\n  - swin_micro\n  - _self_\n")
    smoke = [o for o in SMOKE if not o.startswith(("model=", "hardware="))]
    out = subprocess.run([sys.executable, "-m", "swinexp", "-cd", str(tmp_path / "myconf"), "model=swin_mine",
                          *smoke, "hardware=cpu2", "dry_run=true", f"data.root={tmp_path / 'data'}"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    (msrun,) = [line for line in out.stdout.splitlines() if line.strip().startswith("starts:")]
    assert f"__main__.py --config-dir={tmp_path / 'myconf'} model=swin_mine" in msrun
