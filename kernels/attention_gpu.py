"""GPU versions of the paged-attention, RoPE and KV-append kernels of kernels/attention.py.

Why separate kernels: the portable ones run one serial work item per token (RoPE, KV
append) or per (token, KV head) (attention), which suits a CPU's few threads but leaves a
GPU idle: a decode step ran 2 attention threads per layer, and the first GPU check
(H200) measured attention at 50-94% of every forward -- 0.78 ms per layer per decoded
token on Qwen2.5-1.5B with a 16-token context, 94% of a 512-token prefill.

Attention: a work-group of 8 warps per (token, query head). The rows the token may see
(the same list as the portable kernel: the sequence's positions ``0..prefix-1`` through
its page table, then its extra slots) are cut into blocks of 32, block ``b`` holding rows
``32b..32b+31``; warp ``w`` walks blocks ``w, w + 8, w + 16, ...`` with its own online
softmax state. Inside a block, lane j scores row ``32b + j`` (a full dot product over
head_dim in a fixed order); the block's maximum, exp weights and their fixed pairwise sum
are formed from shared memory identically by every lane of the warp; then each lane
updates its head_dim / 32 output elements over the block's rows in increasing order. At
the end warp 0 merges the 8 states in warp order. Every quantity depends only on the
token's own row list (and the constants 32 and 8), never on how many tokens, sequences or
which entry point share the launch: prefill, decode, chain and tree verify give the same
bits per token on the GPU, as the portable kernel does on the CPU (the two differ from
each other; a library is built for one device). Rows past the end of the list score
nothing and weigh exactly 0, and a warp with no rows merges as exactly zero.

The weighted V sum of a block: lane (g, c) loads the ``vec``-wide piece c of rows g, g + G,
g + 2G, ... (G = 32 / (head_dim / vec) row groups; 4 at head_dim 64, 2 at 128, 16-byte loads
at fp16), all of them right after the block's slots are known, so the loads are in flight
while the block's softmax is formed; then it weighs and sums its rows in order, and each lane
adds the G partial sums of its own dims in group order. Rows past the end of the list take the
last row's slot at weight 0. Why: with the row-by-row sum (a lane's 2-byte loads, a few rows
in flight) an H100 took ~7 us per pass of 8 x 32 rows, 56 us per SmolLM2 layer at a 2,048-token
context whose 1.5 MB of K/V the GPU reads in ~0.5 us; and ptxas places loads next to their
uses unless they are issued before a barrier. Head dims whose pieces do not tile a warp keep
the row-by-row sum.

Why 8 warps: a decode step has one token, so its parallelism is heads x warps; one warp
per head walked a 2,048-token context in 64 serial blocks (93% of a SmolLM2 step on an
H200). With 8 the walk is 8 blocks deep, and a 512-token prefill still fills the GPU.

After the QKV projection, one kernel adds the bias (Qwen2), rotates q and k and appends k
and v to the cache: one work item per element (token, head, dim), its angle computed by the
same expression as the portable kernel's per-token table -- one launch where the portable
graph has three (a GPU decode step is bound by launches).
"""
from __future__ import annotations


import math

from tvm.script import tirx as T

from speccompile.kernels import kernel_cache

from speccompile.runtime.contract import KV_PAGE_SIZE as PAGE

WARP = 32  # lanes per warp; also rows per block of the walk
WARPS = 8  # warps per (token, query head): warp w walks row blocks w, w + 8, w + 16, ...
NEG = -3.0e38  # the running maximum before any row


def max_vector_lanes() -> int:
    """Widest vector of the GPU target being built: Metal has no vector types over 4 lanes (no
    half8); cuda and opencl load 16 bytes (8 halves)."""
    import tvm

    target = tvm.target.Target.current(allow_none=True)
    return 4 if target is not None and target.kind.name == "metal" else 8


def _angle(pos, i, half: int, head_dim: int, theta: float):
    """The rotation angle of pair element ``i % half`` at position ``pos`` (kernels/attention.py's table)."""
    return T.Cast("float32", pos) / T.pow(T.float32(theta), T.Cast("float32", (i % half) * 2) / T.float32(head_dim))


