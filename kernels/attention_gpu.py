"""GPU versions of the paged-attention, RoPE and KV-append kernels of kernels/attention.py.

Why separate kernels: the portable ones run one serial work item per token (RoPE, KV
append) or per (token, KV head) (attention), which suits a CPU's few threads but leaves a
GPU idle: a decode step ran 2 attention threads per layer, and the first GPU check
(H200) measured attention at 50-94% of every forward -- 0.78 ms per layer per decoded
token on Qwen2.5-1.5B with a 16-token context, 94% of a 512-token prefill.

Attention: a token's rows (the same list as the portable kernel: the sequence's positions
``0..prefix-1`` through its page table, then its extra slots) are cut into passes of 256 and
the passes into at most 8 chunks of equal whole passes (``chunking``: 2,048 rows are 8 chunks
of one pass, 8,192 rows 8 of four). A work-group of 8 warps attends one chunk of one (token,
query head): the chunk's rows are blocks of 32, warp ``w`` walking blocks ``w, w + 8, ...``
of it with its own online softmax state. Inside a block, lane j scores row ``32b + j`` (a full
dot product over head_dim in a fixed order); the block's maximum, exp weights and their fixed
pairwise sum are formed from shared memory identically by every lane of the warp; then each
lane updates its head_dim / 32 output elements over the block's rows in increasing order.
Warp 0 merges the 8 warp states in warp order into the chunk's state (m, l, o); a token of one
chunk writes its output there, a token of several writes the state, and a second kernel
(``attention_merge_gpu``) merges its chunk states in chunk order by the same rule. Every
quantity depends only on the token's own row list (and the constants 32, 8 and 8), never on
how many tokens, sequences or which entry point share the launch, nor on how many work-groups
a launch gives each (token, head) (``split_grid``): prefill, decode, chain and tree verify
give the same bits per token on the GPU, as the portable kernel does on the CPU (the two
differ from each other; a library is built for one device). Rows past the end of the list
score nothing and weigh exactly 0, and a warp with no rows merges as exactly zero.

Why chunks: a decode step has one token, so one work-group per (token, head) put 9 to 14
work-groups on a GPU of 132 SMs; the H100 profile of a SmolLM2 step at a 2,048-token context
spent 73% of it in attention (56 us per layer walking 8 passes one after another). With the
chunks side by side a decode step's passes run together; a prefill has tokens enough and walks
a token's chunks in one work-group. The cost: a second launch per layer, and chunk states of
``[tokens, heads, 8, head_dim + 2]`` floats (planned by Relax beside the layer's buffers).

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

Why 8 warps: one warp per head walked a 2,048-token context in 64 serial blocks (93% of a
SmolLM2 step on an H200); with 8, a pass covers 256 rows.

After the QKV projection, one kernel adds the bias (Qwen2), rotates q and k and appends k
and v to the cache: one work item per element (token, head, dim), its angle computed by the
same expression as the portable kernel's per-token table -- one launch where the portable
graph has three (a GPU decode step is bound by launches).
"""
from __future__ import annotations


import math

from tvm.script import tirx as T

from speccompile.kernels import kernel_cache
from speccompile.kernels.attention import rope_angle
from speccompile.models.rope import Rope

from speccompile.runtime.contract import KV_PAGE_SIZE as PAGE

WARP = 32  # lanes per warp; also rows per block of the walk
WARPS = 8  # warps per (token, query head, chunk): warp w walks row blocks w, w + 8, w + 16, ... of the chunk
PASS = WARPS * WARP  # rows of one pass of a work-group
SPLITS = 8  # most chunks a token's rows are cut into
SPLIT_ROWS = 64  # launches of up to 64 / Z tokens run Z work-groups per (token, head), Z <= SPLITS
NEG = -3.0e38  # the running maximum before any row


def chunking(rows):
    """(passes, passes per chunk, chunks) of a token that sees ``rows`` rows: its passes of 256
    rows cut into at most SPLITS chunks of equal whole passes (the last may be shorter). A
    function of the token's own row count only, so a token's bits do not depend on the launch."""
    passes = (rows + PASS - 1) // PASS
    per_chunk = (passes + SPLITS - 1) // SPLITS
    return passes, per_chunk, (passes + per_chunk - 1) // per_chunk


