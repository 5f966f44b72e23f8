"""The q4 matmul with activations quantized to int8 per 32-wide group, on every CPU ISA.

One kernel, several instruction sets, **the same bits**: per group the integer dot product
of the weight nibbles with the int8 activations is exact whatever instructions compute it,
and the float epilogue (``acc += dot * (scale_x * scale_w)``, one fused multiply-add per
group and lane, in group order) is the same expression everywhere. So a model gives the same
logits -- and the same tokens -- on an AVX-512 laptop, an AVX2 desktop, a Raspberry Pi and
a phone (tests/runtime/test_arm.py holds aarch64 to x86 bit for bit under qemu).

ISAs (``int8_dot_isa``):
- ``avx512vnni``: ``vpdpbusd`` (u8 x s8 -> i32, 4 per lane, 16 lanes);
- ``avx2``: ``vpmaddubsw`` + ``vpmaddwd``, the same dot of 4 in two steps (as llama.cpp does);
- ``dotprod`` (aarch64 with the dot-product extension: Cortex-A55/A76 and newer, Apple M1,
  Graviton 2): ``sdot`` on each 128-bit quarter of the 16-lane tile (nibbles 0..15 are
  valid signed bytes, so the signed dot is the unsigned-by-signed one);
- ``i8mm`` (aarch64 with the int8 matrix-multiply extension: Cortex-A510/A710/X2 and newer,
  Neoverse N2/V1 (Graviton 3), Apple M2): ``smmla`` on pairs of x rows -- a 2 x 8 by 8 x 2
  int8 product per instruction, two weight lanes by two rows -- so a verify's rows cost half
  the dot instructions of ``sdot``; a row left alone (a decode step) takes ``sdot``;
- ``neon`` (any other aarch64, e.g. Cortex-A72 in a Raspberry Pi 4): the same integer
  products written as plain multiply-adds, which LLVM vectorizes for NEON.
"""
from __future__ import annotations

import tvm
from tvm.script import tirx as T

from speccompile.kernels import kernel_cache
from speccompile.kernels.cpu_matmul import STACK, TILE
from speccompile.runtime.cpu import cpu_arch

INT8_ISAS = ("avx512vnni", "avx2", "i8mm", "dotprod", "neon")


def int8_dot_isa(target: tvm.target.Target) -> str | None:
    """Which integer dot-product instructions the q4 kernel uses on the target CPU (see the
    module doc), or None (x86 without AVX2: the float kernel, ``cpu_matmul.q4_matmul_tiled``)."""
    from tvm.target import codegen

    if target.kind.name != "llvm":
        return None
    arch = cpu_arch(str(target.attrs.get("mtriple", "")) or codegen.llvm_get_system_triple())
    if arch == "aarch64":
        if all(codegen.target_has_features(f, target) for f in ("i8mm", "dotprod")):
            return "i8mm"
        return "dotprod" if codegen.target_has_features("dotprod", target) else "neon"
    if arch != "x86_64":
        return None
    if all(codegen.target_has_features(f, target) for f in ("avx512vnni", "avx512bw", "avx512f")):
        return "avx512vnni"
    if codegen.target_has_features("avx2", target):
        return "avx2"
    return None


def _dot4(acc, bytes_u8, x4):
    """acc[16] += per-lane dot products of 4 unsigned weight bytes with 4 signed x bytes."""
    return T.call_llvm_pure_intrin("int32x16", "llvm.x86.avx512.vpdpbusd.512", acc,
                                   T.reinterpret("int8x64", bytes_u8), T.reinterpret("int8x64", T.broadcast(x4, 16)))


def _sdot(acc4, bytes_u8, x4):
    """acc[4] += per-lane dot products of 4 weight bytes with 4 signed x bytes (aarch64 sdot)."""
    return T.call_llvm_pure_intrin("int32x4", "llvm.aarch64.neon.sdot", acc4,
                                   T.reinterpret("int8x16", bytes_u8), T.reinterpret("int8x16", T.broadcast(x4, 4)))


