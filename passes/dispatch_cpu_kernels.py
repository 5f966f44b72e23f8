"""DispatchCPUKernels: give the model's tagged matmul/take functions our CPU kernels.

The model emits each projection as a TE compute tagged ``speccompile.kernel``
(``matmul``, ``q4_matmul``, ``q4_take``). On llvm this rule swaps each one for the
hand-scheduled kernel of the same signature from ``cpu_kernels.py``. Untagged
functions, and shapes a kernel does not cover, are left to the default lowering.
"""
from __future__ import annotations

import tvm
from tvm import tirx

from . import cpu_kernels as K

KERNEL_ATTR = "speccompile.kernel"
OPAQUE = 8  # relax op_pattern kOpaque: keep FuseOps from merging our kernels


def _shape(func: tirx.PrimFunc, i: int) -> tuple[int, ...]:
    return tuple(int(d) for d in func.ty.params[i].shape)


def _dtype(func: tirx.PrimFunc, i: int) -> str:
    return str(func.ty.params[i].dtype)


def select_kernel(func: tirx.PrimFunc, int8_isa: str | None = None) -> tirx.PrimFunc | None:
    """The replacement kernel for a tagged function, or None to keep it."""
    kind = func.attrs[KERNEL_ATTR] if func.attrs is not None and KERNEL_ATTR in func.attrs else None
    if kind == "matmul":
        n, k = _shape(func, 1)
        tiled = K.dense_is_tiled(n, k)
        return (K.dense_matmul_tiled if tiled else K.dense_matmul)(n, k, _dtype(func, 1))
    if kind == "take":
        v, d = _shape(func, 0)
        return K.dense_take_tiled(v, d, _dtype(func, 0)) if K.dense_is_tiled(v, d) else None
    if kind == "q4_matmul":
        n, kw = _shape(func, 1)
        if not K.q4_is_tiled(n):
            return None
        if int8_isa:
            return K.q4_matmul_vnni(n, kw * 8, _dtype(func, 2), int8_isa)
        return K.q4_matmul_tiled(n, kw * 8, _dtype(func, 2))
    if kind == "q4_take":
        v, kw = _shape(func, 0)
        return K.q4_take_tiled(v, kw * 8, _dtype(func, 1)) if K.q4_is_tiled(v) else None
    return None


@tvm.transform.module_pass(opt_level=0, name="DispatchCPUKernels")
class DispatchCPUKernels:
    """``int8_isa``: ``"avx512vnni"`` or ``"avx2"`` selects the int8-activation q4 kernel for
    that instruction set (see ``cpu_kernels.q4_matmul_vnni``); None keeps the float one."""

    def __init__(self, int8_isa: str | None = None):
        self.int8_isa = int8_isa

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        updates = {}
        for gv, func in mod.functions.items():
            if isinstance(func, tirx.PrimFunc):
                new = select_kernel(func, self.int8_isa)
                if new is not None:
                    updates[gv] = new.with_attr("op_pattern", OPAQUE).with_attr(KERNEL_ATTR, func.attrs[KERNEL_ATTR])
        if not updates:
            return mod
        mod = mod.shallow_copy() if hasattr(mod, "shallow_copy") else mod
        for gv, func in updates.items():
            mod[gv] = func
        return mod
