"""The model and AdamW keep off MindSpore's CPU kernels that hold memory (models/kernels.py, first section).

Peak resident memory in fresh processes (`benchmarks.kernels`). The bounds sit between what the steps hold now
and what they held with `ops.transpose`, implicit broadcasts and divisions (measured here, in the comments).
"""
from __future__ import annotations

import pytest

from benchmarks import kernels


def test_a_kernel_that_holds_buffers_is_told_apart_from_one_that_does_not() -> None:
    # the probe itself (measured 2.5 and 0.08): if MindSpore stops holding them, the workarounds may go
    assert kernels.held("ops.transpose") > 1.5
    assert kernels.held("mint.permute") < 0.5


@pytest.mark.parametrize("mode", ["mint", "gather"])
def test_swin_blocks_with_mint_permute_or_row_gathers_hold_half_of_what_they_held(mode: str) -> None:
    # measured per block, in block inputs: 27.3 (mint) and 27.4 (gather) now; 22.6 (mint) before the hand-written
    # LayerNorm; 46-52 with ops.transpose; 59 before the explicit broadcasts
    assert kernels.held(f"{kernels.BLOCKS}{mode}") < 34.0


def test_an_adamw_update_holds_little_more_than_its_two_moments() -> None:
    # measured, in parameter sizes: 2.3 with the fused AdamWeightDecay kernel (m and v are 2 of them); 8.3 with
    # ~20 elementwise ops per parameter, 20.3 when two of those were parameter-sized divisions
    assert kernels.held("adamw update") < 4.0


@pytest.mark.parametrize("probe", ["x + expand(b)", "x * expand(s)", "x * ops.reciprocal(y)"])
def test_the_replacements_the_model_uses_hold_nothing(probe: str) -> None:
    # measured 0.71, 0.71, 0.46 outputs per call; the implicit forms 4.3
    assert kernels.held(probe) < 1.5


def test_the_kernels_bench_prints_one_row_per_probe_with_its_unit() -> None:
    result = kernels.run(None, ("mint.permute", "x / y"))
    assert [row[0] for row in result.table.rows] == ["mint.permute", "x / y"]
    assert all(row[2] == "outputs per call" for row in result.table.rows)
    assert result.metrics["kernels/x / y"] > 4 * result.metrics["kernels/mint.permute"]
    assert "| x / y |" in result.table.markdown()


def test_an_unknown_probe_names_the_probes_there_are() -> None:
    with pytest.raises(RuntimeError, match="unknown probe 'x // y'; choose from .*ops.transpose"):
        kernels.held("x // y")
