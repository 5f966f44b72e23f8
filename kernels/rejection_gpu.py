"""Recursive rejection sampling (``accept_sampled``) on GPU threads: one thread block per sequence.

Why: kernels/sampling.py's ``accept_sampled`` walks a sequence's tree serially; bound one GPU
thread per sequence (as passes/bind_gpu_threads.py binds a kernel with no GPU version), that
thread would make every pass over the vocabulary alone: the final draw's two passes (the mass, then the inverse CDF) on every step at
temperature > 0, plus three per rejected draft (the residual max(p - q, 0), its mass, its
normalisation) -- about 300k dependent loads per step on Qwen's 152k-token vocabulary, where a
decode step's forward is ~2 ms on an H100.

Here the walk's decisions (which child, the accept test u < p(x) / q(x)) are thread 0's, shared
with the block through shared memory; the passes over the vocabulary are the block's, 256
threads:
- the residual: each thread its stride of the vocabulary, its mass summed per thread in index
  order then over the threads in a fixed tree (``block_sum``), so it is deterministic;
- the final draw: each thread a contiguous slice; the slices' masses summed in slice order give
  every thread its starting CDF and the total (the same sum for all), then each thread scans its
  slice for the first index with cdf / total > u; the first slice that has one holds the token.
  Should rounding leave every cdf / total at or below u, the last token with mass is taken, as
  the CPU kernel does.

The contract (arguments, outputs, the empty-residual rule) is kernels/sampling.py's. The sums
run in another order than the CPU kernel's serial ones, so a draw whose uniform lies within
float32 rounding of a CDF step may land on the neighbouring token: the sampler's law is the same
and each library is deterministic.

The threads' control flow stays uniform: a barrier never sits under a branch (TVM's sync planner
refuses it, and any shared read in a loop's extent), so the optional work runs in loops of 0 or
1 trips counted in a register that every thread copies from shared state after a barrier.
"""
from __future__ import annotations

from tvm.script import tirx as T

from speccompile.kernels import kernel_cache
from speccompile.kernels.sampling import PROBS_THREADS, block_sum

NT = PROBS_THREADS  # threads per sequence (``block_sum`` reduces over exactly these)
NONE = 2**31 - 1  # "no index" in the block's minimum


