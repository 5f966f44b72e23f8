"""Projections on NVIDIA tensor cores (sm_80+, fp16 activations), q4 and dense fp16: every row
count from 1 to 32 reads (and decodes) each weight once, and costs about what one row costs.

Why: the portable kernels of kernels/gpu_matmul.py accumulate with fp32 FMAs, one per weight
per token row, after decoding each nibble with five integer/float operations. The H100 check
(run e, Qwen2.5-1.5B shape, q4f16_1) found them bound by instructions, not bytes: decode at
12% of the bandwidth roofline, and 8 rows at 1.48x one row, 16 at 1.83x (target 1.25x and
1.5x). Here the multiply-adds go to ``mma.sync.m16n8k16`` (fp16 in, fp32 accumulate), which
does 2,048 of them per warp instruction, so extra token rows cost almost nothing, and a
nibble pair becomes an fp16x2 operand in three instructions (prmt, lop3, fma.f16x2).

Layout: a warp computes a tile of 16 output features x 32 tokens (four mma tiles of 8
tokens), for the k groups ``ty, ty + W, ty + 2W, ...`` (a group = 32 k = one q4 scale; W
warps per block). The weights are the stored q4 layout (no repacking): lane (g, t) = (lane
// 4, lane % 4) needs, per the PTX fragment of A, the nibbles ``2t, 2t + 1`` (byte t) of each
of the group's 4 words for features g and g + 8, so it loads those two 16-byte rows (the 4
lanes of a group load the same bytes) and forms ``half2(q_lo - 7, q_hi - 7)`` exactly from
the fp16 bit patterns ``1024 + q_lo`` and ``1024 + 16 q_hi`` (see ``pair``). Per group and token tile: two mma over the
group's two k16 halves into a zeroed fragment, then ``acc += frag * scale`` in fp32 (the
scale of the fragment's feature). The W warps' partial tiles are summed in warp order
through shared memory, and one fp16 cast writes y.

Batch invariance (greedy losslessness rests on it): y[m, f] is always the sum over W warps
in warp order of, per group in increasing order, ``acc + mma_group(x[m], w[f]) * s[f, g]``.
The mma computes each output element from its own row of A and column of B; which column
of the tile a token occupies, or whether other columns hold tokens or zeros, changes none of
that element's arithmetic (the GPU check verifies this bit for bit on the device:
``speccompile/gpu_check/kernels_bench.py``). W depends only on k. So no M, and no position
of a row in its chunk, changes a bit -- prefill, decode and verify agree per token, as the
portable kernels do. The bits differ from theirs (a library is built for one device).

Numerics: ``q - 7`` is exact in fp16, fp16 x fp16 products are exact in the tensor core's
fp32 accumulation, the scale multiplies in fp32: closer to the fp32 reference than the fp16
weights torch dequantizes to.

``dense_mma`` is the same kernel for fp16 weights: a lane's A fragments are its weight pairs,
loaded as they are, and the mma accumulates group after group into the lane's fragment (no
scale), in the same fixed order.

Cost model (H100, Qwen2.5-1.5B q4f16_1, W ~ 0.87 GB per token): per warp and group (256
weight bytes) 2 loads and ~24 decode instructions, then 4 activation loads + 2 mma + 4 FMA
per token tile of 8. About 130M warp instructions per decode step, ~0.15 ms at ~0.9e12 warp
instructions/s, under the ~0.29 ms the bytes take at 3 TB/s; 32 rows add ~50%. So a
forward of up to 8 rows should cost what one row costs, and 16 rows ~1.1x. Unmeasured on
a GPU when written.
"""
from __future__ import annotations

from tvm.script import tirx as T

from speccompile.kernels import kernel_cache
from speccompile.kernels.activation import GATED

