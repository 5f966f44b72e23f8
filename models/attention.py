"""Paged KV storage and attention kernels whose arithmetic never depends on batching.

Why not TVM's ``PagedKVCache``: for a multi-token forward it attends the cached prefix
and the new chunk separately and merges the two softmax states, while a one-token decode
runs a single pass. The two round differently (1.7e-5 on SmolLM2), so a token verified
among drafts would not get the logits it gets when decoded alone, and greedy speculation
would not be exactly lossless. Here every query walks its rows in one fixed order -- the
sequence's positions ``0..prefix-1`` through its page table, then any extra rows (a
token tree's ancestors, in depth order) -- with the same online-softmax arithmetic in
every mode, so prefill, decode, chain verify and tree verify agree bit for bit.

Cache layout: ``kv [layers, 2, slots, kv_heads, head_dim]``, ``slot = page * 16 + offset``.
"""
from __future__ import annotations

import math

from tvm.script import tirx as T

PAGE = 16


def scratch_scope() -> str:
    """Storage scope of per-thread scratch: registers on GPUs ("local"); on the CPU a
    "local" buffer is a heap workspace call per task while a "global" one declared inside
    the parallel body is a stack alloca that LLVM keeps in registers. Kernels are built
    while the model is exported, under the compile target."""
    import tvm

    target = tvm.target.Target.current(allow_none=True)
    return "global" if target is None or target.kind.name == "llvm" else "local"


def rope_q(num_heads: int, num_kv: int, head_dim: int, theta: float, dtype: str):
    """q_rot [n, H, d] = RoPE(q part of qkv [n, H+2Hkv, d]) at positions [n] (rotate-half)."""
    half = head_dim // 2

    @T.prim_func(private=True)
    def kernel(var_qkv: T.handle, var_pos: T.handle, var_out: T.handle):
        T.func_attr({"tir.noalias": True, "op_pattern": 8})
        n = T.int64()
        qkv = T.match_buffer(var_qkv, (n, num_heads + 2 * num_kv, head_dim), dtype)
        pos = T.match_buffer(var_pos, (n,), "int32")
        out = T.match_buffer(var_out, (n, num_heads, head_dim), dtype)
        for t in T.parallel(n):
            for h, i in T.grid(num_heads, head_dim):
                out[t, h, i] = _rope_elem(qkv, t, h, i, pos[t], half, head_dim, theta, dtype)

    return kernel


def _rope_elem(buf, t, h, i, p, half, head_dim, theta, dtype):
    freq = T.Cast("float32", p) / T.pow(T.float32(theta), T.Cast("float32", (i % half) * 2) / T.float32(head_dim))
    x = T.Cast("float32", buf[t, h, i])
    rot = T.if_then_else(i < half, -T.Cast("float32", buf[t, h, i + half]), T.Cast("float32", buf[t, h, i - half]))
    return T.Cast(dtype, x * T.cos(freq) + rot * T.sin(freq))


def append_kv(num_layers: int, num_heads: int, num_kv: int, head_dim: int, theta: float, dtype: str):
    """kv[layer, 0/1, slot[t]] = RoPE(k[t]) / v[t] (in place)."""
    half = head_dim // 2

    @T.prim_func(private=True)
    def kernel(var_kv: T.handle, var_qkv: T.handle, var_pos: T.handle, var_slot: T.handle, layer: T.int64):
        T.func_attr({"tir.noalias": True, "op_pattern": 8})
        n = T.int64()
        slots = T.int64()
        kv = T.match_buffer(var_kv, (num_layers, 2, slots, num_kv, head_dim), dtype)
        qkv = T.match_buffer(var_qkv, (n, num_heads + 2 * num_kv, head_dim), dtype)
        pos = T.match_buffer(var_pos, (n,), "int32")
        slot = T.match_buffer(var_slot, (n,), "int32")
        for t in T.parallel(n):
            for h, i in T.grid(num_kv, head_dim):
                kv[layer, 0, slot[t], h, i] = _rope_elem(qkv, t, num_heads + h, i, pos[t], half, head_dim, theta, dtype)
                kv[layer, 1, slot[t], h, i] = qkv[t, num_heads + num_kv + h, i]

    return kernel


def attention(num_layers: int, num_heads: int, num_kv: int, head_dim: int, dtype: str):
    """out[t, h] = softmax(q k^T / sqrt(d)) v over the rows token t may see (see module doc).

    seq[t]: row of the page table; prefix[t]: rows 0..prefix-1 of that sequence;
    extra[t, 0:extra_len[t]]: further absolute slots (tree ancestors, then the node itself).
    """
    group = num_heads // num_kv
    scratch = scratch_scope()
    lanes = 16 if head_dim % 16 == 0 else 8
    chunks = head_dim // lanes
    scale = 1.0 / math.sqrt(head_dim)

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
        for th in T.parallel(n * num_heads):
            acc = T.decl_buffer((lanes,), "float32", scope=scratch)
            o = T.decl_buffer((head_dim,), "float32", scope=scratch)
            st = T.decl_buffer((5,), "float32", scope=scratch)  # m, denom, s, rescale, p
            for i in T.vectorized(head_dim):
                o[i] = T.float32(0)
            st[0] = T.float32(-3.0e38)
            st[1] = T.float32(0)
            for r in range(prefix[th // num_heads] + extra_len[th // num_heads]):
                # one row: its slot, score, and the online-softmax update
                s: T.let[T.int32] = T.if_then_else(
                    r < prefix[th // num_heads],
                    pt[seq[th // num_heads], T.min(r // PAGE, T.Cast("int32", pages) - 1)] * PAGE + r % PAGE,
                    extra[th // num_heads, T.max(r - prefix[th // num_heads], 0)])
                for l in T.vectorized(lanes):
                    acc[l] = T.float32(0)
                for c in range(chunks):
                    for l in T.vectorized(lanes):
                        acc[l] = acc[l] + T.Cast("float32", q[th // num_heads, th % num_heads, c * lanes + l]) * T.Cast("float32", kv[layer, 0, s, (th % num_heads) // group, c * lanes + l])
                st[2] = T.float32(0)
                for l in range(lanes):
                    st[2] = st[2] + acc[l]
                st[2] = st[2] * T.float32(scale)
                # rescale = exp(m - max), p = exp(s - max): one of the two is exp(0) = 1
                if st[2] > st[0]:
                    st[3] = T.exp(st[0] - st[2])
                    st[4] = T.float32(1)
                    st[0] = st[2]
                else:
                    st[3] = T.float32(1)
                    st[4] = T.exp(st[2] - st[0])
                st[1] = st[1] * st[3] + st[4]
                for i in T.vectorized(head_dim):
                    o[i] = o[i] * st[3] + st[4] * T.Cast("float32", kv[layer, 1, s, (th % num_heads) // group, i])
            for i in T.vectorized(head_dim):
                out[th // num_heads, th % num_heads, i] = T.Cast(dtype, o[i] / st[1])

    return kernel


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
