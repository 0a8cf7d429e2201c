"""A bad config fails at once with a ConfigError naming the key, the value, what is allowed and the fix.

"At once" is asserted by what did not happen yet: no model weights built, no data read or generated, no tracking
store created, no checkpoint written. The CLI form prints one clean line and exits non-zero.
"""
from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import pytest
from omegaconf import DictConfig

from swinexp.build import build_experiment, resolve
from swinexp.config import HardwareCfg
from swinexp.models import swin
from swinexp.registry import DATASETS, MODELS, ConfigError
from swinexp.runtime import hardware
from swinexp.tracking import open_tracker
from tests.conftest import ROOT, SMOKE


def _refuse(what: str) -> Callable[..., Any]:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"{what} was built before the config error was raised")

    return refuse


@pytest.fixture
def no_data(monkeypatch: pytest.MonkeyPatch) -> None:
    """Reading (or generating) the data set is an error: the check ran before it."""
    monkeypatch.setattr(DATASETS, "build", _refuse("the data set"))


@pytest.fixture
def no_weights(monkeypatch: pytest.MonkeyPatch, no_data: None) -> None:
    """Allocating any model layer is an error: the model's own checks ran before its first weight."""
    monkeypatch.setattr(swin, "PatchEmbed", _refuse("the patch embedding"))
    monkeypatch.setattr(swin, "BasicLayer", _refuse("a Swin stage"))


@pytest.fixture
def no_model(monkeypatch: pytest.MonkeyPatch, no_data: None) -> None:
    """Even building the model is an error: the check ran before the model (seconds for swin_tiny)."""
    monkeypatch.setattr(MODELS, "build", _refuse("the model"))


def _has_backend(target: str) -> bool:
    try:
        hardware.check_backend(HardwareCfg(device_target=target))
    except ConfigError:
        return False
    return True


def _dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed on return: nothing listens there


def test_accumulation_steps_below_one(compose: Callable[..., DictConfig], no_model: None) -> None:
    with pytest.raises(ConfigError, match=r"trainer.accumulation_steps=0 must be >= 1 \(1 = no accumulation\)"):
        build_experiment(resolve(compose("trainer.accumulation_steps=0")))


def test_batch_size_below_one(compose: Callable[..., DictConfig], no_model: None, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"data.batch_size=0 must be >= 1 \(it is the per-device batch\)"):
        build_experiment(resolve(compose("data.batch_size=0", f"data.root={tmp_path / 'synthetic'}")))
    assert not (tmp_path / "synthetic").exists()  # the synthetic set was not generated


def test_unknown_amp_policy_lists_the_policies(compose: Callable[..., DictConfig], no_model: None) -> None:
    with pytest.raises(ConfigError, match=r"amp.name='o4' is not a registered amp. Choose one of: o0, o1, o1_manual, "
                                          r"o2, o3"):
        build_experiment(resolve(compose("amp.name=o4")))


@pytest.mark.skipif(_has_backend("GPU") or _has_backend("Ascend"), reason="this MindSpore has a bfloat16 backend")
def test_bfloat16_on_cpu_says_which_dtype_works(compose: Callable[..., DictConfig], no_model: None) -> None:
    with pytest.raises(ConfigError, match=r"amp.dtype=bfloat16: .*CPU.*use amp.dtype=float16 on CPU"):
        build_experiment(resolve(compose("amp=o2", "amp.dtype=bfloat16")))


def test_image_size_that_no_window_fits_names_the_data_key(compose: Callable[..., DictConfig],
                                                           no_weights: None) -> None:
    # swin_micro, patch 4, window 4: 48 px gives 12x12 then 6x6 maps, and 6 is neither <= 4 nor a multiple of 4
    with pytest.raises(ConfigError, match=r"model.img_size=48 does not fit patch_size=4, window_size=4 and 2 stages.*"
                                          r"Nearest valid model.img_size: 32 or 64. "
                                          r"model.img_size follows data.img_size: change that key instead"):
        build_experiment(resolve(compose("data.img_size=48")))


def test_image_size_the_windows_shrink_to_is_accepted(compose: Callable[..., DictConfig], tmp_path: Path) -> None:
    # 16 px: 4x4 then 2x2 maps, both <= the window, which shrinks to the map (official rule): no error
    plan = resolve(compose("data.img_size=16", f"data.root={tmp_path / 'synthetic'}"))
    assert build_experiment(plan).model.num_classes == 10


def test_heads_that_do_not_divide_the_stage_width(compose: Callable[..., DictConfig], no_weights: None) -> None:
    with pytest.raises(ConfigError, match=r"model.num_heads\[0\]=3 does not divide the stage-0 width "
                                          r"embed_dim\*2\*\*0=32; choose a divisor of 32"):
        build_experiment(resolve(compose("model.num_heads=[3,4]")))


