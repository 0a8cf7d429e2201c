"""Zero-initialized training state is written where it is made (runtime/zero_pages.py): the first update's
read-modify-write of AdamW's moments and of the accumulation buffers takes no page faults of its own.

The measure is the process's minor page faults around an in-place read-modify-write of the buffers' own memory,
the access pattern of an update: untouched pages take two faults each (the read maps the shared zero page, the
write copies it), written ones none.
"""
from __future__ import annotations

import resource

import numpy as np
from mindspore import Parameter, ParameterTuple, Tensor, nn

from swinexp.amp import AmpPolicy
from swinexp.engine.step import make_train_step
from swinexp.optim import adamw
from swinexp.runtime.zero_pages import zeros_like_params

PAGE = resource.getpagesize()
# a (WIDTH, WIDTH) fp32 weight, 36 MiB: above glibc's largest mmap threshold (32 MiB), so each buffer is fresh pages,
# never reused memory freed by an earlier test (whose pages would be written already)
WIDTH = 3072


def _wide() -> nn.Cell:
    net = nn.Dense(WIDTH, WIDTH)
    net.weight.set_data(Tensor(np.random.default_rng(0).normal(size=(WIDTH, WIDTH)).astype(np.float32)))
    return net


def _update_faults(buffers: list[Parameter]) -> tuple[int, int]:
    """(minor faults, pages) of `buffer += 0` in place over each buffer's own memory."""
    pages = sum(p.nbytes for p in buffers) // PAGE
    views = [p.asnumpy() for p in buffers]
    assert all(v.ctypes.data == p.data_ptr() for v, p in zip(views, buffers))  # their memory, not copies
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for view in views:
        np.add(view, 0, out=view)
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before, pages


def test_adamw_moments_are_written_zeros_when_made() -> None:
    optimizer = adamw(_wide(), 1e-3, kernel="fused_cpu")
    moments = [*optimizer.moments1, *optimizer.moments2]
    faults, pages = _update_faults(moments)
    assert pages >= 2 * WIDTH * WIDTH * 4 // PAGE
    assert faults < pages // 20, (faults, pages)
    assert all(not m.asnumpy().any() for m in moments)  # still zeros


def test_accumulation_buffers_are_written_zeros_when_made() -> None:
    net = _wide()
    step = make_train_step(net, nn.SGD(net.trainable_params(), learning_rate=0.1), AmpPolicy("O0"), None, jit=True,
                           accumulation_steps=2)
    faults, pages = _update_faults(list(step.accum))
    assert faults < pages // 20, (faults, pages)
    assert all(not b.asnumpy().any() for b in step.accum)


def test_untouched_zeros_fault_on_their_first_update() -> None:
    """The measure itself: the same zeros made by a plain clone fault on every page."""
    fresh = [Parameter(Tensor(np.ones((WIDTH, WIDTH), np.float32)), name="fresh")]
    untouched = list(ParameterTuple(fresh).clone(prefix="fresh", init="zeros"))
    faults, pages = _update_faults(untouched)
    assert faults >= pages, (faults, pages)
    written = list(zeros_like_params(ParameterTuple(fresh), "written"))
    assert _update_faults(written)[0] < pages // 20
