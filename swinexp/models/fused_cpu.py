"""swinexp's fused CPU kernels (`model.kernels=fused_cpu`): fused_cpu.cc built once per machine, used as MindSpore
Custom ops of type "aot".

MindSpore's CPU backend computes the exact GELU as a chain of elementwise kernels around its `Erf`, one pass over the
tensor each (forward and the hand-written backward: twelve passes), and its `Erf` is slow; its LayerNorm kernel takes
~5 ms at stage 0's shape where one pass takes ~0.7. fused_cpu.cc does each direction in one pass (BENCHMARKS.md,
"Fused CPU kernels"). The library is compiled with the machine's C++ compiler
(`$CXX`, else g++ or c++) for its own CPU (`-march=native`) into the user's cache, keyed by the source, the compiler
and the CPU, so a cluster's nodes with other CPUs each build their own. Only float32 tensors reach these kernels.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from functools import cache
from pathlib import Path

from mindspore import Tensor, nn, ops
from mindspore.common import dtype as mstype
from mindspore.ops import signature as sig

from swinexp.registry import ConfigError

__all__ = ["DTYPE", "KERNEL_MODES", "FusedAdamWUpdate", "FusedAdamWUpdateAll", "FusedBiasSoftmaxFn", "FusedGeluFn",
           "FusedLayerNormFn", "FusedSoftmaxFn", "GlobalNorm", "check_compiler", "library"]

KERNEL_MODES = ("mindspore", "fused_cpu")
DTYPE = mstype.float32  # the only dtype the kernels compute
SOURCE = Path(__file__).with_name("fused_cpu.cc")
FLAGS = ("-O3", "-march=native", "-fno-math-errno", "-shared", "-fPIC", "-pthread", "-std=c++17")


def compiler() -> str | None:
    """The C++ compiler: $CXX, else g++, else c++ on PATH; None when there is none."""
    candidates = [os.environ["CXX"]] if os.environ.get("CXX") else ["g++", "c++"]
    return next((path for name in candidates if (path := shutil.which(name))), None)


def check_compiler(keys: tuple[str, ...] = ("model.kernels",)) -> None:
    """Raise a ConfigError naming the fix when no C++ compiler can build the kernels (before any work starts);
    `keys` are the config keys set to fused_cpu."""
    if compiler() is None:
        chosen = " and ".join(f"{key}=fused_cpu" for key in keys)
        raise ConfigError(f"{chosen} build swinexp's fused CPU kernels with a C++ compiler, and none was found ($CXX, "
                          "g++ or c++ on PATH): install one (e.g. apt-get install g++) or use MindSpore's kernels "
                          f"with {' '.join(f'{key}=mindspore' for key in keys)}")


def cache_dir() -> Path:
    """$XDG_CACHE_HOME/swinexp/kernels, else ~/.cache/swinexp/kernels."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "swinexp" / "kernels"


def native_target(cxx: str) -> str:
    """What `-march=native` means to `cxx` on this CPU: the target and feature flags the compiler resolves it to (g++'s
    cc1plus line, clang's -target-cpu/-target-feature), so nodes whose CPUs differ get libraries of their own."""
    probe = subprocess.run([cxx, "-march=native", "-E", "-v", "-x", "c++", os.devnull], capture_output=True, text=True)
    lines = [line for line in probe.stderr.splitlines() if "-march" in line or "-target-" in line]
    return "\n".join(lines) or probe.stderr


