"""Hand-scheduled TensorIR kernels for the CPU (llvm): dense and q4 matmul, q4 take.

Every kernel is batch invariant by construction: each output element is one reduction
chain over K in a fixed order, and the row count M only decides how many accumulators
are live. A token's logits are then bit-identical whether it is decoded alone or
verified among others, which greedy losslessness of speculation depends on.

q4 kernels read weights in a 16-row tiled order, ``[N/16, K/8, 16]`` words (and
``[N/16, K/32, 16]`` scales), stored in the tensor's own ``[N, K/8]`` buffer: the runtime
permutes them once at load (see ``runtime/params.py``); the stored format on disk stays
q4f32_1/q4f16_1. One 16-lane vector then covers 16 output rows and each thread reads one
contiguous stream. Nibbles become floats by a bit trick, ``reinterpret(nib | 0x4B000000)``
equals ``2^23 + nib``, cheaper than an int-to-float convert.
"""
from __future__ import annotations

from tvm.script import tirx as T

TILE = 16  # output rows per q4 tile (one 512-bit vector of fp32)
M_BLOCK = 4  # rows of activations sharing one decode of the weights
MAGIC = 8388608.0 + 7.0  # 2^23 + the q4 zero point


def q4_is_tiled(out_features: int) -> bool:
    """The rule shared by the kernel dispatcher, the metadata and the loader."""
    return out_features % TILE == 0


def _lanes(k: int) -> int:
    for lanes in (16, 8, 4, 2):
        if k % lanes == 0:
            return lanes
    return 1


def dense_matmul(n: int, k: int, dtype: str):
    """y[m, n] = sum_k x[m, k] w[n, k]; K split into `lanes` interleaved partial sums."""
    lanes = _lanes(k)
    kc = k // lanes

    @T.prim_func(private=True)
    def kernel(var_x: T.handle, w: T.Buffer((n, k), dtype), var_y: T.handle):
        T.func_attr({"tir.noalias": True})
        m_dim = T.int64()
        x = T.match_buffer(var_x, (m_dim, k), dtype)
        y = T.match_buffer(var_y, (m_dim, n), dtype)
        for j in T.parallel(n):
            for m in range(m_dim):
                acc = T.decl_buffer((lanes,), "float32", scope="local")
                tot = T.decl_buffer((1,), "float32", scope="local")
                for l in T.vectorized(lanes):
                    acc[l] = T.float32(0)
                for c in range(kc):
                    for l in T.vectorized(lanes):
                        acc[l] = acc[l] + T.Cast("float32", x[m, c * lanes + l]) * T.Cast("float32", w[j, c * lanes + l])
                tot[0] = T.float32(0)
                for l in range(lanes):
                    tot[0] = tot[0] + acc[l]
                y[m, j] = T.Cast(dtype, tot[0])

    return kernel


