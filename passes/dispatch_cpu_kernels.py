"""DispatchCPUKernels: give the model's tagged matmul/take functions our CPU kernels.

The model emits each projection as a TE compute tagged ``speccompile.kernel``
(``matmul``, ``q4_matmul``, ``q4_take``). On llvm this rule swaps each one for the
hand-scheduled kernel of the same signature from ``kernels/cpu_matmul.py``. Untagged
functions, and shapes a kernel does not cover, are left to the default lowering.
(Reading the tag and swapping the kernel in, shared with DispatchGPUKernels, is
passes/tagged_kernels.py.)
"""
from __future__ import annotations

import tvm
from tvm import tirx

from speccompile.kernels import cpu_matmul as K
from speccompile.kernels.cpu_matmul_int8 import q4_matmul_int8
from speccompile.passes.tagged_kernels import kernel_tag, param_dtype, param_shape, replace_tagged


def select_kernel(func: tirx.PrimFunc, int8_isa: str | None = None) -> tirx.PrimFunc | None:
    """The replacement kernel for a tagged function, or None to keep it."""
    kind = kernel_tag(func)
    if kind == "matmul":
        n, k = param_shape(func, 1)
        tiled = K.dense_is_tiled(n, k)
        return (K.dense_matmul_tiled if tiled else K.dense_matmul)(n, k, param_dtype(func, 1))
    if kind == "take":
        v, d = param_shape(func, 0)
        return K.dense_take_tiled(v, d, param_dtype(func, 0)) if K.dense_is_tiled(v, d) else None
    if kind == "q4_matmul":
        n, kw = param_shape(func, 1)
        if not K.q4_is_tiled(n):
            return None
        if int8_isa:
            return q4_matmul_int8(n, kw * 8, param_dtype(func, 2), int8_isa)
        return K.q4_matmul_tiled(n, kw * 8, param_dtype(func, 2))
    if kind == "q4_take":
        v, kw = param_shape(func, 0)
        return K.q4_take_tiled(v, kw * 8, param_dtype(func, 1)) if K.q4_is_tiled(v) else None
    return None


@tvm.transform.module_pass(opt_level=0, name="DispatchCPUKernels")
class DispatchCPUKernels:
    """``int8_isa`` (``kernels/cpu_matmul_int8.INT8_ISAS``) selects the int8-activation q4 kernel
    for that instruction set (``q4_matmul_int8``); None keeps the float one."""

    def __init__(self, int8_isa: str | None = None):
        self.int8_isa = int8_isa

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        return replace_tagged(mod, lambda func: select_kernel(func, self.int8_isa))
