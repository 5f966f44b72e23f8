"""Greedy verification as a TensorIR kernel compiled into every model library.

Batched over sequences, tree-aware, and a twin of ``runtime/verify.py`` (the numpy
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


def greedy_verify(vocab: int):
    @T.prim_func(private=True)
    def kernel(var_logits: T.handle, var_tokens: T.handle, var_parents: T.handle, var_indptr: T.handle,
               var_out: T.handle):
        T.func_attr({"tir.noalias": True, "op_pattern": 8})
        n = T.int64()
        b1 = T.int64()
        logits = T.match_buffer(var_logits, (n, vocab), "float32")
        tokens = T.match_buffer(var_tokens, (n,), "int32")
        parents = T.match_buffer(var_parents, (n,), "int32")
        indptr = T.match_buffer(var_indptr, (b1,), "int32")
        out = T.match_buffer(var_out, (b1, n + 2), "int32")
        best = T.decl_buffer((n,), "int32")
        for i in T.parallel(n):
            top = T.decl_buffer((1,), "float32", scope="local")
            arg = T.decl_buffer((1,), "int32", scope="local")
            top[0] = logits[i, 0]
            arg[0] = 0
            for v in range(1, vocab):
                if logits[i, v] > top[0]:
                    top[0] = logits[i, v]
                    arg[0] = v
            best[i] = arg[0]
        for s in range(b1 - 1):
            st = T.decl_buffer((3,), "int32", scope="local")  # current row, accepted, still walking
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

    return kernel
