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

The q4 matmul with int8 activations, which CPUs with integer dot products run instead of
``q4_matmul_tiled``, is ``cpu_matmul_int8.py``.
"""
from __future__ import annotations


import tvm
from tvm import tirx
from tvm.script import tirx as T

from speccompile.kernels import kernel_cache

TILE = 16  # output rows per q4 tile (one 512-bit vector of fp32)
# Per-task scratch (accumulators): "local" buffers become TVMBackendAllocWorkspace heap calls
# on the CPU, once per task, and their values then live in memory; "global" ones inside a
# parallel body become stack allocas that LLVM keeps in registers (2x on the q4 kernels).
STACK = "global"
MAGIC = 8388608.0 + 7.0  # 2^23 + the q4 zero point


def q4_is_tiled(out_features: int) -> bool:
    """The rule shared by the kernel dispatcher, the metadata and the loader."""
    return out_features % TILE == 0


def dense_is_tiled(out_features: int, in_features: int) -> bool:
    """Same for plain (q0) weights: 16-row tiles, K in whole 32-wide groups."""
    return out_features % TILE == 0 and in_features % 32 == 0


def is_tiled_param(name: str, shape: list[int]) -> bool:
    """Which stored tensors the CPU kernels read in the 16-row tiled order."""
    if name.endswith((".q_weight", ".q_scale")):
        return q4_is_tiled(shape[0])
    return name.endswith(".weight") and len(shape) == 2 and dense_is_tiled(shape[0], shape[1])


def _lanes(k: int) -> int:
    for lanes in (16, 8, 4, 2):
        if k % lanes == 0:
            return lanes
    return 1


@kernel_cache
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
                acc = T.decl_buffer((lanes,), "float32", scope=STACK)
                tot = T.decl_buffer((1,), "float32", scope=STACK)
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


def _nib(wf, word_idx, r):
    """float(q - 7) of nibble r of a packed word: reinterpret(nib | 0x4B000000) - (2^23 + 7)."""
    shift = tirx.const(r * 4, "uint32") if isinstance(r, int) else tirx.Cast("uint32", r * 4)
    bits = ((wf[word_idx] >> shift) & tirx.const(15, "uint32")) | tirx.const(0x4B000000, "uint32")
    return tirx.reinterpret("float32", bits) - tirx.const(MAGIC, "float32")


def _group_sum(wf, x, row, t, g, l, kw):
    """Sum over one 32-weight group of w * x for output lane l, as four 8-term chains
    added pairwise: a fixed order (batch invariant) with enough independent FMAs to hide
    their latency. Built at parse time into one expression, so no partial sum touches
    memory."""
    parts = []
    for wd in range(4):
        word_idx = (t * kw + g * 4 + wd) * TILE + l
        acc = None
        for r in range(8):
            term = _nib(wf, word_idx, r) * tirx.Cast("float32", x[row, (g * 4 + wd) * 8 + r])
            acc = term if acc is None else acc + term
        parts.append(acc)
    return (parts[0] + parts[1]) + (parts[2] + parts[3])


def _dense_group_sum(wf, x, row, t, g, l, k):
    """32 products of one K-group for output lane l as four 8-term chains added pairwise."""
    parts = []
    for c in range(4):
        acc = None
        for r in range(8):
            kk = g * 32 + c * 8 + r
            term = tirx.Cast("float32", wf[(t * k + kk) * TILE + l]) * tirx.Cast("float32", x[row, kk])
            acc = term if acc is None else acc + term
        parts.append(acc)
    return (parts[0] + parts[1]) + (parts[2] + parts[3])


@kernel_cache
def dense_matmul_tiled(n: int, k: int, dtype: str):
    """y[m, n] = sum_k x[m, k] w[n, k] over weights stored as 16-row tiles [n/16, k, 16]:
    each thread streams contiguous memory and one 16-lane FMA covers 16 outputs."""
    groups, L = k // 32, TILE

    @T.prim_func(private=True)
    def kernel(var_x: T.handle, w: T.Buffer((n, k), dtype), var_y: T.handle):
        T.func_attr({"tir.noalias": True})
        m_dim = T.int64()
        x = T.match_buffer(var_x, (m_dim, k), dtype)
        y = T.match_buffer(var_y, (m_dim, n), dtype)
        wf = T.decl_buffer((n * k,), dtype, data=w.data)
        for t in T.parallel(n // L):
            for m in range(m_dim):
                acc = T.decl_buffer((L,), "float32", scope=STACK)
                for l in T.vectorized(L):
                    acc[l] = T.float32(0)
                for g in range(groups):
                    for l in T.vectorized(L):
                        acc[l] = acc[l] + _dense_group_sum(wf, x, m, t, g, l, k)
                for l in T.vectorized(L):
                    y[m, t * L + l] = T.Cast(dtype, acc[l])

    return kernel


@kernel_cache
def dense_take_tiled(vocab: int, dim: int, dtype: str):
    """Embedding rows from a tiled table: out[i, j] = w[ids[i], j]."""
    L = TILE

    @T.prim_func(private=True)
    def kernel(w: T.Buffer((vocab, dim), dtype), var_ids: T.handle, var_out: T.handle):
        T.func_attr({"tir.noalias": True})
        n_ids = T.int64()
        ids = T.match_buffer(var_ids, (n_ids,), "int32")
        out = T.match_buffer(var_out, (n_ids, dim), dtype)
        wf = T.decl_buffer((vocab * dim,), dtype, data=w.data)
        for i in range(n_ids):
            for j in range(dim):
                out[i, j] = wf[((T.Cast("int64", ids[i]) // L) * dim + j) * L + T.Cast("int64", ids[i]) % L]

    return kernel


@kernel_cache
def q4_matmul_tiled(n: int, k: int, dtype: str):
    """y[m, n] = sum_k x[m, k] dequant(w)[n, k] over tiled q4 storage (see module doc).

    Rows of x go in pairs (the pair shares each decoded weight vector), then a single
    last row; both use the identical per-element expression."""
    kw, groups, L = k // 8, k // 32, TILE

    @T.macro
    def rows(wf, sf, x, y, t, base, mb):
        acc = T.decl_buffer((mb, L), "float32", scope=STACK)
        for mi in T.unroll(mb):
            for l in T.vectorized(L):
                acc[mi, l] = T.float32(0)
        for g in range(groups):
            for mi in T.unroll(mb):
                for l in T.vectorized(L):
                    acc[mi, l] = acc[mi, l] + _group_sum(wf, x, base + mi, t, g, l, kw) * T.Cast("float32", sf[(t * groups + g) * L + l])
        for mi in T.unroll(mb):
            for l in T.vectorized(L):
                y[base + mi, t * L + l] = T.Cast(dtype, acc[mi, l])

    @T.prim_func(private=True)
    def kernel(var_x: T.handle, qw: T.Buffer((n, kw), "uint32"), qs: T.Buffer((n, groups), dtype), var_y: T.handle):
        T.func_attr({"tir.noalias": True})
        m_dim = T.int64()
        x = T.match_buffer(var_x, (m_dim, k), dtype)
        y = T.match_buffer(var_y, (m_dim, n), dtype)
        wf = T.decl_buffer((n * kw,), "uint32", data=qw.data)  # flat views of the tiled storage
        sf = T.decl_buffer((n * groups,), dtype, data=qs.data)
        for t in T.parallel(n // L):
            for mo in range(m_dim // 2):
                rows(wf, sf, x, y, t, mo * 2, 2)
            if m_dim % 2 == 1:
                rows(wf, sf, x, y, t, m_dim - 1, 1)

    return kernel


@kernel_cache
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
