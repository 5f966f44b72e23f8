"""Greedy acceptance (``accept_greedy``) as a TensorIR kernel compiled into every model library.

Batched over sequences, tree-aware, and a twin of ``runtime/acceptance.py`` (the numpy
reference, which also handles sampling): per row, the argmax of the target logits
(first index of the maximum, as numpy); per sequence, a walk from the root that follows
the child whose token equals its parent row's argmax. Only a few integers per sequence
leave the device, not the logits.

Inputs (rows of all sequences back to back, each sequence's row 0 = its last token):
  logits [n, vocab]; tokens [n] (row token); parents [n] (local parent row, -1 = root);
  seq_indptr [b + 1]. Output out [b + 1, n + 2]: out[i, 0] = accepted drafts,
  out[i, 1] = bonus token, out[i, 2 + d] = accepted draft node (row - 1) at depth d.
"""
from __future__ import annotations


from tvm.script import tirx as T

from speccompile.kernels import kernel_cache


@T.macro
def _walk(s, indptr, parents, tokens, best, out, scratch):
    """Sequence s: from its root row, follow the child whose token is its parent's argmax."""
    st = T.decl_buffer((3,), "int32", scope=scratch)  # current row, accepted, still walking
    st[0] = indptr[s]
    st[1] = 0
    st[2] = 1
    for _step in range(indptr[s + 1] - indptr[s]):
        if st[2] == 1:
            st[2] = 0
            for c in range(indptr[s] + 1, indptr[s + 1]):
                if st[2] == 0 and parents[c] == st[0] - indptr[s] and tokens[c] == best[st[0]]:
                    out[s, 2 + st[1]] = T.Cast("int32", c - indptr[s] - 1)
                    st[0] = T.Cast("int32", c)
                    st[1] = st[1] + 1
                    st[2] = 1
    out[s, 0] = st[1]
    out[s, 1] = best[st[0]]


@kernel_cache
def accept_greedy(vocab: int):
    @T.prim_func(private=True)
    def kernel(var_logits: T.handle, var_tokens: T.handle, var_parents: T.handle, var_indptr: T.handle,
               var_out: T.handle):
        T.func_attr({"tir.noalias": True, "op_pattern": 8, "speccompile.kernel": "accept_greedy"})
        n = T.int64()
        b1 = T.int64()
        logits = T.match_buffer(var_logits, (n, vocab), "float32")
        tokens = T.match_buffer(var_tokens, (n,), "int32")
        parents = T.match_buffer(var_parents, (n,), "int32")
        indptr = T.match_buffer(var_indptr, (b1,), "int32")
        out = T.match_buffer(var_out, (b1, n + 2), "int32")
        best = T.decl_buffer((n,), "int32")
        for i in T.parallel(n):
            top = T.decl_buffer((1,), "float32", scope="global")  # stack scratch on the CPU
            arg = T.decl_buffer((1,), "int32", scope="global")
            top[0] = logits[i, 0]
            arg[0] = 0
            for v in range(1, vocab):
                if logits[i, v] > top[0]:
                    top[0] = logits[i, v]
                    arg[0] = v
            best[i] = arg[0]
        for s in range(b1 - 1):
            _walk(s, indptr, parents, tokens, best, out, "global")

    return kernel


ARGMAX_THREADS = 256  # threads per block of the GPU argmax
ARGMAX_PARTS = 32  # blocks per logits row in the GPU argmax: a 152k vocabulary was one block's 594 serial loads


