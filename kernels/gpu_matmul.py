"""Hand-written TensorIR kernels for GPU targets (cuda, opencl, metal): dense and q4 projections
for small token counts that read every weight once per chunk of MC token rows.

Why: decoding is bound by weight traffic, so speculation pays on a GPU only if verifying k
drafts reads the weights about once, as one decode step does. The first kernels here put the
token index on ``blockIdx.y``: a forward of M rows read every weight M times.

Layout: a block owns ``ROWS * NR`` output rows (``ROWS`` warps of ``NR`` rows each) and one
chunk of ``MC`` token rows (the chunk index is ``blockIdx.y``, ``ceil(M / MC)`` chunks). The
32 lanes of a warp stride over k: at each k-step a lane loads and decodes its weight word(s)
once, then for every token row of the chunk adds ``acc + x * w`` into that row's register
accumulator. The lane partials go through shared memory, and one thread per (output row,
token row) sums its 32 in a fixed pairwise tree and writes the output. The k-loop comes in
three copies chosen per block, uniformly: a full chunk (no row guards), a single row (decode:
no guards, no dead rows) and a partial chunk (a uniform guard per row); each adds exactly
``acc + x * w`` per element, so the choice changes no bit.

q4 specifics (``q4_gemv``). A lane's k-step is a lane-chunk of ``WORDS`` = 4 q4 words of a
row: one scale group, one 16-byte load per output row (run e's kernel loaded one 4-byte word
per lane and step). A matrix of few output rows and long ones splits its k over the block's
warps as well (``q4_split``): on the H100, run e's down projection of the Qwen2.5-1.5B shape
(1,536 x 8,960) had 768 warps for 132 SMs and took 19 us, ~7x the time its 7.7 MB take at
copy bandwidth; split 4 ways, 3,072 warps each keep two 16-byte loads in flight per lane. The
split warps' sums are added in warp order after each warp's own tree. Which k a partial owns
depends on the shape only (the lane-chunk and the split), so the invariance below holds.

Batch invariance (greedy losslessness rests on it): y[m, n] is, for every M and every
position of row m in its chunk, the same operations in the same order -- lane tx sums
``acc = acc + x[m, kk] * w[n, kk]`` over its k indices in increasing order (w decoded by one
expression, shared by all rows), then the same pairwise tree over lanes, then one cast. Rows of
a partial chunk past M are skipped (no reads, no writes) and no value crosses token rows, so
neither M nor MC, NR or ROWS changes a bit of any output (tests/kernels/test_gpu_kernels.py checks
this). Weights stay in the stored q4f16_1/q4f32_1 layout (GPU targets skip the CPU's 16-row
tiling); accumulation is fp32 even for fp16 models.

MC = 8: chain verification up to draft length 7 (k + 1 rows), or 2 sequences with 3 drafts
each, read the weights once; 16 and 32 rows read them 2 and 4 times. Per lane: MC * NR = 16
fp32 accumulators, 8 * NR decoded weights, 8 activations -- ptxas (sm_90) reports 54-72
registers and no spills, far under the 255 a 128-thread block may use, and modest for
Adreno/Mali register files. Shared: ROWS * NR * MC * 33 fp32 = 8.25 KiB per block (OpenCL
guarantees 32 KiB). Work-group: 32 x ROWS = 128 items (PoCL/Adreno/Mali allow >= 128).

NR = 2 output rows per warp: each activation a lane loads serves NR weight rows. Per q4 word
(4 weight bytes) a lane loads 8 activations per token row, 16 B at fp16: at 8 rows 128 B, 32x
the weight bytes, through an L1 only ~11x faster than HBM on an H100 (~33 vs 3 TB/s). NR = 2
halves that; a larger NR cuts it further but leaves fewer blocks for small matrices.

Bandwidth (H100 SXM: 3.35 TB/s HBM3, ~3.0 TB/s measured copy; W = weight bytes): before, a
forward of M rows read M * W (L2, 50 MB, absorbs some re-reads of one matrix); now
ceil(M / 8) * W, plus M * k activations per projection (< 1% of W for M <= 32).
  SmolLM2-135M q4f16_1, W ~ 0.1 GB: 33 us per pass; 8 rows: 267 us -> 33 us of weight traffic.
  Qwen2.5-1.5B q4f16_1, W ~ 0.9 GB: 300 us per pass; 8 rows: 2.4 ms -> 0.3 ms.
The bandwidth-implied 8-row/1-row forward ratio thus falls from ~8x to ~1x for both (SmolLM2's
forward is dominated by ~300 kernel launches anyway). What bounds it next is on-chip: at 3.0
TB/s q4f16_1 streams 5.3e12 weights/s; 8 rows need 8 fp32 FMAs each, 43e12 FMA/s against the
H100's 33.5e12 (~1.3x), and 16x the weight bytes in L1 activation loads (~1.45x). So expect
~1.3-1.5x for 8 rows of Qwen2.5-1.5B, and ~2x+ for 16 (two passes) -- packed fp16 (HFMA2) or
tensor-core mma, which keep the invariance if every M takes the same path, are the next step.
Unmeasured on a GPU so far (`make gpu-check`). Long prefills want a tiled GEMM.
"""
from __future__ import annotations


