"""A draft head's top-k as TensorIR kernels: the ``k`` best tokens of each logits row and
their log-probabilities (log-softmax over the draft vocabulary), mapped to target ids.

Why our own kernel and not ``relax.op.topk``: that op lowers on llvm to a call of the
runtime's ``tvm.contrib.sort.topk`` (a CPU-only packed function, so no GPU library could
carry it), whose order among equal logits is the C++ sort's, and the log-softmax would
still need two more passes over the row. Here one pass per chunk of the row keeps the
chunk's k best in a sorted register list, its maximum and its sum of ``exp(x - max)``;
a second kernel merges the chunks of each row. Chunks (not rows) are the parallel work
items, so one row -- a batch-1 draft step -- still uses every core.

Order: by logit, ties by the lower draft id first -- the order of ``top_tokens``
(runtime/drafters/eagle.py), its numpy reference. Within a chunk the scan goes up the ids and a
new element is inserted *after* equal ones; the merge visits chunks in id order and does
the same, so among equal logits the lower id always stays first.

The log-probabilities are float32: within ~1e-6 of the reference's float64.
"""
from __future__ import annotations


from tvm.script import tirx as T

from speccompile.kernels import kernel_cache

from speccompile.kernels.attention import building_for_cpu, scratch_scope

CHUNK = 2048  # logits per work item of the first kernel (a multiple of 16)
NEG_INF = -3.4028234663852886e38  # the lowest float32: below every finite logit


