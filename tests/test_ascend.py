"""The Ascend 910 path, on CPU: overflow seen on a saturating device (simulated), the operator precision mode each amp
policy pins, and every hardware x amp x experiment preset checked before launch (no host sync between read points:
tests/test_host_sync.py)."""
from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Callable

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn
from omegaconf import DictConfig

from swinexp.amp import AmpPolicy, overflow, precision
from swinexp.amp.overflow import FiniteCheck, SaturatingDevice
from swinexp.amp.precision import Precision
from swinexp.app.job import run
from swinexp.app.job_info import JobInfo
from swinexp.build import build_amp, resolve
from swinexp.config import HardwareCfg
from swinexp.engine.step import TrainStep, make_train_step, read_all
from swinexp.registry import AMP_POLICIES, ConfigError
from swinexp.runtime import hardware, simulated_ascend
from swinexp.runtime.chips import CHIPS, Chip
from tests.conftest import CONF_DIR
from tests.test_cluster_launch import _table
from tests.test_recipes import _folder


def _fp16_step(check: FiniteCheck, init_scale: float, accumulation: int = 1) -> tuple[nn.Cell, TrainStep]:
    ms.set_seed(0)
    net = nn.SequentialCell(nn.Dense(8, 16), nn.ReLU(), nn.Dense(16, 4))
    policy = AmpPolicy("O3", ms.float16, loss_scale="dynamic", init_scale=init_scale)
    net = policy.apply(net)
    return net, make_train_step(net, nn.SGD(net.trainable_params(), 0.1), policy, None, True, accumulation,
                                overflow_check=check)


def _batch() -> tuple[Tensor, Tensor]:
    rng = np.random.default_rng(0)
    return (Tensor(rng.standard_normal((8, 8)).astype(np.float32)),
            Tensor(np.eye(4, dtype=np.float32)[np.arange(8) % 4]))


def _weights(net: nn.Cell) -> list[np.ndarray]:
    return [p.asnumpy().copy() for p in net.trainable_params()]


@pytest.mark.parametrize("accumulation", [1, 2])
def test_a_saturating_device_hides_overflow_from_the_isfinite_check(accumulation: int) -> None:
    """The defect on a 910: at a scale of 2^40 the fp16 backward overflows, the device saturates it to finite
    values, and a step deciding by isfinite neither skips nor lowers the scale."""
    _, step = _fp16_step(SaturatingDevice(read_register=False), 2.0**40, accumulation)
    outputs = [step(*_batch()) for _ in range(2 * accumulation)]
    read_all(outputs)
    updates = [o for o in outputs if o.updated]
    assert all(np.isfinite(o.grad_norm) and not o.overflow for o in updates)
    assert [o.loss_scale for o in updates] == [2.0**40, 2.0**40]


@pytest.mark.parametrize("accumulation", [1, 2])
def test_the_status_register_skips_the_saturated_step_and_halves_the_scale(accumulation: int) -> None:
    net, step = _fp16_step(SaturatingDevice(), 2.0**40, accumulation)
    before = _weights(net)
    outputs = [step(*_batch()) for _ in range(2 * accumulation)]
    read_all(outputs)
    updates = [o for o in outputs if o.updated]
    assert all(o.overflow and np.isfinite(o.grad_norm) for o in updates)  # finite norm, still seen
    assert [o.loss_scale for o in updates] == [2.0**40, 2.0**39]
    assert all(np.array_equal(a, b) for a, b in zip(before, _weights(net)))  # no update from saturated gradients
    assert step.optimizer_step == 2  # the LR schedule still advances per skipped step


@pytest.mark.parametrize("check", [FiniteCheck, SaturatingDevice])
def test_a_clean_fp16_step_is_not_skipped(check: type[FiniteCheck]) -> None:
    net, step = _fp16_step(check(), 2.0**4)
    before = _weights(net)
    out = step(*_batch())
    assert not out.overflow and out.loss_scale == 16.0 and np.isfinite(out.loss)
    assert not all(np.array_equal(a, b) for a, b in zip(before, _weights(net)))


