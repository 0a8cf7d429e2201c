"""Zero-initialized training state is written where it is made (runtime/zero_pages.py): the first update's
read-modify-write of AdamW's moments and of the accumulation buffers takes no page faults of its own.

The measure is the process's minor page faults around an in-place read-modify-write of the buffers' own memory,
the access pattern of an update: untouched pages take two faults each (the read maps the shared zero page, the
write copies it), written ones none. It runs in a fresh process, as a training run starts: in a long-lived test
worker the allocator hands out memory an earlier test has touched already, which would hide untouched pages.
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

# a (WIDTH, WIDTH) fp32 weight, 36 MiB: above glibc's largest mmap threshold (32 MiB), fresh pages of their own
MEASURE = r"""
import json, resource
import numpy as np
from mindspore import Parameter, ParameterTuple, Tensor, nn
from swinexp.amp import AmpPolicy
from swinexp.engine.step import make_train_step
from swinexp.optim import adamw
from swinexp.runtime.zero_pages import zeros_like_params

WIDTH = 3072
PAGE = resource.getpagesize()

def update_faults(buffers):
    views = [p.asnumpy() for p in buffers]
    assert all(v.ctypes.data == p.data_ptr() for v, p in zip(views, buffers))  # their memory, not copies
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for view in views:
        np.add(view, 0, out=view)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    return {"faults": faults, "pages": sum(p.nbytes for p in buffers) // PAGE,
            "zeros": all(not v.any() for v in views)}

def wide():
    net = nn.Dense(WIDTH, WIDTH)
    net.weight.set_data(Tensor(np.random.default_rng(0).normal(size=(WIDTH, WIDTH)).astype(np.float32)))
    return net

keep = []  # nothing is freed, so no later buffer reuses an earlier one's pages
fresh = ParameterTuple([Parameter(Tensor(np.ones((WIDTH, WIDTH), np.float32)), name="fresh")])
out = {}
keep.append(fresh.clone(prefix="plain", init="zeros"))
out["plain clone"] = update_faults(list(keep[-1]))
keep.append(zeros_like_params(fresh, "written"))
out["zeros_like_params"] = update_faults(list(keep[-1]))
optimizer = adamw(wide(), 1e-3, kernel="fused_cpu")
keep.append(optimizer)
out["adamw moments"] = update_faults([*optimizer.moments1, *optimizer.moments2])
net = wide()
step = make_train_step(net, nn.SGD(net.trainable_params(), learning_rate=0.1), AmpPolicy("O0"), None, jit=True,
                       accumulation_steps=2)
keep.append(step)
out["accumulation buffers"] = update_faults(list(step.accum))
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def measured() -> dict[str, dict]:
    done = subprocess.run([sys.executable, "-c", MEASURE], check=True, capture_output=True, text=True, timeout=300)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_untouched_zeros_fault_on_their_first_update(measured: dict[str, dict]) -> None:
    """The measure itself: zeros made by a plain clone fault on every page."""
    plain = measured["plain clone"]
    assert plain["faults"] >= plain["pages"] >= 9216, plain


@pytest.mark.parametrize("buffers", ["zeros_like_params", "adamw moments", "accumulation buffers"])
def test_zero_state_is_written_when_made(measured: dict[str, dict], buffers: str) -> None:
    got = measured[buffers]
    assert got["pages"] >= 9216 and got["faults"] < got["pages"] // 20, got
    assert got["zeros"]  # the values are still zeros
