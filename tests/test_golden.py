"""Golden tests: swinexp against numbers PyTorch computed (timm's Swin, the official recipe), without torch.

The fixture `tests/golden/swin_micro_golden.safetensors` (0.55 MB) was written by `tests/golden/make_golden.py`
with torch + timm; regenerate it only with that script (`pip install -e ".[reference]"`, then
`python tests/golden/make_golden.py`) and commit the result. It holds a micro Swin with random weights (timm
names), a batch with soft targets, timm's logits and input gradient for it, and a 3-step official-recipe
trajectory (AdamW no-decay groups, warmup-cosine with warmup_epochs=0.5 at 3 steps/epoch, clip_grad_norm 0.5,
2 micro-batches per step, a weights EMA of decay 0.75 by timm's ModelEmaV3 without warmup).

Tolerances (fp32 on both sides, different kernels and summation orders), relative L2: logits 1e-5 (measured
2.2e-7), input gradient 1e-5 (1.1e-6), every micro-batch loss 1e-5, grad norms 1e-4, LRs 1e-6 (the same
formula), final weights 1e-4 per tensor (measured 1.2e-5 at worst, a qkv bias: AdamW's
first steps move every element by about lr whatever its gradient's size, so tiny gradients amplify noise), final
EMA weights 1e-4 per tensor (measured 4.5e-6 at worst, the same qkv bias).
"""
from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any, Callable

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor
from omegaconf import DictConfig
from safetensors import safe_open

from swinexp.amp import AmpPolicy
from swinexp.build import build_model, build_optimization, resolve
from swinexp.engine.step import make_train_step, soft_target_cross_entropy
from swinexp.models import SwinTransformer, create_model
from swinexp.models.convert import to_timm
from swinexp.models.pretrained import load_weights, model_state

GOLDEN = Path(__file__).resolve().parent / "golden" / "swin_micro_golden.safetensors"


def _golden() -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    with safe_open(str(GOLDEN), "np") as f:
        names = f.keys()  # a safe_open handle is not iterable
        return {k: f.get_tensor(k) for k in names}, json.loads(f.metadata()["golden"])


TENSORS, META = _golden()
ARCH, RECIPE = META["arch"], META["recipe"]


def _prefixed(prefix: str) -> dict[str, np.ndarray]:
    return {k[len(prefix):]: v for k, v in TENSORS.items() if k.startswith(prefix)}