def num_chunks(vocab: int) -> int:
    return -(-vocab // CHUNK)


def _exp(x):
    """exp(x) for x <= 0 in float32 from vector-friendly operations (Cephes' expf: 2^k times
    a degree-7 polynomial of the remainder, ~1e-7 relative error): ``T.exp`` becomes one
    libm call per lane, which made the softmax mass cost more than the rest of the kernel."""
    x = T.max(x, T.float32(-87.0))  # exp(-87) ~ 1.6e-38: the smallest normal float32 above
    k = T.floor(x * T.float32(1.4426950408889634) + T.float32(0.5))
    r = x - k * T.float32(0.693359375) - k * T.float32(-2.12194440e-4)
    p = T.float32(1.9875691500e-4)
    for c in (1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1):
        p = p * r + T.float32(c)
    p = p * r * r + r + T.float32(1.0)
    return p * T.reinterpret("float32", T.shift_left(T.Cast("int32", k) + 127, 23))


@T.macro
def _insert(vals, ids, pos, x, token, k: int):
    """Insert (x, token) into the descending list vals/ids of length k when x beats its
    last entry, after every entry equal to x."""
    if x > vals[k - 1]:
        pos[0] = k - 1
        for q in range(k - 1):
            r = k - 2 - q
            if vals[r] < x:  # vals is descending: once vals[r] >= x no earlier entry moves
                vals[r + 1] = vals[r]
                ids[r + 1] = ids[r]
                pos[0] = r
        vals[pos[0]] = x
        ids[pos[0]] = token


# A parallel region costs ~6 us to start on the CPU and waits for its slowest worker (one the
# OS has lent to another process, on a busy host, for a whole time slice): up to 8 rows of a
# 32k draft vocabulary (~17 us of scanning per row) run on the calling thread instead
# (kernels/attention.py's SERIAL_BELOW idea), which measured steadier draft steps on a
# shared 2-core host at the same best-case time.
SERIAL_CHUNKS = 128  # at most this many work items (rows x chunks) run serially on the CPU
SERIAL_ROWS = 16  # the merge (~1 us per row): fewer rows than this run serially


@kernel_cache
def topk_chunks(vocab: int, k: int):
    """logits [n, vocab], d2t [vocab] -> per chunk c: its k best (values [n, C, k], target ids
    [n, C, k]: draft id j is token j + d2t[j]), its maximum [n, C] and its sum of
    exp(logit - maximum) [n, C]."""
    chunks, scratch, cpu = num_chunks(vocab), scratch_scope(), building_for_cpu()

    @T.macro
    def chunk(logits, d2t, cv, ci, cm, cs, t):
        vals = T.decl_buffer((k,), "float32", scope=scratch)
        ids = T.decl_buffer((k,), "int32", scope=scratch)
        pos = T.decl_buffer((1,), "int32", scope=scratch)
        acc = T.decl_buffer((16,), "float32", scope=scratch)
        i = t // chunks
        lo = (t % chunks) * CHUNK
        size = T.min(vocab - lo, CHUNK)
        for q in range(k):
            vals[q] = T.float32(NEG_INF)
            ids[q] = T.Cast("int32", lo)
        for c in range(size // 16):  # blocks of 16: scanned only if their maximum gets in
            for l in T.vectorized(8):
                acc[l] = T.max(logits[i, lo + c * 16 + l], logits[i, lo + c * 16 + 8 + l])
            for l in T.vectorized(4):
                acc[l] = T.max(acc[l], acc[l + 4])
            if T.max(T.max(acc[0], acc[1]), T.max(acc[2], acc[3])) > vals[k - 1]:
                for j in range(16):
                    _insert(vals, ids, pos, logits[i, lo + c * 16 + j], T.Cast("int32", lo + c * 16 + j), k)
        for j in range(size // 16 * 16, size):
            _insert(vals, ids, pos, logits[i, lo + j], T.Cast("int32", lo + j), k)
        for l in T.vectorized(16):
            acc[l] = T.float32(0)
        for c in range(size // 16):  # the chunk's softmax mass in 16 fixed partial sums
            for l in T.vectorized(16):
                acc[l] = acc[l] + _exp(logits[i, lo + c * 16 + l] - vals[0])
        for j in range(size % 16):
            acc[j] = acc[j] + _exp(logits[i, lo + size // 16 * 16 + j] - vals[0])
        cs[i, t % chunks] = T.float32(0)
        for l in range(16):
            cs[i, t % chunks] = cs[i, t % chunks] + acc[l]
        cm[i, t % chunks] = vals[0]
        for q in range(k):
            cv[i, t % chunks, q] = vals[q]
            ci[i, t % chunks, q] = ids[q] + d2t[ids[q]]  # the target's token id

    @T.prim_func(private=True)
    def kernel(var_logits: T.handle, d2t: T.Buffer((vocab,), "int32"), var_vals: T.handle, var_ids: T.handle,
               var_max: T.handle, var_sum: T.handle):
        # (a second used input also keeps relax's RewriteDataflowReshape from probing the kernel as a
        # possible reshape, which it cannot do without blocks: kernels/activation.py)
        T.func_attr({"tir.noalias": True, "op_pattern": 8, "speccompile.kernel": "draft_topk_chunks"})
        n = T.int64()
        logits = T.match_buffer(var_logits, (n, vocab), "float32")
        cv = T.match_buffer(var_vals, (n, chunks, k), "float32")
        ci = T.match_buffer(var_ids, (n, chunks, k), "int32")
        cm = T.match_buffer(var_max, (n, chunks), "float32")
        cs = T.match_buffer(var_sum, (n, chunks), "float32")
        if cpu and n * chunks <= SERIAL_CHUNKS:
            for t in range(n * chunks):
                chunk(logits, d2t, cv, ci, cm, cs, t)
        else:
            for t in T.parallel(n * chunks):
                chunk(logits, d2t, cv, ci, cm, cs, t)

    return kernel


@kernel_cache
def topk_merge(vocab: int, k: int):
    """The chunks of each row merged: target ids [n, k] and log-probabilities [n, k], best first."""
    chunks, scratch, cpu = num_chunks(vocab), scratch_scope(), building_for_cpu()

    @T.macro
    def row(cv, ci, cm, cs, out_ids, out_logp, i):
        vals = T.decl_buffer((k,), "float32", scope=scratch)
        ids = T.decl_buffer((k,), "int32", scope=scratch)
        pos = T.decl_buffer((1,), "int32", scope=scratch)
        lse = T.decl_buffer((2,), "float32", scope=scratch)  # row maximum, softmax mass
        for q in range(k):
            vals[q] = T.float32(NEG_INF)
            ids[q] = 0
        lse[0] = cm[i, 0]
        for c in range(1, chunks):
            lse[0] = T.max(lse[0], cm[i, c])
        lse[1] = T.float32(0)
        for c in range(chunks):
            lse[1] = lse[1] + cs[i, c] * _exp(cm[i, c] - lse[0])
            for q in range(k):
                _insert(vals, ids, pos, cv[i, c, q], ci[i, c, q], k)
        for q in range(k):
            out_ids[i, q] = ids[q]
            out_logp[i, q] = vals[q] - (lse[0] + T.log(lse[1]))

    @T.prim_func(private=True)
    def kernel(var_vals: T.handle, var_ids: T.handle, var_max: T.handle, var_sum: T.handle, var_out_ids: T.handle,
               var_out_logp: T.handle):
        T.func_attr({"tir.noalias": True, "op_pattern": 8, "speccompile.kernel": "draft_topk_merge"})
        n = T.int64()
        cv = T.match_buffer(var_vals, (n, chunks, k), "float32")
        ci = T.match_buffer(var_ids, (n, chunks, k), "int32")
        cm = T.match_buffer(var_max, (n, chunks), "float32")
        cs = T.match_buffer(var_sum, (n, chunks), "float32")
        out_ids = T.match_buffer(var_out_ids, (n, k), "int32")
        out_logp = T.match_buffer(var_out_logp, (n, k), "float32")
        if cpu and n < SERIAL_ROWS:
            for i in range(n):
                row(cv, ci, cm, cs, out_ids, out_logp, i)
        else:
            for i in T.parallel(n):
                row(cv, ci, cm, cs, out_ids, out_logp, i)

    return kernel


def draft_top(logits, d2t, k: int):
    """nn graph: logits [n, draft_vocab] float32, d2t [draft_vocab] int32 -> (target ids
    [n, k] int32, log-probabilities [n, k] float32), best first."""
    from tvm.relax.frontend.nn import Tensor, op

    n, vocab = logits.shape
    chunks = num_chunks(int(vocab))
    parts = op.tensor_ir_op(topk_chunks(int(vocab), k), "draft_topk_chunks", [logits, d2t],
                            [Tensor.placeholder((n, chunks, k), "float32"), Tensor.placeholder((n, chunks, k), "int32"),
                             Tensor.placeholder((n, chunks), "float32"), Tensor.placeholder((n, chunks), "float32")])
    return op.tensor_ir_op(topk_merge(int(vocab), k), "draft_topk_merge", parts,
                           [Tensor.placeholder((n, k), "int32"), Tensor.placeholder((n, k), "float32")])
