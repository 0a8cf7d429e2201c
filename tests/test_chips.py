"""The per-chip capability model, on CPU: a simulated Ascend card that behaves as CANN documents each chip
(runtime/simulated_ascend.py), every amp policy resolved to what the chip can run, the card read before anything is
resolved, the divergence guard of a saturating card, the self-check's FAIL lines, and the
per-chip table of docs/ascend.md."""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Callable

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, ops
from omegaconf import DictConfig

from swinexp.amp import AmpPolicy, overflow, precision
from swinexp.build import build_experiment, build_precision, configure_device, resolve
from swinexp.engine import loop
from swinexp.engine.step import StepOutput, read_all, train_step_for
from swinexp.registry import AMP_POLICIES, ConfigError
from swinexp.runtime import chips, devices, simulated_ascend
from swinexp.runtime.chips import CHIPS
from tests.conftest import CONF_DIR, ROOT

AMPS = sorted(p.stem for p in (CONF_DIR / "amp").glob("*.yaml"))
ON_THE_CARD = ["hardware=ascend", "hardware.mode=pynative"]  # the Ascend preset: its formulation and optimizer


@pytest.fixture
def card(monkeypatch: pytest.MonkeyPatch) -> Callable[[str], None]:
    """card(name): this process is a simulated Ascend card of that chip, with fresh operator precision settings."""

    def simulate(name: str) -> None:
        monkeypatch.setenv(simulated_ascend.SIMULATE_ENV, name)
        monkeypatch.setattr(simulated_ascend, "OP_PRECISION", simulated_ascend.OpPrecision())
        simulated_ascend.install(CHIPS[name])
        simulated_ascend.CUBE_CALLS.clear()

    yield simulate
    ms.set_context(mode=ms.GRAPH_MODE)


def _fp32_matmul() -> float:
    a = Tensor(np.full((4, 4), 1 + 2.0**-11, np.float32))
    return float(ops.MatMul()(a, Tensor(np.eye(4, dtype=np.float32))).asnumpy()[0, 0])


def test_the_simulated_910_raises_on_an_fp32_matmul_kept_fp32_and_lowers_it_otherwise(card) -> None:
    """CANN aclnnMatmul: KEEP_DTYPE with FLOAT inputs raises on the Atlas training series; ALLOW_FP32_DOWN_PRECISION
    computes fp16 inputs there. The 910B keeps fp32 under KEEP_DTYPE and lowers force_fp32's convolutions to HF32."""
    ms.set_context(mode=ms.PYNATIVE_MODE)
    card("ascend910")
    simulated_ascend.OP_PRECISION.precision_mode("must_keep_origin_dtype")
    with pytest.raises(RuntimeError, match=r"simulated ascend910: MatMul with FLOAT inputs and cubeMathType=KEEP"):
        _fp32_matmul()
    card("ascend910")
    simulated_ascend.OP_PRECISION.precision_mode("allow_fp32_to_fp16")
    assert _fp32_matmul() == 1.0  # 1 + 2^-11 has no fp16 form
    card("ascend910b")
    simulated_ascend.OP_PRECISION.precision_mode("must_keep_origin_dtype")
    assert _fp32_matmul() == np.float32(1 + 2.0**-11)
    card("ascend910b")
    simulated_ascend.OP_PRECISION.precision_mode("force_fp32")  # op_api_util.cc: not in kCubeMathType
    assert simulated_ascend.cube_math_type(CHIPS["ascend910b"], "Conv2D") == "FORCE_HF32"
    assert simulated_ascend.cube_math_type(CHIPS["ascend910b"], "MatMul") == "KEEP_DTYPE"
    assert simulated_ascend.cube_math_type(CHIPS["ascend910"], "MatMul") == "FORCE_FP16"


