"""swinexp's side of the per-stage comparison: every stage output and the loss gradient with respect to it.

The stages are those of `amp.report.stage_outputs` (patch embedding, every block, every patch merging, final
norm, head). Gradients run backward one stage at a time (`ms.vjp` of each sub-cell at its recorded input), so
each sub-cell keeps its AMP casts and the walk works in graph and pynative mode alike, without hooks.
"""
from __future__ import annotations

import mindspore as ms
import numpy as np
from mindspore import Tensor, nn, ops

from swinexp.amp.report import unwrap


class _PooledHead(nn.Cell):
    """The head as SwinTransformer.construct calls it: on the mean over tokens."""

    def __init__(self, head: nn.Cell) -> None:
        super().__init__()
        self.head = head

    def construct(self, x: Tensor) -> Tensor:
        return self.head(ops.mean(x, 1))


def stage_cells(network: nn.Cell) -> list[tuple[str, nn.Cell]]:
    """(name, cell) in forward order; names as amp.report.stage_outputs and reference.stage_names."""
    net = unwrap(network)
    if net.ape:
        raise ValueError("model.ape=true has no counterpart in timm's Swin; compare with model.ape=false")
    cells: list[tuple[str, nn.Cell]] = [("patch_embed", net.patch_embed)]
    for i, layer in enumerate(net.layers):
        cells += [(f"stage{i}.block{j}", block) for j, block in enumerate(layer.blocks)]
        if layer.downsample is not None:
            cells.append((f"stage{i}.downsample", layer.downsample))
    return [*cells, ("norm", net.norm), ("logits", _PooledHead(net.head))]


def stage_activations(network: nn.Cell, images: np.ndarray,
                      targets: np.ndarray) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], float]:
    """Per stage: output and d loss / d output (fp32 numpy), plus the soft-target CE loss; "images" in the
    gradients is d loss / d images. The network is put in eval mode (no dropout either way: parity runs
    without it) and left so."""
    network.set_train(False)
    cells = stage_cells(network)
    inputs, outputs = [], []
    x = Tensor(images)
    for _, cell in cells:
        inputs.append(x)
        x = cell(x)
        outputs.append(x)
    logits = outputs[-1].asnumpy().astype(np.float64)
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    loss = float(np.mean(np.sum(-targets * np.log(probs), -1)))
    # d mean_b(-sum_k t log softmax(z)) / dz = (softmax(z) * sum_k t - t) / B
    grad = (probs * targets.sum(-1, keepdims=True) - targets) / len(targets)
    values, grads = {}, {}
    sens = Tensor(grad.astype(np.float32))
    for (name, cell), x, y in zip(reversed(cells), reversed(inputs), reversed(outputs)):
        values[name] = _f32(y)
        grads[name] = _f32(sens)
        _, vjp_fn = ms.vjp(cell, x)
        (sens,) = _as_tuple(vjp_fn(ops.cast(sens, y.dtype)))
    grads["images"] = _f32(sens)
    return dict(reversed(values.items())), dict(reversed(grads.items())), loss


def _as_tuple(value: Tensor | tuple[Tensor, ...]) -> tuple[Tensor, ...]:
    return value if isinstance(value, tuple) else (value,)


def _f32(t: Tensor) -> np.ndarray:
    return t.asnumpy().astype(np.float32)