@pytest.mark.parametrize("check,device,chip,env,expected", [
    ("auto", "CPU", None, {}, "isfinite"),
    ("auto", "GPU", None, {}, "isfinite"),
    ("auto", "Ascend", "ascend910", {}, "status_register"),
    ("auto", "Ascend", "ascend910b", {}, "isfinite"),
    ("auto", "Ascend", "ascend910b", {overflow.SATURATION_ENV: "SATURATION_MODE"}, "status_register"),
    ("isfinite", "Ascend", "ascend910", {}, "isfinite"),
    ("status_register", "Ascend", "ascend910b", {}, "status_register"),
])
def test_auto_overflow_check_follows_the_card(check: str, device: str, chip: str | None, env: dict[str, str],
                                              expected: str) -> None:
    assert overflow.resolve(check, device, chip, env) == expected
    assert isinstance(overflow.make(expected), overflow.StatusRegister) == (expected == "status_register")


@pytest.mark.parametrize("hw,match", [
    (HardwareCfg(overflow_check="status_register"), r"status_register reads an Ascend card.*CPU has none"),
    (HardwareCfg(overflow_check="isnan"), r"overflow_check='isnan' is not valid; choose one of: auto"),
    (HardwareCfg(chip="ascend910"), r"hardware.chip=ascend910 names an Ascend card.*CPU"),
    (HardwareCfg(device_target="Ascend", chip="ascend310"), r"chip='ascend310' is not a known Ascend card"),
])
def test_impossible_overflow_and_chip_settings_are_config_errors(hw: HardwareCfg, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        hardware.validate(hw)


def test_a_card_other_than_the_configured_one_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"hardware.chip=ascend910 but this machine's card is ascend910b.*"
                                          r"hardware.chip=ascend910b"):
        hardware.check_chip("ascend910", "ascend910b")
    hardware.check_chip(None, "ascend910b")


@pytest.mark.parametrize("amp", sorted(p.stem for p in (CONF_DIR / "amp").glob("*.yaml")))
def test_every_policy_leaves_the_precision_mode_to_the_chip(compose: Callable[..., DictConfig], amp: str) -> None:
    cfg = compose(f"amp={amp}")
    assert cfg.amp.ascend_precision_mode == "auto"  # so it is an MLflow param of every run
    assert build_amp(resolve(cfg)).ascend_precision_mode == "auto"


def test_o0_refuses_a_mode_that_is_not_fp32_on_any_chip() -> None:
    with pytest.raises(ConfigError, match=r"amp=o0 is the fp32 reference.*force_fp32 is not an fp32 mode.*HF32"):
        precision.resolve(AMP_POLICIES.build({"name": "o0", "ascend_precision_mode": "force_fp32"}), None)
    with pytest.raises(ConfigError, match=r"amp=o0 is the fp32 reference.*force_fp16.*auto"):
        precision.resolve(AMP_POLICIES.build({"name": "o0", "ascend_precision_mode": "force_fp16"}), CHIPS["cpu"])
    with pytest.raises(ConfigError, match=r"'must_keep_origin' is not an Ascend precision mode.*Did you mean"):
        AMP_POLICIES.build({"name": "o2", "ascend_precision_mode": "must_keep_origin"})
    mixed = precision.resolve(AMP_POLICIES.build({"name": "o2", "ascend_precision_mode": "allow_mix_precision"}),
                              CHIPS["ascend910b"])  # an fp16 policy may ask for CANN's own mixing, as an ablation
    assert mixed.precision_mode == "allow_mix_precision" and "allow_mix_precision" in mixed.effective


OVERRIDES = ("amp=o2", "amp.ascend_precision_mode=allow_mix_precision", "trainer.deterministic=true")


@pytest.fixture
def device_setups(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, bool, str]]:
    """What each hardware.apply call was given: (devices, deterministic, Ascend precision mode on a 910B)."""
    seen: list[tuple[int, bool, str]] = []

    def apply(hw: HardwareCfg, seed: int, deterministic: bool = False,
              precision: Callable[[Chip | None], Precision] | None = None) -> HardwareCfg:
        mode = precision(CHIPS["ascend910b"]).precision_mode if precision else "?"  # the policy's, on a 910B
        seen.append((hw.num_devices, deterministic, mode))
        return hw

    monkeypatch.setattr(hardware, "apply", apply)
    return seen