def split_grid(n):
    """Work-groups per (token, head) for a launch of ``n`` tokens: a decode or verify step has
    few tokens, so its chunks run side by side (a 2,048-token context: 8 work-groups per head
    where one walked all the rows); a prefill has tokens enough, and one work-group walks a
    token's chunks one after another. Any Z gives the same bits."""
    return T.max(T.int64(1), T.min(T.int64(SPLITS), T.int64(SPLIT_ROWS) // n))


def _state_at(src, t, hq, u, k, head_dim):
    """Element k of softmax state u -- (m, l, o[head_dim]) -- in a work-group's warp states
    (shared, [u * (head_dim + 2) + k]) or a token's chunk states (global, [t, hq, u, k])."""
    return src[u * (head_dim + 2) + k] if len(src.shape) == 1 else src[t, hq, u, k]


def state_merge(head_dim: int):
    """The one merge of online-softmax states, in state order: m = the largest m_u, then
    l = sum l_u exp(m_u - m) and o = sum o_u exp(m_u - m), each summed u = 0, 1, ... in turn
    (st[4] = m, st[1] = l; lane tx's dims v * 32 + tx of o). Warps into a chunk's state and
    chunks into a token's output both use it."""
    per_lane = (head_dim + WARP - 1) // WARP

    @T.macro
    def merge(src, t, hq, count, st, o, tx):
        st[4] = _state_at(src, t, hq, 0, 0, head_dim)
        for u in range(1, count):
            st[4] = T.max(st[4], _state_at(src, t, hq, u, 0, head_dim))
        st[1] = T.float32(0)
        for v in T.unroll(per_lane):
            o[v] = T.float32(0)
        for u in range(count):
            st[3] = T.exp(_state_at(src, t, hq, u, 0, head_dim) - st[4])
            st[1] = st[1] + _state_at(src, t, hq, u, 1, head_dim) * st[3]
            for v in T.unroll(per_lane):
                if v * WARP + tx < head_dim:
                    o[v] = o[v] + _state_at(src, t, hq, u, 2 + v * WARP + tx, head_dim) * st[3]

    return merge


def max_vector_lanes() -> int:
    """Widest vector of the GPU target being built: Metal has no vector types over 4 lanes (no
    half8); cuda and opencl load 16 bytes (8 halves)."""
    import tvm

    target = tvm.target.Target.current(allow_none=True)
    return 4 if target is not None and target.kind.name == "metal" else 8


@kernel_cache
def qkv_rope_append_gpu(num_layers: int, num_heads: int, num_kv: int, head_dim: int, rope: Rope, dtype: str,
                        bias: bool):
    """One kernel for what follows the QKV projection: (+ bias), q_rot [n, H, d] = RoPE(q),
    kv[layer, 0/1, slot[t]] = RoPE(k[t]) / v[t] in place -- one launch where the portable
    graph has two or three (bias add, rope_q, append_kv). One work item per element of qkv;
    each element rotated by the portable kernels' formula, after the same bias add."""
    rotary, heads = rope.rotary_dim, num_heads + 2 * num_kv
    half, per_tok = rotary // 2, heads * head_dim

    def val(qkv, b, t, h, i):
        return qkv[t, h, i] if b is None else qkv[t, h, i] + b[h * head_dim + i]

    def rotate(qkv, b, t, h, i, p):
        # kernels/attention.py's _rope_elem, with the angle per element
        x = T.Cast("float32", val(qkv, b, t, h, i))
        j = i if rotary == head_dim else T.min(i, rotary - 1)
        rot = T.if_then_else(j < half, -T.Cast("float32", val(qkv, b, t, h, j + half)),
                             T.Cast("float32", val(qkv, b, t, h, T.max(j - half, 0))))
        a = rope_angle(p, j % half, rope)
        y = x * (T.cos(a) * T.float32(rope.scale)) + rot * (T.sin(a) * T.float32(rope.scale))
        return T.Cast(dtype, y if rotary == head_dim else T.if_then_else(i < rotary, y, x))

    @T.macro
    def body(kv, qkv, b, pos, slot, layer, q, n):
        for e in T.parallel(n * per_tok):
            t: T.let[T.int64] = e // per_tok
            h: T.let[T.int64] = e % per_tok // head_dim
            i: T.let[T.int64] = e % head_dim
            if h < num_heads:
                q[t, h, i] = rotate(qkv, b, t, h, i, pos[t])
            elif h < num_heads + num_kv:
                kv[layer, 0, slot[t], h - num_heads, i] = rotate(qkv, b, t, h, i, pos[t])
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
def attention_gpu(num_layers: int, num_heads: int, num_kv: int, head_dim: int, dtype: str, v_sum: str = "tiled",
                  scale: float = 0.0, window: int = 0):
    """out[t, h] = softmax(q k^T * scale) v over the rows token t may see; the arguments, and
    ``scale`` and ``window``, of kernels/attention.py's ``attention``. Grid: (token, query head)
    x 32 lanes. ``v_sum="rows"`` keeps the row-by-row V sum for every head dim (the GPU check's
    kernel bench compares them)."""
    group, per_lane = num_heads // num_kv, (head_dim + WARP - 1) // WARP  # lane tx owns dims v * 32 + tx
    vec = max_vector_lanes()  # K-row loads of 16 bytes at fp16 (8 on Metal)
    vec = vec if head_dim % vec == 0 else 1
    scale = scale or 1.0 / math.sqrt(head_dim)
    reach = window or 2 ** 30  # rows a token attends at most
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
    merge_states = state_merge(head_dim)

    @T.prim_func(private=True)
    def kernel(var_q: T.handle, var_kv: T.handle, var_pt: T.handle, var_seq: T.handle, var_prefix: T.handle,
               var_extra: T.handle, var_extra_len: T.handle, layer: T.int64, var_out: T.handle, var_part: T.handle):
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
        part = T.match_buffer(var_part, (n, num_heads, SPLITS, head_dim + 2), "float32")  # [t, h, chunk]: m, l, o
        for t in T.thread_binding(n, thread="blockIdx.x"):
            for hq in T.thread_binding(num_heads, thread="blockIdx.y"):
                for z in T.thread_binding(split_grid(n), thread="blockIdx.z"):
                    for w in T.thread_binding(WARPS, thread="threadIdx.y"):
                        for tx in T.thread_binding(WARP, thread="threadIdx.x"):
                            q_s = T.decl_buffer((head_dim,), "float32", scope="shared")
                            red = T.decl_buffer((WARPS * WARP,), "float32", scope="shared")  # [w, j]: scores, weights
                            slot_s = T.decl_buffer((WARPS * WARP,), "int32", scope="shared")
                            warp_part = T.decl_buffer((WARPS * (head_dim + 2),), "float32", scope="shared")  # [w]: m, l, o
                            vals = T.decl_buffer((max(per_row, 1) * vec,), dtype, scope="local")  # V vectors ahead
                            vp = T.decl_buffer((WARPS * WARP * vec,), "float32", scope="shared")  # [w, g, d]: V sums
                            tmp = T.decl_buffer((16,), "float32", scope="local")
                            o = T.decl_buffer((per_lane,), "float32", scope="local")  # dims v * 32 + tx
                            kl = T.decl_buffer((vec,), dtype, scope="local")
                            st = T.decl_buffer((5,), "float32", scope="local")  # m, l, score, alpha, new m
                            for v in T.unroll(per_lane):
                                if w == 0 and v * WARP + tx < head_dim:
                                    q_s[v * WARP + tx] = T.Cast("float32", q[t, hq, v * WARP + tx])
                            T.tvm_storage_sync("shared")
                            hk: T.let[T.int32] = T.Cast("int32", hq) // group
                            pre: T.let[T.int32] = prefix[t]
                            sq: T.let[T.int32] = seq[t]  # loaded once, not before every pass's page lookup
                            first: T.let[T.int32] = T.max(prefix[t] + extra_len[t] - reach, 0)  # window's first row
                            rows: T.let[T.int32] = prefix[t] + extra_len[t] - first
                            passes: T.let[T.int32] = chunking(rows)[0]
                            per_chunk: T.let[T.int32] = chunking(rows)[1]  # passes of a chunk
                            chunks: T.let[T.int32] = chunking(rows)[2]
                            zz: T.let[T.int32] = T.Cast("int32", z)
                            zn: T.let[T.int32] = T.Cast("int32", split_grid(n))
                            # this block's chunks: z, z + Z, ... (each chunk's bits do not depend on Z)
                            for ci in range((chunks - zz + zn - 1) // zn):
                                c: T.let[T.int32] = zz + ci * zn
                                st[0] = T.float32(NEG)
                                st[1] = T.float32(0)
                                for v in T.unroll(per_lane):
                                    o[v] = T.float32(0)
                                for it in range(T.min(per_chunk, passes - c * per_chunk)):
                                    blk: T.let[T.int32] = (c * per_chunk + it) * WARPS + T.Cast("int32", w)
                                    r: T.let[T.int32] = blk * WARP + T.Cast("int32", tx)
                                    # a row past the end takes the last row's slot: its V is loaded, weighted 0
                                    rr: T.let[T.int32] = first + T.min(r, rows - 1)
                                    s: T.let[T.int32] = T.if_then_else(
                                        rr < pre,
                                        pt[sq, T.min(rr // PAGE, T.Cast("int32", pages) - 1)] * PAGE + rr % PAGE,
                                        extra[t, T.max(rr - pre, 0)])
                                    st[2] = T.float32(NEG)
                                    if r < rows:
                                        for a in T.unroll(4):
                                            tmp[a] = T.float32(0)
                                        for cc in range(head_dim // vec):
                                            for u in T.vectorized(vec):
                                                kl[u] = kv[layer, 0, s, hk, cc * vec + u]
                                            for u in T.unroll(vec):
                                                tmp[u % 4] = tmp[u % 4] + q_s[cc * vec + u] * T.Cast("float32", kl[u])
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
                                # the chunk: each warp's (m, l, o) into shared; warp 0 merges them in warp order
                                if tx == 0:
                                    warp_part[w * (head_dim + 2)] = st[0]
                                    warp_part[w * (head_dim + 2) + 1] = st[1]
                                for v in T.unroll(per_lane):
                                    if v * WARP + tx < head_dim:
                                        warp_part[w * (head_dim + 2) + 2 + v * WARP + tx] = o[v]
                                T.tvm_storage_sync("shared")
                                if w == 0:
                                    merge_states(warp_part, t, hq, WARPS, st, o, tx)
                                    # one chunk: the output itself; more: the chunk's state for attention_merge_gpu
                                    if chunks == 1:
                                        for v in T.unroll(per_lane):
                                            if v * WARP + tx < head_dim:
                                                out[t, hq, v * WARP + tx] = T.Cast(dtype, o[v] / st[1])
                                    else:
                                        if tx == 0:
                                            part[t, hq, c, 0] = st[4]
                                            part[t, hq, c, 1] = st[1]
                                        for v in T.unroll(per_lane):
                                            if v * WARP + tx < head_dim:
                                                part[t, hq, c, 2 + v * WARP + tx] = o[v]
                                T.tvm_storage_sync("shared")

    return kernel


@kernel_cache
def attention_merge_gpu(num_heads: int, head_dim: int, dtype: str, window: int = 0):
    """out[t, h] of every token cut into more than one chunk: its chunk states merged in chunk
    order (state_merge); tokens of one chunk got their output from attention_gpu itself. One
    warp per (token, query head); out is updated in place. ``window``: attention_gpu's."""
    per_lane = (head_dim + WARP - 1) // WARP
    reach = window or 2 ** 30
    merge_states = state_merge(head_dim)

    @T.prim_func(private=True)
    def kernel(var_out: T.handle, var_part: T.handle, var_prefix: T.handle, var_extra_len: T.handle):
        T.func_attr({"tir.noalias": True, "op_pattern": 8, "tirx.is_scheduled": True})
        n = T.int64()
        out = T.match_buffer(var_out, (n, num_heads, head_dim), dtype)
        part = T.match_buffer(var_part, (n, num_heads, SPLITS, head_dim + 2), "float32")
        prefix = T.match_buffer(var_prefix, (n,), "int32")
        extra_len = T.match_buffer(var_extra_len, (n,), "int32")
        for t in T.thread_binding(n, thread="blockIdx.x"):
            for hq in T.thread_binding(num_heads, thread="blockIdx.y"):
                for tx in T.thread_binding(WARP, thread="threadIdx.x"):
                    o = T.decl_buffer((per_lane,), "float32", scope="local")
                    st = T.decl_buffer((5,), "float32", scope="local")
                    chunks: T.let[T.int32] = chunking(T.min(prefix[t] + extra_len[t], reach))[2]
                    if chunks > 1:
                        merge_states(part, t, hq, chunks, st, o, tx)
                        for v in T.unroll(per_lane):
                            if v * WARP + tx < head_dim:
                                out[t, hq, v * WARP + tx] = T.Cast(dtype, o[v] / st[1])

    return kernel
