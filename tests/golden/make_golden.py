"""Write tests/golden/swin_micro_golden.safetensors: what PyTorch (timm's Swin, the official recipe) computes.

    pip install -e ".[reference]"          # torch + timm, see README "Checking a run against PyTorch"
    python tests/golden/make_golden.py     # rewrites the fixture; commit it with the change that needed it

The fixture holds a micro Swin (swin_micro at 32 px, embed_dim 16, 10 classes) with random weights (norms and
biases not at 1/0, large relative position tables so the bias path matters), a forward batch with its soft
targets, timm's logits and input gradient for it, and a 3-step trajectory of the official recipe (AdamW with
the no-decay groups, warmup-cosine per step with a fractional warmup, clip_grad_norm, accumulation of 2
micro-batches, a weights EMA of decay 0.75 by timm's ModelEmaV3): every micro-batch loss, the LR and grad norm of
each step, the final weights and the final EMA weights. All tensors use timm's names (`init.*`, `final.*`,
`final_ema.*`); the architecture and recipe are in the file's metadata (`golden` JSON).
`tests/test_golden.py` checks swinexp against it without torch.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from safetensors.numpy import save_file

from swinexp.parity import reference

OUT = Path(__file__).resolve().parent / "swin_micro_golden.safetensors"
ARCH = {"img_size": 32, "patch_size": 4, "in_chans": 3, "num_classes": 10, "embed_dim": 16, "depths": [2, 2],
        "num_heads": [2, 4], "window_size": 4, "mlp_ratio": 4.0, "qkv_bias": True}
# swinexp config overrides that state the same recipe (test_golden composes them)
RECIPE = {"lr": 1e-3, "warmup_lr": 1e-5, "min_lr": 1e-5, "weight_decay": 0.05, "epochs": 2, "steps_per_epoch": 3,
          "warmup_epochs": 0.5, "clip_grad": 0.5, "accumulation_steps": 2, "micro_batch": 2, "steps": 3,
          "ema_decay": 0.75}  # a low decay: after 3 steps the EMA is still far from both the start and the end


def random_state(model: torch.nn.Module, rng: np.random.Generator) -> dict[str, np.ndarray]:
    state = {}
    for name, p in model.named_parameters():
        shape = tuple(p.shape)
        if "relative_position_bias_table" in name:
            value = rng.normal(0, 0.5, shape)
        elif "norm" in name and name.endswith("weight"):
            value = 1 + rng.normal(0, 0.1, shape)
        else:  # weights and biases alike
            value = rng.normal(0, 0.05, shape)
        state[name] = value.astype(np.float32)
    return state


def soft_targets(rng: np.random.Generator, n: int, classes: int, smoothing: float = 0.1) -> np.ndarray:
    """Mixup of two label-smoothed one-hots with a random lambda, as the official data pipeline makes them."""
    eye = np.full((classes, classes), smoothing / classes) + np.eye(classes) * (1 - smoothing)
    a, b = eye[rng.integers(0, classes, n)], eye[rng.integers(0, classes, n)]
    lam = rng.uniform(0.3, 1.0, (n, 1))
    return (lam * a + (1 - lam) * b).astype(np.float32)


def main() -> None:
    torch.manual_seed(0)
    rng = np.random.default_rng(2026)
    model = reference.timm_swin({**ARCH, "ape": False, "patch_norm": True})
    init = random_state(model, rng)
    reference.load_numpy_state(model, init)
    classes, size = ARCH["num_classes"], ARCH["img_size"]
    images = rng.normal(0, 1, (4, 3, size, size)).astype(np.float32)
    targets = soft_targets(rng, 4, classes)
    x = torch.from_numpy(images).requires_grad_(True)
    logits = model(x)
    reference.soft_target_cross_entropy(logits, torch.from_numpy(targets)).backward()
    input_grad = x.grad.numpy().copy()
    model.zero_grad(set_to_none=True)

    r = RECIPE
    total = r["epochs"] * r["steps_per_epoch"]
    recipe = reference.Recipe(base_lr=r["lr"], warmup_lr=r["warmup_lr"], min_lr=r["min_lr"],
                              weight_decay=r["weight_decay"], betas=(0.9, 0.999), eps=1e-8, total_steps=total,
                              warmup_steps=int(r["warmup_epochs"] * r["steps_per_epoch"]), clip_grad=r["clip_grad"],
                              accumulation_steps=r["accumulation_steps"], ema_decay=r["ema_decay"])
    micro = r["steps"] * r["accumulation_steps"]
    train_images = rng.normal(0, 1, (micro, r["micro_batch"], 3, size, size)).astype(np.float32)
    train_targets = np.stack([soft_targets(rng, r["micro_batch"], classes) for _ in range(micro)])
    trainer = reference.ReferenceTrainer(model, recipe)
    records = []
    for k in range(r["steps"]):
        window = [(train_images[i], train_targets[i])
                  for i in range(k * r["accumulation_steps"], (k + 1) * r["accumulation_steps"])]
        records.append(trainer.step(window))
    final = reference.numpy_state(model)
    tensors = {"forward.images": images, "forward.targets": targets, "forward.logits": logits.detach().numpy(),
               "forward.input_grad": input_grad, "train.images": train_images, "train.targets": train_targets,
               "train.losses": np.array([loss for rec in records for loss in rec.losses], np.float32),
               "train.lrs": np.array([rec.lr for rec in records], np.float32),
               "train.grad_norms": np.array([rec.grad_norm for rec in records], np.float32),
               **{f"init.{k}": v for k, v in init.items()}, **{f"final.{k}": v for k, v in final.items()},
               **{f"final_ema.{k}": v for k, v in trainer.ema_state().items()}}
    meta = {"arch": ARCH, "recipe": RECIPE, "torch": torch.__version__, "timm": __import__("timm").__version__,
            "clipped_steps": [rec.grad_norm > r["clip_grad"] for rec in records]}
    save_file(tensors, str(OUT), metadata={"golden": json.dumps(meta)})
    print(f"wrote {OUT} ({OUT.stat().st_size / 1e6:.2f} MB): losses {tensors['train.losses']}, "
          f"lrs {tensors['train.lrs']}, grad norms {tensors['train.grad_norms']}")


if __name__ == "__main__":
    main()