@pytest.mark.parametrize("override,message", [
    ("hardware.cpu_threads=0", r"hardware.cpu_threads=0 must be >= 1, or null for one per core"),
    ("hardware.memory_optimize_level=O2", r"hardware.memory_optimize_level='O2' is not valid; choose one of: O0, O1"),
])
def test_impossible_cpu_settings(compose: Callable[..., DictConfig], no_model: None, override: str,
                                 message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        build_experiment(resolve(compose(override)))


@pytest.mark.skipif(_has_backend("GPU"), reason="this MindSpore has a GPU backend")
def test_gpu_preset_without_a_gpu_backend(compose: Callable[..., DictConfig], no_model: None) -> None:
    with pytest.raises(ConfigError, match=r"hardware.device_target='GPU' .* has no GPU backend .*hardware=cpu.*"
                                          r"dry_run=true"):
        build_experiment(resolve(compose("hardware=gpu")))


def test_unreachable_tracking_server(compose: Callable[..., DictConfig], no_model: None, tmp_path: Path) -> None:
    uri = f"http://127.0.0.1:{_dead_port()}"
    with pytest.raises(ConfigError, match=rf"cannot reach the MLflow tracking server tracking.uri='{uri}'.*"
                                          r"tracking=none, or set tracking.on_unreachable=warn"):
        plan = resolve(compose("tracking=mlflow", f"tracking.uri={uri}"))
        open_tracker(plan.section("tracking"), plan.hardware.shared_dir)  # what app.job.train opens before the model
    assert not (tmp_path / "mlflow-offline.db").exists() and not (tmp_path / "mlflow.db").exists()


# --- the CLI: one clean line, non-zero exit, nothing written -----------------------------------------------------

def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "run.py"), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300)


def _assert_one_clean_line(out: subprocess.CompletedProcess, starts: str) -> None:
    assert out.returncode != 0
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    assert out.stderr.strip().splitlines()[-1].startswith(starts), out.stderr[-3000:]


@pytest.mark.slow
@pytest.mark.skipif(_has_backend("Ascend"), reason="this MindSpore has an Ascend backend")
def test_cli_ascend_without_the_backend(tmp_path: Path) -> None:
    smoke = [o for o in SMOKE if not o.startswith("hardware=")]
    out = _run(*smoke, "hardware=ascend", f"data.root={tmp_path / 'data'}", f"hydra.run.dir={tmp_path / 'run'}",
               cwd=tmp_path)
    _assert_one_clean_line(out, "ConfigError: hardware.device_target='Ascend'")
    assert "dry_run=true" in out.stderr  # how to check the launch here instead
    assert not (tmp_path / "data").exists() and not (tmp_path / "run" / "checkpoints").exists()


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["ascend", "gpu8"])  # ascend8 and ascend8x2: tests/test_launch.py
def test_cli_dry_run_works_without_the_backend(preset: str, tmp_path: Path) -> None:
    smoke = [o for o in SMOKE if not o.startswith("hardware=")]
    out = _run(*smoke, f"hardware={preset}", "dry_run=true", f"data.root={tmp_path / 'data'}",
               f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "dry run:" in out.stdout and "mindspore context: device_target=" in out.stdout


@pytest.mark.slow
def test_cli_data_root_that_does_not_exist(tmp_path: Path) -> None:
    missing = tmp_path / "no" / "imagenet"
    out = _run("model=swin_micro", "data=imagefolder", f"data.root={missing}", "data.num_classes=2",
               "data.img_size=32", "trainer=smoke", "hardware=cpu", "tracking=none",
               f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    _assert_one_clean_line(out, f"ConfigError: data.root='{missing}' does not exist")
    assert "data=synthetic" in out.stderr.splitlines()[-1]  # the fix
    assert not (tmp_path / "run" / "checkpoints").exists()


@pytest.mark.parametrize("override,message", [("trainer.epochs=0", "trainer.epochs=0 must be >= 1"),
                                              ("amp.loss_scale=sometimes", "amp.loss_scale"),
                                              ("data.batch_size=0", "data.batch_size")])
def test_a_multi_worker_run_checks_its_config_before_msrun_starts(compose: Callable[..., DictConfig],
                                                                   tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   override: str, message: str) -> None:
    from swinexp.app.job import run
    from swinexp.app.job_info import JobInfo
    from swinexp.runtime import launch

    monkeypatch.setattr(launch, "launch", _refuse("an msrun launch"))
    cfg = compose("hardware=cpu2", "amp=o2" if override.startswith("amp") else "amp=o0", override)
    with pytest.raises(ConfigError, match=message):
        run(cfg, JobInfo(tmp_path / "run"))
    assert not (tmp_path / "run").exists()  # no msrun log dir, no checkpoint, nothing
