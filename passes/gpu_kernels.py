"""Hand-written TensorIR kernels for GPU targets (cuda, opencl, metal): dense and q4 GEMV.

One thread block computes ``ROWS`` outputs of one token: each of its ``ROWS`` warps owns
an output row, its 32 lanes stride over the packed weight words (coalesced reads), and
a fixed shared-memory tree sums the 32 partial sums. The token index is a grid axis, so
every output element is reduced in the same order whatever the number of tokens: a
verified token gets bit-identical logits to the same token decoded alone (batch
invariance, which greedy losslessness of speculation depends on). Weights stay in the
stored q4f16_1/q4f32_1 layout (GPU targets skip the CPU's 16-row tiling); accumulation
is fp32 even for fp16 models.

These kernels are correct for any token count; for long prefills a tiled GEMM would
reuse each weight across tokens and be faster, at the cost of a second reduction order.
"""
from __future__ import annotations

from tvm.script import tirx as T

ROWS = 4  # output rows (warps) per block
LANES = 32  # threads per row: one warp
PACK, GROUP = 8, 32  # q4 nibbles per word, weights per scale


@T.macro
def _lane_tree_sum(red, part, ty, tx):
    """red[ty, 0] = sum of red[ty, 0:32], added in one fixed pairwise order.

    Each halving step reads into a register, syncs, then writes, so no sync sits inside
    a branch (TVM's sync planner refuses that)."""
    for step in T.unroll(5):
        T.tvm_storage_sync("shared")
        if tx < T.shift_right(16, step):
            part[0] = red[ty, tx] + red[ty, tx + T.shift_right(16, step)]
        T.tvm_storage_sync("shared")
        if tx < T.shift_right(16, step):
            red[ty, tx] = part[0]
    T.tvm_storage_sync("shared")


def q4_gemv(n: int, k: int, dtype: str):
    """y[m, n] = sum_k x[m, k] * (nibble(qw[n, k/8], k%8) - 7) * qs[n, k/32]."""
    kw, kg = k // PACK, k // GROUP
    steps = (kw + LANES - 1) // LANES
    blocks = (n + ROWS - 1) // ROWS

    @T.prim_func(private=True)
    def kernel(var_x: T.handle, qw: T.Buffer((n, kw), "uint32"), qs: T.Buffer((n, kg), dtype), var_y: T.handle):
        T.func_attr({"tir.noalias": True, "tirx.is_scheduled": True})
        m_dim = T.int64()
        x = T.match_buffer(var_x, (m_dim, k), dtype)
        y = T.match_buffer(var_y, (m_dim, n), dtype)
        for bm in T.thread_binding(m_dim, thread="blockIdx.y"):
            for bn in T.thread_binding(blocks, thread="blockIdx.x"):
                for ty in T.thread_binding(ROWS, thread="threadIdx.y"):
                    for tx in T.thread_binding(LANES, thread="threadIdx.x"):
                        red = T.decl_buffer((ROWS, LANES), "float32", scope="shared")
                        acc = T.decl_buffer((1,), "float32", scope="local")
                        acc[0] = T.float32(0)
                        for i in range(steps):
                            if bn * ROWS + ty < n and i * LANES + tx < kw:
                                for j in T.unroll(PACK):
                                    acc[0] = acc[0] + T.Cast("float32", x[bm, (i * LANES + tx) * PACK + j]) * (
                                        T.Cast("float32", T.bitwise_and(
                                            T.shift_right(qw[bn * ROWS + ty, i * LANES + tx], T.uint32(j * 4)),
                                            T.uint32(15))) - T.float32(7)
                                    ) * T.Cast("float32", qs[bn * ROWS + ty, (i * LANES + tx) // 4])
                        red[ty, tx] = acc[0]
                        _lane_tree_sum(red, acc, ty, tx)
                        if tx == 0 and bn * ROWS + ty < n:
                            y[bm, bn * ROWS + ty] = T.Cast(dtype, red[ty, 0])

    return kernel


def dense_gemv(n: int, k: int, dtype: str):
    """y[m, n] = sum_k x[m, k] * w[n, k], lanes striding over k."""
    steps = (k + LANES - 1) // LANES
    blocks = (n + ROWS - 1) // ROWS

    @T.prim_func(private=True)
    def kernel(var_x: T.handle, w: T.Buffer((n, k), dtype), var_y: T.handle):
        T.func_attr({"tir.noalias": True, "tirx.is_scheduled": True})
        m_dim = T.int64()
        x = T.match_buffer(var_x, (m_dim, k), dtype)
        y = T.match_buffer(var_y, (m_dim, n), dtype)
        for bm in T.thread_binding(m_dim, thread="blockIdx.y"):
            for bn in T.thread_binding(blocks, thread="blockIdx.x"):
                for ty in T.thread_binding(ROWS, thread="threadIdx.y"):
                    for tx in T.thread_binding(LANES, thread="threadIdx.x"):
                        red = T.decl_buffer((ROWS, LANES), "float32", scope="shared")
                        acc = T.decl_buffer((1,), "float32", scope="local")
                        acc[0] = T.float32(0)
                        for i in range(steps):
                            if bn * ROWS + ty < n and i * LANES + tx < k:
                                acc[0] = acc[0] + T.Cast("float32", x[bm, i * LANES + tx]) * T.Cast(
                                    "float32", w[bn * ROWS + ty, i * LANES + tx])
                        red[ty, tx] = acc[0]
                        _lane_tree_sum(red, acc, ty, tx)
                        if tx == 0 and bn * ROWS + ty < n:
                            y[bm, bn * ROWS + ty] = T.Cast(dtype, red[ty, 0])

    return kernel