@cache
def library() -> str:
    """Path of the compiled kernels for this machine, compiling them on the first call (per cache, not per process).

    Concurrent processes may each compile; each publishes its file with one atomic rename, so a reader sees a whole
    library or none.

    Raises:
        ConfigError: No C++ compiler, or the compile failed (its output is in the message).
    """
    check_compiler()
    cxx = compiler()
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True).stdout
    key = hashlib.sha256("\0".join([SOURCE.read_text(), cxx, version, " ".join(FLAGS), native_target(cxx)]).encode())
    target = cache_dir() / key.hexdigest()[:16] / "fused_cpu.so"
    if target.exists():
        return str(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, partial = tempfile.mkstemp(prefix=".fused_cpu.", suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        done = subprocess.run([cxx, *FLAGS, "-o", partial, str(SOURCE)], capture_output=True, text=True)
        if done.returncode != 0:
            raise ConfigError(f"model.kernels=fused_cpu: {cxx} could not compile {SOURCE}:\n{done.stderr.strip()}\n"
                              "Fix the compiler (or set $CXX to another one), or use model.kernels=mindspore")
        os.replace(partial, target)
    finally:
        if os.path.exists(partial):
            os.remove(partial)
    return str(target)


def _same_shape(x, *rest):
    return x


def _same_dtype(x, *rest):
    return x


def custom_op(function: str, out_shape=_same_shape, out_dtype=_same_dtype) -> ops.Custom:
    """The Custom op running `function` of the library; by default its one output has the first input's shape and
    dtype, else `out_shape`/`out_dtype` map the inputs' shapes/dtypes to the outputs' (MindSpore's inference hooks).
    """
    return ops.Custom(f"{library()}:{function}", out_shape=out_shape, out_dtype=out_dtype, func_type="aot")


class FusedGeluFn(nn.Cell):
    """Exact GELU x * Phi(x) in one pass each way; the backward recomputes Phi and phi from x (keeps nothing else).

    float32 only (`DTYPE`); `kernels.ExactGELU` sends other dtypes to MindSpore's kernels.
    """

    def __init__(self) -> None:
        super().__init__()
        self.forward = custom_op("GeluForward")
        self.backward = custom_op("GeluBackward")

    def construct(self, x: Tensor) -> Tensor:
        return self.forward(x)

    def bprop(self, x: Tensor, out: Tensor, dout: Tensor) -> tuple[Tensor]:
        return (self.backward(x, dout),)


class FusedSoftmaxFn(nn.Cell):
    """Softmax over the last axis: MindSpore's Softmax forward, a backward of one C++ pass per row; float32 only."""

    def __init__(self) -> None:
        super().__init__()
        self.softmax = ops.Softmax(-1)
        self.backward = custom_op("SoftmaxBackward")

    def construct(self, x: Tensor) -> Tensor:
        return self.softmax(x)

    def bprop(self, x: Tensor, out: Tensor, dout: Tensor) -> tuple[Tensor]:
        return (self.backward(out, dout),)


def _bias_softmax_grad_shapes(y, dy, bias):
    return y, bias


class FusedBiasSoftmaxFn(nn.Cell):
    """softmax(x + bias) over the last axis, the bias repeating over x's leading blocks (x (..., P rows, M) with bias
    (P rows, M) in the same row order: the attention's position bias, or bias + mask per window), one C++ pass each
    way; the backward also sums the bias gradient over the blocks. float32 only.
    """

    def __init__(self) -> None:
        super().__init__()
        self.forward = custom_op("BiasSoftmaxForward")
        self.backward = custom_op("BiasSoftmaxBackward", _bias_softmax_grad_shapes, _bias_softmax_grad_shapes)

    def construct(self, x: Tensor, bias: Tensor) -> Tensor:
        return self.forward(x, bias)

    def bprop(self, x: Tensor, bias: Tensor, out: Tensor, dout: Tensor) -> tuple[Tensor, Tensor]:
        return self.backward(out, dout, bias)


def _layer_norm_shapes(x, gamma, beta, epsilon):
    return x, [x[0], 1], [x[0], 1]


def _layer_norm_dtypes(x, gamma, beta, epsilon):
    return x, x, x


def _layer_norm_grad_shapes(x, gamma, *rest):
    return x, gamma, gamma


class FusedLayerNormFn(nn.Cell):
    """LayerNorm over the last axis of (R, C), each direction one C++ pass per row: the forward returns
    (y, mean, inv_std), the backward dx with the (C,) gradients of gamma and beta summed alongside. float32 only.
    """

    def __init__(self, epsilon: float) -> None:
        super().__init__()
        self.forward = custom_op("LayerNormForward", _layer_norm_shapes, _layer_norm_dtypes)
        self.backward = custom_op("LayerNormBackward", _layer_norm_grad_shapes, _layer_norm_grad_shapes)
        self.epsilon = Tensor([epsilon], DTYPE)

    def construct(self, x: Tensor, gamma: Tensor, beta: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        return self.forward(x, gamma, beta, self.epsilon)

    def bprop(self, x: Tensor, gamma: Tensor, beta: Tensor, out: tuple, dout: tuple) -> tuple[Tensor, ...]:
        return self.backward(x, gamma, out[1], out[2], dout[0])


def _placeholder_shape(*shapes):
    return [1]


def _placeholder_dtype(var, *rest):
    return var


class FusedAdamWUpdate(ops.Custom):
    """MindSpore's `ops.AdamWeightDecay` as one vectorized C++ pass: the same arguments, var, m and v updated in place
    (declared written, so the graph orders reads after it); returns a (1,) placeholder. float32 only.
    """

    __mindspore_signature__ = (
        sig.make_sig("var", sig.sig_rw.RW_WRITE),
        sig.make_sig("m", sig.sig_rw.RW_WRITE),
        sig.make_sig("v", sig.sig_rw.RW_WRITE),
        *(sig.make_sig(name) for name in ("lr", "beta1", "beta2", "epsilon", "decay", "gradient")),
    )

    def __init__(self) -> None:
        super().__init__(f"{library()}:AdamWUpdate", out_shape=_placeholder_shape, out_dtype=_placeholder_dtype,
                         func_type="aot")
        self.add_prim_attr("side_effect_mem", True)


def _float32_only(what: str):
    def out_dtype(*dtypes):
        others = sorted({str(d) for d in dtypes if "Float32" not in str(d)})  # Float32, Tensor[..], Ref[Tensor[..]]
        if others:
            raise TypeError(f"{what} computes float32 tensors only and was given {', '.join(others)}: use "
                            "optimizer.kernel=mindspore for parameters or gradients of other dtypes")
        return DTYPE
    return out_dtype


class GlobalNorm(ops.Custom):
    """sqrt(sum((factor * g) ** 2)) over every tensor g given, in one C++ pass: `(factor, *tensors) -> (1,)`, the sum
    in fixed blocks (its value does not depend on the thread count). float32 only."""

    def __init__(self) -> None:
        super().__init__(f"{library()}:GlobalNorm", out_shape=_placeholder_shape,
                         out_dtype=_float32_only("GlobalNorm"), func_type="aot")


@cache
def _update_all_class(count: int) -> type:
    """FusedAdamWUpdateAll's op class for `count` parameters: MindSpore reads which inputs are written from the class's
    signature, and here that depends on the count."""
    written = [sig.make_sig(f"{kind}{i}", sig.sig_rw.RW_WRITE) for kind in ("var", "m", "v") for i in range(count)]
    scalars = ("lr", "beta1", "beta2", "epsilon", "decay_factor", "unscale", "clip", "apply", "decays")
    signature = (*(sig.make_sig(name) for name in scalars), *written,
                 *(sig.make_sig(f"gradient{i}") for i in range(count)))
    return type(f"FusedAdamWUpdateAll{count}", (ops.Custom,), {"__mindspore_signature__": signature})


def FusedAdamWUpdateAll(count: int) -> ops.Custom:  # noqa: N802 - builds a Custom op, like a class
    """AdamW over `count` float32 parameters in one C++ call (fused_cpu.cc's AdamWUpdateAll): inputs lr, beta1, beta2,
    epsilon, decay_factor, unscale, clip, apply (scalars), decays (count,), then the parameters, first moments and
    second moments (updated in place) and the gradients, `count` each; each gradient is multiplied by unscale, then
    by clip (the train step's two passes), each parameter's decay by decay_factor; apply 0 changes nothing (an
    overflow-skipped step). Returns a (1,) placeholder."""
    op = _update_all_class(count)(f"{library()}:AdamWUpdateAll", out_shape=_placeholder_shape,
                                  out_dtype=_float32_only("AdamWUpdateAll"), func_type="aot")
    op.add_prim_attr("side_effect_mem", True)
    return op
