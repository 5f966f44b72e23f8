"""DispatchGPUKernels: give the model's tagged kernels their GPU versions.

The GPU twin of DispatchCPUKernels: the tagged TE matmuls (``matmul``, ``q4_matmul``)
become the batch-invariant GEMV kernels of ``gpu_kernels.py``, the greedy
acceptance kernel ``accept_greedy`` its thread-parallel version (models/verification.py), and
``sampling_probs`` its block-per-row version (models/sampling_kernels.py; the
rejection-sampling walk, serial per sequence, is bound by BindGPUThreads). The
embedding gathers (``take``, ``q4_take``) are plain injective functions that dlight's
fallback rule schedules well, so they are left alone.
"""
from __future__ import annotations

import tvm
from tvm import tirx

from speccompile.models.sampling_kernels import sampling_probs_gpu
from speccompile.models.verification import accept_greedy_gpu

from . import gpu_kernels as K
from .dispatch_cpu_kernels import KERNEL_ATTR, OPAQUE, _dtype, _shape


def select_kernel(func: tirx.PrimFunc) -> tirx.PrimFunc | None:
    kind = func.attrs[KERNEL_ATTR] if func.attrs is not None and KERNEL_ATTR in func.attrs else None
    if kind == "matmul":
        n, k = _shape(func, 1)
        return K.dense_gemv(n, k, _dtype(func, 1))
    if kind == "q4_matmul":
        n, kw = _shape(func, 1)
        return K.q4_gemv(n, kw * 8, _dtype(func, 2))
    if kind == "accept_greedy":
        return accept_greedy_gpu(int(func.ty.params[0].shape[1]))  # logits [n, vocab]
    if kind == "sampling_probs":
        return sampling_probs_gpu(int(func.ty.params[0].shape[1]))  # logits [n, vocab]
    return None


@tvm.transform.module_pass(opt_level=0, name="DispatchGPUKernels")
class DispatchGPUKernels:
    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        updates = {}
        for gv, func in mod.functions.items():
            if isinstance(func, tirx.PrimFunc):
                new = select_kernel(func)
                if new is not None:
                    updates[gv] = new.with_attr("op_pattern", OPAQUE).with_attr(KERNEL_ATTR, func.attrs[KERNEL_ATTR])
        for gv, func in updates.items():
            mod[gv] = func
        return mod
