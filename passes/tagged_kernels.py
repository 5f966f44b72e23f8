"""What the CPU and GPU dispatch passes share: reading a tagged function and swapping it.

models/ marks each function it wants a hand-written kernel for with the attribute
``speccompile.kernel`` (the tag's one definition is models/quantization.py's
``KERNEL_ATTR``). DispatchCPUKernels and DispatchGPUKernels differ only in which kernel
they choose for a tag; reading the tag and the operand shapes, and putting the chosen
kernel in place, is the same for both, so it lives here rather than in one of them.
"""
from __future__ import annotations

from typing import Callable

import tvm
from tvm import tirx

from speccompile.models.quantization import KERNEL_ATTR

__all__ = ["KERNEL_ATTR", "OPAQUE", "kernel_tag", "param_dtype", "param_shape", "replace_tagged"]

OPAQUE = 8  # relax op_pattern kOpaque: keep FuseOps from merging our kernels


def kernel_tag(func: tirx.PrimFunc) -> str | None:
    """The function's ``speccompile.kernel`` tag (``matmul``, ``q4_matmul`` ...), or None."""
    return func.attrs[KERNEL_ATTR] if func.attrs is not None and KERNEL_ATTR in func.attrs else None


def param_shape(func: tirx.PrimFunc, i: int) -> tuple[int, ...]:
    """The static shape of the function's ``i``-th parameter (the kernels are built per shape)."""
    return tuple(int(d) for d in func.ty.params[i].shape)


def param_dtype(func: tirx.PrimFunc, i: int) -> str:
    """The dtype of the function's ``i``-th parameter."""
    return str(func.ty.params[i].dtype)


def replace_tagged(mod: tvm.IRModule, select: Callable[[tirx.PrimFunc], tirx.PrimFunc | None]) -> tvm.IRModule:
    """``mod`` with every PrimFunc for which ``select`` returns a kernel replaced by it.

    The replacement keeps the tag (later passes and the tests find our kernels by it) and
    is marked opaque so that FuseOps does not merge it with its neighbours."""
    updates = {}
    for gv, func in mod.functions.items():
        if isinstance(func, tirx.PrimFunc):
            new = select(func)
            if new is not None:
                updates[gv] = new.with_attr("op_pattern", OPAQUE).with_attr(KERNEL_ATTR, func.attrs[KERNEL_ATTR])
    if not updates:
        return mod
    mod = mod.shallow_copy() if hasattr(mod, "shallow_copy") else mod
    for gv, func in updates.items():
        mod[gv] = func
    return mod