MMA = "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"
FEAT = 16  # output features per warp tile (the mma's M)
TOK = 8  # tokens per mma tile (the mma's N)
TILES = 4  # token tiles per block: a chunk of 32 tokens per blockIdx.y
CHUNK = TOK * TILES
GROUP, PACK = 32, 8  # weights per q4 scale (one k-step of a warp), nibbles per uint32 word
WORDS = GROUP // PACK  # 4 words per feature per group: one 16-byte load
UNROLL = 2  # groups whose words a warp loads before decoding them (bytes in flight)
PRMT_BYTE = 0x4040  # prmt selector: byte t of the word into bytes 0 and 2 (+ t * 0x0101), zero bytes 1 and 3
NIBBLES = 0x00F0000F  # the low nibble of byte 0, the high nibble of byte 2
MAGIC16 = 0x64006400  # fp16x2 (1024.0, 1024.0): with q in bits 0-3 and 16 q' in bits 16-23, (1024 + q, 1024 + 16 q')
SCALE16 = 0x2C003C00  # fp16x2 (1.0, 0.0625)
BIAS16 = 0xD470E407  # fp16x2 (-1031.0, -71.0): (1024 + q) - 1031 = q - 7, (1024 + 16 q') / 16 - 71 = q' - 7


def warps_for(groups: int) -> int:
    """Warps per block (the k split) for a matrix of ``groups`` scale groups per row: more
    warps in flight where a matrix has few feature tiles and long rows (Qwen2.5-1.5B's down
    projection: 96 tiles, 280 groups); never a function of the token count. At most 8: with
    16 (512 threads) ptxas held the kernel to 64 registers and spilled."""
    return 8 if groups >= 24 else 4


def supported(target, dtype: str) -> bool:
    """mma.m16n8k16 with fp16 operands needs sm_80+; the fatbin's lowest arch is the target's."""
    if target is None or target.kind.name != "cuda" or dtype != "float16":
        return False
    arch = str(target.attrs.get("arch", ""))
    return arch.startswith("sm_") and int(arch[3:].rstrip("af")) >= 80


@T.macro
def _activations(b, x, tok0, g, t, kbase, m_dim):
    """B fragments of both k16 halves of the group at ``kbase``: token ``tok0 + g``'s k ``2t, 2t + 1``
    and ``2t + 8, 2t + 9`` (zeros for a token past m_dim)."""
    for hf in T.unroll(2):
        for r in T.unroll(2):
            if tok0 + g < m_dim:
                b[hf * 2 + r] = T.reinterpret("uint32", x[tok0 + g, T.Ramp(kbase + hf * 16 + r * 8 + t * 2, 1, 2)])
            else:
                b[hf * 2 + r] = T.uint32(0)


@T.macro
def _mma_group(d, d0, a, a0, b):
    """d[d0:d0+4] += A B over the group's two k16 halves, the first half first."""
    for hf in T.unroll(2):
        T.ptx[MMA](d[d0], d[d0 + 1], d[d0 + 2], d[d0 + 3], a[a0 + hf * 4], a[a0 + hf * 4 + 1], a[a0 + hf * 4 + 2],
                   a[a0 + hf * 4 + 3], b[hf * 2], b[hf * 2 + 1], d[d0], d[d0 + 1], d[d0 + 2], d[d0 + 3])