def q4_matmul_tiled(n: int, k: int, dtype: str):
    """y[m, n] = sum_k x[m, k] dequant(w)[n, k] over tiled q4 storage (see module doc)."""
    kw, groups, L, MB = k // 8, k // 32, TILE, M_BLOCK

    @T.prim_func(private=True)
    def kernel(var_x: T.handle, qw: T.Buffer((n, kw), "uint32"), qs: T.Buffer((n, groups), dtype), var_y: T.handle):
        T.func_attr({"tir.noalias": True})
        m_dim = T.int64()
        x = T.match_buffer(var_x, (m_dim, k), dtype)
        y = T.match_buffer(var_y, (m_dim, n), dtype)
        wf = T.decl_buffer((n * kw,), "uint32", data=qw.data)  # flat views of the tiled storage
        sf = T.decl_buffer((n * groups,), dtype, data=qs.data)
        for t in T.parallel(n // L):
            # blocks of MB activation rows share each decoded weight vector
            for mo in range(m_dim // MB):
                acc = T.decl_buffer((MB, L), "float32", scope="local")
                gacc = T.decl_buffer((MB, L), "float32", scope="local")
                for mi in T.unroll(MB):
                    for l in T.vectorized(L):
                        acc[mi, l] = T.float32(0)
                for g in range(groups):
                    for mi in T.unroll(MB):
                        for l in T.vectorized(L):
                            gacc[mi, l] = T.float32(0)
                    for wd in T.unroll(4):
                        for r in T.unroll(8):
                            for mi in T.unroll(MB):
                                for l in T.vectorized(L):
                                    gacc[mi, l] = gacc[mi, l] + (T.reinterpret("float32", ((wf[(t * kw + g * 4 + wd) * L + l] >> T.uint32(r * 4)) & T.uint32(15)) | T.uint32(0x4B000000)) - T.float32(MAGIC)) * T.Cast("float32", x[mo * MB + mi, (g * 4 + wd) * 8 + r])
                    for mi in T.unroll(MB):
                        for l in T.vectorized(L):
                            acc[mi, l] = acc[mi, l] + gacc[mi, l] * T.Cast("float32", sf[(t * groups + g) * L + l])
                for mi in T.unroll(MB):
                    for l in T.vectorized(L):
                        y[mo * MB + mi, t * L + l] = T.Cast(dtype, acc[mi, l])
            # the remaining rows, one at a time, with the same per-element arithmetic
            for m in range(m_dim // MB * MB, m_dim):
                acc1 = T.decl_buffer((L,), "float32", scope="local")
                gacc1 = T.decl_buffer((L,), "float32", scope="local")
                for l in T.vectorized(L):
                    acc1[l] = T.float32(0)
                for g in range(groups):
                    for l in T.vectorized(L):
                        gacc1[l] = T.float32(0)
                    for wd in T.unroll(4):
                        for r in T.unroll(8):
                            for l in T.vectorized(L):
                                gacc1[l] = gacc1[l] + (T.reinterpret("float32", ((wf[(t * kw + g * 4 + wd) * L + l] >> T.uint32(r * 4)) & T.uint32(15)) | T.uint32(0x4B000000)) - T.float32(MAGIC)) * T.Cast("float32", x[m, (g * 4 + wd) * 8 + r])
                    for l in T.vectorized(L):
                        acc1[l] = acc1[l] + gacc1[l] * T.Cast("float32", sf[(t * groups + g) * L + l])
                for l in T.vectorized(L):
                    y[m, t * L + l] = T.Cast(dtype, acc1[l])

    return kernel


def q4_take_tiled(vocab: int, dim: int, dtype: str):
    """Embedding rows from tiled q4 storage: out[i, j] = dequant(w)[ids[i], j]."""
    kw, groups, L = dim // 8, dim // 32, TILE

    @T.prim_func(private=True)
    def kernel(qw: T.Buffer((vocab, kw), "uint32"), qs: T.Buffer((vocab, groups), dtype), var_ids: T.handle, var_out: T.handle):
        T.func_attr({"tir.noalias": True})
        n_ids = T.int64()
        ids = T.match_buffer(var_ids, (n_ids,), "int32")
        out = T.match_buffer(var_out, (n_ids, dim), dtype)
        wf = T.decl_buffer((vocab * kw,), "uint32", data=qw.data)
        sf = T.decl_buffer((vocab * groups,), dtype, data=qs.data)
        for i in range(n_ids):
            for j in range(dim):
                # row v sits in tile v // L at lane v % L
                out[i, j] = T.Cast(dtype, (T.reinterpret("float32", ((wf[((T.Cast("int64", ids[i]) // L) * kw + j // 8) * L + T.Cast("int64", ids[i]) % L] >> T.Cast("uint32", (j % 8) * 4)) & T.uint32(15)) | T.uint32(0x4B000000)) - T.float32(MAGIC)) * T.Cast("float32", sf[((T.Cast("int64", ids[i]) // L) * groups + j // 32) * L + T.Cast("int64", ids[i]) % L]))

    return kernel