def test_serving_a_run_sets_its_precision_mode(compose: Callable[..., DictConfig], tmp_path: Path,
                                               device_setups: list[tuple[int, bool, str]]) -> None:
    """evaluate/export/predict configure the device as the run did: a lowering mode the run asked for (or
    keep-origin for o0) — not the default, which would serve other numbers on a card."""
    from swinexp.serve.saved_run import SavedRun, setup

    setup(SavedRun(resolve(compose(*OVERRIDES)), tmp_path / "last.ckpt", None))
    assert device_setups == [(1, True, "allow_mix_precision")]


def test_checking_a_run_sets_its_precision_mode(monkeypatch: pytest.MonkeyPatch,
                                                device_setups: list[tuple[int, bool, str]]) -> None:
    """Parity configures the device as the run did (it imports torch and timm before anything else)."""
    pytest.importorskip("torch", reason="the reference extra (torch + timm) is not installed")
    pytest.importorskip("timm", reason="the reference extra (torch + timm) is not installed")
    from swinexp.parity import __main__ as parity_cli

    monkeypatch.setattr(parity_cli, "open_tracker", lambda *a: (_ for _ in ()).throw(ConfigError("stop here")))
    with pytest.raises(SystemExit):
        parity_cli.main(["--steps", "1", *OVERRIDES, "tracking=none"])
    assert device_setups == [(1, True, "allow_mix_precision")]


