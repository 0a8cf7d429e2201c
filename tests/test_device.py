"""On a real card (`pytest -m device` on a GPU or Ascend host, after the self-check): the self-check of the mission's
amp sweep arms, each in its own process as a run is — the card's chip read by MindSpore (`detected_chip`), the
operator precision read back, an fp32 MatMul/BatchMatMul/Conv2D computing as the chip table says, a real fp16
overflow seen by the resolved check (the float status register on a first-generation 910) and the loop's own train
step with accumulation 1 and 2. Skipped, and listed as such in tests/ci_skips.txt, where MindSpore has no GPU or
Ascend backend."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from mindspore._c_expression import MSContext

from tests.conftest import ROOT


def _card() -> str | None:
    """The hardware preset of this host's card: ascend, gpu, or None (this MindSpore build has neither backend)."""
    context = MSContext.get_instance()
    for target, preset in (("Ascend", "ascend"), ("GPU", "gpu")):
        if context.is_pkg_support_device(target):
            return preset
    return None


CARD = _card()
pytestmark = [pytest.mark.device,
              pytest.mark.skipif(CARD is None, reason="no GPU or Ascend backend: run `pytest -m device` on a card")]


@pytest.mark.parametrize("amp", ["o0", "o2", "o1_manual"])  # the mission's sweep: -m amp=o0,o2,o1_manual
def test_the_self_check_passes_on_this_card(amp: str, tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "swinexp.app.selfcheck", f"hardware={CARD}", f"amp={amp}"],
                         cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    assert "self-check: all 5 checks passed" in out.stdout
    if CARD == "ascend":
        assert "read back precision_mode=" in out.stdout  # the settings as MindSpore reports them
        if "chip ascend910 (" in out.stdout:  # a first-generation 910: the register, and Cube inputs in fp16
            assert "status_register" in out.stdout and "MatMul lowered" in out.stdout
        else:
            assert "MatMul fp32, BatchMatMul fp32, Conv2D fp32" in out.stdout
    else:
        assert "MatMul fp32, BatchMatMul fp32, Conv2D fp32" in out.stdout  # TF32 off for fp32 MatMul and Conv
