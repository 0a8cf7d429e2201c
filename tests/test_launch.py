"""Multi-process runs through msrun: the command, dry runs, and (slow) a real 2-process CPU training."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from swinexp.config import HardwareCfg
from swinexp.registry import ConfigError
from swinexp.runtime.launch import (
    CONFIG_ERROR_STATUS,
    exit_for_config_error,
    failure_report,
    msrun_command,
    needs_launch,
    worker_config_error,
)
from tests.conftest import ROOT, SMOKE
from tests.servers import free_port


def _run(*args: str, cwd: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "run.py"), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


def test_msrun_command_carries_world_node_master_and_the_same_run_dir(tmp_path: Path) -> None:
    hw = HardwareCfg(device_target="Ascend", num_devices=8, num_nodes=2, node_rank=1, master_addr="10.0.0.1",
                     master_port=9000)
    cmd = msrun_command(hw, Path("run.py"), ["model=swin_tiny", "hydra.run.dir=/old", "dry_run=true"], tmp_path)
    assert cmd[1:8] == ["--worker_num=16", "--local_worker_num=8", "--master_addr=10.0.0.1", "--master_port=9000",
                        "--node_rank=1", f"--log_dir={tmp_path / 'msrun' / 'node1'}", "--join=True"]
    assert cmd[8:] == ["run.py", "model=swin_tiny", f"hydra.run.dir={tmp_path}"]
    assert needs_launch(hw) and not needs_launch(HardwareCfg())
    with pytest.raises(ConfigError, match="hardware.node_rank=2 must be in 0..1"):
        msrun_command(HardwareCfg(num_devices=8, num_nodes=2, node_rank=2), Path("run.py"), [], tmp_path)


def test_failure_report_shows_the_failing_workers_traceback(tmp_path: Path) -> None:
    (tmp_path / "worker_0.log").write_text("[WARNING] noise\nall fine\n")
    (tmp_path / "worker_1.log").write_text("[WARNING] noise\nTraceback (most recent call last):\nValueError: boom\n")
    report = failure_report(tmp_path)
    assert "worker_1.log" in report and "ValueError: boom" in report
    assert "worker_0.log" not in report and "noise" not in report


def test_a_worker_ends_a_config_error_with_one_line_and_its_own_status(monkeypatch: pytest.MonkeyPatch,
                                                                     capsys: pytest.CaptureFixture) -> None:
    err = ConfigError("data.num_classes=3 is wrong\nset it to 4")
    monkeypatch.delenv("MS_ROLE", raising=False)
    assert exit_for_config_error(err).code == "ConfigError: data.num_classes=3 is wrong set it to 4"  # single run
    monkeypatch.setenv("MS_ROLE", "MS_WORKER")
    assert exit_for_config_error(err).code == CONFIG_ERROR_STATUS
    assert capsys.readouterr().err == "ConfigError: data.num_classes=3 is wrong set it to 4\n"  # into its log


def test_the_launcher_finds_a_workers_config_error_line(tmp_path: Path) -> None:
    (tmp_path / "worker_0.log").write_text("[WARNING] noise\nall fine\n")
    assert worker_config_error(tmp_path) is None
    (tmp_path / "worker_1.log").write_text("[WARNING] noise\nConfigError: data.root='x' has 4 class folders\n"
                                           "[WARNING] teardown\n")
    assert worker_config_error(tmp_path) == "data.root='x' has 4 class folders"


@pytest.mark.slow
@pytest.mark.parametrize("hardware,expected", [
    ("ascend8", ["8 worker(s) = 8 per node x 1 node(s)", "--worker_num=8 --local_worker_num=8",
                 "--master_addr=127.0.0.1 --master_port=8118 --node_rank=0", "communication=HCCL",
                 "total batch: 8 per device x 8 devices x 1 accumulation = 64"]),
    ("ascend8x2", ["16 worker(s) = 8 per node x 2 node(s)", "--worker_num=16 --local_worker_num=8",
                   "--node_rank=0", "--node_rank=1", "hardware.node_rank=1 hardware.master_addr=<node 0 address>",
                   "device_num=16"]),
])
def test_dry_run_prints_the_launch_without_hardware(hardware: str, expected: list[str], tmp_path: Path) -> None:
    smoke = [o for o in SMOKE if not o.startswith("hardware=")]
    out = _run(*smoke, f"hardware={hardware}", "dry_run=true", f"data.root={tmp_path / 'data'}",
               f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    for text in expected:
        assert text in out.stdout, text
    assert not (tmp_path / "run" / "msrun").exists()  # nothing was launched


@pytest.mark.slow
def test_cpu2_trains_two_real_workers_into_one_run(tmp_path: Path) -> None:
    from swinexp.build import resolve
    from swinexp.data import DATASETS, build_loaders
    from swinexp.data.transforms import EvalTransform
    from swinexp.engine import checkpoint
    from swinexp.engine.evaluate import evaluate
    from swinexp.registry import MODELS

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    run_dir = tmp_path / "run"
    smoke = [o for o in SMOKE if not o.startswith(("hardware=", "tracking="))]
    out = _run(*smoke, "hardware=cpu2", f"hardware.master_port={free_port()}", f"data.root={tmp_path / 'data'}",
               "trainer.limit_val_batches=null", "tracking=mlflow", f"tracking.uri={uri}",
               f"hydra.run.dir={run_dir}", cwd=tmp_path, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]

    digests = {p.name: p.read_text() for p in run_dir.glob("weights_rank*.sha256")}
    assert sorted(digests) == ["weights_rank0.sha256", "weights_rank1.sha256"]
    assert len(set(digests.values())) == 1  # data parallel kept both replicas bit-identical

    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("swinexp").experiment_id])
    assert run.data.params["hardware.num_devices"] == "2" and run.data.metrics["train/total_batch"] == 16
    logged = client.get_metric_history(run.info.run_id, "val/top1")
    assert [m.step for m in logged] == [1, 2]

    # val/top1 is over the whole val set (both shards), not rank 0's half
    from omegaconf import OmegaConf
    cfg = OmegaConf.load(run_dir / "config.yaml")
    model = MODELS.build(resolve(cfg).section("model"))
    checkpoint.load(run_dir / "checkpoints" / "last.ckpt", model)
    spec = DATASETS.build({k: v for k, v in resolve(cfg).section("data").items() if k != "augment"})
    _, val = build_loaders(spec, EvalTransform(spec.img_size, 1.0), seed=0)
    assert evaluate(model, val.epoch(0))["val/top1"] == pytest.approx(logged[-1].value, abs=1e-4)

    # repeatable: a second 2-worker run from the first epoch's checkpoint retrains epoch 2, each rank drawing its
    # stochastic-depth masks from its own key again, and ends with the same weights to the bit
    assert cfg.model.drop_path_rate > 0
    rerun = tmp_path / "rerun"
    out = _run(*smoke, "hardware=cpu2", f"hardware.master_port={free_port()}", f"data.root={tmp_path / 'data'}",
               "trainer.limit_val_batches=null", "tracking=none",
               f"trainer.resume={run_dir / 'checkpoints' / 'step-00000003.ckpt'}", f"hydra.run.dir={rerun}",
               cwd=tmp_path, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert {p.name: p.read_text() for p in rerun.glob("weights_rank*.sha256")} == digests


@pytest.mark.slow
def test_a_failing_worker_fails_the_command_and_shows_its_error(tmp_path: Path) -> None:
    smoke = [o for o in SMOKE if not o.startswith("hardware=")]
    out = _run(*smoke, "hardware=cpu2", f"hardware.master_port={free_port()}", f"data.root={tmp_path / 'data'}",
               "debug.fail_rank=1", f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path, timeout=900)
    assert out.returncode != 0
    assert "worker_1.log" in out.stderr and "debug.fail_rank=1: this worker fails on purpose" in out.stderr
    assert "MissingMandatoryValue" not in out.stderr  # SweepCallback.on_job_end in a failed single run
    leftover = subprocess.run(["pgrep", "-f", str(tmp_path / "run")], capture_output=True, text=True).stdout
    assert leftover.strip() == ""  # msrun took every worker down


def _four_class_folder(root: Path) -> Path:
    from PIL import Image

    for split in ("train", "val"):
        for c in range(4):
            (root / split / f"c{c}").mkdir(parents=True)
            for i in range(4):
                Image.new("RGB", (40, 40), (60 * c, 50 * i, 0)).save(root / split / f"c{c}" / f"{i}.jpg")
    return root


@pytest.mark.slow
def test_a_workers_config_error_reaches_the_user_as_one_line(tmp_path: Path) -> None:
    """A mistake only the data shows (the class count) fails inside the msrun workers."""
    root = _four_class_folder(tmp_path / "four")
    out = _run("model=swin_micro", "data=imagefolder", f"data.root={root}", "data.num_classes=3", "data.img_size=32",
               "data.batch_size=4", "data/augment=none", "trainer=smoke", "amp=o0", "tracking=none", "hardware=cpu2",
               f"hardware.master_port={free_port()}", f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path, timeout=900)
    assert out.returncode == 1
    line = (f"ConfigError: data.root='{root}' has 4 class folders but data.num_classes=3; set data.num_classes=4, "
            "or data.num_classes=null to count the class folders")
    assert out.stderr.strip().splitlines() == [line], out.stderr[-3000:]  # no traceback, no callback warning
    assert f"Error code: {CONFIG_ERROR_STATUS}" in (tmp_path / "run" / "msrun" / "msrun.out").read_text()


@pytest.mark.slow
def test_a_trainer_mistake_fails_before_msrun_starts(tmp_path: Path) -> None:
    smoke = [o for o in SMOKE if not o.startswith("hardware=")]
    out = _run(*smoke, "hardware=cpu2", f"hardware.master_port={free_port()}", "trainer.epochs=0",
               f"data.root={tmp_path / 'data'}", f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path, timeout=900)
    assert out.returncode == 1
    assert out.stderr.strip().splitlines()[-1].startswith("ConfigError: trainer.epochs=0 must be >= 1"), out.stderr
    assert not (tmp_path / "run" / "msrun").exists() and "launching" not in out.stdout
