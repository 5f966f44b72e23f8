"""The CPU paged-attention kernel alone (kernels/attention.py): rows in blocks of 16, per block
one maximum, one rescale and one vector of exponentials.

The model-level tests see at most ~21 rows per token; here tokens see up to 70 (four whole
blocks and a partial one), through a page table out of order and with tree rows (extra
slots), against float64 attention, and each token's output must be the same bits whether it
runs alone or among the others -- what makes prefill, decode and verify agree.
"""
from __future__ import annotations

import numpy as np
import tvm

from speccompile.compiler.targets import cpu_target
from speccompile.kernels import attention as A
from speccompile.kernels.attention import _exp

H, KV, D, LAYERS, PAGE = 6, 2, 64, 2, A.PAGE


def _kernel():
    target = tvm.target.Target(cpu_target(None, None))
    with target:
        func = A.attention(LAYERS, H, KV, D, "float32").with_attr("global_symbol", "main")
    return tvm.compile(tvm.IRModule({"main": func}), target=target)["main"]


def _run(fn, q, kv, pt, seq, prefix, extra, extra_len, layer):
    dev = tvm.cpu()
    out = tvm.runtime.tensor(np.zeros(q.shape, np.float32), dev)
    fn(*[tvm.runtime.tensor(np.ascontiguousarray(a), dev) for a in (q, kv, pt, seq, prefix, extra, extra_len)],
       layer, out)
    return out.numpy()


def test_blocked_attention_matches_float64_and_each_token_is_bit_identical_alone():
    rng = np.random.default_rng(0)
    pages = 6
    slots = pages * PAGE
    order = rng.permutation(pages).astype(np.int32)  # the sequence's pages, out of order
    kv = rng.standard_normal((LAYERS, 2, slots, KV, D)).astype(np.float32)
    n = 12
    prefix = np.array([1, 15, 16, 17, 31, 32, 33, 47, 64, 70, 40, 40], np.int32)
    q = (3 * rng.standard_normal((n, H, D))).astype(np.float32)  # sharp softmaxes: the maximum moves
    # the last two tokens are tree nodes: rows 0..39, then their ancestors' slots and their own
    extra = np.zeros((n, 3), np.int32)
    extra_len = np.zeros(n, np.int32)
    slot = lambda r: int(order[r // PAGE]) * PAGE + r % PAGE
    extra[10, :2], extra_len[10] = [slot(80), slot(81)], 2
    extra[11, :3], extra_len[11] = [slot(80), slot(82), slot(83)], 3
    pt, seq = order[None, :], np.zeros(n, np.int32)
    fn = _kernel()
    out = _run(fn, q, kv, pt, seq, prefix, extra, extra_len, 1)
    for t in range(n):  # float64 reference over the same rows
        rows = [slot(r) for r in range(prefix[t])] + list(extra[t, : extra_len[t]])
        for h in range(H):
            k = kv[1, 0, rows, h // (H // KV)].astype(np.float64)
            v = kv[1, 1, rows, h // (H // KV)].astype(np.float64)
            s = k @ q[t, h].astype(np.float64) / np.sqrt(D)
            p = np.exp(s - s.max())
            assert np.abs(out[t, h] - (p / p.sum()) @ v).max() < 2e-5
        alone = _run(fn, q[t: t + 1], kv, pt, seq[t: t + 1], prefix[t: t + 1], extra[t: t + 1], extra_len[t: t + 1], 1)
        assert np.array_equal(alone[0], out[t])  # the same bits alone as among the others


def test_the_inlined_exponential_is_close_to_exp_and_exact_at_zero():
    x = np.concatenate([-np.logspace(-8, np.log10(87), 2000), [0.0, -100.0, -1e30]]).astype(np.float32)
    target = tvm.target.Target(cpu_target(None, None))

    @tvm.script.tirx.prim_func
    def f(a: tvm.script.tirx.Buffer((x.size,), "float32"), b: tvm.script.tirx.Buffer((x.size,), "float32")):
        for i in range(x.size):
            b[i] = _exp(a[i])

    fn = tvm.compile(tvm.IRModule({"main": f.with_attr("global_symbol", "main")}), target=target)["main"]
    dev = tvm.cpu()
    out = tvm.runtime.tensor(np.zeros_like(x), dev)
    fn(tvm.runtime.tensor(x, dev), out)
    got, want = out.numpy().astype(np.float64), np.exp(x.astype(np.float64))
    ok = x >= -87
    assert np.all(np.abs(got[ok] - want[ok]) <= 3e-7 * want[ok])
    assert got[x == 0.0][0] == 1.0 and np.all(got[~ok] < 1e-37)