@pytest.mark.parametrize("chip", ["ascend910", "ascend910b", "gpu", "cpu"])
@pytest.mark.parametrize("amp", AMPS)
def test_every_policy_resolves_to_what_the_chip_can_run(amp: str, chip: str) -> None:
    resolved = precision.resolve(AMP_POLICIES.build({"name": amp}), CHIPS[chip])
    if chip == "ascend910":
        assert resolved.precision_mode == "allow_fp32_to_fp16" and resolved.matmul_hf32 is None
        assert resolved.effective == (f"{amp} (fp32 except Cube inputs: fp16 on ascend910)" if amp == "o0"
                                      else f"{amp} (fp32 Cube inputs: fp16 on ascend910)")
        assert not any(issubclass(t, precision.CUBE_CELLS) for t in resolved.policy.fp32_cells)
    elif chip == "ascend910b":
        assert (resolved.precision_mode, resolved.matmul_hf32, resolved.conv_hf32) == ("must_keep_origin_dtype",
                                                                                        False, False)
        assert resolved.effective == amp
    else:
        assert resolved.precision_mode is None and resolved.effective == amp
        assert resolved.conv_hf32 is (False if chip == "gpu" else None)  # MindSpore's GPU Conv defaults to TF32


def test_o1_manual_keeps_its_convolutions_fp32_only_where_the_chip_can() -> None:
    policy = AMP_POLICIES.build({"name": "o1_manual"})
    assert {t.__name__ for t in precision.resolve(policy, CHIPS["ascend910b"]).policy.fp32_cells} >= {"Conv2d"}
    on_910 = precision.resolve(policy, CHIPS["ascend910"])
    assert {t.__name__ for t in on_910.policy.fp32_cells} == {"GELU", "Softmax", "BatchNorm2d", "LayerNorm"}
    assert any("Conv2d, Conv1d left amp.fp32_cells" in note for note in on_910.notes)


def test_an_explicit_keep_dtype_mode_is_refused_before_launch_on_a_910(compose: Callable[..., DictConfig]) -> None:
    cfg = compose("hardware=ascend", "hardware.chip=ascend910", "amp=o2",
                  "amp.ascend_precision_mode=must_keep_origin_dtype")
    with pytest.raises(ConfigError, match=r"must_keep_origin_dtype asks ascend910 to compute fp32.*aclnnMatmul"):
        resolve(cfg, backend=False)


@pytest.mark.parametrize("chip", ["ascend910", "ascend910b"])
@pytest.mark.parametrize("amp", AMPS)
def test_every_policy_runs_on_the_simulated_card(compose: Callable[..., DictConfig], card, amp: str,
                                                  chip: str) -> None:
    """hardware.chip=null read from the card, the AMP report's fp32 reference pass and two steps of the loop's own
    train step, every Cube op through the simulated Cube unit. Pinning must_keep_origin_dtype on every policy (the
    defect) fails here on the 910 in the AMP report's reference pass."""
    card(chip)
    plan = resolve(compose(*ON_THE_CARD, f"amp={amp}", "trainer.limit_train_batches=2"))
    assert plan.hardware.chip == chip  # read from the card in resolve, before the precision and overflow check
    plan = configure_device(plan)
    exp = build_experiment(plan, amp_report=True)
    assert exp.amp_effective == build_precision(plan).effective
    assert exp.overflow_check == ("status_register" if chip == "ascend910" else "isfinite")
    step = train_step_for(exp, jit=False)
    outputs = [step(images, targets) for images, targets in list(exp.train_loader.epoch(0))[:2]]
    read_all(outputs)
    assert all(np.isfinite(o.loss) for o in outputs)
    assert isinstance(step.overflow_check, overflow.SaturatingDevice) == (chip == "ascend910")
    expected = "ALLOW_FP32_DOWN_PRECISION" if chip == "ascend910" else "KEEP_DTYPE"
    assert {math for _, math in simulated_ascend.CUBE_CALLS} == {expected}  # fp32 Cube ops ran, as the chip says
    assert f"amp policy {exp.amp_effective}" in exp.amp_report["amp_dtypes.txt"]


def test_a_card_other_than_the_configured_chip_is_one_line_before_launch(compose: Callable[..., DictConfig],
                                                                         card) -> None:
    card("ascend910b")
    with pytest.raises(ConfigError, match=r"^hardware.chip=ascend910 but this machine's card is ascend910b.*"
                                          r"hardware.chip=ascend910b") as err:
        resolve(compose(*ON_THE_CARD, "hardware.chip=ascend910"))
    assert "\n" not in str(err.value)