@T.macro
def _to_shared(red, acc, ty, tx):
    """Each warp's tiles into shared memory: red[warp, tile, lane, fragment i]."""
    for i in T.unroll(TILES * 4):
        red[((ty * TILES + i // 4) * 32 + tx) * 4 + i % 4] = acc[i]
    T.tvm_storage_sync("shared")


@T.macro
def _store(red, acc, y, c, bf, ty, tx, warps, outs, rounds, m_dim, n):
    """Each warp's tiles into shared memory, then every output summed over the warps in warp
    order and cast once: output o = (tile, lane, fragment i) is token tile * 8 + 2 (lane % 4) +
    i % 2, feature lane // 4 + (i // 2) * 8."""
    _to_shared(red, acc, ty, tx)
    for rd in T.unroll(rounds):
        if rd * warps * 32 + ty * 32 + tx < outs:
            o = T.int32(rd * warps * 32 + ty * 32 + tx)
            tok = c * CHUNK + o // 128 * TOK + o // 4 % 4 * 2 + o % 2
            feat = bf * FEAT + o // 16 % 8 + o % 4 // 2 * 8
            if tok < m_dim and feat < n:
                total = T.decl_buffer((1,), "float32", scope="local")
                total[0] = red[o]
                for w in range(1, warps):
                    total[0] = total[0] + red[w * outs + o]
                y[tok, feat] = T.Cast("float16", total[0])


@T.macro
def _store_gated(red, acc, y, c, bf, ty, tx, warps, outs, rounds, m_dim, inter, act):
    """As ``_store`` for a gated tile: its features 0-7 are gate rows, 8-15 the same up rows, so
    a lane's fragments i and i + 2 are one output's gate and up. Output q = (tile, lane, i < 2)
    of the [tokens, inter] result sums both halves over the warps in warp order, rounds each to
    fp16 (as the activation kernel read them) and writes act(gate) * up."""
    _to_shared(red, acc, ty, tx)
    for rd in T.unroll(rounds):
        if rd * warps * 32 + ty * 32 + tx < outs // 2:
            q = T.int32(rd * warps * 32 + ty * 32 + tx)
            o = q // 2 * 4 + q % 2  # the gate's place in red; the up row's is o + 2
            tok = c * CHUNK + o // 128 * TOK + o // 4 % 4 * 2 + o % 2
            feat = bf * (FEAT // 2) + o // 16 % 8
            if tok < m_dim and feat < inter:
                total = T.decl_buffer((2,), "float32", scope="local")
                total[0] = red[o]
                total[1] = red[o + 2]
                for w in range(1, warps):
                    total[0] = total[0] + red[w * outs + o]
                    total[1] = total[1] + red[w * outs + o + 2]
                y[tok, feat] = T.Cast("float16", GATED[act](T.Cast("float32", T.Cast("float16", total[0])),
                                                            T.Cast("float32", T.Cast("float16", total[1]))))


def _split(n: int, k: int, warps: int | None, unroll: int) -> tuple[int, int, int, int]:
    """(warps, k-steps of a warp, feature tiles, store rounds) of an [n, k] projection."""
    kg = k // GROUP
    warps = warps or warps_for(kg)
    return warps, (kg + warps * unroll - 1) // (warps * unroll), (n + FEAT - 1) // FEAT, \
        (TILES * TOK * FEAT + warps * 32 - 1) // (warps * 32)


@kernel_cache
def q4_mma(n: int, k: int, warps: int | None = None, unroll: int = UNROLL, gated: str | None = None):
    """y[m, n] = sum_k x[m, k] * w[n, k], w = (nibble(qw[n, k/8], k%8) - 7) * qs[n, k/32];
    x, qs and y in fp16, accumulation in fp32 (cuda sm_80+ only: mma.sync). ``warps`` (default
    warps_for) and ``unroll`` are fixed per matrix: the GPU check times other choices.

    ``gated`` (kernels/activation.py's GATED): the MLP's gate/up projection with its activation,
    y[m, j] = act(g[m, j]) * g[m, inter + j] for n = 2 * inter weight rows: a tile's 16 features
    are gate rows j..j+7 and up rows inter + j..j+7 (``row``), so one lane holds both halves of
    its outputs (kernels/gpu_matmul.py's portable kernel does the same with a warp's two rows)."""
    kw, kg = k // PACK, k // GROUP
    assert k % GROUP == 0, f"q4 projections need k % {GROUP} == 0, got {k}"
    assert gated is None or (n % 2 == 0 and gated in GATED)
    half = FEAT if gated is None else FEAT // 2  # output features per tile
    n_out = n if gated is None else n // 2
    warps, steps, ftiles, rounds = _split(n, k, warps, unroll)  # gated: ceil(inter / 8) = ceil(n / 16) tiles
    outs = TILES * TOK * FEAT  # outputs per block

    def row(bf, f):
        """Weight row of tile bf's feature f (f < 16): bf * 16 + f, or gate and up rows, gated."""
        return bf * FEAT + f if gated is None else bf * half + f % 8 + f // 8 * n_out

    @T.macro
    def pair(dst, word, t):
        """dst = fp16x2(nibble 2t - 7, nibble 2t + 1 - 7) of ``word`` (byte t), in three
        instructions: prmt copies byte t into bytes 0 and 2; the AND keeps the low nibble in
        bits 0-3 and the high one in bits 20-23 and the OR makes them fp16 (1024 + lo, 1024 + 16 hi);
        one fp16x2 fma scales and shifts both halves to (lo - 7, hi - 7), exactly."""
        T.ptx["prmt.b32"](dst[0], word, T.uint32(0), T.Cast("uint32", PRMT_BYTE + t * 0x0101))
        dst[0] = T.bitwise_or(T.bitwise_and(dst[0], T.uint32(NIBBLES)), T.uint32(MAGIC16))
        T.ptx["fma.rn.f16x2"](dst[0], dst[0], T.uint32(SCALE16), T.uint32(BIAS16))

    @T.prim_func(private=True)
    def kernel(var_x: T.handle, qw: T.Buffer((n, kw), "uint32"), qs: T.Buffer((n, kg), "float16"), var_y: T.handle):
        T.func_attr({"tir.noalias": True, "tirx.is_scheduled": True})
        m_dim = T.int64()
        x = T.match_buffer(var_x, (m_dim, k), "float16")
        y = T.match_buffer(var_y, (m_dim, n_out), "float16")
        for c in T.thread_binding((m_dim + CHUNK - 1) // CHUNK, thread="blockIdx.y"):
            for bf in T.thread_binding(ftiles, thread="blockIdx.x"):
                for ty in T.thread_binding(warps, thread="threadIdx.y"):
                    for tx in T.thread_binding(32, thread="threadIdx.x"):
                        red = T.decl_buffer((warps * outs,), "float32", scope="shared")  # [warp, tile, lane, 4]
                        acc = T.decl_buffer((TILES * 4,), "float32", scope="local")  # [tile, c fragment]
                        words = T.decl_buffer((unroll * 2 * WORDS,), "uint32", scope="local")  # [u, g / g+8, word]
                        a = T.decl_buffer((8,), "uint32", scope="local")  # [k16 half, A fragment]
                        b = T.decl_buffer((4,), "uint32", scope="local")  # [k16 half, B fragment]
                        d = T.decl_buffer((4,), "float32", scope="local")
                        one = T.decl_buffer((1,), "uint32", scope="local")
                        g = tx // 4
                        t = tx % 4
                        for i in T.unroll(TILES * 4):
                            acc[i] = T.float32(0)
                        for s in range(steps):
                            for u in T.unroll(unroll):  # issue the loads of unroll groups first
                                if (s * unroll + u) * warps + ty < kg:
                                    for h in T.unroll(2):
                                        if bf * half + g + h * (half - 8) < n_out:
                                            for v in T.vectorized(WORDS):
                                                words[(u * 2 + h) * WORDS + v] = qw[row(bf, g + h * 8),
                                                                                      ((s * unroll + u) * warps + ty) * WORDS + v]
                                        else:
                                            for v in T.vectorized(WORDS):
                                                words[(u * 2 + h) * WORDS + v] = T.uint32(0)
                            for u in T.unroll(unroll):
                                if (s * unroll + u) * warps + ty < kg:
                                    # A fragments, k16 half hf: regs (row g, k 2t..), (g+8, 2t..), (g, 2t+8..), (g+8, 2t+8..)
                                    for hf in T.unroll(2):
                                        for r in T.unroll(4):
                                            pair(one, words[(u * 2 + r % 2) * WORDS + hf * 2 + r // 2], t)
                                            a[hf * 4 + r] = one[0]
                                    for j in T.unroll(TILES):
                                        if c * CHUNK + j * TOK < m_dim:  # uniform over the warp
                                            _activations(b, x, c * CHUNK + j * TOK, g, t,
                                                         ((s * unroll + u) * warps + ty) * GROUP, m_dim)
                                            for i in T.unroll(4):
                                                d[i] = T.float32(0)
                                            _mma_group(d, 0, a, 0, b)
                                            for i in T.unroll(4):  # c fragment i: feature g + (i // 2) * 8
                                                acc[j * 4 + i] = acc[j * 4 + i] + d[i] * T.Cast("float32", qs[
                                                    T.min(row(bf, g + (i // 2) * 8), n - 1), (s * unroll + u) * warps + ty])
                        if gated is None:
                            _store(red, acc, y, c, bf, ty, tx, warps, outs, rounds, m_dim, n)
                        else:
                            _store_gated(red, acc, y, c, bf, ty, tx, warps, outs, rounds, m_dim, n_out, gated)

    return kernel


@kernel_cache
def dense_mma(n: int, k: int, warps: int | None = None, unroll: int = UNROLL):
    """y[m, n] = sum_k x[m, k] * w[n, k] for fp16 weights and activations, accumulated in fp32
    by the mma itself, group after group (cuda sm_80+ only). The same tiles, k split and store
    as q4_mma; a lane's A fragments are its 8 weight pairs of the group, loaded as they are."""
    kg = k // GROUP
    assert k % GROUP == 0, f"tensor-core projections need k % {GROUP} == 0, got {k}"
    warps, steps, ftiles, rounds = _split(n, k, warps, unroll)
    outs = TILES * TOK * FEAT

    @T.prim_func(private=True)
    def kernel(var_x: T.handle, w: T.Buffer((n, k), "float16"), var_y: T.handle):
        T.func_attr({"tir.noalias": True, "tirx.is_scheduled": True})
        m_dim = T.int64()
        x = T.match_buffer(var_x, (m_dim, k), "float16")
        y = T.match_buffer(var_y, (m_dim, n), "float16")
        for c in T.thread_binding((m_dim + CHUNK - 1) // CHUNK, thread="blockIdx.y"):
            for bf in T.thread_binding(ftiles, thread="blockIdx.x"):
                for ty in T.thread_binding(warps, thread="threadIdx.y"):
                    for tx in T.thread_binding(32, thread="threadIdx.x"):
                        red = T.decl_buffer((warps * outs,), "float32", scope="shared")  # [warp, tile, lane, 4]
                        acc = T.decl_buffer((TILES * 4,), "float32", scope="local")  # [tile, c fragment]
                        a = T.decl_buffer((unroll * 8,), "uint32", scope="local")  # [u, k16 half, A fragment]
                        b = T.decl_buffer((4,), "uint32", scope="local")  # [k16 half, B fragment]
                        g = tx // 4
                        t = tx % 4
                        for i in T.unroll(TILES * 4):
                            acc[i] = T.float32(0)
                        for s in range(steps):
                            for u in T.unroll(unroll):  # issue the loads of unroll groups first
                                if (s * unroll + u) * warps + ty < kg:
                                    # A, k16 half hf: regs (row g, k 2t..), (g+8, 2t..), (g, 2t+8..), (g+8, 2t+8..)
                                    for hf in T.unroll(2):
                                        for r in T.unroll(4):
                                            if bf * FEAT + g + r % 2 * 8 < n:
                                                a[u * 8 + hf * 4 + r] = T.reinterpret("uint32", w[
                                                    bf * FEAT + g + r % 2 * 8,
                                                    T.Ramp(((s * unroll + u) * warps + ty) * GROUP + hf * 16 + r // 2 * 8 + t * 2, 1, 2)])
                                            else:
                                                a[u * 8 + hf * 4 + r] = T.uint32(0)
                            for u in T.unroll(unroll):
                                if (s * unroll + u) * warps + ty < kg:
                                    for j in T.unroll(TILES):
                                        if c * CHUNK + j * TOK < m_dim:  # uniform over the warp
                                            _activations(b, x, c * CHUNK + j * TOK, g, t,
                                                         ((s * unroll + u) * warps + ty) * GROUP, m_dim)
                                            _mma_group(acc, j * 4, a, u * 8, b)
                        _store(red, acc, y, c, bf, ty, tx, warps, outs, rounds, m_dim, n)

    return kernel