import numpy as np
from tvm.script import tirx as T

from speccompile.kernels import kernel_cache

from speccompile.kernels.activation import GATED
from speccompile.kernels.attention_gpu import tree_sum32

ROWS = 4  # warps per block
NR = 2  # output rows per warp: a block owns ROWS * NR output rows
LANES = 32  # threads per warp, striding over k
MC = 8  # token rows per chunk (blockIdx.y): each weight is read once per chunk
PACK, GROUP = 8, 32  # q4 nibbles per uint32 word, weights per scale
PITCH = LANES + 1  # shared row pitch: a lane reading its row's 32 partials hits its own bank
VEC_BYTES = 16  # widest portable vector load (float4 / half8)
MAGIC = 0x4B000000  # bits of 2.0**23: as_float(MAGIC | q) == 2**23 + q exactly for q < 2**23
WORDS = 4  # q4 words per lane-chunk: one scale group, one 16-byte load per output row
TARGET_WARPS = 4096  # warps in flight a projection should offer (an H100: 132 SMs x 64 warp slots = 8,448)


def _vec(dtype: str, max_lanes: int) -> int:
    """Elements per vector load of ``dtype``: 16 bytes, at most ``max_lanes`` (Metal has no
    vectors over 4 lanes, so no half8)."""
    return min(max_lanes, VEC_BYTES // np.dtype(dtype).itemsize)


@T.macro
def _chunk_rows(add_row, x, acc, wl, xl, c, mc, m_dim, nrows, guarded, word):
    """add_row for each of the chunk's ``nrows`` token rows at one k-step (the weights decoded
    once for all of them); ``guarded``: rows past m_dim are skipped, uniformly per row."""
    for r in T.unroll(nrows):
        if guarded:
            if c * mc + r < m_dim:
                add_row(x, acc, wl, xl, c * mc + r, r, word)
        else:
            add_row(x, acc, wl, xl, c * mc + r, r, word)


@T.macro
def _reduce_and_store(red, acc, part, y, dtype, c, m_dim, row0, n, ty, tx, mc, nr):
    """Every lane's nr * mc partials into shared memory; then lane p = o * mc + r gathers the
    32 partials of (output row row0 + o, token row c * mc + r), sums them and writes y."""
    for p in T.unroll(nr * mc):
        red[(ty * nr * mc + p) * PITCH + tx] = acc[p]
    T.tvm_storage_sync("shared")
    if tx < nr * mc and c * mc + tx % mc < m_dim and row0 + tx // mc < n:
        for lane in T.unroll(LANES):
            part[lane] = red[(ty * nr * mc + tx) * PITCH + lane]
        tree_sum32(part, 0, part)  # the lanes' partials in one fixed order: one barrier, not ten
        y[c * mc + tx % mc, row0 + tx // mc] = T.Cast(dtype, part[0])


@T.macro
def _split_total(part, at, sums, first, step, split):
    """part[at] = the ``split`` warps' sums ``sums[first + s * step]`` added in warp order, in
    one fixed pairwise tree: v0, v0 + v1, or (v0 + v1) + (v2 + v3)."""
    for s in T.unroll(split):
        part[at + s] = sums[first + s * step]
    if split > 1:
        part[at] = part[at] + part[at + 1]
    if split == 4:
        part[at + 2] = part[at + 2] + part[at + 3]
        part[at] = part[at] + part[at + 2]


@T.macro
def _reduce_combine(red, sums, acc, part, y, dtype, c, m_dim, base, stride, n, ty, tx, mc, nr, split, gated):
    """As ``_reduce_and_store``, for ``split`` warps sharing output rows and for a gated
    epilogue: each warp's lane p = o * mc + r sums its 32 partials into ``sums``; then the row
    group's first warp adds the split warps' sums (``_split_total``) and writes y -- or, gated,
    y[r, base] = act(gate) * up from the rows base (o = 0) and base + stride (o = 1), each
    rounded to ``dtype`` first, as the separate activation kernel read them."""
    for p in T.unroll(nr * mc):
        red[(ty * nr * mc + p) * PITCH + tx] = acc[p]
    T.tvm_storage_sync("shared")
    if tx < nr * mc:
        for lane in T.unroll(LANES):
            part[lane] = red[(ty * nr * mc + tx) * PITCH + lane]
        tree_sum32(part, 0, part)
        sums[ty * nr * mc + tx] = part[0]
    T.tvm_storage_sync("shared")
    if gated is None:
        if ty % split == 0 and tx < nr * mc and c * mc + tx % mc < m_dim and base + tx // mc * stride < n:
            _split_total(part, 0, sums, ty * nr * mc + tx, nr * mc, split)
            y[c * mc + tx % mc, base + tx // mc] = T.Cast(dtype, part[0])
    else:
        if ty % split == 0 and tx < mc and c * mc + tx < m_dim and base < stride:
            _split_total(part, 0, sums, ty * nr * mc + tx, nr * mc, split)  # o = 0: the gate
            _split_total(part, 4, sums, ty * nr * mc + mc + tx, nr * mc, split)  # o = 1: the up row
            y[c * mc + tx, base] = T.Cast(dtype, GATED[gated](T.Cast("float32", T.Cast(dtype, part[0])),
                                                              T.Cast("float32", T.Cast(dtype, part[4]))))


def q4_split(n: int, k: int, nr: int = NR, rows: int = ROWS, words: int = WORDS) -> int:
    """Warps of a block that share its output rows and split their k (1, 2 or 4; at most
    ``rows``): enough warps in flight for a matrix of few output rows and long ones, a shape
    fact, never a function of the token count. Qwen2.5-1.5B's down projection (1,536 x 8,960)
    had 768 warps of 2 rows each for an H100's 132 SMs (run e: 19 us per call, ~7x its bytes'
    time); split 4 ways it has 3,072. A split needs 32 lane-chunks per warp at least."""
    warps, chunks = -(-n // nr), k // (PACK * words)
    split = 1
    while split * 2 <= rows and rows % (split * 2) == 0 and warps * split < TARGET_WARPS and chunks >= 32 * split * 2:
        split *= 2
    return split


@kernel_cache
def q4_gemv(n: int, k: int, dtype: str, mc: int = MC, nr: int = NR, rows: int = ROWS, max_lanes: int = 8,
            words: int = WORDS, split: int | None = None, gated: str | None = None):
    """y[m, n] = sum_k x[m, k] * w[n, k], w = (nibble(qw[n, k/8], k%8) - 7) * qs[n, k/32].

    ``gated`` (an activation of kernels/activation.py's GATED): the MLP's gate and up
    projections with their activation, y[m, j] = act(g[m, j]) * g[m, inter + j] (n = 2 * inter
    weight rows, y [m, inter]): a warp's two output rows are j and inter + j, so the epilogue
    has both, and the activation kernel's launch and the [m, 2 * inter] round trip go.

    A lane-chunk is ``words`` consecutive q4 words of an output row (4: one scale group, one
    16-byte load per row; 1: one word, run e's kernel, kept for the GPU check's kernel bench).
    The ``split`` warps of a row group (``q4_split`` by default) own partials p = s * 32 + tx;
    partial p adds lane-chunks p, p + 32 * split, ... in increasing k, its 8 * words weights
    decoded once for all token rows of the chunk; an activation load per token row is one
    16-byte vector (two at fp32). Each warp sums its 32 partials (``tree_sum32``), and the
    split warps' sums are added in warp order ((s0 + s1) + (s2 + s3)). Both ``words`` and
    ``split`` decide which k each partial owns, so they change bits; they depend on the shape
    only, so no token count does."""
    split = q4_split(n, k, nr, rows, words) if split is None else split
    kw, kg = k // PACK, k // GROUP
    chunks = kw // words
    per_block = rows // split  # row groups per block
    steps = (chunks + LANES * split - 1) // (LANES * split)
    xv = min(PACK, _vec(dtype, max_lanes))
    assert k % GROUP == 0 and nr * mc <= LANES and words in (1, 2, 4) and rows % split == 0
    assert gated is None or (nr == 2 and n % 2 == 0 and gated in GATED)
    stride = 1 if gated is None else n // 2  # row o of a warp: base + o * stride
    n_out = n if gated is None else n // 2
    step = 1 if gated else nr  # a row group's base row: (bn * per_block + ty // split) * step
    blocks = (n_out + per_block * step - 1) // (per_block * step)

    @T.macro
    def load_chunk(qw, qs, wq, sl, base, ch):
        """wq[o, v] = word ch * words + v of weight row base + o * stride (one vector load), sl[o]
        its scale (the chunk lies in one scale group)."""
        for o in T.unroll(nr):
            if base + o * stride < n:
                for v in T.vectorized(words):
                    wq[o * words + v] = qw[base + o * stride, ch * words + v]
                sl[o] = T.Cast("float32", qs[base + o * stride, ch * words // (GROUP // PACK)])
            else:
                for v in T.vectorized(words):
                    wq[o * words + v] = T.uint32(0)
                sl[o] = T.float32(0)

    @T.macro
    def decode(wq, sl, wl, v):
        """wl[o, j] = (q - 7) * s of the chunk's word v; q - 7 is formed exactly (2**23 + q as
        float bits, minus 2**23 + 7) without an int->float convert."""
        for o in T.unroll(nr):
            for j in T.unroll(PACK):
                wl[o * PACK + j] = (T.reinterpret("float32", T.bitwise_or(T.bitwise_and(
                    T.shift_right(wq[o * words + v], T.uint32(j * 4)), T.uint32(15)), T.uint32(MAGIC)))
                    - T.float32(2.0**23 + 7)) * sl[o]

    @T.macro
    def add_row(x, acc, wl, xl, row, r, word):
        """acc[o, r] += x[row, 8 k of the word] . wl[o, :], in increasing k."""
        for h in T.unroll(PACK // xv):
            for v in T.vectorized(xv):
                xl[h * xv + v] = x[row, word * PACK + h * xv + v]
        for o in T.unroll(nr):
            for j in T.unroll(PACK):
                acc[o * mc + r] = acc[o * mc + r] + T.Cast("float32", xl[j]) * wl[o * PACK + j]

    @T.macro
    def k_loop(x, qw, qs, acc, wq, sl, wl, xl, c, base, p, m_dim, nrows, guarded):
        for i in range(steps):
            if i * LANES * split + p < chunks:
                load_chunk(qw, qs, wq, sl, base, i * LANES * split + p)
                for v in T.unroll(words):
                    decode(wq, sl, wl, v)  # once for all rows of the chunk
                    _chunk_rows(add_row, x, acc, wl, xl, c, mc, m_dim, nrows, guarded,
                                (i * LANES * split + p) * words + v)

    @T.prim_func(private=True)
    def kernel(var_x: T.handle, qw: T.Buffer((n, kw), "uint32"), qs: T.Buffer((n, kg), dtype), var_y: T.handle):
        T.func_attr({"tir.noalias": True, "tirx.is_scheduled": True})
        m_dim = T.int64()
        x = T.match_buffer(var_x, (m_dim, k), dtype)
        y = T.match_buffer(var_y, (m_dim, n_out), dtype)
        for c in T.thread_binding((m_dim + mc - 1) // mc, thread="blockIdx.y"):
            for bn in T.thread_binding(blocks, thread="blockIdx.x"):
                for ty in T.thread_binding(rows, thread="threadIdx.y"):
                    for tx in T.thread_binding(LANES, thread="threadIdx.x"):
                        # [ty, o * mc + r, lane]
                        red = T.decl_buffer((rows * nr * mc * PITCH,), "float32", scope="shared")
                        sums = T.decl_buffer((rows * nr * mc,), "float32", scope="shared")  # [ty, o * mc + r]
                        part = T.decl_buffer((LANES,), "float32", scope="local")
                        acc = T.decl_buffer((nr * mc,), "float32", scope="local")  # [o, r]
                        wq = T.decl_buffer((nr * words,), "uint32", scope="local")  # [o, v] the chunk's words
                        sl = T.decl_buffer((nr,), "float32", scope="local")  # [o] its scale
                        wl = T.decl_buffer((nr * PACK,), "float32", scope="local")  # [o, j] one word decoded
                        xl = T.decl_buffer((PACK,), dtype, scope="local")  # one token row's 8 x
                        for a in T.unroll(nr * mc):
                            acc[a] = T.float32(0)
                        if c * mc + mc <= m_dim:  # a full chunk: no row guards
                            k_loop(x, qw, qs, acc, wq, sl, wl, xl, c, (bn * per_block + ty // split) * step, ty % split * LANES + tx, m_dim, mc, False)
                        elif c * mc + 1 == m_dim:  # one row (decode): no guards, no dead rows
                            k_loop(x, qw, qs, acc, wq, sl, wl, xl, c, (bn * per_block + ty // split) * step, ty % split * LANES + tx, m_dim, 1, False)
                        else:
                            k_loop(x, qw, qs, acc, wq, sl, wl, xl, c, (bn * per_block + ty // split) * step, ty % split * LANES + tx, m_dim, mc, True)
                        if split == 1 and gated is None:
                            _reduce_and_store(red, acc, part, y, dtype, c, m_dim, (bn * per_block + ty // split) * step, n,
                                              ty, tx, mc, nr)
                        else:
                            _reduce_combine(red, sums, acc, part, y, dtype, c, m_dim, (bn * per_block + ty // split) * step,
                                            stride, n, ty, tx, mc, nr, split, gated)

    return kernel


@kernel_cache
def dense_gemv(n: int, k: int, dtype: str, mc: int = MC, nr: int = NR, rows: int = ROWS, max_lanes: int = 8):
    """y[m, n] = sum_k x[m, k] * w[n, k] for fp16/fp32 weights, accumulated in fp32.

    Lane tx owns vector ``i * 32 + tx`` at step i (16 bytes of consecutive k, or single
    elements when k is not a multiple of the vector width): coalesced vector loads of weights
    and activations."""
    vec = _vec(dtype, max_lanes) if k % _vec(dtype, max_lanes) == 0 else 1
    kv = k // vec
    steps = (kv + LANES - 1) // LANES
    blocks = (n + rows * nr - 1) // (rows * nr)
    assert nr * mc <= LANES

    @T.macro
    def load_weights(w, wl, row0, vi):
        for o in T.unroll(nr):
            if row0 + o < n:
                for v in T.vectorized(vec):
                    wl[o * vec + v] = w[row0 + o, vi * vec + v]
            else:
                for v in T.vectorized(vec):
                    wl[o * vec + v] = T.Cast(dtype, T.float32(0))

    @T.macro
    def add_row(x, acc, wl, xl, row, r, vi):
        for v in T.vectorized(vec):
            xl[v] = x[row, vi * vec + v]
        for o in T.unroll(nr):
            for v in T.unroll(vec):
                acc[o * mc + r] = acc[o * mc + r] + T.Cast("float32", xl[v]) * T.Cast("float32", wl[o * vec + v])

    @T.macro
    def k_loop(x, w, acc, wl, xl, c, row0, tx, m_dim, nrows, guarded):
        for i in range(steps):
            if i * LANES + tx < kv:
                load_weights(w, wl, row0, i * LANES + tx)
                _chunk_rows(add_row, x, acc, wl, xl, c, mc, m_dim, nrows, guarded, i * LANES + tx)

    @T.prim_func(private=True)
    def kernel(var_x: T.handle, w: T.Buffer((n, k), dtype), var_y: T.handle):
        T.func_attr({"tir.noalias": True, "tirx.is_scheduled": True})
        m_dim = T.int64()
        x = T.match_buffer(var_x, (m_dim, k), dtype)
        y = T.match_buffer(var_y, (m_dim, n), dtype)
        for c in T.thread_binding((m_dim + mc - 1) // mc, thread="blockIdx.y"):
            for bn in T.thread_binding(blocks, thread="blockIdx.x"):
                for ty in T.thread_binding(rows, thread="threadIdx.y"):
                    for tx in T.thread_binding(LANES, thread="threadIdx.x"):
                        # [ty, o * mc + r, lane]
                        red = T.decl_buffer((rows * nr * mc * PITCH,), "float32", scope="shared")
                        part = T.decl_buffer((LANES,), "float32", scope="local")
                        acc = T.decl_buffer((nr * mc,), "float32", scope="local")  # [o, r]
                        wl = T.decl_buffer((nr * vec,), dtype, scope="local")  # [o, v]
                        xl = T.decl_buffer((vec,), dtype, scope="local")
                        for a in T.unroll(nr * mc):
                            acc[a] = T.float32(0)
                        if c * mc + mc <= m_dim:
                            k_loop(x, w, acc, wl, xl, c, (bn * rows + ty) * nr, tx, m_dim, mc, False)
                        elif c * mc + 1 == m_dim:
                            k_loop(x, w, acc, wl, xl, c, (bn * rows + ty) * nr, tx, m_dim, 1, False)
                        else:
                            k_loop(x, w, acc, wl, xl, c, (bn * rows + ty) * nr, tx, m_dim, mc, True)
                        _reduce_and_store(red, acc, part, y, dtype, c, m_dim, (bn * rows + ty) * nr, n, ty, tx, mc, nr)

    return kernel