def rel(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@pytest.fixture(scope="module", autouse=True)
def pynative_cpu() -> None:
    ms.set_device("CPU")
    ms.set_context(mode=ms.PYNATIVE_MODE)


def micro(**formulation: Any) -> SwinTransformer:
    model = create_model("swin_micro", drop_path_rate=0.0, **ARCH, **formulation)
    load_weights(model, _prefixed("init."), GOLDEN)  # timm names: the conversion is under test too
    return model


# every index rewrite combination with MindSpore's autodiff; the hand-written backward (it replaces the kernels
# of Dense biases, GELU and softmax, whatever the rewrites) with each qkv mode and each bias / merging variant
FORMULATIONS = [{"qkv": q, "patch_merging": m, "rel_pos_bias": b, "custom_bprop": False}
                for q, m, b in itertools.product(("fused", "split", "fused_split"), ("slice", "reshape"),
                                                 ("gather", "onehot"))]
FORMULATIONS += [{"qkv": q, "patch_merging": m, "rel_pos_bias": b, "custom_bprop": True}
                 for q, m, b in (("fused", "slice", "gather"), ("split", "reshape", "gather"),
                                 ("fused_split", "slice", "onehot"))]
# mint.permute for every permutation: the cpu formulation before row Gathers, and the official one
FORMULATIONS += [{"qkv": "split", "patch_merging": "reshape", "rel_pos_bias": "gather", "custom_bprop": True,
                  "permute": "mint"},
                 {"qkv": "fused", "patch_merging": "slice", "rel_pos_bias": "gather", "custom_bprop": False,
                  "permute": "mint"}]
# row Gathers: the cpu formulation (its patch embedding one MatMul), and with fused qkv (its 5-D permutation falls
# back to ops.transpose)
FORMULATIONS += [{"qkv": "fused_split", "patch_merging": "reshape", "rel_pos_bias": "gather", "custom_bprop": True,
                  "permute": "gather", "patch_embed": "matmul"},
                 {"qkv": "fused_split", "patch_merging": "reshape", "rel_pos_bias": "gather", "custom_bprop": True,
                  "permute": "gather", "patch_embed": "matmul", "kernels": "fused_cpu"},
                 {"qkv": "fused", "patch_merging": "reshape", "rel_pos_bias": "gather", "custom_bprop": True,
                  "permute": "gather"}]


@pytest.mark.parametrize("formulation", FORMULATIONS,
                         ids=lambda f: "-".join(str(v) for v in f.values()).replace("True", "bprop").replace(
                             "-False", ""))
def test_every_formulation_matches_timm_logits_and_input_gradient(formulation: dict[str, Any]) -> None:
    model = micro(**formulation)
    model.set_train(False)
    images, targets = Tensor(TENSORS["forward.images"]), Tensor(TENSORS["forward.targets"])
    logits = rel(model(images).asnumpy(), TENSORS["forward.logits"])
    input_grad = rel(ms.grad(lambda x: soft_target_cross_entropy(model(x), targets))(images).asnumpy(),
                     TENSORS["forward.input_grad"])
    assert logits < 1e-5 and input_grad < 1e-5, (logits, input_grad)


def test_train_step_follows_the_official_recipe_trajectory(compose: Callable[..., DictConfig]) -> None:
    """The jitted train step of `run.py` (the hardware preset's formulation; the others equal it, see above)."""
    r = RECIPE
    cfg = compose(*[f"model.{k}={json.dumps(v)}" for k, v in ARCH.items() if k not in ("img_size", "num_classes")],
                  f"data.img_size={ARCH['img_size']}", f"data.num_classes={ARCH['num_classes']}",
                  "model.drop_path_rate=0.0", "optimizer=adamw", f"optimizer.lr={r['lr']}",
                  f"optimizer.weight_decay={r['weight_decay']}", f"scheduler.warmup_epochs={r['warmup_epochs']}",
                  f"scheduler.warmup_lr={r['warmup_lr']}", f"scheduler.min_lr={r['min_lr']}",
                  f"trainer.epochs={r['epochs']}", f"trainer.clip_grad={r['clip_grad']}",
                  f"trainer.accumulation_steps={r['accumulation_steps']}", f"data.batch_size={r['micro_batch']}")
    model = build_model(resolve(cfg))
    load_weights(model, _prefixed("init."), GOLDEN)
    optimizer, schedule = build_optimization(resolve(cfg), model, r["steps_per_epoch"],
                                          r["micro_batch"] * r["accumulation_steps"])
    np.testing.assert_allclose(schedule[:r["steps"]], TENSORS["train.lrs"], rtol=1e-6)  # truncated warmup: 1 step
    step = make_train_step(model, optimizer, AmpPolicy("O0"), r["clip_grad"], jit=True,
                           accumulation_steps=r["accumulation_steps"], ema_decay=r["ema_decay"])
    model.set_train(True)
    outs = [step(Tensor(i), Tensor(t)) for i, t in zip(TENSORS["train.images"], TENSORS["train.targets"])]
    np.testing.assert_allclose([o.loss for o in outs], TENSORS["train.losses"], rtol=1e-5)
    np.testing.assert_allclose([o.grad_norm for o in outs if o.updated], TENSORS["train.grad_norms"], rtol=1e-4)
    ours, final = to_timm(model_state(model)), _prefixed("final.")
    assert ours.keys() == final.keys()
    worst = max((rel(ours[k], v), k) for k, v in final.items())
    assert worst[0] < 1e-4, worst
    assert max(rel(v, _prefixed("init.")[k]) for k, v in final.items()) > 1e-2  # the weights did move

    ema = to_timm({**model_state(model), **{p.name: e.asnumpy() for p, e in zip(step.params, step.ema)}})
    golden_ema = _prefixed("final_ema.")
    assert golden_ema.keys() == final.keys()
    worst = max((rel(ema[k], v), k) for k, v in golden_ema.items())
    assert worst[0] < 1e-4, worst
    assert min(rel(golden_ema[k], v) for k, v in final.items()) > 1e-4  # the EMA is neither the final weights
    assert min(rel(golden_ema[k], _prefixed("init.")[k]) for k in final if "norm" not in k) > 1e-4  # nor the start
