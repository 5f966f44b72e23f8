"""The residual add and the RMSNorm after it, as one GPU kernel.

Why: on a GPU a decode step is bound by the host launching kernels, not by the kernels
(the H200 check: SmolLM2-135M ran 372 launches in 3.4 ms of wall time for 0.8 ms of device
time). Each decoder layer added its attention and MLP outputs to the residual stream and
normalized the sum in four launches; this kernel does each add-and-normalize in one,
writing both the new residual stream and its normalized copy. 60 launches fewer per
SmolLM2 forward.

One work-group per token row: each thread sums the squares of its elements (indices
``tx, tx + 128, ...`` in increasing order), the 128 partials go through shared memory and
are summed in one fixed pairwise tree by every thread alike. A row's result depends on that
row alone, so the kernel is batch invariant like the rest of the forward.
"""
from __future__ import annotations


from tvm.script import tirx as T

from speccompile.kernels import kernel_cache

from speccompile.kernels.attention_gpu import tree_sum32

THREADS = 128


@T.macro
def _tree(part, out):
    """out[0] = part[0] + ... + part[127], the same pairwise order in every thread."""
    for t in T.unroll(64):
        out[t] = part[t] + part[t + 64]
    for t in T.unroll(32):
        out[t] = out[t] + out[t + 32]
    tree_sum32(out, 0, out)


@kernel_cache
def add_rms_norm_gpu(hidden: int, eps: float, dtype: str):
    """s = x + a (in ``dtype``, as the separate add did); y = s / sqrt(mean(s^2) + eps) * w,
    computed in fp32. x, a, s, y: [n, hidden]; w: [hidden]."""
    per = (hidden + THREADS - 1) // THREADS

    @T.prim_func(private=True)
    def kernel(var_x: T.handle, var_a: T.handle, w: T.Buffer((hidden,), dtype), var_s: T.handle, var_y: T.handle):
        T.func_attr({"tir.noalias": True, "op_pattern": 8, "tirx.is_scheduled": True})
        n = T.int64()
        x = T.match_buffer(var_x, (n, hidden), dtype)
        a = T.match_buffer(var_a, (n, hidden), dtype)
        s = T.match_buffer(var_s, (n, hidden), dtype)
        y = T.match_buffer(var_y, (n, hidden), dtype)
        for row in T.thread_binding(n, thread="blockIdx.x"):
            for tx in T.thread_binding(THREADS, thread="threadIdx.x"):
                part = T.decl_buffer((THREADS,), "float32", scope="shared")
                vals = T.decl_buffer((per,), dtype, scope="local")
                acc = T.decl_buffer((THREADS // 2,), "float32", scope="local")
                ss = T.decl_buffer((1,), "float32", scope="local")
                ss[0] = T.float32(0)
                for i in T.unroll(per):
                    if i * THREADS + tx < hidden:
                        vals[i] = x[row, i * THREADS + tx] + a[row, i * THREADS + tx]
                        s[row, i * THREADS + tx] = vals[i]
                        ss[0] = ss[0] + T.Cast("float32", vals[i]) * T.Cast("float32", vals[i])
                part[tx] = ss[0]
                T.tvm_storage_sync("shared")
                _tree(part, acc)
                for i in T.unroll(per):
                    if i * THREADS + tx < hidden:
                        y[row, i * THREADS + tx] = T.Cast(dtype, T.Cast("float32", vals[i]) * T.rsqrt(
                            acc[0] / T.float32(hidden) + T.float32(eps)) * T.Cast("float32", w[i * THREADS + tx]))

    return kernel