@kernel_cache
def qkv_rope_append_gpu(num_layers: int, num_heads: int, num_kv: int, head_dim: int, theta: float, dtype: str,
                        bias: bool):
    """One kernel for what follows the QKV projection: (+ bias), q_rot [n, H, d] = RoPE(q),
    kv[layer, 0/1, slot[t]] = RoPE(k[t]) / v[t] in place -- one launch where the portable
    graph has two or three (bias add, rope_q, append_kv). One work item per element of qkv;
    each element rotated by the portable kernels' formula, after the same bias add."""
    half, heads = head_dim // 2, num_heads + 2 * num_kv
    per_tok = heads * head_dim

    def val(qkv, b, t, h, i):
        return qkv[t, h, i] if b is None else qkv[t, h, i] + b[h * head_dim + i]

    def rope(qkv, b, t, h, i, p):
        x = T.Cast("float32", val(qkv, b, t, h, i))
        rot = T.if_then_else(i < half, -T.Cast("float32", val(qkv, b, t, h, i + half)),
                             T.Cast("float32", val(qkv, b, t, h, i - half)))
        a = _angle(p, i, half, head_dim, theta)
        return T.Cast(dtype, x * T.cos(a) + rot * T.sin(a))

    @T.macro
    def body(kv, qkv, b, pos, slot, layer, q, n):
        for e in T.parallel(n * per_tok):
            t: T.let[T.int64] = e // per_tok
            h: T.let[T.int64] = e % per_tok // head_dim
            i: T.let[T.int64] = e % head_dim
            if h < num_heads:
                q[t, h, i] = rope(qkv, b, t, h, i, pos[t])
            elif h < num_heads + num_kv:
                kv[layer, 0, slot[t], h - num_heads, i] = rope(qkv, b, t, h, i, pos[t])
            else:
                kv[layer, 1, slot[t], h - num_heads - num_kv, i] = val(qkv, b, t, h, i)

    @T.prim_func(private=True)
    def with_bias(var_kv: T.handle, var_qkv: T.handle, b: T.Buffer((per_tok,), dtype), var_pos: T.handle,
                  var_slot: T.handle, layer: T.int64, var_q: T.handle):
        T.func_attr({"tir.noalias": True, "op_pattern": 8})
        n = T.int64()
        slots = T.int64()
        kv = T.match_buffer(var_kv, (num_layers, 2, slots, num_kv, head_dim), dtype)
        qkv = T.match_buffer(var_qkv, (n, heads, head_dim), dtype)
        pos = T.match_buffer(var_pos, (n,), "int32")
        slot = T.match_buffer(var_slot, (n,), "int32")
        q = T.match_buffer(var_q, (n, num_heads, head_dim), dtype)
        body(kv, qkv, b, pos, slot, layer, q, n)

    @T.prim_func(private=True)
    def without_bias(var_kv: T.handle, var_qkv: T.handle, var_pos: T.handle, var_slot: T.handle, layer: T.int64,
                     var_q: T.handle):
        T.func_attr({"tir.noalias": True, "op_pattern": 8})
        n = T.int64()
        slots = T.int64()
        kv = T.match_buffer(var_kv, (num_layers, 2, slots, num_kv, head_dim), dtype)
        qkv = T.match_buffer(var_qkv, (n, heads, head_dim), dtype)
        pos = T.match_buffer(var_pos, (n,), "int32")
        slot = T.match_buffer(var_slot, (n,), "int32")
        q = T.match_buffer(var_q, (n, num_heads, head_dim), dtype)
        body(kv, qkv, None, pos, slot, layer, q, n)

    return with_bias if bias else without_bias


@T.macro
def tree_sum32(src, base, out):
    """out[0] = src[base] + ... + src[base + 31] in one fixed pairwise order: out[t] = src[base + t]
    + src[base + t + 16], then lanes 0..h-1 add lane t + h, h = 8, 4, 2, 1 -- the tree a warp
    would run across its lanes, run by one thread over partials in shared memory or registers
    (``out`` may be ``src`` itself at base 0). Every GPU reduction whose bits must not depend on
    the launch uses it: the projections (kernels/gpu_matmul.py), attention and the norm."""
    for t in T.unroll(16):
        out[t] = src[base + t] + src[base + t + 16]
    for t in T.unroll(8):
        out[t] = out[t] + out[t + 8]
    for t in T.unroll(4):
        out[t] = out[t] + out[t + 4]
    for t in T.unroll(2):
        out[t] = out[t] + out[t + 2]
    out[0] = out[0] + out[1]


