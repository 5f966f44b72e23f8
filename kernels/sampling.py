"""Rejection-sampling verification as TensorIR kernels compiled into every model library.

The sampling half of the one verification routine (``runtime/acceptance.py`` is its numpy
reference). Two kernels, so the runtime only moves a few integers per sequence:

- ``sampling_probs``: logits -> probabilities with temperature, top-k and top-p, per row.
  The same kernel serves target and draft, which is what keeps the transform identical
  on both sides (a condition of losslessness). No sort: top-k and top-p thresholds are
  found by bisection over an order-preserving integer key of the float32 logits, so the
  threshold is an exact element of the row, found in at most 33 counting passes.
- ``accept_sampled``: recursive rejection sampling over chains and token trees, one
  sequence per work item, with the random numbers given as input (the caller owns the
  per-sequence generators, so a seeded request stays reproducible).

On GPUs (dispatched by passes/dispatch_gpu_kernels.py), ``sampling_probs_gpu`` (one thread
block per row) replaces the first and kernels/rejection_gpu.py's ``accept_sampled_gpu`` (one
block per sequence: thread 0 walks, the block makes the passes over the vocabulary) the second.

Differences from numpy, all at float ties: top-p keeps *every* element tied with the
last one it needs (numpy's stable argsort keeps only the lower indices among them), and
-0.0 ranks below +0.0. Sums are float32 (Metal has no float64), so a top-p cut or an
accept test that lands within ~1e-6 of its threshold may fall the other way.

Temperature <= 0 gives the one-hot of the first argmax: a greedy row, so greedy and
sampled sequences can share one batch (rejection sampling against a one-hot target
accepts exactly the argmax and then emits it, the greedy law).
"""
from __future__ import annotations


from tvm.script import tirx as T

from speccompile.kernels import kernel_cache

from speccompile.kernels.attention import scratch_scope
from speccompile.kernels.verification import LOAD_AHEAD as CHUNK, block_argmax, load_strided

INT32_MIN = -(2**31)
BISECT_STEPS = 33  # the key range spans at most 2**32 + 1 values
BUCKETS = 2048  # the CPU kernel's histograms: 11 bits of a key at a time
CANDIDATES = 4096  # most keys the CPU kernel's top-p bisection sums over as a list
MARGIN = 1e-3  # the K0 a top-p histogram proposes holds this much more than top_p (float sums differ)
SLOTS = 16  # the GPU kernel's keys above K0 kept per thread (4,096 a row; ~1,000 spread over 256 threads fit)
SPAN = 8.0  # the GPU kernel's K0: logits within SPAN temperatures of the maximum (probability > e^-8)


def _key(x):
    """int64 key of a float32 ordered like the floats (negative floats flip their magnitude bits)."""
    bits = T.reinterpret("int32", x)
    return T.Cast("int64", T.if_then_else(bits >= 0, bits, T.bitwise_xor(bits, T.int32(0x7FFFFFFF))))


def _ukey(x):
    """_key shifted to [0, 2**32): the same order, non-negative (its top bits pick a bucket)."""
    return _key(x) - T.int64(INT32_MIN)


@T.macro
def _find_bucket(hist, count: int, need, k, at, rank):
    """Scan ``hist`` [count] from its last bucket down: k[at] = the bucket where the running
    count reaches ``need``, k[rank] = ``need`` less the counts above that bucket."""
    k[at] = T.int64(-1)
    k[rank] = need
    for bb in range(count):
        if k[at] < 0:
            if T.Cast("int64", hist[count - 1 - bb]) >= k[rank]:
                k[at] = T.int64(count - 1 - bb)
            else:
                k[rank] = k[rank] - T.Cast("int64", hist[count - 1 - bb])


