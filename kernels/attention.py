"""Paged KV storage and attention kernels whose arithmetic never depends on batching.

Why not TVM's ``PagedKVCache``: for a multi-token forward it attends the cached prefix
and the new chunk separately and merges the two softmax states, while a one-token decode
runs a single pass. The two round differently (1.7e-5 on SmolLM2), so a token verified
among drafts would not get the logits it gets when decoded alone, and greedy speculation
would not be exactly lossless. Here every query walks its rows in one fixed order -- the
sequence's positions ``0..prefix-1`` through its page table, then any extra rows (a
token tree's ancestors, in depth order) -- with the same online-softmax arithmetic in
every mode, so prefill, decode, chain verify and tree verify agree bit for bit.

Cache layout: ``kv [layers, 2, slots, kv_heads, head_dim]``, ``slot = page * KV_PAGE_SIZE +
offset``; the page size is the contract's (runtime/contract.py), compiled into the kernel
here and used by the host bookkeeping that builds the page tables.
"""
from __future__ import annotations


import math

from tvm.script import tirx as T

from speccompile.kernels import kernel_cache
from speccompile.models.rope import Rope

from speccompile.runtime.contract import KV_PAGE_SIZE as PAGE


def building_for_cpu() -> bool:
    """Kernels are built while the model is exported, under the compile target."""
    import tvm

    target = tvm.target.Target.current(allow_none=True)
    return target is None or target.kind.name == "llvm"


def scratch_scope() -> str:
    """Storage scope of per-thread scratch: registers on GPUs ("local"); on the CPU a
    "local" buffer is a heap workspace call per task while a "global" one declared inside
    the parallel body is a stack alloca that LLVM keeps in registers."""
    return "global" if building_for_cpu() else "local"


# On the CPU a parallel region costs ~6 us to launch (TVM's thread pool, 2 cores); a
# per-token kernel with fewer rows than this runs on the calling thread instead.
SERIAL_BELOW = 8


@kernel_cache
def rope_q(num_heads: int, num_kv: int, head_dim: int, rope: Rope, dtype: str):
    """q_rot [n, H, d] = RoPE(q part of qkv [n, H+2Hkv, d]) at positions [n] (rotate-half over
    the rope's leading ``rotary_dim`` dims of each head; the rest pass through)."""
    half = rope.rotary_dim // 2
    scratch, cpu = scratch_scope(), building_for_cpu()

    @T.macro
    def token(qkv, pos, out, t):
        cs = T.decl_buffer((2, half), "float32", scope=scratch)
        _rope_angles(cs, pos[t], rope)
        for h, i in T.grid(num_heads, head_dim):
            out[t, h, i] = _rope_elem(qkv, t, h, i, cs, rope.rotary_dim, head_dim, dtype)

    @T.prim_func(private=True)
    def kernel(var_qkv: T.handle, var_pos: T.handle, var_out: T.handle):
        T.func_attr({"tir.noalias": True, "op_pattern": 8})
        n = T.int64()
        qkv = T.match_buffer(var_qkv, (n, num_heads + 2 * num_kv, head_dim), dtype)
        pos = T.match_buffer(var_pos, (n,), "int32")
        out = T.match_buffer(var_out, (n, num_heads, head_dim), dtype)
        if cpu and n < SERIAL_BELOW:
            for t in range(n):
                token(qkv, pos, out, t)
        else:
            for t in T.parallel(n):
                token(qkv, pos, out, t)

    return kernel


def inv_freq(rope: Rope, i):
    """The rope's inverse frequency of pair ``i`` (a TIR index): its table as a balanced tree of
    selects, so every family's frequencies are constants of the kernel (models/rope.py)."""
    table = rope.inv_freq

    def pick(lo: int, hi: int):
        if hi - lo == 1:
            return T.float32(table[lo])
        mid = (lo + hi) // 2
        return T.Select(i < mid, pick(lo, mid), pick(mid, hi))

    return pick(0, len(table))


def rope_angle(pos, i, rope: Rope):
    """position * inv_freq[i] in float32, as transformers' RoPE computes it."""
    return T.Cast("float32", pos) * inv_freq(rope, i)