@kernel_cache
def attention_gpu(num_layers: int, num_heads: int, num_kv: int, head_dim: int, dtype: str, v_sum: str = "tiled"):
    """out[t, h] = softmax(q k^T / sqrt(d)) v over the rows token t may see; the arguments of
    kernels/attention.py's ``attention``. Grid: (token, query head) x 32 lanes. ``v_sum="rows"``
    keeps the row-by-row V sum for every head dim (the GPU check's kernel bench compares them)."""
    group, per_lane = num_heads // num_kv, (head_dim + WARP - 1) // WARP  # lane tx owns dims v * 32 + tx
    vec = max_vector_lanes()  # K-row loads of 16 bytes at fp16 (8 on Metal)
    vec = vec if head_dim % vec == 0 else 1
    scale = 1.0 / math.sqrt(head_dim)
    per_row = head_dim // vec  # lanes that cover one V row with a vector load each
    tiles = v_sum == "tiled" and vec > 1 and WARP % per_row == 0
    groups = WARP // per_row if tiles else 0  # row groups of the tiled V sum

    @T.macro
    def v_rows_load(kv, layer, hk, slot_s, vals, w, tx):
        """(Nothing ahead: the row-by-row sum loads as it goes.)"""
        T.evaluate(0)

    @T.macro
    def v_rows_sum(kv, layer, hk, red, slot_s, vals, vp, o, w, tx, left):
        """o += sum over the block's rows j < left of weight_j * V[row j]: row by row, each lane its dims."""
        for j in range(T.max(T.min(left, WARP), 0)):
            for v in T.unroll(per_lane):
                if v * WARP + tx < head_dim:
                    o[v] = o[v] + red[w * WARP + j] * T.Cast(
                        "float32", kv[layer, 1, slot_s[w * WARP + j], hk, v * WARP + tx])

    @T.macro
    def v_tiled_load(kv, layer, hk, slot_s, vals, w, tx):
        """Lane (g, c) loads dims c*vec.. of the block's rows g, g + groups, ... (``per_row`` rows,
        one vector each), issued together as soon as the slots are known, so they land while the
        softmax of the block is formed."""
        for i in T.unroll(per_row):
            for u in T.vectorized(vec):
                vals[i * vec + u] = kv[layer, 1, slot_s[w * WARP + T.Cast("int32", tx) // per_row + i * groups], hk,
                                       T.Cast("int32", tx) % per_row * vec + u]

    @T.macro
    def v_tiled_sum(kv, layer, hk, red, slot_s, vals, vp, o, w, tx, left):
        """The row-by-row sum from the loaded vectors: each lane weighs and sums its rows in row
        order, then adds the ``groups`` partial sums of its own dims in group order. A row past
        the end holds the last row's V at weight 0 (so it adds +-0.0)."""
        g: T.let[T.int32] = T.Cast("int32", tx) // per_row
        c: T.let[T.int32] = T.Cast("int32", tx) % per_row
        acc = T.decl_buffer((vec,), "float32", scope="local")
        for u in T.unroll(vec):
            acc[u] = T.float32(0)
        for i in T.unroll(per_row):
            for u in T.unroll(vec):
                acc[u] = acc[u] + red[w * WARP + g + i * groups] * T.Cast("float32", vals[i * vec + u])
        for u in T.unroll(vec):
            vp[(w * groups + g) * head_dim + c * vec + u] = acc[u]
        T.tvm_storage_sync("shared")
        for v in T.unroll(per_lane):
            if v * WARP + tx < head_dim:
                acc[0] = vp[w * groups * head_dim + v * WARP + tx]
                for gg in range(1, groups):
                    acc[0] = acc[0] + vp[(w * groups + gg) * head_dim + v * WARP + tx]
                o[v] = o[v] + acc[0]

    load_values, weigh_values = (v_tiled_load, v_tiled_sum) if groups else (v_rows_load, v_rows_sum)

    @T.prim_func(private=True)
    def kernel(var_q: T.handle, var_kv: T.handle, var_pt: T.handle, var_seq: T.handle, var_prefix: T.handle,
               var_extra: T.handle, var_extra_len: T.handle, layer: T.int64, var_out: T.handle):
        T.func_attr({"tir.noalias": True, "op_pattern": 8, "tirx.is_scheduled": True})
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
        for t in T.thread_binding(n, thread="blockIdx.x"):
            for hq in T.thread_binding(num_heads, thread="blockIdx.y"):
                for w in T.thread_binding(WARPS, thread="threadIdx.y"):
                    for tx in T.thread_binding(WARP, thread="threadIdx.x"):
                        q_s = T.decl_buffer((head_dim,), "float32", scope="shared")
                        red = T.decl_buffer((WARPS * WARP,), "float32", scope="shared")  # [w, j]: scores, weights
                        slot_s = T.decl_buffer((WARPS * WARP,), "int32", scope="shared")
                        part = T.decl_buffer((WARPS * (head_dim + 2),), "float32", scope="shared")  # [w]: m, l, o
                        vals = T.decl_buffer((max(per_row, 1) * vec,), dtype, scope="local")  # V vectors ahead
                        vp = T.decl_buffer((WARPS * WARP * vec,), "float32", scope="shared")  # [w, g, d]: V sums
                        tmp = T.decl_buffer((16,), "float32", scope="local")
                        o = T.decl_buffer((per_lane,), "float32", scope="local")  # dims v * 32 + tx
                        kl = T.decl_buffer((vec,), dtype, scope="local")
                        st = T.decl_buffer((5,), "float32", scope="local")  # m, l, score, alpha, new m
                        for v in T.unroll(per_lane):
                            if w == 0 and v * WARP + tx < head_dim:
                                q_s[v * WARP + tx] = T.Cast("float32", q[t, hq, v * WARP + tx])
                            o[v] = T.float32(0)
                        st[0] = T.float32(NEG)
                        st[1] = T.float32(0)
                        T.tvm_storage_sync("shared")
                        hk: T.let[T.int32] = T.Cast("int32", hq) // group
                        pre: T.let[T.int32] = prefix[t]
                        sq: T.let[T.int32] = seq[t]  # loaded once, not before every pass's page lookup
                        rows: T.let[T.int32] = prefix[t] + extra_len[t]
                        for it in range(((rows + WARP - 1) // WARP + WARPS - 1) // WARPS):
                            blk: T.let[T.int32] = it * WARPS + T.Cast("int32", w)  # this warp's block of rows
                            r: T.let[T.int32] = blk * WARP + T.Cast("int32", tx)
                            # a row past the end takes the last row's slot: its V is loaded, weighted 0
                            rr: T.let[T.int32] = T.min(r, rows - 1)
                            s: T.let[T.int32] = T.if_then_else(
                                rr < pre, pt[sq, T.min(rr // PAGE, T.Cast("int32", pages) - 1)] * PAGE + rr % PAGE,
                                extra[t, T.max(rr - pre, 0)])
                            st[2] = T.float32(NEG)
                            if r < rows:
                                for a in T.unroll(4):
                                    tmp[a] = T.float32(0)
                                for c in range(head_dim // vec):
                                    for u in T.vectorized(vec):
                                        kl[u] = kv[layer, 0, s, hk, c * vec + u]
                                    for u in T.unroll(vec):
                                        tmp[u % 4] = tmp[u % 4] + q_s[c * vec + u] * T.Cast("float32", kl[u])
                                st[2] = ((tmp[0] + tmp[1]) + (tmp[2] + tmp[3])) * T.float32(scale)
                            red[w * WARP + tx] = st[2]
                            slot_s[w * WARP + tx] = s
                            T.tvm_storage_sync("shared")
                            load_values(kv, layer, hk, slot_s, vals, w, tx)
                            st[4] = st[0]  # the block's new maximum, read by every lane of the warp alike
                            for j in range(WARP):
                                st[4] = T.max(st[4], red[w * WARP + j])
                            T.tvm_storage_sync("shared")
                            red[w * WARP + tx] = T.if_then_else(r < rows, T.exp(st[2] - st[4]), T.float32(0))
                            T.tvm_storage_sync("shared")
                            tree_sum32(red, w * WARP, tmp)
                            st[3] = T.exp(st[0] - st[4])
                            st[1] = st[1] * st[3] + tmp[0]
                            st[0] = st[4]
                            for v in T.unroll(per_lane):
                                o[v] = o[v] * st[3]
                            weigh_values(kv, layer, hk, red, slot_s, vals, vp, o, w, tx, rows - blk * WARP)
                            T.tvm_storage_sync("shared")
                        # each warp's (m, l, o) into shared; warp 0 merges them in warp order
                        if tx == 0:
                            part[w * (head_dim + 2)] = st[0]
                            part[w * (head_dim + 2) + 1] = st[1]
                        for v in T.unroll(per_lane):
                            if v * WARP + tx < head_dim:
                                part[w * (head_dim + 2) + 2 + v * WARP + tx] = o[v]
                        T.tvm_storage_sync("shared")
                        if w == 0:
                            st[4] = part[0]
                            for u in range(1, WARPS):
                                st[4] = T.max(st[4], part[u * (head_dim + 2)])
                            st[1] = T.float32(0)
                            for v in T.unroll(per_lane):
                                o[v] = T.float32(0)
                            for u in range(WARPS):
                                st[3] = T.exp(part[u * (head_dim + 2)] - st[4])
                                st[1] = st[1] + part[u * (head_dim + 2) + 1] * st[3]
                                for v in T.unroll(per_lane):
                                    if v * WARP + tx < head_dim:
                                        o[v] = o[v] + part[u * (head_dim + 2) + 2 + v * WARP + tx] * st[3]
                            for v in T.unroll(per_lane):
                                if v * WARP + tx < head_dim:
                                    out[t, hq, v * WARP + tx] = T.Cast(dtype, o[v] / st[1])

    return kernel