@kernel_cache
def sampling_probs(vocab: int):
    """The CPU kernel: a row per work item. The thresholds are the bisection's (module doc),
    found with fewer passes over the row (a pass over 152k logits is ~0.1 ms on one core; the
    bisections' ~66 made sampling 6 ms a row, a fifth of a 1.5B model's decode step):

    - top-k: the k-th largest key by radix selection -- counts of the keys' top 11 bits, then of
      the next 11 within the bucket that holds it, then of the last 10: three passes, exact.
    - top-p: the bisection's predicate at key K sums, in index order, the probabilities of
      the keys above K; every key it tests lies above its ``lo``. K0, a larger ``lo``: after a
      top-k, its threshold less one (all the mass lies above); else, from a histogram of the mass
      (and count) by the keys' top 11 bits, a bucket edge with a little more than top_p of the
      mass above it. One pass checks it exactly (the same
      index-order sum the bisection would make at K0) and lists the keys above it, in index
      order; the bisection then sums over that list alone -- the same terms in the same order,
      so the same bits -- from K0. Whatever K0 is, the threshold is the one the predicate
      defines; when the check fails or the list would be too long (a flat row: ~0.3 ms more
      than before, for the histogram), the bisection runs over the whole row from the bottom."""
    scratch = scratch_scope()

    @T.prim_func(private=True)
    def kernel(var_logits: T.handle, var_temp: T.handle, var_top_k: T.handle, var_top_p: T.handle,
               var_probs: T.handle):
        T.func_attr({"tir.noalias": True, "op_pattern": 8, "speccompile.kernel": "sampling_probs"})
        n = T.int64()
        logits = T.match_buffer(var_logits, (n, vocab), "float32")
        temp = T.match_buffer(var_temp, (n,), "float32")
        top_k = T.match_buffer(var_top_k, (n,), "int32")
        top_p = T.match_buffer(var_top_p, (n,), "float32")
        probs = T.match_buffer(var_probs, (n, vocab), "float32")
        for i in T.parallel(n):
            f = T.decl_buffer((4,), "float32", scope=scratch)  # max logit, softmax mass, kept mass, mass above K0
            # lo, hi, mid, count, argmax / top-k key, bucket, rank in it / candidates
            k = T.decl_buffer((7,), "int64", scope=scratch)
            f[0] = logits[i, 0]
            k[4] = T.int64(0)
            for v in range(1, vocab):
                if logits[i, v] > f[0]:
                    f[0] = logits[i, v]
                    k[4] = T.Cast("int64", v)
            if temp[i] <= T.float32(0):
                for v in range(vocab):
                    probs[i, v] = T.if_then_else(T.Cast("int64", v) == k[4], T.float32(1), T.float32(0))
            else:
                k[4] = T.int64(INT32_MIN)  # keep key >= this (INT32_MIN without top-k: everything)
                if top_k[i] > 0 and top_k[i] < vocab:
                    # the top_k-th largest key, 11 + 11 + 10 bits at a time
                    hist = T.decl_buffer((BUCKETS,), "int32", scope=scratch)  # key counts per bucket
                    for b in range(BUCKETS):
                        hist[b] = 0
                    for v in range(vocab):
                        hist[_ukey(logits[i, v]) // (1 << 21)] += 1
                    _find_bucket(hist, BUCKETS, T.Cast("int64", top_k[i]), k, 5, 6)
                    k[0] = k[5]  # the bits found so far
                    for b in range(BUCKETS):
                        hist[b] = 0
                    for v in range(vocab):
                        if _ukey(logits[i, v]) // (1 << 21) == k[0]:
                            hist[_ukey(logits[i, v]) // (1 << 10) % BUCKETS] += 1
                    _find_bucket(hist, BUCKETS, k[6], k, 5, 6)
                    k[0] = k[0] * BUCKETS + k[5]
                    for b in range(1024):
                        hist[b] = 0
                    for v in range(vocab):
                        if _ukey(logits[i, v]) // (1 << 10) == k[0]:
                            hist[_ukey(logits[i, v]) % 1024] += 1
                    _find_bucket(hist, 1024, k[6], k, 5, 6)
                    k[4] = k[0] * 1024 + k[5] + T.int64(INT32_MIN)
                f[1] = T.float32(0)
                for v in range(vocab):
                    if _key(logits[i, v]) >= k[4]:
                        probs[i, v] = T.exp(logits[i, v] / temp[i] - f[0] / temp[i])
                    else:
                        probs[i, v] = T.float32(0)
                    f[1] = f[1] + probs[i, v]
                f[2] = f[1]
                if top_p[i] < T.float32(1):
                    # top-p: hi = the smallest key K with mass(key > K) < top_p * mass; keep key >= hi
                    # K0 (k[2], when k[5] >= 0): top-k's threshold less one (all the mass is above it),
                    # else the highest bucket edge with top_p (and a margin) of the mass above it
                    cand = T.decl_buffer((CANDIDATES,), "int32", scope=scratch)  # indices with key > K0, in order
                    k[5] = T.int64(0)
                    k[2] = k[4] - 1
                    if k[4] == T.int64(INT32_MIN):
                        hist = T.decl_buffer((BUCKETS,), "int32", scope=scratch)  # key counts per bucket
                        mass = T.decl_buffer((BUCKETS,), "float32", scope=scratch)  # probability per bucket
                        for b in range(BUCKETS):
                            mass[b] = T.float32(0)
                            hist[b] = 0
                        for v in range(vocab):
                            mass[_ukey(logits[i, v]) // (1 << 21)] += probs[i, v]
                            hist[_ukey(logits[i, v]) // (1 << 21)] += 1
                        f[3] = T.float32(0)
                        k[5] = T.int64(-1)
                        k[6] = T.int64(0)  # keys at or above the bucket
                        for bb in range(BUCKETS):
                            if k[5] < 0:
                                f[3] = f[3] + mass[BUCKETS - 1 - bb]
                                k[6] = k[6] + T.Cast("int64", hist[BUCKETS - 1 - bb])
                                if f[3] >= top_p[i] * f[1] * T.float32(1 + MARGIN):
                                    k[5] = T.int64(BUCKETS - 1 - bb)
                        if k[6] > CANDIDATES:  # too many keys to list (a flat row): bisect over the row
                            k[5] = T.int64(-1)
                        k[2] = k[5] * (1 << 21) + T.int64(INT32_MIN) - 1
                    k[0] = T.int64(INT32_MIN) - 1
                    k[1] = _key(f[0])
                    k[6] = T.int64(CANDIDATES + 1)
                    if k[5] >= 0:  # check K0 exactly and list the keys above it
                        k[6] = T.int64(0)
                        f[3] = T.float32(0)
                        for v in range(vocab):
                            if _key(logits[i, v]) > k[2]:
                                f[3] = f[3] + probs[i, v]
                                if k[6] < CANDIDATES:
                                    cand[k[6]] = T.Cast("int32", v)
                                k[6] = k[6] + 1
                        if f[3] >= top_p[i] * f[1] and k[6] <= CANDIDATES:
                            k[0] = k[2]
                        else:
                            k[6] = T.int64(CANDIDATES + 1)
                    for _it in range(BISECT_STEPS):
                        if k[1] - k[0] > 1:
                            k[2] = T.floordiv(k[0] + k[1], 2)
                            f[2] = T.float32(0)
                            if k[6] <= CANDIDATES:
                                for j in range(k[6]):
                                    if _key(logits[i, cand[j]]) > k[2]:
                                        f[2] = f[2] + probs[i, cand[j]]
                            else:
                                for v in range(vocab):
                                    if _key(logits[i, v]) > k[2]:
                                        f[2] = f[2] + probs[i, v]
                            if f[2] < top_p[i] * f[1]:
                                k[1] = k[2]
                            else:
                                k[0] = k[2]
                    f[2] = T.float32(0)
                    for v in range(vocab):
                        if _key(logits[i, v]) < k[1]:
                            probs[i, v] = T.float32(0)
                        f[2] = f[2] + probs[i, v]
                for v in range(vocab):
                    probs[i, v] = probs[i, v] / f[2]

    return kernel


@kernel_cache
def accept_sampled(vocab: int):
    """Recursive rejection sampling, one sequence per work item (see runtime/acceptance.py).

    p [n, vocab] target probs per row; q [nq, vocab] the draft distribution each row's
    node was sampled from (nq = n, or 1 when every row is one-hot); one_hot [n] (q is the
    one-hot of the row's token: n-gram and greedy drafts); tokens, parents [n] and
    seq_indptr [b + 1] as in accept_greedy; uniforms [n + b] in [0, 1): row c's for the
    accept test of child c, n + s for sequence s's final draw. out [b + 1, n + 2] as in
    accept_greedy. The residual max(p - q, 0) lives in a workspace row per sequence.
    """
    scratch = scratch_scope()

    @T.prim_func(private=True)
    def kernel(var_p: T.handle, var_q: T.handle, var_one_hot: T.handle, var_tokens: T.handle,
               var_parents: T.handle, var_indptr: T.handle, var_uniforms: T.handle, var_out: T.handle):
        T.func_attr({"tir.noalias": True, "op_pattern": 8, "speccompile.kernel": "accept_sampled"})
        n = T.int64()
        nq = T.int64()
        b1 = T.int64()
        p = T.match_buffer(var_p, (n, vocab), "float32")
        q = T.match_buffer(var_q, (nq, vocab), "float32")
        one_hot = T.match_buffer(var_one_hot, (n,), "int32")
        tokens = T.match_buffer(var_tokens, (n,), "int32")
        parents = T.match_buffer(var_parents, (n,), "int32")
        indptr = T.match_buffer(var_indptr, (b1,), "int32")
        uniforms = T.match_buffer(var_uniforms, (n + b1 - 1,), "float32")
        out = T.match_buffer(var_out, (b1, n + 2), "int32")
        res = T.decl_buffer((b1 * vocab,), "float32")  # [b, vocab] residual of each sequence
        for s in T.parallel(b1 - 1):
            # current row, accepted, still walking, p is the residual row, siblings exhausted,
            # picked token, last token with mass
            st = T.decl_buffer((7,), "int32", scope=scratch)
            f = T.decl_buffer((4,), "float32", scope=scratch)  # p[x], q[x], mass, cdf
            st[0] = indptr[s]
            st[1] = 0
            st[2] = 1
            st[3] = 0
            for _step in range(indptr[s + 1] - indptr[s]):
                if st[2] == 1:
                    st[2] = 0
                    st[3] = 0
                    st[4] = 0
                    for c in range(indptr[s] + 1, indptr[s + 1]):
                        if st[2] == 0 and st[4] == 0 and parents[c] == st[0] - indptr[s]:
                            if st[3] == 1:
                                f[0] = res[s * vocab + T.Cast("int64", tokens[c])]
                            else:
                                f[0] = p[st[0], tokens[c]]
                            if one_hot[c] != 0:
                                f[1] = T.float32(1)
                            else:
                                f[1] = q[c, tokens[c]]
                            if f[1] > T.float32(0) and uniforms[c] < f[0] / f[1]:
                                out[s, 2 + st[1]] = T.Cast("int32", c - indptr[s] - 1)
                                st[0] = T.Cast("int32", c)
                                st[1] = st[1] + 1
                                st[2] = 1
                            else:  # rejected: p <- norm(max(p - q, 0)) for the next sibling
                                f[2] = T.float32(0)
                                for v in range(vocab):
                                    if st[3] == 0:
                                        res[s * vocab + v] = p[st[0], v]
                                    if one_hot[c] != 0:
                                        if v == tokens[c]:
                                            res[s * vocab + v] = T.float32(0)
                                    else:
                                        res[s * vocab + v] = T.max(res[s * vocab + v] - q[c, v], T.float32(0))
                                    f[2] = f[2] + res[s * vocab + v]
                                if f[2] <= T.float32(0):  # empty residual: back to the node's p, stop
                                    st[3] = 0
                                    st[4] = 1
                                else:
                                    for v in range(vocab):
                                        res[s * vocab + v] = res[s * vocab + v] / f[2]
                                    st[3] = 1
            out[s, 0] = st[1]
            # the final token: inverse CDF of the current p at uniforms[n + s] (as Generator.choice),
            # or the last token with mass should rounding leave the CDF at or below u
            f[2] = T.float32(0)
            for v in range(vocab):
                if st[3] == 1:
                    f[2] = f[2] + res[s * vocab + v]
                else:
                    f[2] = f[2] + p[st[0], v]
            f[3] = T.float32(0)
            st[5] = -1
            st[6] = 0
            for v in range(vocab):
                if st[3] == 1:
                    f[1] = res[s * vocab + v]
                else:
                    f[1] = p[st[0], v]
                f[3] = f[3] + f[1]
                if f[1] > T.float32(0):
                    st[6] = T.Cast("int32", v)
                if st[5] < 0 and f[3] / f[2] > uniforms[n + s]:
                    st[5] = T.Cast("int32", v)
            out[s, 1] = T.if_then_else(st[5] >= 0, st[5], st[6])

    return kernel


PROBS_THREADS = 256  # threads per row in the GPU sampling_probs kernel
_LOG_THREADS = 8


@T.macro
def block_sum(red, tx, acc):
    """acc[0] <- the sum of acc[0] over the block, in a fixed tree order (deterministic)."""
    red[tx] = acc[0]
    for step in T.unroll(_LOG_THREADS):  # 256 -> 1; read, sync, write
        T.tvm_storage_sync("shared")
        if tx < T.shift_right(PROBS_THREADS // 2, step):
            acc[0] = acc[0] + red[tx + T.shift_right(PROBS_THREADS // 2, step)]
        T.tvm_storage_sync("shared")
        if tx < T.shift_right(PROBS_THREADS // 2, step):
            red[tx] = acc[0]
    T.tvm_storage_sync("shared")
    acc[0] = red[0]
    T.tvm_storage_sync("shared")


@T.macro
def gather_above(logits, probs, row, tx, lv, pv, cl, cp, cnt, acc, k0, with_probs: bool, chunks, vocab):
    """One pass: this thread's elements with key >= k0, in its pass order, into cl / cp (their
    logits and probs, at most SLOTS; cnt[0] counts them all); acc[0] = their mass (their count
    without probs), summed in the order a bisection pass sums them."""
    cnt[0] = 0
    acc[0] = T.float32(0)
    for io in range(chunks):
        load_strided(logits, row, io * CHUNK, tx, lv, CHUNK, PROBS_THREADS, vocab)
        if with_probs:
            load_strided(probs, row, io * CHUNK, tx, pv, CHUNK, PROBS_THREADS, vocab)
        for ii in T.unroll(CHUNK):
            if (io * CHUNK + ii) * PROBS_THREADS + tx < vocab:
                if _key(lv[ii]) >= k0:
                    if cnt[0] < SLOTS:
                        cl[cnt[0]] = lv[ii]
                        if with_probs:
                            cp[cnt[0]] = pv[ii]
                    cnt[0] = cnt[0] + 1
                    acc[0] = acc[0] + (pv[ii] if with_probs else T.float32(1))


@kernel_cache
def sampling_probs_gpu(vocab: int):
    """The same contract, one thread block per row: every pass over the row is strided over
    256 threads, each loading its elements ``CHUNK`` at a time (``load_strided``), and reduced
    in shared memory. GPU sync rules forbid a barrier under a branch, so the optional stages run
    a data-dependent number of bisection steps (0 when off) and temperature 0 is resolved only
    in the final write.

    Each bisection starts from a proposed ``lo`` (K0): one pass lists, per thread, its keys at or
    above K0 (logits and probs, up to SLOTS each, in pass order), and checks K0 with the sum a
    pass would make there (top-k: at least top_k keys; top-p: top_p of the mass). When K0 holds
    and every list fits, each bisection step sums a thread's list instead of its share of the row:
    the same terms in the same order, the same tree, so the same bits, and the threshold is the
    one the predicate defines whatever K0 was. Why: a step over the row is ~600 loads per thread;
    66 of them made a 152k-vocabulary row a chain of 66 passes (never timed on a GPU: the GPU
    check's kernel bench times it). A row too flat for the lists bisects over the row."""
    nt = PROBS_THREADS
    chunks = (vocab + nt * CHUNK - 1) // (nt * CHUNK)  # a thread's chunks of CHUNK logits per pass

    @T.prim_func(private=True)
    def kernel(var_logits: T.handle, var_temp: T.handle, var_top_k: T.handle, var_top_p: T.handle,
               var_probs: T.handle):
        T.func_attr({"tir.noalias": True, "op_pattern": 8, "tirx.is_scheduled": True,
                     "speccompile.kernel": "sampling_probs"})
        n = T.int64()
        logits = T.match_buffer(var_logits, (n, vocab), "float32")
        temp = T.match_buffer(var_temp, (n,), "float32")
        top_k = T.match_buffer(var_top_k, (n,), "int32")
        top_p = T.match_buffer(var_top_p, (n,), "float32")
        probs = T.match_buffer(var_probs, (n, vocab), "float32")
        for row in T.thread_binding(n, thread="blockIdx.x"):
            for tx in T.thread_binding(nt, thread="threadIdx.x"):
                val = T.decl_buffer((nt,), "float32", scope="shared")
                idx = T.decl_buffer((nt,), "int32", scope="shared")
                f = T.decl_buffer((4,), "float32", scope="local")  # max, rival / K0 count or mass, mass, kept
                acc = T.decl_buffer((1,), "float32", scope="local")  # block-reduced count or mass
                at = T.decl_buffer((2,), "int32", scope="local")  # argmax, rival's index
                k = T.decl_buffer((5,), "int64", scope="local")  # lo, hi, mid, top-k key, K0
                lv = T.decl_buffer((CHUNK,), "float32", scope="local")  # a chunk of logits
                pv = T.decl_buffer((CHUNK,), "float32", scope="local")  # and of probs
                cl = T.decl_buffer((SLOTS,), "float32", scope="local")  # this thread's keys above K0: logits
                cp = T.decl_buffer((SLOTS,), "float32", scope="local")  # and probs
                cnt = T.decl_buffer((1,), "int32", scope="local")
                use = T.decl_buffer((1,), "int32", scope="local")  # bisect over the lists (1) or the row (0)
                block_argmax(logits, row, tx, val, idx, f, at, vocab, nt)  # the first maximum
                f[0] = val[0]
                at[0] = idx[0]
                T.tvm_storage_sync("shared")
                # top-k (see sampling_probs): the largest key lo with count(key >= lo) >= top_k,
                # from lo = K0 over the lists of keys >= K0 when K0 holds top_k keys and the lists fit
                k[0] = T.int64(INT32_MIN)
                k[1] = _key(f[0]) + 1
                use[0] = 0
                for _g in range(T.if_then_else(temp[row] > T.float32(0) and top_k[row] > 0 and top_k[row] < vocab,
                                               1, 0)):
                    k[4] = _key(f[0] - T.float32(SPAN) * temp[row])
                    gather_above(logits, probs, row, tx, lv, pv, cl, cp, cnt, acc, k[4], False, chunks, vocab)
                    block_sum(val, tx, acc)
                    f[1] = acc[0]  # keys >= K0
                    acc[0] = T.if_then_else(cnt[0] > SLOTS, T.float32(1), T.float32(0))
                    block_sum(val, tx, acc)  # threads whose list is too long
                    if acc[0] == T.float32(0) and f[1] >= T.Cast("float32", top_k[row]):
                        use[0] = 1
                        k[0] = k[4]
                for _it in range(T.if_then_else(temp[row] > T.float32(0) and top_k[row] > 0 and top_k[row] < vocab,
                                                BISECT_STEPS, 0)):
                    k[2] = T.floordiv(k[0] + k[1], 2)
                    acc[0] = T.float32(0)
                    if use[0] == 1:
                        for j in range(T.min(cnt[0], SLOTS)):
                            if _key(cl[j]) >= k[2]:
                                acc[0] = acc[0] + T.float32(1)
                    else:
                        for io in range(chunks):
                            load_strided(logits, row, io * CHUNK, tx, lv, CHUNK, nt, vocab)
                            for ii in T.unroll(CHUNK):
                                if (io * CHUNK + ii) * nt + tx < vocab:
                                    if _key(lv[ii]) >= k[2]:
                                        acc[0] = acc[0] + T.float32(1)
                    block_sum(val, tx, acc)
                    if k[1] - k[0] > 1:
                        if acc[0] >= T.Cast("float32", top_k[row]):
                            k[0] = k[2]
                        else:
                            k[1] = k[2]
                k[3] = k[0]
                acc[0] = T.float32(0)
                for io in range(chunks):
                    load_strided(logits, row, io * CHUNK, tx, lv, CHUNK, nt, vocab)
                    for ii in T.unroll(CHUNK):
                        if (io * CHUNK + ii) * nt + tx < vocab:
                            if temp[row] > T.float32(0) and _key(lv[ii]) >= k[3]:
                                pv[ii] = T.exp(lv[ii] / temp[row] - f[0] / temp[row])
                            else:
                                pv[ii] = T.float32(0)
                            probs[row, (io * CHUNK + ii) * nt + tx] = pv[ii]
                            acc[0] = acc[0] + pv[ii]
                block_sum(val, tx, acc)
                f[2] = acc[0]
                # top-p: the smallest key hi with mass(key > hi) < top_p * mass; keep key >= hi --
                # from lo = K0 - 1 over the lists of keys >= K0 when their mass (summed as a pass at
                # K0 - 1 sums it) holds top_p and the lists fit. K0: top-k's threshold (all the mass),
                # else the key SPAN temperatures below the maximum, then 2 SPAN.
                k[0] = T.int64(INT32_MIN) - 1
                k[1] = T.if_then_else(top_p[row] < T.float32(1), _key(f[0]), T.int64(INT32_MIN))
                use[0] = 0
                for attempt in range(T.if_then_else(temp[row] > T.float32(0) and top_p[row] < T.float32(1), 2, 0)):
                    for _g in range(T.if_then_else(use[0] == 0, 1, 0)):
                        k[4] = T.if_then_else(attempt == 0 and k[3] > T.int64(INT32_MIN), k[3],
                                              _key(f[0] - T.float32(SPAN) * T.Cast("float32", attempt + 1) * temp[row]))
                        gather_above(logits, probs, row, tx, lv, pv, cl, cp, cnt, acc, k[4], True, chunks, vocab)
                        block_sum(val, tx, acc)
                        f[1] = acc[0]  # mass of the keys >= K0
                        acc[0] = T.if_then_else(cnt[0] > SLOTS, T.float32(1), T.float32(0))
                        block_sum(val, tx, acc)
                        if acc[0] == T.float32(0) and not (f[1] < top_p[row] * f[2]):
                            use[0] = 1
                            k[0] = k[4] - 1
                for _it in range(T.if_then_else(temp[row] > T.float32(0) and top_p[row] < T.float32(1),
                                                BISECT_STEPS, 0)):
                    k[2] = T.floordiv(k[0] + k[1], 2)
                    acc[0] = T.float32(0)
                    if use[0] == 1:
                        for j in range(T.min(cnt[0], SLOTS)):
                            if _key(cl[j]) > k[2]:
                                acc[0] = acc[0] + cp[j]
                    else:
                        for io in range(chunks):
                            load_strided(logits, row, io * CHUNK, tx, lv, CHUNK, nt, vocab)
                            load_strided(probs, row, io * CHUNK, tx, pv, CHUNK, nt, vocab)
                            for ii in T.unroll(CHUNK):
                                if (io * CHUNK + ii) * nt + tx < vocab:
                                    if _key(lv[ii]) > k[2]:
                                        acc[0] = acc[0] + pv[ii]
                    block_sum(val, tx, acc)
                    if k[1] - k[0] > 1:
                        if acc[0] < top_p[row] * f[2]:
                            k[1] = k[2]
                        else:
                            k[0] = k[2]
                acc[0] = T.float32(0)
                for io in range(chunks):
                    load_strided(logits, row, io * CHUNK, tx, lv, CHUNK, nt, vocab)
                    load_strided(probs, row, io * CHUNK, tx, pv, CHUNK, nt, vocab)
                    for ii in T.unroll(CHUNK):
                        if (io * CHUNK + ii) * nt + tx < vocab:
                            if _key(lv[ii]) < k[1]:
                                pv[ii] = T.float32(0)
                                probs[row, (io * CHUNK + ii) * nt + tx] = T.float32(0)
                            acc[0] = acc[0] + pv[ii]
                block_sum(val, tx, acc)
                for io in range(chunks):
                    load_strided(probs, row, io * CHUNK, tx, pv, CHUNK, nt, vocab)
                    for ii in T.unroll(CHUNK):
                        if (io * CHUNK + ii) * nt + tx < vocab:
                            if temp[row] > T.float32(0):
                                probs[row, (io * CHUNK + ii) * nt + tx] = pv[ii] / acc[0]
                            else:
                                probs[row, (io * CHUNK + ii) * nt + tx] = T.if_then_else(
                                    (io * CHUNK + ii) * nt + tx == at[0], T.float32(1), T.float32(0))

    return kernel
