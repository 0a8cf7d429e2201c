"""Validation: loss, top-1 and top-5 over a loader; pure (no logging)."""
from __future__ import annotations

from collections.abc import Iterable
from typing import Callable

import mindspore as ms
from mindspore import Tensor, nn, ops

from swinexp.engine.step import GraphStep
from swinexp.runtime import phases

EVAL_GRAPH = "the eval step"


class EvalStep:
    """(images, labels) -> (summed loss, top-1 hits, top-5 hits) for one batch, knowing whether its next call is
    the first (the one that compiles its graph)."""

    def __init__(self, step: Callable[[Tensor, Tensor], tuple[Tensor, Tensor, Tensor]], jit: bool) -> None:
        self._step, self._compiled = step, not jit

    def next_compile(self) -> str | None:
        return None if self._compiled else EVAL_GRAPH

    def __call__(self, images: Tensor, labels: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        self._compiled = True
        return self._step(images, labels)


def make_eval_step(model: nn.Cell, jit: bool, jit_level: str | None = None) -> EvalStep:
    """The eval step of `model`, compiled (graph mode, at `jit_level`: hardware.jit_level, None = ms.jit's O0) or
    eager."""

    def step(images: Tensor, labels: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        logits = ops.cast(model(images), ms.float32)
        loss = ops.cross_entropy(logits, labels, reduction="sum")
        k = min(5, logits.shape[-1])
        # indices only: unpacking `_, top = ops.topk(...)` leaves the values' getitem isolated in the graph, and
        # MindSpore's auto-monad pass warns "Some side effect nodes were eliminated by mistake" on every compile
        top = ops.topk(logits, k)[1]  # (B, k) class indices, best first
        hits = ops.equal(top, ops.expand_dims(labels, -1))
        top1 = ops.cast(hits[:, 0], ms.float32).sum()
        top5 = ops.cast(hits.any(axis=-1), ms.float32).sum()
        return loss, top1, top5

    return EvalStep(ms.jit(GraphStep(step, {"model": model}), jit_level=jit_level or "O0") if jit else step, jit)


def evaluate(model: nn.Cell, batches: Iterable[tuple[Tensor, Tensor]],
             step: Callable[[Tensor, Tensor], tuple[Tensor, Tensor, Tensor]] | None = None,
             distributed: bool = False) -> dict[str, float]:
    """Mean loss and top-1/top-5 accuracy in percent over all samples of `batches` (of every rank's batches
    when `distributed`). The sums stay on the device until the last batch: one read per evaluation, not per batch."""
    model.set_train(False)
    step = step or make_eval_step(model, jit=False)
    sums: Tensor | None = None  # (loss, top-1 hits, top-5 hits), fp32 on the device
    count = 0
    for images, labels in batches:
        batch = ops.stack([ops.cast(v, ms.float32).reshape(()) for v in step(images, labels)])
        sums = batch if sums is None else sums + batch
        if count == 0:
            phases.mark("eval")
        count += int(labels.shape[0])  # the host knows the batch size: no read
    if sums is None:
        sums = Tensor([0.0, 0.0, 0.0], ms.float32)
    if distributed:  # every rank evaluated its own shard: add the sums up so all ranks report the whole set
        totals = ops.AllReduce(ops.ReduceOp.SUM)(ops.concat([sums, Tensor([float(count)], ms.float32)]))
        loss, top1, top5, count = totals.tolist()
    else:
        loss, top1, top5 = sums.tolist()
    if count == 0:
        raise ValueError("evaluate() received no batches")
    return {"val/loss": loss / count, "val/top1": 100.0 * top1 / count, "val/top5": 100.0 * top5 / count}