def test_bfloat16_is_refused_on_a_detected_910(compose: Callable[..., DictConfig], card) -> None:
    card("ascend910")  # hardware.chip=null: the card's chip decides
    with pytest.raises(ConfigError, match=r"bfloat16 but hardware.chip=ascend910.*no bfloat16 kernels"):
        resolve(compose(*ON_THE_CARD, "amp=o2", "amp.dtype=bfloat16"))


def test_the_simulated_card_asks_for_eager_mode(compose: Callable[..., DictConfig], card) -> None:
    card("ascend910")
    with pytest.raises(ConfigError, match=r"hardware.mode=graph compiles them.*hardware.mode=pynative"):
        resolve(compose("hardware=ascend"))


class OverflowingStep:
    """A stand-in device step behind the real loop (a `TrainStepLike`, checked in tests/test_step_protocol.py):
    every micro-batch overflows at the smallest loss scale, with a finite loss, as a diverged fp16 run looks on a
    card that saturates."""

    def __init__(self, optimizer) -> None:  # noqa: ANN001
        self.global_step, self._steps = optimizer.global_step, 0
        self.overflow_check = overflow.SaturatingDevice()

    @property
    def optimizer_step(self) -> int:
        return self._steps

    def next_compile(self) -> str | None:
        return None

    def __call__(self, images: Tensor, targets: Tensor) -> StepOutput:
        self._steps += 1
        return StepOutput(Tensor(np.array([2.3, 65504.0, 1.0, 1.0], np.float32)), True)

    def state(self) -> dict:
        return {}

    def swap_ema(self) -> None:
        pass


