"""Model summary: official parameter counts and FLOPs, per-stage shapes, and the command line."""
from __future__ import annotations

import pytest

from swinexp.models import create_model
from swinexp.models.summary import main, summarize

# (parameters with 1000 classes, GFLOPs at 224 px) from the microsoft/Swin-Transformer model zoo
OFFICIAL = {"swin_tiny": (28_288_354, 4.5), "swin_small": (49_606_258, 8.7), "swin_base": (87_768_224, 15.4),
            "swin_large": (196_532_476, 34.5)}


@pytest.mark.parametrize("name", sorted(OFFICIAL))
def test_parameters_and_flops_match_the_official_numbers(name: str) -> None:
    params, gflops = OFFICIAL[name]
    model = create_model(name)
    rows = summarize(model)
    assert sum(p.size for p in model.trainable_params()) == sum(r.params for r in rows) == params
    assert sum(r.flops for r in rows) / 1e9 == pytest.approx(gflops, rel=0.02)


def test_stage_shapes_of_swin_tiny() -> None:
    rows = summarize(create_model("swin_tiny"))
    assert [r.name for r in rows] == ["patch_embed", "layers.0", "layers.1", "layers.2", "layers.3", "norm+head"]
    assert [r.out_shape for r in rows] == [(56, 56, 96), (28, 28, 192), (14, 14, 384), (7, 7, 768), (7, 7, 768),
                                           (1000,)]
    assert [(r.depth, r.heads, r.window) for r in rows[1:5]] == [(2, 3, 7), (2, 6, 7), (6, 12, 7), (2, 24, 7)]
    assert rows[1].in_shape == rows[0].out_shape and rows[0].in_shape == (3, 224, 224)


def test_flops_do_not_depend_on_the_switches() -> None:
    # the rewrites compute the same function; a window that shrinks to the map (stage 1 at 32 px) is counted as used
    counts = {tuple(r.flops for r in summarize(create_model("swin_micro", img_size=32, qkv=q, patch_merging=m,
                                                            rel_pos_bias=b)))
              for q, m, b in [("fused", "slice", "gather"), ("split", "reshape", "onehot")]}  # fmt: skip
    assert len(counts) == 1


def test_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["model=swin_micro", "model.qkv=fused", "num_classes=10"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("swin_micro (qkv=fused, num_classes=10)") and "136,822" in out and "8x8x64" in out
    assert main(["model=swin_mikro"]) == 2
    assert "Did you mean 'swin_micro'" in capsys.readouterr().err
    assert main(["qkv=split"]) == 2
    assert "name the model" in capsys.readouterr().err
