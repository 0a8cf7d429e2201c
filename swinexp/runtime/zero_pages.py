"""Zero-initialized training state (AdamW's moments, gradient-accumulation buffers) written once where it is made.

On the CPU backend MindSpore backs a Parameter made with `init="zeros"` by fresh, untouched pages. The first train
step then reads each page before writing it (an update is read-modify-write): the read maps the kernel's shared zero
page, and the write must copy it and flush the old mapping from every CPU that runs the step's threads, on a VM an
inter-processor interrupt per 4 KiB page. swin_tiny's two moments are 2 x 112 MB: ~56,000 such copies, ~0.5 s of
system time in the first train step on the 2-core VM of BENCHMARKS.md, 0.25-0.35 s of its wall time (`perf`: the
interrupts under the fused AdamW's page faults). Written once here, before the step's threads run, each page faults
once and has nothing to flush (~0.1 s).
"""
from __future__ import annotations

import mindspore as ms
from mindspore import ParameterTuple

__all__ = ["zeros_like_params"]


def zeros_like_params(params: ParameterTuple, prefix: str) -> ParameterTuple:
    """`params.clone(prefix, init="zeros")` whose memory is written, on the CPU backend (elsewhere the plain clone)."""
    zeros = params.clone(prefix=prefix, init="zeros")
    if ms.get_context("device_target") != "CPU":
        return zeros  # device memory: the host pages are not what an update writes
    for param in zeros:
        host = param.asnumpy()
        if host.ctypes.data == param.data_ptr():  # a view of the Parameter's own memory, not a copy
            host.fill(0)
    return zeros
