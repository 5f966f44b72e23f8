"""DispatchGPUKernels: give the model's tagged kernels their GPU versions.

The GPU twin of DispatchCPUKernels: the tagged TE matmuls (``matmul``, ``q4_matmul``)
become the batch-invariant GEMV kernels of ``kernels/gpu_matmul.py`` -- or, with
``projections="tensor-core"`` (cuda sm_80+, fp16 activations; speccompile/compiler/compile.py
decides), the tensor-core kernels of ``kernels/gpu_matmul_mma.py`` (q4, and dense fp16 whose k
is a multiple of 32) -- the greedy
acceptance kernel ``accept_greedy`` its thread-parallel version (kernels/verification.py), and
``sampling_probs`` its block-per-row version (kernels/sampling.py), and ``accept_sampled`` its
block-per-sequence version (kernels/rejection_gpu.py). The
embedding gathers (``take``, ``q4_take``) are plain injective functions that dlight's
fallback rule schedules well, so they are left alone.
"""
from __future__ import annotations

import tvm
from tvm import tirx

from speccompile.kernels.attention_gpu import max_vector_lanes
from speccompile.kernels.rejection_gpu import accept_sampled_gpu
from speccompile.kernels.sampling import sampling_probs_gpu
from speccompile.kernels.verification import accept_greedy_gpu

from speccompile.kernels import gpu_matmul as K
from speccompile.kernels import gpu_matmul_mma as MMA
from speccompile.passes.tagged_kernels import kernel_tag, param_dtype, param_shape, replace_tagged


def select_kernel(func: tirx.PrimFunc, projections: str = "portable") -> tirx.PrimFunc | None:
    kind = kernel_tag(func)
    if kind == "matmul":
        n, k = param_shape(func, 1)
        if projections == "tensor-core" and param_dtype(func, 1) == "float16" and k % MMA.GROUP == 0:
            return MMA.dense_mma(n, k)
        return K.dense_gemv(n, k, param_dtype(func, 1), max_lanes=max_vector_lanes())
    if kind == "q4_matmul":
        n, kw = param_shape(func, 1)
        if projections == "tensor-core":
            return MMA.q4_mma(n, kw * 8)
        return K.q4_gemv(n, kw * 8, param_dtype(func, 2), max_lanes=max_vector_lanes())
    if kind == "accept_greedy":
        return accept_greedy_gpu(int(func.ty.params[0].shape[1]))  # logits [n, vocab]
    if kind == "sampling_probs":
        return sampling_probs_gpu(int(func.ty.params[0].shape[1]))  # logits [n, vocab]
    if kind == "accept_sampled":
        return accept_sampled_gpu(int(func.ty.params[0].shape[1]))  # p [n, vocab]
    return None


@tvm.transform.module_pass(opt_level=0, name="DispatchGPUKernels")
class DispatchGPUKernels:
    def __init__(self, projections: str = "portable"):
        self.projections = projections  # "portable" | "tensor-core"

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        return replace_tagged(mod, lambda func: select_kernel(func, self.projections))