@pytest.fixture
def simulated_910b(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(simulated_ascend.SIMULATE_ENV, "ascend910b")


def test_the_precision_is_set_read_back_and_a_second_value_is_refused(simulated_910b: None) -> None:
    op = simulated_ascend.OpPrecision()  # MindSpore's op_precision as the card has it: settable once per process
    keep = precision.resolve(AmpPolicy("O0"), CHIPS["ascend910b"])
    hardware.set_precision(keep, "Ascend", op)
    assert hardware.read_precision(op) == {"precision_mode": "must_keep_origin_dtype", "matmul_allow_hf32": False,
                                           "conv_allow_hf32": False}
    with pytest.raises(ConfigError, match=r"already set in this process.*start a fresh process"):
        hardware.set_precision(precision.resolve(AmpPolicy("O2", ms.float16, ascend_precision_mode="force_fp16"),
                                                 CHIPS["ascend910b"]), "Ascend", op)


def test_a_precision_setting_that_did_not_take_effect_stops_the_run(simulated_910b: None) -> None:
    class Ignoring(simulated_ascend.OpPrecision):  # a MindSpore/CANN pair that accepts a setting and drops it
        def conv_allow_hf32(self, value: bool) -> None:
            pass

    with pytest.raises(ConfigError, match=r"did not take the values set: conv_allow_hf32 is True, not False"):
        hardware.set_precision(precision.resolve(AmpPolicy("O0"), CHIPS["ascend910b"]), "Ascend", Ignoring())


def _dry_run(cfg: DictConfig, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    cfg.dry_run = True
    run(cfg, JobInfo(run_dir=tmp_path / "run"))
    return capsys.readouterr().out


def test_the_dry_run_states_overflow_check_and_precision_mode(compose: Callable[..., DictConfig], tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str],
                                                              caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="swinexp"):
        report = _dry_run(compose("hardware=ascend8", "amp=o1_manual", "hardware.chip=ascend910"), tmp_path, capsys)
    assert "overflow_check=status_register (ascend910 saturates fp16 overflow" in report
    assert "ascend_precision_mode=allow_fp32_to_fp16," in report and "chip=ascend910 (Atlas training series" in report
    assert "amp_effective=o1_manual (fp32 Cube inputs: fp16 on ascend910)" in report
    assert "precision note: Conv2d, Conv1d left amp.fp32_cells: ascend910 has no fp32 Cube unit" in report
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("embedded synthetic dataset" in w and "experiment=swin_tiny_in1k" in w for w in warnings)
    report = _dry_run(compose("hardware=ascend8", "amp=o0", "hardware.chip=ascend910b"), tmp_path, capsys)
    assert "overflow_check=isfinite" in report and "amp_effective=o0," in report
    assert "ascend_precision_mode=must_keep_origin_dtype, HF32 off for MatMul and Conv" in report
    report = _dry_run(compose("hardware=ascend8", "amp=o0"), tmp_path, capsys)  # no card here, none simulated
    assert "chip=read from the card at start" in report and "ascend910 allow_fp32_to_fp16" in report
    report = _dry_run(compose("hardware=cpu"), tmp_path, capsys)
    assert "overflow_check=isfinite" in report and "ascend_precision_mode" not in report


HARDWARE = sorted(p.stem for p in (CONF_DIR / "hardware").glob("*.yaml"))
AMPS = sorted(p.stem for p in (CONF_DIR / "amp").glob("*.yaml"))
EXPERIMENTS = [None, *sorted(p.stem for p in (CONF_DIR / "experiment").glob("*.yaml"))]


@pytest.mark.parametrize("hw", HARDWARE)
@pytest.mark.parametrize("card", ["ascend910", "ascend910b"])
def test_every_preset_combination_is_checked_before_launch(compose: Callable[..., DictConfig], tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str],
                                                           monkeypatch: pytest.MonkeyPatch, hw: str, card: str) -> None:
    """Every amp policy and experiment preset on this hardware preset gives its dry-run report in the launching
    process, on a (simulated) card of each chip; the combinations that cannot run fail there with one line."""
    monkeypatch.setenv("RANK_TABLE_FILE", _table(tmp_path / "hccl.json", ["127.0.0.1"], devices=8))  # *_ranktable
    monkeypatch.setenv(simulated_ascend.SIMULATE_ENV, card)
    imagenet = _folder(tmp_path / "imagenet")
    shutil.copytree(imagenet / "val", imagenet / "test")  # cifar10_micro reads <root>/{train,test}
    for amp in AMPS:
        for experiment in EXPERIMENTS:
            preset = [f"experiment={experiment}", f"data.root={imagenet}", "data.num_classes=2"] if experiment else []
            report = _dry_run(compose(f"hardware={hw}", f"amp={amp}", *preset, smoke=experiment is None),
                              tmp_path, capsys)
            assert report.startswith("dry run:") and "mindspore context:" in report, (hw, amp, experiment)
            if "device_target=Ascend" in report:  # the card was read before anything was resolved
                assert f"chip={card} (" in report and "read from the card" not in report, (hw, amp, experiment)
    impossible = {"amp.dtype=bfloat16": "bfloat16", "hardware.overflow_check=status_register": "status_register",
                  "amp.ascend_precision_mode=force_fp16": "force_fp16"}
    for override, named in impossible.items():
        on_this = compose(f"hardware={hw}", "amp=o0" if "precision" in override else "amp=o2", override)
        device = on_this.hardware.device_target
        cannot = (override.startswith("amp.dtype") and (device == "CPU" or device == "Ascend" and card == "ascend910")
                  or override.startswith("hardware.overflow") and device != "Ascend"
                  or override.startswith("amp.ascend"))
        if not cannot:
            continue
        with pytest.raises(ConfigError, match=named) as err:
            _dry_run(on_this, tmp_path, capsys)
        assert "\n" not in str(err.value)


def test_the_self_check_passes_here_and_fails_when_overflow_goes_unseen(monkeypatch: pytest.MonkeyPatch,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    from swinexp.app import selfcheck

    assert selfcheck.main(["--simulate-saturation", "amp=o1_manual"]) == 0
    out = capsys.readouterr().out
    assert out.count("PASS") == 5 and "status_register on a simulated saturating device" in out
    # a card whose step would read isfinite only (the defect): the self-check must say FAIL and exit 1
    monkeypatch.setattr(overflow, "SaturatingDevice", lambda: SaturatingDevice(read_register=False))
    assert selfcheck.main(["--simulate-saturation"]) == 1
    out = capsys.readouterr().out
    assert "FAIL  fp16 overflow is seen" in out and "1 of 5 checks failed (fp16 overflow is seen)" in out