def test_a_run_whose_every_step_overflows_at_scale_1_stops(compose: Callable[..., DictConfig], tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    exp = build_experiment(resolve(compose("amp=o2", "trainer.max_overflow_at_min_scale=4",
                                           "trainer.log_every_n_steps=1", "trainer.epochs=2")))
    monkeypatch.setattr(loop, "train_step_for", lambda exp, *args: OverflowingStep(exp.optimizer))
    with pytest.raises(loop.NonFiniteLoss, match=r"overflowed in 4 optimizer steps in a row at the smallest loss "
                                                 r"scale \(1; trainer.max_overflow_at_min_scale=4\) by epoch 2"):
        loop.fit(exp, tmp_path / "run", jit=False)
    assert (tmp_path / "run" / "checkpoints").is_dir()  # the last good state is kept


def _self_check(args: list[str], capsys: pytest.CaptureFixture[str],
                monkeypatch: pytest.MonkeyPatch) -> tuple[int, str]:
    """(exit code, printed text) of `python -m swinexp.app.selfcheck ARGS`, in this process, on fresh settings."""
    from swinexp.app import selfcheck

    monkeypatch.setattr(simulated_ascend, "OP_PRECISION", simulated_ascend.OpPrecision())
    code = selfcheck.main(args)
    return code, capsys.readouterr().out


def test_the_self_check_runs_the_loops_step_on_a_simulated_910(capsys: pytest.CaptureFixture[str],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    code, out = _self_check(["--simulate-chip", "ascend910", "amp=o0"], capsys, monkeypatch)
    assert code == 0
    assert "read back precision_mode=allow_fp32_to_fp16" in out
    assert "MatMul lowered, BatchMatMul lowered, Conv2D lowered" in out
    assert re.search(r"PASS  swin_micro trains \(o0 \(fp32 except Cube inputs: fp16 on ascend910\), accumulation 2\): "
                     r"status_register \(simulated saturating device\)", out)
    assert "chip ascend910 (Atlas training series" in out and "self-check: all 5 checks passed" in out
    assert simulated_ascend.SIMULATE_ENV not in os.environ  # the caller's process is not left simulating a card


def test_the_self_check_turns_a_chip_mismatch_into_a_fail_line(capsys: pytest.CaptureFixture[str],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    code, out = _self_check(["--simulate-chip", "ascend910b", "hardware.chip=ascend910"], capsys, monkeypatch)
    assert code == 1
    assert "FAIL  backend and card: ConfigError: hardware.chip=ascend910 but this machine's card is ascend910b" in out
    assert "Traceback" not in out


def test_the_readme_table_is_the_capability_tables() -> None:
    table = precision.policy_table({name: AMP_POLICIES.build({"name": name}) for name in AMPS})
    assert table in (ROOT / "docs" / "ascend.md").read_text(), "regenerate docs/ascend.md's per-chip table: " + table


def test_every_ascend_chip_fact_is_in_one_table() -> None:
    assert chips.ASCEND_CHIPS == ("ascend910", "ascend910b", "ascend910_93")
    assert [c.name for c in CHIPS.values() if c.saturates] == ["ascend910"]
    assert devices.hccs_groups("Ascend", "ascend910") == ({0, 1, 2, 3}, {4, 5, 6, 7})  # the launcher reads chips.py
    assert devices.hccs_groups("Ascend", "ascend910b") is None and devices.hccs_groups("GPU", None) is None
    assert AmpPolicy("O0").ascend_precision_mode == "auto"


def test_hardware_jit_level_reaches_the_compiled_steps(compose: Callable[..., DictConfig],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """ms.jit takes its own jit_level (default O0), so hardware.jit_level set on the context alone never reached the
    train or eval step."""
    from swinexp.engine import evaluate, step

    levels: list[str] = []

    def recording_jit(fn, jit_level: str = "O0", **kwargs):  # noqa: ANN001, ANN202
        levels.append(jit_level)
        return fn

    monkeypatch.setattr(step.ms, "jit", recording_jit)
    exp = build_experiment(resolve(compose("hardware.jit_level=O1")))
    train_step_for(exp, jit=True)
    evaluate.make_eval_step(exp.model, True, exp.jit_level)
    assert levels == ["O1", "O1"]  # the train step's graph (no accumulation: one), the eval step's
    with pytest.raises(ConfigError, match=r"hardware.jit_level='O3' is not valid; choose one of: O0, O1, O2"):
        resolve(compose("hardware.jit_level=O3"))


def test_evaluation_reads_the_device_once(compose: Callable[..., DictConfig],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from swinexp.engine import evaluate

    exp = build_experiment(resolve(compose()))
    batches = list(exp.val_loader.epoch(0))
    expected = evaluate.evaluate(exp.model, batches)
    reads: list[str] = []
    for name in ("asnumpy", "tolist", "__float__", "item"):
        original = getattr(Tensor, name)
        monkeypatch.setattr(Tensor, name, lambda self, *a, _o=original, _n=name, **k: (reads.append(_n), _o(self, *a,
                                                                                                            **k))[1])
    got = evaluate.evaluate(exp.model, batches)
    assert len(batches) > 1 and reads == ["tolist"]  # one read for the whole pass
    assert got == pytest.approx(expected, rel=1e-6)


@pytest.mark.slow
def test_the_mission_command_trains_on_a_simulated_910_and_says_what_it_computed(tmp_path: Path) -> None:
    """`python run.py ... amp=o1_manual hardware=ascend` as a user runs it, in a process that is a first-generation
    910 (hardware.chip=null): the card is read, the run's params carry it, the MLflow tag names what the policy
    computed there, and the overflow check is the status register."""
    import os
    import subprocess
    import sys

    from mlflow.tracking import MlflowClient

    from tests.conftest import SMOKE

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    smoke = [o for o in SMOKE if not o.startswith(("tracking=", "hardware="))]
    args = [*smoke, *ON_THE_CARD, "amp=o1_manual", f"data.root={tmp_path / 'data'}", "trainer.epochs=1",
            "trainer.limit_train_batches=2", "trainer.amp_report=true", "tracking=mlflow", f"tracking.uri={uri}",
            "tracking.experiment=card",
            f"hydra.run.dir={tmp_path / 'run'}"]
    env = {**os.environ, simulated_ascend.SIMULATE_ENV: "ascend910"}
    out = subprocess.run([sys.executable, str(ROOT / "run.py"), *args], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("card").experiment_id])
    assert run.data.params["hardware.chip"] == "ascend910"  # null in the config, the card's in the run
    assert run.data.params["hardware.overflow_check_resolved"] == "status_register"
    assert run.data.tags["amp.effective"] == "o1_manual (fp32 Cube inputs: fp16 on ascend910)"
    dtypes = (tmp_path / "run" / "amp_dtypes.txt").read_text()
    assert dtypes.startswith("amp policy o1_manual (fp32 Cube inputs: fp16 on ascend910)")
    assert "Conv2d, Conv1d left amp.fp32_cells" in dtypes
