"""What an AMP policy does to the network: a per-cell compute-dtype table and a precision drift report.

`python run.py amp=o1_manual inspect=amp` prints `dtype_table`; `inspect=drift` prints `drift_report` (fp32 vs
the policy on the same weights and batch, per stage/block), through `swinexp.app.job.inspect_precision`;
`artifacts(...)` gives both texts for a training run to save.
"""
from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager

import mindspore as ms
import numpy as np
from mindspore import Tensor, nn, ops

from swinexp.amp.policies import AmpPolicy
from swinexp.amp.precision import Precision

INSPECTIONS = ("amp", "drift")
_FLAG_DTYPES = (("fp16", "float16"), ("bf16", "bfloat16"), ("fp32", "float32"))
_WRAPPER_ATTR = "_backbone"  # MindSpore's _OutputTo16/_OutputTo32 AMP wrappers keep the wrapped cell here


def unwrap(cell: nn.Cell) -> nn.Cell:
    """The network inside MindSpore's output-cast wrappers (O2/O3/o1_manual put one around the whole net)."""
    while hasattr(cell, _WRAPPER_ATTR) and isinstance(getattr(cell, _WRAPPER_ATTR), nn.Cell):
        cell = getattr(cell, _WRAPPER_ATTR)
    return cell


def compute_cells(network: nn.Cell) -> dict[str, nn.Cell]:
    """Cell path (as in parameter names, "(model)" for the root) -> cell, skipping AMP output-cast wrappers.

    Every path is listed: a function cell the model shares among its layers (`models.kernels.shared`) appears under
    each layer that calls it, where `cells_and_names` would name it once, under the first.
    """
    cells = {}
    for path, cell in _every_path(network, ""):
        if _WRAPPER_ATTR in cell.name_cells():  # an output-cast wrapper: plumbing, not a compute cell
            continue
        cells[".".join(p for p in path.split(".") if p != _WRAPPER_ATTR) or "(model)"] = cell
    return cells


def _every_path(cell: nn.Cell, path: str) -> Iterator[tuple[str, nn.Cell]]:
    yield path, cell
    for name, child in cell.name_cells().items():
        if child is not None:
            yield from _every_path(child, f"{path}.{name}" if path else name)


def compute_dtypes(network: nn.Cell, policy: AmpPolicy) -> dict[str, str]:
    """Cell path (as in parameter names) -> the dtype the cell computes in under `policy`, read off the network.

    O2/O3/o1_manual mark cells with to_float flags, which are read directly. O1 rewrites the network instead,
    inserting casts around MindSpore's white-list cells (and everything inside them); those are reported in the
    policy's dtype.
    """
    white = tuple(c for c in ms.amp.get_white_list() if isinstance(c, type) and issubclass(c, nn.Cell))
    table: dict[str, str] = {}
    inside_white: list[str] = []
    for path, cell in compute_cells(network).items():
        flags = cell.get_flags()
        dtype = next((name for flag, name in _FLAG_DTYPES if flags.get(flag)), "float32")
        if policy.level == "O1":
            if isinstance(cell, white) or any(path.startswith(w + ".") for w in inside_white):
                inside_white.append(path)
                dtype = str(policy.dtype).lower()
        table[path] = dtype
    return table


def dtype_table(network: nn.Cell, precision: Precision) -> str:
    """A text table: every cell path, its type and its compute dtype under the policy, as it runs on its chip."""
    policy = precision.policy
    dtypes = compute_dtypes(network, policy)
    cells = compute_cells(network)
    width = max(len(p) for p in dtypes)
    lines = [f"amp policy {precision.effective} (low precision: {str(policy.dtype).lower()})",
             *(f"chip: {note}" for note in precision.notes),
             f"{'cell':<{width}}  {'type':<22}  compute dtype", "-" * (width + 40)]
    lines += [f"{path:<{width}}  {_type_name(cells[path]):<22}  {dtype}"
              for path, dtype in dtypes.items()]
    counts = {d: list(dtypes.values()).count(d) for d in sorted(set(dtypes.values()))}
    lines.append("-" * (width + 40))
    lines.append("cells per dtype: " + ", ".join(f"{d} {n}" for d, n in counts.items()))
    if policy.level == "O1":
        lines.append("note: O1 also casts white-list primitives (MatMul, BatchMatMul, Conv2D, ...) called directly "
                     "in a construct; functional ops (ops.matmul in attention) stay float32")
    return "\n".join(lines)