@T.macro
def _block_min_max(ired, tx, ia):
    """ia[0] <- the minimum of ia[0], ia[1] <- the maximum of ia[1], over the block (exact: any
    order gives the same)."""
    ired[tx] = ia[0]
    ired[NT + tx] = ia[1]
    for step in T.unroll(NT.bit_length() - 1):
        T.tvm_storage_sync("shared")
        if tx < T.shift_right(NT // 2, step):
            ia[0] = T.min(ia[0], ired[tx + T.shift_right(NT // 2, step)])
            ia[1] = T.max(ia[1], ired[NT + tx + T.shift_right(NT // 2, step)])
        T.tvm_storage_sync("shared")
        if tx < T.shift_right(NT // 2, step):
            ired[tx] = ia[0]
            ired[NT + tx] = ia[1]
    T.tvm_storage_sync("shared")
    ia[0] = ired[0]
    ia[1] = ired[NT]
    T.tvm_storage_sync("shared")


@kernel_cache
def accept_sampled_gpu(vocab: int):
    """kernels/sampling.py's ``accept_sampled`` with a block of ``NT`` threads per sequence."""
    # elements per thread: a stride in the residual's passes (v = i * NT + tx), a contiguous
    # slice in the final draw (v = tx * span + j)
    span = (vocab + NT - 1) // NT

    @T.prim_func(private=True)
    def kernel(var_p: T.handle, var_q: T.handle, var_one_hot: T.handle, var_tokens: T.handle,
               var_parents: T.handle, var_indptr: T.handle, var_uniforms: T.handle, var_out: T.handle):
        T.func_attr({"tir.noalias": True, "op_pattern": 8, "tirx.is_scheduled": True,
                     "speccompile.kernel": "accept_sampled"})
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
        for s in T.thread_binding(b1 - 1, thread="blockIdx.x"):
            for tx in T.thread_binding(NT, thread="threadIdx.x"):
                # current row, accepted, still walking, p is the residual row, siblings exhausted,
                # this child rejected
                st = T.decl_buffer((6,), "int32", scope="shared")
                red = T.decl_buffer((NT,), "float32", scope="shared")
                ired = T.decl_buffer((2 * NT,), "int32", scope="shared")
                acc = T.decl_buffer((3,), "float32", scope="local")  # a sum; p[x], q[x] / a value; a CDF
                ia = T.decl_buffer((2,), "int32", scope="local")  # first index past u, last with mass
                go = T.decl_buffer((1,), "int32", scope="local")  # a loop's trips, read from st (0 or 1)
                ls = T.decl_buffer((4,), "int32", scope="local")  # st[0..3] as thread 0 decides from them
                if tx == 0:
                    st[0] = indptr[s]
                    st[1] = 0
                    st[2] = 1
                    st[3] = 0
                T.tvm_storage_sync("shared")
                for _step in range(indptr[s + 1] - indptr[s]):
                    go[0] = st[2]
                    for _walk in range(go[0]):
                        T.tvm_storage_sync("shared")  # every thread has read st before thread 0 writes
                        if tx == 0:
                            st[2] = 0
                            st[3] = 0
                            st[4] = 0
                        T.tvm_storage_sync("shared")
                        for c in range(indptr[s] + 1, indptr[s + 1]):
                            go[0] = T.if_then_else(st[2] == 0 and st[4] == 0 and parents[c] == st[0] - indptr[s], 1, 0)
                            for _try in range(go[0]):
                                for k in T.unroll(4):
                                    ls[k] = st[k]
                                T.tvm_storage_sync("shared")  # read by all before thread 0 writes
                                if tx == 0:
                                    acc[1] = T.if_then_else(ls[3] == 1, res[s * vocab + T.Cast("int64", tokens[c])],
                                                            p[ls[0], tokens[c]])
                                    acc[2] = T.if_then_else(one_hot[c] != 0, T.float32(1), q[c, tokens[c]])
                                    if acc[2] > T.float32(0) and uniforms[c] < acc[1] / acc[2]:
                                        out[s, 2 + ls[1]] = T.Cast("int32", c - indptr[s] - 1)
                                        st[0] = T.Cast("int32", c)
                                        st[1] = ls[1] + 1
                                        st[2] = 1
                                        st[5] = 0
                                    else:
                                        st[5] = 1
                                T.tvm_storage_sync("shared")
                                go[0] = st[5]
                                for _rej in range(go[0]):
                                    # rejected: p <- norm(max(p - q, 0)) for the next sibling
                                    acc[0] = T.float32(0)
                                    for i in range(span):
                                        if i * NT + tx < vocab:
                                            acc[1] = T.if_then_else(st[3] == 0, p[st[0], i * NT + tx],
                                                                    res[s * vocab + i * NT + tx])
                                            if one_hot[c] != 0:
                                                acc[1] = T.if_then_else(i * NT + tx == tokens[c], T.float32(0),
                                                                        acc[1])
                                            else:
                                                acc[1] = T.max(acc[1] - q[c, i * NT + tx], T.float32(0))
                                            res[s * vocab + i * NT + tx] = acc[1]
                                            acc[0] = acc[0] + acc[1]
                                    block_sum(red, tx, acc)  # every thread: the residual's mass
                                    if acc[0] > T.float32(0):
                                        for i in range(span):
                                            if i * NT + tx < vocab:
                                                res[s * vocab + i * NT + tx] = res[s * vocab + i * NT + tx] / acc[0]
                                    if tx == 0:
                                        if acc[0] <= T.float32(0):  # empty residual: back to the node's p, stop
                                            st[3] = 0
                                            st[4] = 1
                                        else:
                                            st[3] = 1
                                    T.tvm_storage_sync("shared")
                # the final token: inverse CDF of the current row at uniforms[n + s]
                acc[0] = T.float32(0)
                for j in range(span):
                    if tx * span + j < vocab:
                        acc[0] = acc[0] + T.if_then_else(st[3] == 1, res[s * vocab + tx * span + j],
                                                         p[st[0], tx * span + j])
                red[tx] = acc[0]
                T.tvm_storage_sync("shared")
                acc[2] = T.float32(0)  # the slices before this one, in slice order
                for u in range(NT):
                    if u < tx:
                        acc[2] = acc[2] + red[u]
                acc[0] = acc[2]  # the total: all slices, in the same order
                for u in range(NT):
                    if u >= tx:
                        acc[0] = acc[0] + red[u]
                ia[0] = NONE
                ia[1] = -1
                for j in range(span):
                    if tx * span + j < vocab:
                        acc[1] = T.if_then_else(st[3] == 1, res[s * vocab + tx * span + j], p[st[0], tx * span + j])
                        acc[2] = acc[2] + acc[1]
                        if acc[1] > T.float32(0):
                            ia[1] = T.Cast("int32", tx * span + j)
                        if ia[0] == NONE and acc[2] / acc[0] > uniforms[n + s]:
                            ia[0] = T.Cast("int32", tx * span + j)
                _block_min_max(ired, tx, ia)
                if tx == 0:
                    out[s, 0] = st[1]
                    out[s, 1] = T.if_then_else(ia[0] != NONE, ia[0], ia[1])

    return kernel