@T.macro
def tree_argmax(tx, val, idx, mine, at, nt):
    """GPU: combine the ``nt`` threads' (mine[0], at[0]) -- each the first maximum of its share,
    at = past the end if none -- into the block's first maximum: a fixed tree in shared val/idx
    halves them, the lower index winning ties, so the result is the first maximum of the union
    whatever the shares were. Every step reads into registers, syncs, then writes (the sync
    planner refuses a sync inside a branch). Afterwards val[0]/idx[0] hold it for all threads."""
    val[tx] = mine[0]
    idx[tx] = at[0]
    for step in T.unroll(nt.bit_length() - 1):
        T.tvm_storage_sync("shared")
        if tx < T.shift_right(nt // 2, step):
            mine[1] = val[tx + T.shift_right(nt // 2, step)]
            at[1] = idx[tx + T.shift_right(nt // 2, step)]
            if mine[1] > mine[0] or (mine[1] == mine[0] and at[1] < at[0]):
                mine[0] = mine[1]
                at[0] = at[1]
        T.tvm_storage_sync("shared")
        if tx < T.shift_right(nt // 2, step):
            val[tx] = mine[0]
            idx[tx] = at[0]
    T.tvm_storage_sync("shared")


LOAD_AHEAD = 8  # GPU: a thread's strided loads issued together in a pass over a row


@T.macro
def load_strided(src, row, first, tx, buf, count, nt, vocab):
    """buf[i] = src[row, (first + i) * nt + tx] for i < count, every load issued before any is
    used (not one memory latency per element); an index past the row reads its last element,
    which the caller does not use."""
    for i in T.unroll(count):
        buf[i] = src[row, T.min((first + i) * nt + tx, vocab - 1)]


@T.macro
def scan_first_max(logits, row, tx, mine, at, got, first, count, nt, vocab):
    """mine[0] / at[0] <- the first maximum of themselves and logits[row, (first + i) * nt + tx],
    i < count (indices rise, so ">" keeps the first); ``got``: count floats of scratch."""
    load_strided(logits, row, first, tx, got, count, nt, vocab)
    for i in T.unroll(count):
        if (first + i) * nt + tx < vocab and got[i] > mine[0]:
            mine[0] = got[i]
            at[0] = T.Cast("int32", (first + i) * nt + tx)


@T.macro
def block_argmax(logits, row, tx, val, idx, mine, at, vocab, nt):
    """GPU: the first maximum of logits[row] over one block of ``nt`` (a power of two)
    threads: each thread scans its stride ``LOAD_AHEAD`` logits at a time, then
    ``tree_argmax``. Afterwards mine[0]/at[0] of thread 0, and val[0]/idx[0] for all threads,
    hold the maximum and its index (vocab if the row has no finite value)."""
    got = T.decl_buffer((LOAD_AHEAD,), "float32", scope="local")
    mine[0] = T.float32(-3.4e38)
    at[0] = vocab
    for io in range((vocab + nt * LOAD_AHEAD - 1) // (nt * LOAD_AHEAD)):
        scan_first_max(logits, row, tx, mine, at, got, io * LOAD_AHEAD, LOAD_AHEAD, nt, vocab)
    tree_argmax(tx, val, idx, mine, at, nt)


@kernel_cache
def accept_greedy_gpu(vocab: int):
    """The same contract on GPU threads, in three launches: ``ARGMAX_PARTS`` blocks per row each
    find the first maximum of their slice of the vocabulary (a thread's loads unrolled, so they
    are in flight together), one block per row combines the slices' results, one thread per
    sequence walks its tree. The first maximum is unique, so the split gives the CPU kernel's
    answer exactly; a row with no value above -3.4e38 (all -inf or NaN) takes index 0."""
    nt, parts = ARGMAX_THREADS, ARGMAX_PARTS
    per_thread = (vocab + parts * nt - 1) // (parts * nt)  # logits per thread; a part's slice is nt of these

    @T.prim_func(private=True)
    def kernel(var_logits: T.handle, var_tokens: T.handle, var_parents: T.handle, var_indptr: T.handle,
               var_out: T.handle):
        T.func_attr({"tir.noalias": True, "op_pattern": 8, "tirx.is_scheduled": True,
                     "speccompile.kernel": "accept_greedy"})
        n = T.int64()
        b1 = T.int64()
        logits = T.match_buffer(var_logits, (n, vocab), "float32")
        tokens = T.match_buffer(var_tokens, (n,), "int32")
        parents = T.match_buffer(var_parents, (n,), "int32")
        indptr = T.match_buffer(var_indptr, (b1,), "int32")
        out = T.match_buffer(var_out, (b1, n + 2), "int32")
        part_val = T.decl_buffer((n * parts,), "float32")  # [row, part]: the slice's maximum
        part_idx = T.decl_buffer((n * parts,), "int32")  # and its index (vocab if none)
        best = T.decl_buffer((n,), "int32")
        for row in T.thread_binding(n, thread="blockIdx.x"):
            for p in T.thread_binding(parts, thread="blockIdx.y"):
                for tx in T.thread_binding(nt, thread="threadIdx.x"):
                    val = T.decl_buffer((nt,), "float32", scope="shared")
                    idx = T.decl_buffer((nt,), "int32", scope="shared")
                    mine = T.decl_buffer((2,), "float32", scope="local")  # this thread's max, a rival's
                    at = T.decl_buffer((2,), "int32", scope="local")  # and their indices
                    got = T.decl_buffer((per_thread,), "float32", scope="local")
                    mine[0] = T.float32(-3.4e38)
                    at[0] = vocab
                    scan_first_max(logits, row, tx, mine, at, got, p * per_thread, per_thread, nt, vocab)
                    tree_argmax(tx, val, idx, mine, at, nt)
                    if tx == 0:
                        part_val[row * parts + p] = mine[0]
                        part_idx[row * parts + p] = at[0]
        for row in T.thread_binding(n, thread="blockIdx.x"):
            for tx in T.thread_binding(parts, thread="threadIdx.x"):
                val = T.decl_buffer((parts,), "float32", scope="shared")
                idx = T.decl_buffer((parts,), "int32", scope="shared")
                mine = T.decl_buffer((2,), "float32", scope="local")
                at = T.decl_buffer((2,), "int32", scope="local")
                mine[0] = part_val[row * parts + tx]
                at[0] = part_idx[row * parts + tx]
                tree_argmax(tx, val, idx, mine, at, parts)
                if tx == 0:
                    best[row] = T.if_then_else(at[0] < vocab, at[0], 0)
        for sb in T.thread_binding((b1 + 63) // 64, thread="blockIdx.x"):
            for st_x in T.thread_binding(64, thread="threadIdx.x"):
                if sb * 64 + st_x < b1 - 1:
                    _walk(sb * 64 + st_x, indptr, parents, tokens, best, out, "local")

    return kernel