def _type_name(cell: nn.Cell) -> str:
    return re.sub(r"Opt(_\d+)?$", "", type(cell).__name__)  # O1's rewrite renames Dense to DenseOpt_2


def stage_outputs(network: nn.Cell, images: Tensor) -> Iterator[tuple[str, Tensor]]:
    """(name, output) after the patch embedding, every block, every patch merging, the final norm and the head.

    Walks SwinTransformer.forward_features/forward_head by hand, calling each sub-cell the way the model does, so
    each keeps its AMP casts (no hooks). Reports run it eagerly (`_eagerly`).
    """
    net = unwrap(network)
    x = net.patch_embed(images)
    yield "patch_embed", x
    if net.ape:
        x = x + ops.cast(net.absolute_pos_embed, x.dtype)
    for i, layer in enumerate(net.layers):
        for j, block in enumerate(layer.blocks):
            x = block(x)
            yield f"stage{i}.block{j}", x
        if layer.downsample is not None:
            x = layer.downsample(x)
            yield f"stage{i}.downsample", x
    x = net.norm(x)
    yield "norm", x
    yield "logits", net.head(ops.mean(x, 1))


@contextmanager
def _eagerly() -> Iterator[None]:
    """Pynative mode for the duration. In graph mode a sub-cell called again after the policy cast it runs the graph
    compiled for it before, in fp32, and the report would show no drift at all."""
    mode = ms.get_context("mode")
    ms.set_context(mode=ms.PYNATIVE_MODE)
    try:
        yield
    finally:
        ms.set_context(mode=mode)


def _stage_arrays(network: nn.Cell, images: Tensor) -> list[tuple[str, str, np.ndarray]]:
    network.set_train(False)
    with _eagerly():
        return [(k, str(v.dtype).lower(), v.asnumpy().astype(np.float64)) for k, v in stage_outputs(network, images)]


def fp32_outputs(network: nn.Cell, images: Tensor) -> dict[str, np.ndarray]:
    """Every stage output of the fp32 network (float64 numpy), recorded before a policy casts it: the reference a
    drift report compares with, so the run needs no second model."""
    return {name: y for name, _, y in _stage_arrays(network, images)}


def drift_report(reference: dict[str, np.ndarray], candidate: nn.Cell, policy: AmpPolicy, images: Tensor) -> str:
    """Relative L2 error ||y - y_ref|| / ||y_ref|| and max abs error of every stage output, fp32 vs `policy`.

    Args:
        reference: `fp32_outputs` of the same weights before `policy.apply`, on `images`.
        candidate: the network after `policy.apply`.
        policy: the policy `candidate` was cast with (for the header).
        images: one batch, (B, 3, H, W) fp32.
    """
    rows, y = [], np.zeros(0)
    for name, dtype, y in _stage_arrays(candidate, images):
        r = reference[name]
        rows.append((name, dtype, np.linalg.norm(y - r) / max(np.linalg.norm(r), 1e-30), float(np.abs(y - r).max())))
    agree = 100.0 * np.mean(np.argmax(reference["logits"], -1) == np.argmax(y, -1))  # y: the last output
    lines = [f"precision drift: amp {policy.level} ({str(policy.dtype).lower()}) vs float32, same weights, "
             f"batch of {images.shape[0]}",
             f"{'output':<20}  {'dtype':<8}  {'rel L2 err':>10}  {'max abs err':>11}", "-" * 56]
    lines += [f"{n:<20}  {d:<8}  {e:>10.3e}  {m:>11.3e}" for n, d, e, m in rows]
    lines += ["-" * 56, f"top-1 agreement with fp32: {agree:.1f}%"]
    return "\n".join(lines)


def artifacts(reference: dict[str, np.ndarray], model: nn.Cell, precision: Precision,
              images: Tensor) -> dict[str, str]:
    """{file name: text} for a run to save: the dtype table and the drift report of `model` vs its own fp32
    outputs `reference` (`fp32_outputs` before the policy was applied)."""
    return {"amp_dtypes.txt": dtype_table(model, precision),
            "amp_drift.txt": drift_report(reference, model, precision.policy, images)}