@kernel_cache
def _smmla(acc4, w_u32x4, x_i32x4):
    """acc[2 i + j] += dot of the 8 weight bytes of lane i with the 8 x bytes of row j (aarch64
    smmla: a 2 x 8 by 8 x 2 int8 matrix product)."""
    return T.call_llvm_pure_intrin("int32x4", "llvm.aarch64.neon.smmla", acc4,
                                   T.reinterpret("int8x16", w_u32x4), T.reinterpret("int8x16", x_i32x4))


def q4_matmul_int8(n: int, k: int, dtype: str, isa: str = "avx512vnni"):
    """The q4 matmul with activations quantized to int8 per 32-wide group (as llama.cpp does),
    for ``isa`` one of INT8_ISAS (the module doc; on a 2-core Zen 3, AVX2 took Qwen2.5-1.5B q4
    decoding from 11 to 27 tok/s, and a 4-token verify from 2.7x to 1.9x a decode step).

    Why: the float kernel spends 4 instructions decoding each 16-nibble vector and is
    compute-bound at ~21 GB/s; here a weight word splits into even and odd nibble bytes
    with 3 instructions, and each ``vpdpbusd`` does 64 multiply-adds. Decode then runs near
    memory bandwidth, and each extra verified token costs ~8 dot instructions per group
    instead of 32 FMAs, so verifying drafts is cheaper too.

    Per group the integer sum is exact, so only the per-group float update
    ``acc += (sum - 7 * sum(xq)) * (scale_x * scale_w)`` rounds -- in a fixed order, per
    row: batch invariant like the float kernel. The offset ``7 * sum(xq)`` is the integer
    accumulator's starting value, not a float subtraction: both operands are integers far
    below 2^24, so the result is the same bits, and each row pays 3 float operations per
    group instead of 4 (a verify's extra rows are compute-bound). Phase 1 packs x:
    ``xp[m, word, 0/1]`` holds the int8 x of the word's even / odd nibbles,
    ``xs[m, g] = scale_x``, ``xo[m, g] = 7 * sum(xq)``.
    """
    if isa not in INT8_ISAS:
        raise ValueError(f"int8 q4 kernel: unknown ISA {isa!r} (one of {', '.join(INT8_ISAS)})")
    kw, groups, L = k // 8, k // 32, TILE
    # independent integer chains per row: vpdpbusd's latency needs them; AVX2's int16 sums
    # already form a tree (one chain, no zero chains to add up)
    chains = (lambda c: c) if isa == "avx512vnni" else (lambda c: 1)
    lo_mask = T.broadcast(T.uint32(0x0F0F0F0F), L)
    PF = 4096  # prefetch distance in words
    # Rows of x per pass over a weight tile. Each pass decodes the tile's nibbles again, so a
    # verify's rows share one pass where the registers hold their accumulators: 8 rows in
    # AVX-512's 32 registers (Qwen2.5-1.5B's MLP matmuls on Zen 5, cache-resident: 3 rows
    # -17%, 5-6 rows -11%, 8 rows -8% against passes of 4, 2, 1), 4 in AVX2's 16 and in
    # NEON's 32 128-bit ones (a row's tile takes 4 of them, integer and float each), where a
    # remainder of 3 stays a pass of 2 and one of 1. Which pass a row lands in never changes
    # its bits (tests/kernels/test_cpu_kernels.py).
    block = 8 if isa == "avx512vnni" else 4

    def word(wf, t, g, wd):  # the 16 packed words (16 output rows) of word wd of group g
        return wf[T.ramp((t * kw + g * 4 + wd) * L, 1, L)]

    @T.macro
    def dots_vnni(wf, xp, xo, dot, t, g, base, mb, chains):
        for mi in T.unroll(mb):
            dot[mi, 0, T.ramp(0, 1, L)] = T.broadcast(-xo[base + mi, g], L)
            for c in T.unroll(1, chains):
                for l in T.vectorized(L):
                    dot[mi, c, l] = 0
        for wd in T.unroll(4):
            for mi in T.unroll(mb):
                for half in T.unroll(2):
                    dot[mi, (wd * 2 + half) % chains, T.ramp(0, 1, L)] = _dot4(
                        dot[mi, (wd * 2 + half) % chains, T.ramp(0, 1, L)],
                        T.bitwise_and(T.shift_right(word(wf, t, g, wd), T.broadcast(T.Cast("uint32", half * 4), L)),
                                      lo_mask),
                        xp[base + mi, g * 4 + wd, half])

    @T.macro
    def dots_avx2(wf, xp, xo, dot, t, g, base, mb, chains):
        # AVX2 has no vpdpbusd: vpmaddubsw multiplies unsigned weight nibbles by signed int8 x
        # and sums byte pairs into int16 (at most 2 * 15 * 127 = 3810); a group's eight such
        # products add up in int16 (at most 30480 < 2^15: exact) before one vpmaddwd by ones
        # widens them to int32. Exact integer sums: the very results of the VNNI kernel.
        # Each nibble vector is extracted once and multiplied into every row's accumulator
        # right away, so few registers are live however many rows (an expression per row
        # kept all 16 nibble vectors live, spilled them, and cost 30% more at M = 4-8).
        d16 = T.decl_buffer((mb, 2, 16), "int16", scope=STACK)
        nb = T.decl_buffer((32,), "int8", scope=STACK)
        for mi in T.unroll(mb):
            for h in T.unroll(2):
                d16[mi, h, T.ramp(0, 1, 16)] = T.broadcast(T.int16(0), 16)
        for wd in T.unroll(4):
            for h in T.unroll(2):
                for half in T.unroll(2):
                    nb[T.ramp(0, 1, 32)] = T.reinterpret("int8x32", T.bitwise_and(
                        T.shift_right(wf[T.ramp((t * kw + g * 4 + wd) * L + h * 8, 1, 8)],
                                      T.broadcast(T.Cast("uint32", half * 4), 8)),
                        T.broadcast(T.uint32(0x0F0F0F0F), 8)))
                    for mi in T.unroll(mb):
                        d16[mi, h, T.ramp(0, 1, 16)] = d16[mi, h, T.ramp(0, 1, 16)] + T.call_llvm_pure_intrin(
                            "int16x16", "llvm.x86.avx2.pmadd.ub.sw", nb[T.ramp(0, 1, 32)],
                            T.reinterpret("int8x32", T.broadcast(xp[base + mi, g * 4 + wd, half], 8)))
        for mi in T.unroll(mb):
            for h in T.unroll(2):
                dot[mi, 0, T.ramp(h * 8, 1, 8)] = T.call_llvm_pure_intrin(
                    "int32x8", "llvm.x86.avx2.pmadd.wd", d16[mi, h, T.ramp(0, 1, 16)], T.broadcast(T.int16(1), 16)
                ) - T.broadcast(xo[base + mi, g], 8)

    @T.macro
    def dots_sdot(wf, xp, xo, dot, t, g, base, mb, chains):
        # A 128-bit NEON register holds a quarter of the tile's 16 lanes: one sdot per quarter,
        # nibble parity and row, each adding 4 products per lane, as vpdpbusd does for all 16.
        for mi in T.unroll(mb):
            dot[mi, 0, T.ramp(0, 1, L)] = T.broadcast(-xo[base + mi, g], L)
        for wd in T.unroll(4):
            for q in T.unroll(4):
                for half in T.unroll(2):
                    for mi in T.unroll(mb):
                        dot[mi, 0, T.ramp(q * 4, 1, 4)] = _sdot(
                            dot[mi, 0, T.ramp(q * 4, 1, 4)],
                            T.bitwise_and(T.shift_right(wf[T.ramp((t * kw + g * 4 + wd) * L + q * 4, 1, 4)],
                                                        T.broadcast(T.Cast("uint32", half * 4), 4)),
                                          T.broadcast(T.uint32(0x0F0F0F0F), 4)),
                            xp[base + mi, g * 4 + wd, half])

    @T.macro
    def dots_int(wf, xp, xo, dot, t, g, base, mb, chains):
        # No dot-product instruction: the same 32 products per group and lane as int32
        # multiply-adds. Nibble b of a parity is bits 8b + 4 half of the word; its x is byte b
        # of the packed int32, sign-extended by shifting it to the top and back.
        for mi in T.unroll(mb):
            dot[mi, 0, T.ramp(0, 1, L)] = T.broadcast(-xo[base + mi, g], L)
        for wd in T.unroll(4):
            for half in T.unroll(2):
                for b in T.unroll(4):
                    for mi in T.unroll(mb):
                        for l in T.vectorized(L):
                            dot[mi, 0, l] = dot[mi, 0, l] + T.Cast("int32", T.bitwise_and(
                                T.shift_right(wf[(t * kw + g * 4 + wd) * L + l], T.Cast("uint32", half * 4 + b * 8)),
                                T.uint32(15))) * T.shift_right(
                                    T.shift_left(xp[base + mi, g * 4 + wd, half], 24 - b * 8), 24)

    @T.macro
    def dots_mmla(wf, xp, xo, dot, t, g, base, mb, chains):
        # smmla multiplies two 8-byte weight rows by two 8-byte x rows. A word's 8 nibbles are
        # its even-nibble bytes then its odd ones, against x's even then odd int8 (xp[.., 0],
        # xp[.., 1]): zipping a quarter's even and odd words pairs lanes (0, 1) and (2, 3),
        # and each product lands as (lane, row) = (0, m), (0, m + 1), (1, m), (1, m + 1),
        # unzipped into the rows' lanes at the group's end. A pass's odd row takes sdot.
        mm = T.decl_buffer((2, 4, 2, 4), "int32", scope=STACK)  # [row pair, quarter, lane pair, 2 x 2]
        wz = T.decl_buffer((2, 4), "uint32", scope=STACK)  # a quarter's even, odd nibble bytes
        for p in T.unroll(mb // 2):
            for q in T.unroll(4):
                for j in T.unroll(2):
                    mm[p, q, j, T.ramp(0, 1, 4)] = T.broadcast(0, 4)
        for mi in T.unroll(mb % 2):
            dot[mb - 1, 0, T.ramp(0, 1, L)] = T.broadcast(-xo[base + mb - 1, g], L)
        for wd in T.unroll(4):
            for q in T.unroll(4):
                for half in T.unroll(2):
                    wz[half, T.ramp(0, 1, 4)] = T.bitwise_and(
                        T.shift_right(wf[T.ramp((t * kw + g * 4 + wd) * L + q * 4, 1, 4)],
                                      T.broadcast(T.Cast("uint32", half * 4), 4)),
                        T.broadcast(T.uint32(0x0F0F0F0F), 4))
                for j in T.unroll(2):
                    for p in T.unroll(mb // 2):
                        mm[p, q, j, T.ramp(0, 1, 4)] = _smmla(
                            mm[p, q, j, T.ramp(0, 1, 4)],
                            T.Shuffle([wz[0, T.ramp(0, 1, 4)], wz[1, T.ramp(0, 1, 4)]], [2 * j, 2 * j + 4, 2 * j + 1, 2 * j + 5]),
                            T.Shuffle([xp[base + 2 * p, g * 4 + wd, T.ramp(0, 1, 2)],
                                       xp[base + 2 * p + 1, g * 4 + wd, T.ramp(0, 1, 2)]], [0, 1, 2, 3]))
                for mi in T.unroll(mb % 2):
                    for half in T.unroll(2):
                        dot[mb - 1, 0, T.ramp(q * 4, 1, 4)] = _sdot(
                            dot[mb - 1, 0, T.ramp(q * 4, 1, 4)], wz[half, T.ramp(0, 1, 4)], xp[base + mb - 1, g * 4 + wd, half])
        for p in T.unroll(mb // 2):
            for r in T.unroll(2):
                for q in T.unroll(4):
                    dot[2 * p + r, 0, T.ramp(q * 4, 1, 4)] = T.Shuffle(
                        [mm[p, q, 0, T.ramp(0, 1, 4)], mm[p, q, 1, T.ramp(0, 1, 4)]], [r, r + 2, r + 4, r + 6]
                    ) - T.broadcast(xo[base + 2 * p + r, g], 4)

    group_dots = {"avx512vnni": dots_vnni, "avx2": dots_avx2, "i8mm": dots_mmla, "dotprod": dots_sdot,
                  "neon": dots_int}[isa]

    @T.macro
    def rows(wf, sf, xp, xs, xo, y, t, base, mb, chains):
        # `chains` independent integer accumulators per row hide vpdpbusd's latency (one row
        # alone would otherwise wait on a single 8-long chain); integer sums are exact, so
        # the split cannot change any result.
        acc = T.decl_buffer((mb, L), "float32", scope=STACK)
        dot = T.decl_buffer((mb, chains, L), "int32", scope=STACK)
        for mi in T.unroll(mb):
            for l in T.vectorized(L):
                acc[mi, l] = T.float32(0)
        for g in range(groups):
            # software prefetch of every line 16 KB ahead in both streams (weights, scales): a
            # verify of up to 4 rows then runs at the memory speed of one row, not 1.6x its time
            # (prefetching past the end of the buffer is harmless on x86 and aarch64: prefetches never fault)
            for wd in T.unroll(4):
                T.evaluate(T.call_llvm_intrin("void", "llvm.prefetch.p0", T.address_of(wf[(t * kw + g * 4 + wd) * L + PF]),
                                              T.int32(0), T.int32(3), T.int32(1)))
            T.evaluate(T.call_llvm_intrin("void", "llvm.prefetch.p0", T.address_of(sf[(t * groups + g) * L + PF // 4]),
                                          T.int32(0), T.int32(3), T.int32(1)))
            group_dots(wf, xp, xo, dot, t, g, base, mb, chains)
            for mi in T.unroll(mb):
                for c in T.unroll(1, chains):
                    for l in T.vectorized(L):
                        dot[mi, 0, l] = dot[mi, 0, l] + dot[mi, c, l]
                for l in T.vectorized(L):
                    acc[mi, l] = acc[mi, l] + T.Cast("float32", dot[mi, 0, l]) * (
                        xs[base + mi, g] * T.Cast("float32", sf[(t * groups + g) * L + l]))
        for mi in T.unroll(mb):
            for l in T.vectorized(L):
                y[base + mi, t * L + l] = T.Cast(dtype, acc[mi, l])

    @T.macro
    def pack4(qv, xp, m, word, half):
        """Four int8 of one nibble parity (even: half 0, odd: half 1) into one int32."""
        xp[m, word, half] = T.bitwise_or(
            T.bitwise_or(T.bitwise_and(qv[(word % 4) * 8 + half], 255),
                         T.shift_left(T.bitwise_and(qv[(word % 4) * 8 + half + 2], 255), 8)),
            T.bitwise_or(T.shift_left(T.bitwise_and(qv[(word % 4) * 8 + half + 4], 255), 16),
                         T.shift_left(qv[(word % 4) * 8 + half + 6], 24)))

    @T.macro
    def quantize_group(x, xp, xs, xo, mg):
        """Round the 32 x of group mg (row mg // groups) to int8 and pack them for vpdpbusd."""
        qv = T.decl_buffer((32,), "int32", scope=STACK)
        st = T.decl_buffer((2,), "float32", scope=STACK)  # amax, 127 / amax
        so = T.decl_buffer((1,), "int32", scope=STACK)  # sum(xq)
        st[0] = T.float32(0)
        for i in range(32):
            st[0] = T.max(st[0], T.abs(T.Cast("float32", x[mg // groups, (mg % groups) * 32 + i])))
        st[1] = T.if_then_else(st[0] > T.float32(0), T.float32(127) / st[0], T.float32(0))
        so[0] = 0
        for i in range(32):
            qv[i] = T.Cast("int32", T.round(T.Cast("float32", x[mg // groups, (mg % groups) * 32 + i]) * st[1]))
            so[0] = so[0] + qv[i]
        for wd in range(4):
            pack4(qv, xp, mg // groups, (mg % groups) * 4 + wd, 0)
            pack4(qv, xp, mg // groups, (mg % groups) * 4 + wd, 1)
        xs[mg // groups, mg % groups] = st[0] / T.float32(127)
        xo[mg // groups, mg % groups] = so[0] * 7

    @T.prim_func(private=True)
    def kernel(var_x: T.handle, qw: T.Buffer((n, kw), "uint32"), qs: T.Buffer((n, groups), dtype), var_y: T.handle):
        T.func_attr({"tir.noalias": True})
        m_dim = T.int64()
        x = T.match_buffer(var_x, (m_dim, k), dtype)
        y = T.match_buffer(var_y, (m_dim, n), dtype)
        wf = T.decl_buffer((n * kw,), "uint32", data=qw.data)  # flat views of the tiled storage
        sf = T.decl_buffer((n * groups,), dtype, data=qs.data)
        xp = T.decl_buffer((m_dim, kw, 2), "int32")
        xs = T.decl_buffer((m_dim, groups), "float32")
        xo = T.decl_buffer((m_dim, groups), "int32")
        # phase 1: quantize x. Up to a few hundred rows this is cheaper on this thread than with
        # one more parallel launch (Zen 5: at 4-8 rows of the 8960-wide MLP input the parallel
        # launch cost 28-50 us of a 180-370 us matmul; at 256 rows the two were even); the
        # per-group arithmetic is the same either way.
        if m_dim * groups >= 65536:
            for mg in T.parallel(m_dim * groups):
                quantize_group(x, xp, xs, xo, mg)
        else:
            for mg in range(m_dim * groups):
                quantize_group(x, xp, xs, xo, mg)
        for t in T.parallel(n // L):  # phase 2: 16-row tiles, rows of x by `block`, the rest in one pass
            for mo in range(m_dim // block):
                rows(wf, sf, xp, xs, xo, y, t, mo * block, block, chains(1))
            if m_dim % block == 1:
                rows(wf, sf, xp, xs, xo, y, t, m_dim - 1, 1, chains(4))
            if m_dim % block == 2:
                rows(wf, sf, xp, xs, xo, y, t, m_dim - 2, 2, chains(2))
            if m_dim % block == 3:
                if block == 8:
                    rows(wf, sf, xp, xs, xo, y, t, m_dim - 3, 3, chains(2))
                else:
                    rows(wf, sf, xp, xs, xo, y, t, m_dim - 3, 2, chains(2))
                    rows(wf, sf, xp, xs, xo, y, t, m_dim - 1, 1, chains(4))
            if block == 8:
                if m_dim % block == 4:
                    rows(wf, sf, xp, xs, xo, y, t, m_dim - 4, 4, chains(1))
                if m_dim % block == 5:
                    rows(wf, sf, xp, xs, xo, y, t, m_dim - 5, 5, chains(1))
                if m_dim % block == 6:
                    rows(wf, sf, xp, xs, xo, y, t, m_dim - 6, 6, chains(1))
                if m_dim % block == 7:
                    rows(wf, sf, xp, xs, xo, y, t, m_dim - 7, 7, chains(1))

    return kernel