@T.macro
def _rope_angles(cs, p, rope):
    """cs[0/1, i] = scale * cos/sin(p * inv_freq[i]): once per token, shared by all heads (the
    transcendental calls dominated the kernel when made per element)."""
    for i in range(rope.rotary_dim // 2):
        cs[0, i] = T.cos(rope_angle(p, i, rope)) * T.float32(rope.scale)
        cs[1, i] = T.sin(rope_angle(p, i, rope)) * T.float32(rope.scale)


def _rope_elem(buf, t, h, i, cs, rotary: int, head_dim: int, dtype):
    """Element i of a head rotated: x cos + rotate_half(x) sin within the first ``rotary``
    dims, x itself past them (partial rotary)."""
    half = rotary // 2
    x = T.Cast("float32", buf[t, h, i])
    if rotary == head_dim:
        rot = T.if_then_else(i < half, -T.Cast("float32", buf[t, h, i + half]), T.Cast("float32", buf[t, h, i - half]))
        return T.Cast(dtype, x * cs[0, i % half] + rot * cs[1, i % half])
    j = T.min(i, rotary - 1)  # in range whichever branch is evaluated
    rot = T.if_then_else(j < half, -T.Cast("float32", buf[t, h, j + half]), T.Cast("float32", buf[t, h, T.max(j - half, 0)]))
    return T.Cast(dtype, T.if_then_else(i < rotary, x * cs[0, j % half] + rot * cs[1, j % half], x))


@kernel_cache
def append_kv(num_layers: int, num_heads: int, num_kv: int, head_dim: int, rope: Rope, dtype: str):
    """kv[layer, 0/1, slot[t]] = RoPE(k[t]) / v[t] (in place)."""
    half = rope.rotary_dim // 2
    scratch, cpu = scratch_scope(), building_for_cpu()

    @T.macro
    def token(kv, qkv, pos, slot, layer, t):
        cs = T.decl_buffer((2, half), "float32", scope=scratch)
        _rope_angles(cs, pos[t], rope)
        for h, i in T.grid(num_kv, head_dim):
            kv[layer, 0, slot[t], h, i] = _rope_elem(qkv, t, num_heads + h, i, cs, rope.rotary_dim, head_dim, dtype)
            kv[layer, 1, slot[t], h, i] = qkv[t, num_heads + num_kv + h, i]

    @T.prim_func(private=True)
    def kernel(var_kv: T.handle, var_qkv: T.handle, var_pos: T.handle, var_slot: T.handle, layer: T.int64):
        T.func_attr({"tir.noalias": True, "op_pattern": 8})
        n = T.int64()
        slots = T.int64()
        kv = T.match_buffer(var_kv, (num_layers, 2, slots, num_kv, head_dim), dtype)
        qkv = T.match_buffer(var_qkv, (n, num_heads + 2 * num_kv, head_dim), dtype)
        pos = T.match_buffer(var_pos, (n,), "int32")
        slot = T.match_buffer(var_slot, (n,), "int32")
        if cpu and n < SERIAL_BELOW:
            for t in range(n):
                token(kv, qkv, pos, slot, layer, t)
        else:
            for t in T.parallel(n):
                token(kv, qkv, pos, slot, layer, t)

    return kernel


BLOCK = 16  # rows whose scores, maximum and exponentials a query head takes together (CPU kernel)
LOG2E = 1.4426950408889634
LN2_HI, LN2_LO = 0.693145751953125, 1.428606765330187e-06  # ln 2 split: LN2_HI has 15 significant bits, so n * LN2_HI is exact for |n| < 512 (here |n| <= 126)


def _exp(x):
    """e^x in float32 by one fixed expression (x <= 0 here: scores less the running maximum):
    x = n ln2 + f with |f| <= ln2 / 2, e^f by its degree-6 Taylor polynomial (relative error
    below 7e-8), 2^n from the exponent bits. Inlined and vectorized, where ``T.exp`` on the CPU
    is a scalar libm call per score (6% of a 700-token prefill went to expf). Inputs below -87
    give ~1e-38 (e^x would be as negligible next to the rows it is summed with); e^0 is exactly 1."""
    xc = T.max(x, T.float32(-87.0))
    n = T.floor(xc * T.float32(LOG2E) + T.float32(0.5))
    f = xc - n * T.float32(LN2_HI) - n * T.float32(LN2_LO)
    p = T.float32(1.0 / 720)
    for c in (1.0 / 120, 1.0 / 24, 1.0 / 6, 0.5, 1.0, 1.0):
        p = p * f + T.float32(c)
    return p * T.reinterpret("float32", T.shift_left(T.Cast("int32", n) + 127, 23))


@kernel_cache
def attention(num_layers: int, num_heads: int, num_kv: int, head_dim: int, dtype: str, scale: float = 0.0,
              window: int = 0):
    """out[t, h] = softmax(q k^T * scale) v over the rows token t may see (see module doc);
    ``scale`` 0 means 1/sqrt(d). ``window`` > 0: only the token's last ``window`` rows, itself
    included (a sliding-window layer; a token's rows are its positions, so that is
    transformers' ``q - k < window``), taken in blocks from the first of them.

    seq[t]: row of the page table; prefix[t]: rows 0..prefix-1 of that sequence;
    extra[t, 0:extra_len[t]]: further absolute slots (tree ancestors, then the node itself).

    One task per (token, KV head) serves the ``group`` query heads that share it, so each
    K/V row is fetched once for all of them and their independent dot products overlap.
    A token's rows are taken in blocks of BLOCK (rows 0-15, 16-31, ... of its own list): per
    head, the block's scores, their maximum, one rescale of the running output and sum, the
    block's exponentials as one vector (``_exp``), then its rows' weighted V -- every step a
    fixed sequence over the token's own rows, so prefill, decode, chain and tree verify still
    give the same bits. Why blocks: with one row at a time (a libm expf per score, the whole
    output rescaled per row) attention was 34% of a 700-token prefill on a 2-core Zen 4 and
    53% of a 1,400-token one. GPU builds use kernels/attention_gpu.py's pair instead
    (models/llama.py: chunks of rows, then their merge).
    """
    group = num_heads // num_kv
    scratch = scratch_scope()
    lanes = 16 if head_dim % 16 == 0 else 8
    chunks = head_dim // lanes
    scale = scale or 1.0 / math.sqrt(head_dim)
    reach = window or 2 ** 30  # rows a token attends at most
    halve = _halve16 if lanes == 16 else _halve8

    @T.prim_func(private=True)
    def kernel(var_q: T.handle, var_kv: T.handle, var_pt: T.handle, var_seq: T.handle, var_prefix: T.handle,
               var_extra: T.handle, var_extra_len: T.handle, layer: T.int64, var_out: T.handle):
        T.func_attr({"tir.noalias": True, "op_pattern": 8})
        n = T.int64()
        slots = T.int64()
        b = T.int64()
        pages = T.int64()
        e = T.int64()
        q = T.match_buffer(var_q, (n, num_heads, head_dim), dtype)
        kv = T.match_buffer(var_kv, (num_layers, 2, slots, num_kv, head_dim), dtype)
        pt = T.match_buffer(var_pt, (b, pages), "int32")
        seq = T.match_buffer(var_seq, (n,), "int32")
        prefix = T.match_buffer(var_prefix, (n,), "int32")
        extra = T.match_buffer(var_extra, (n, e), "int32")
        extra_len = T.match_buffer(var_extra_len, (n,), "int32")
        out = T.match_buffer(var_out, (n, num_heads, head_dim), dtype)
        for tk in T.parallel(n * num_kv):
            acc = T.decl_buffer((group, lanes), "float32", scope=scratch)
            o = T.decl_buffer((group, head_dim), "float32", scope=scratch)
            sc = T.decl_buffer((group, BLOCK), "float32", scope=scratch)  # the block's scores, then weights
            st = T.decl_buffer((group, 3), "float32", scope=scratch)  # per head: max, denominator, rescale
            sl = T.decl_buffer((BLOCK,), "int32", scope=scratch)  # the block's slots
            ob = T.decl_buffer((head_dim,), "float32", scope=scratch)
            seen: T.let[T.int32] = prefix[tk // num_kv] + extra_len[tk // num_kv]
            first: T.let[T.int32] = T.max(seen - reach, 0)  # the window's first row
            rows: T.let[T.int32] = seen - first
            for g in range(group):
                for i in T.vectorized(head_dim):
                    o[g, i] = T.float32(0)
                st[g, 0] = T.float32(-3.0e38)
                st[g, 1] = T.float32(0)
            for blk in range((rows + BLOCK - 1) // BLOCK):
                for j in range(BLOCK):
                    if blk * BLOCK + j < rows:
                        # the row's slot, then per head its score
                        sl[j] = T.if_then_else(
                            first + blk * BLOCK + j < prefix[tk // num_kv],
                            pt[seq[tk // num_kv], T.min((first + blk * BLOCK + j) // PAGE, T.Cast("int32", pages) - 1)]
                            * PAGE + (first + blk * BLOCK + j) % PAGE,
                            extra[tk // num_kv, T.max(first + blk * BLOCK + j - prefix[tk // num_kv], 0)])
                        for g in T.unroll(group):
                            for l in T.vectorized(lanes):
                                acc[g, l] = T.float32(0)
                            for c in T.unroll(chunks):
                                for l in T.vectorized(lanes):
                                    acc[g, l] = acc[g, l] + T.Cast("float32", q[tk // num_kv, (tk % num_kv) * group + g, c * lanes + l]) * T.Cast("float32", kv[layer, 0, sl[j], tk % num_kv, c * lanes + l])
                            halve(acc, g)  # the pairwise sum of _tree_sum, as vector halves
                            sc[g, j] = acc[g, 0] * T.float32(scale)
                    else:
                        for g in T.unroll(group):
                            sc[g, j] = T.float32(-3.0e38)
                for g in T.unroll(group):
                    # the new maximum; the rescale of what the earlier blocks summed (exactly 1 when
                    # the maximum stays); this block's weights, 0 past the token's last row
                    st[g, 2] = _exp(st[g, 0] - T.max(st[g, 0], _tree_max(sc, g, BLOCK)))
                    st[g, 0] = T.max(st[g, 0], _tree_max(sc, g, BLOCK))
                    for j in T.vectorized(BLOCK):
                        sc[g, j] = T.if_then_else(blk * BLOCK + j < rows, _exp(sc[g, j] - st[g, 0]), T.float32(0))
                    st[g, 1] = st[g, 1] * st[g, 2] + _tree_sum(sc, g, BLOCK)
                for g in T.unroll(group):  # (apart: the heads' exponentials above overlap)
                    # the head's output in registers (ob) across the block's rows
                    for i in T.vectorized(head_dim):
                        ob[i] = o[g, i] * st[g, 2]
                    for j in range(T.min(BLOCK, rows - blk * BLOCK)):
                        for i in T.vectorized(head_dim):
                            ob[i] = ob[i] + sc[g, j] * T.Cast("float32", kv[layer, 1, sl[j], tk % num_kv, i])
                    for i in T.vectorized(head_dim):
                        o[g, i] = ob[i]
            for g in range(group):
                for i in T.vectorized(head_dim):
                    out[tk // num_kv, (tk % num_kv) * group + g, i] = T.Cast(dtype, o[g, i] / st[g, 1])

    return kernel


@T.macro
def _halve8(acc, g):
    """acc[g, 0] = acc[g, 0] + ... + acc[g, 7] in _tree_sum's pairwise order, each level one
    vector add of the upper half onto the lower (not a chain of scalar adds)."""
    for l in T.vectorized(4):
        acc[g, l] = acc[g, l] + acc[g, l + 4]
    for l in T.vectorized(2):
        acc[g, l] = acc[g, l] + acc[g, l + 2]
    acc[g, 0] = acc[g, 0] + acc[g, 1]


@T.macro
def _halve16(acc, g):
    """As _halve8, over 16 lanes."""
    for l in T.vectorized(8):
        acc[g, l] = acc[g, l] + acc[g, l + 8]
    _halve8(acc, g)


def _tree_max(buf, g, width):
    """The largest of buf[g, 0..width-1], pairwise in a fixed order."""
    vals = [buf[g, l] for l in range(width)]
    while len(vals) > 1:
        vals = [T.max(vals[i], vals[i + len(vals) // 2]) for i in range(len(vals) // 2)]
    return vals[0]


def _tree_sum(acc, g, lanes):
    """acc[g, 0] + ... + acc[g, lanes-1] added pairwise, a fixed order with short latency."""
    vals = [acc[g, l] for l in range(lanes)]
    while len(vals) > 1:
        vals = [vals[i] + vals[i + len(vals) // 2] for i in range(len(vals) // 2)]
    return vals[0]


@kernel_cache
def copy_slots(num_layers: int, num_kv: int, head_dim: int, dtype: str):
    """kv[:, :, dst[i]] = kv[:, :, src[i]] in order (commits accepted tree nodes)."""

    @T.prim_func(private=True)
    def kernel(var_kv: T.handle, var_src: T.handle, var_dst: T.handle):
        T.func_attr({"tir.noalias": True, "op_pattern": 8})
        c = T.int64()
        slots = T.int64()
        kv = T.match_buffer(var_kv, (num_layers, 2, slots, num_kv, head_dim), dtype)
        src = T.match_buffer(var_src, (c,), "int32")
        dst = T.match_buffer(var_dst, (c,), "int32")
        for i in range(c):
            for layer in T.parallel(num_layers):
                for k, h, d in T.grid(2, num_kv, head_dim):
                    kv[layer, k, dst[i], h, d] = kv[layer, k, src[i], h, d]

    return kernel
