"""The GPU projections of kernels/gpu_matmul.py and the GPU attention of kernels/attention_gpu.py,
standalone, on the CPU OpenCL device (PoCL).

What it proves: for every token count M = 1..32 each row of an M-row projection is
bit-identical to the same row projected alone (batch invariance, which greedy losslessness of
speculation rests on), also across partial chunks, partial blocks and the chunk/tile sizes
themselves, and close to numpy. PoCL has no fp16, so fp32 activations run (dense fp32 and
q4f32_1); the fp16 variants are built for opencl and cuda (and checked by ptxas for
registers and spills where nvcc is installed).

Without an OpenCL device the device tests skip, unless SPECCOMPILE_REQUIRE_OPENCL=1 (what
`make test` sets): then a missing runtime or device fails them.
"""
from __future__ import annotations

import re
import shutil
import subprocess

import numpy as np
import pytest

from speccompile.kernels import gpu_matmul as K
from conftest import opencl_missing


_MISSING = opencl_missing()
needs_opencl = pytest.mark.skipif(_MISSING is not None, reason=f"OpenCL unavailable: {_MISSING}")

OPENCL = {"kind": "opencl", "host": {"kind": "llvm"}}
CUDA = {"kind": "cuda", "arch": "sm_90", "host": {"kind": "llvm"}}
METAL = {"kind": "metal", "host": {"kind": "llvm"}}
ALL_M = range(1, 33)


def _compile(func, target: dict):
    import tvm

    mod = tvm.IRModule({"proj": func.with_attr("global_symbol", "proj")})
    return tvm.compile(mod, target=tvm.target.Target(target))


def _kernel(func, tmp_path):
    """The prim_func built for OpenCL and loaded back (a library, as the runtime loads models)."""
    import tvm

    lib = tmp_path / f"proj-{len(list(tmp_path.iterdir()))}.so"
    _compile(func, OPENCL).export_library(str(lib))
    return tvm.runtime.load_module(str(lib))["proj"]


def _weights(kind: str, n: int, k: int, rng) -> tuple[list[np.ndarray], np.ndarray]:
    """(kernel weight operands, the dense fp32 weight they encode). q4: random nibbles, positive
    and negative scales; w = (q - 7) * scale, 8 nibbles per word from the low bits up."""
    if kind == "fp32":
        w = rng.standard_normal((n, k)).astype(np.float32)
        return [w], w
    qw = rng.integers(0, 2**32, (n, k // K.PACK), dtype=np.uint64).astype(np.uint32)
    qs = (rng.standard_normal((n, k // K.GROUP)) * 0.05).astype(np.float32)
    nib = (qw[:, :, None] >> (np.arange(K.PACK, dtype=np.uint32) * 4)) & 15
    w = (nib.reshape(n, k).astype(np.float32) - 7) * np.repeat(qs, K.GROUP, axis=1)
    return [qw, qs], w


def _build(kind: str, n: int, k: int, **sizes):
    return K.dense_gemv(n, k, "float32", **sizes) if kind == "fp32" else K.q4_gemv(n, k, "float32", **sizes)


class _Projection:
    """One kernel on the device with fixed weights; ``run(x)`` projects the rows of x."""

    def __init__(self, func, operands: list[np.ndarray], n: int, tmp_path):
        import tvm

        self.dev = tvm.device("opencl", 0)
        self.fn, self.n = _kernel(func, tmp_path), n
        self.operands = [tvm.runtime.tensor(a, self.dev) for a in operands]

    def run(self, x: np.ndarray) -> np.ndarray:
        import tvm

        y = tvm.runtime.empty((x.shape[0], self.n), "float32", self.dev)
        self.fn(tvm.runtime.tensor(np.ascontiguousarray(x), self.dev), *self.operands, y)
        return y.numpy()


def check_rows_invariant(proj: _Projection, x: np.ndarray, w: np.ndarray, ms=ALL_M) -> None:
    """Every row of every M-row result == that row projected alone, bit for bit; and each
    within 1e-5 of the exact sum relative to sum |x * w| (the scale of fp32 rounding)."""
    alone = np.concatenate([proj.run(x[i:i + 1]) for i in range(max(ms))])
    ref, scale = x.astype(np.float64) @ w.T.astype(np.float64), np.abs(x) @ np.abs(w).T
    assert (np.abs(alone - ref[:len(alone)]) <= 1e-5 * scale[:len(alone)]).all()
    for m in ms:
        y = proj.run(x[:m])
        same = (y == alone[:m]).all(axis=1)
        assert same.all(), f"M={m}: rows {np.flatnonzero(~same).tolist()} differ from the same rows alone"
    # rows in other positions of their chunk: row i of x placed at each position of an M-row batch
    y = proj.run(x[::-1].copy())
    assert np.array_equal(y, alone[::-1]), "reversed rows changed bits"


@needs_opencl
@pytest.mark.parametrize("kind", ["fp32", "q4f32_1"])
@pytest.mark.parametrize("n, k", [(96, 256), (100, 288), (576, 1536)])
def test_each_row_bit_identical_to_the_row_alone(kind, n, k, tmp_path):
    """(100, 288): a partial block of output rows and a partial last k-step of lanes;
    (576, 1536): SmolLM2's o/down projection shape."""
    rng = np.random.default_rng(n + k)
    operands, w = _weights(kind, n, k, rng)
    x = rng.standard_normal((32, k)).astype(np.float32)
    check_rows_invariant(_Projection(_build(kind, n, k), operands, n, tmp_path), x, w)


@needs_opencl
@pytest.mark.parametrize("n, k, split", [(96, 4096, 4), (100, 2304, 2)])
def test_warps_splitting_k_keep_each_row_bit_identical_alone(n, k, split, tmp_path):
    """Few output rows and long ones: the shape's own k split (q4_split) -- 4 warps, and 2
    with a partial block and a partial last step -- still gives every row the bits it has
    alone, close to numpy."""
    assert K.q4_split(n, k) == split
    rng = np.random.default_rng(n + k)
    operands, w = _weights("q4f32_1", n, k, rng)
    x = rng.standard_normal((32, k)).astype(np.float32)
    check_rows_invariant(_Projection(_build("q4f32_1", n, k), operands, n, tmp_path), x, w, ms=(1, 2, 7, 8, 9, 17, 32))


@needs_opencl
@pytest.mark.parametrize("act, inter, k", [("silu", 100, 288), ("gelu_pytorch_tanh", 64, 4096), ("silu", 48, 4096)])
def test_gated_projection_equals_the_projection_then_the_activation_kernel(act, inter, k, tmp_path):
    """The gate/up projection with its activation in the epilogue gives, bit for bit, what the
    projection followed by kernels/activation.py's kernel gives (as the GPU pipeline binds it),
    for every token count, and each row alone the same: fusing them changes no token. (100,
    288): a partial block; (48, 4096): the k split 4 ways; gelu: Gemma's activation."""
    import tvm

    from speccompile.kernels.activation import swiglu
    from speccompile.passes.bind_gpu_threads import BindGPUThreads

    target = tvm.target.Target(OPENCL)
    with target:
        funcs = {"proj": _build("q4f32_1", 2 * inter, k), "act": swiglu(inter, "float32", act),
                 "fused": K.q4_gemv(2 * inter, k, "float32", gated=act)}
        mod = BindGPUThreads()(tvm.IRModule({n: f.with_attr("global_symbol", n) for n, f in funcs.items()}))
    lib = tmp_path / "gated.so"
    tvm.compile(mod, target=target).export_library(str(lib))
    module, dev = tvm.runtime.load_module(str(lib)), tvm.device("opencl", 0)
    rng = np.random.default_rng(inter + k)
    operands, _ = _weights("q4f32_1", 2 * inter, k, rng)
    w_d = [tvm.runtime.tensor(a, dev) for a in operands]
    x = rng.standard_normal((19, k)).astype(np.float32)

    def run(rows: np.ndarray, fused: bool) -> np.ndarray:
        xd = tvm.runtime.tensor(np.ascontiguousarray(rows), dev)
        y = tvm.runtime.empty((len(rows), inter), "float32", dev)
        if fused:
            module["fused"](xd, *w_d, y)
        else:
            gu = tvm.runtime.empty((len(rows), 2 * inter), "float32", dev)
            module["proj"](xd, *w_d, gu)
            module["act"](gu, gu, y)
        return y.numpy()

    alone = np.concatenate([run(x[i:i + 1], True) for i in range(len(x))])
    assert np.abs(alone).max() > 0
    for m in (1, 2, 8, 9, 19):
        assert np.array_equal(run(x[:m], True), run(x[:m], False)), f"M={m}: fused != projection + activation"
        assert np.array_equal(run(x[:m], True), alone[:m]), f"M={m}: a row differs from the row alone"


@needs_opencl
def test_dense_with_k_not_a_multiple_of_the_vector_width(tmp_path):
    rng = np.random.default_rng(1)
    n, k = 37, 250
    operands, w = _weights("fp32", n, k, rng)
    x = rng.standard_normal((32, k)).astype(np.float32)
    check_rows_invariant(_Projection(_build("fp32", n, k), operands, n, tmp_path), x, w, ms=(1, 2, 7, 8, 9, 17, 32))


@needs_opencl
@pytest.mark.parametrize("kind", ["fp32", "q4f32_1"])
def test_chunk_and_tile_sizes_do_not_change_bits(kind, tmp_path):
    """MC, NR and ROWS only decide which thread computes what: the same kernel built with
    other sizes gives the same bits, the strongest form of 'the reduction order is fixed'."""
    n, k = 200, 512
    rng = np.random.default_rng(2)
    operands, w = _weights(kind, n, k, rng)
    x = rng.standard_normal((19, k)).astype(np.float32)
    base = _Projection(_build(kind, n, k), operands, n, tmp_path).run(x)
    for mc, nr, rows in ((4, 1, 4), (1, 1, 1), (16, 2, 2), (8, 4, 2)):
        got = _Projection(_build(kind, n, k, mc=mc, nr=nr, rows=rows), operands, n, tmp_path).run(x)
        assert np.array_equal(got, base), f"MC={mc} NR={nr} ROWS={rows}"


@needs_opencl
@pytest.mark.parametrize("words, split", [(1, 1), (4, 2), (2, 4)])
def test_q4_lane_chunks_and_k_splits_are_fixed_orders_too(words, split, tmp_path):
    """``words`` and ``split`` decide which k a partial sums (so they may change bits), and only
    that: for each, MC, NR and the row groups per block change no bit, every row equals itself
    alone, and the result is close to numpy. (1, 1) is run e's kernel, which the GPU check's
    kernel bench times beside the default."""
    n, k = 200, 8192
    rng = np.random.default_rng(3)
    operands, w = _weights("q4f32_1", n, k, rng)
    x = rng.standard_normal((19, k)).astype(np.float32)
    proj = _Projection(_build("q4f32_1", n, k, words=words, split=split), operands, n, tmp_path)
    check_rows_invariant(proj, x, w, ms=(1, 8, 19))
    base = proj.run(x)
    for mc, nr, rows in ((4, 1, 4), (16, 2, 4), (8, 4, 4 * split)):
        if rows % split or nr * mc > 32:
            continue
        got = _Projection(_build("q4f32_1", n, k, mc=mc, nr=nr, rows=rows, words=words, split=split), operands, n,
                          tmp_path).run(x)
        assert np.array_equal(got, base), f"words={words} split={split} MC={mc} NR={nr} ROWS={rows}"


@needs_opencl
def test_work_group_fits_the_device():
    import tvm

    dev = tvm.device("opencl", 0)
    assert K.ROWS * K.LANES <= min(dev.max_threads_per_block, 128)  # PoCL, Adreno and Mali allow 128
    assert K.ROWS * K.NR * K.MC * K.PITCH * 4 <= min(dev.max_shared_memory_per_block, 16 * 1024)


@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("kind", ["dense", "q4"])
def test_builds_for_opencl_cuda_and_metal(kind, dtype, tmp_path):
    """fp16 cannot run on PoCL: build it (and fp32) for opencl, metal (vectors of at most 4
    lanes, as passes/dispatch_gpu_kernels.py asks there) and cuda sm_90; where nvcc
    is installed, ptxas compiles the CUDA C and reports no spills and a modest register count
    (a 128-thread block may use up to 255; fewer keep more blocks resident)."""
    n, k = 1536, 576
    func = K.dense_gemv(n, k, dtype) if kind == "dense" else K.q4_gemv(n, k, dtype)
    ocl = _compile(func, OPENCL).mod.imports[0]
    assert ocl.kind == "opencl" and "__kernel void proj_kernel(" in ocl.inspect_source()
    metal = K.dense_gemv(n, k, dtype, max_lanes=4) if kind == "dense" else K.q4_gemv(n, k, dtype, max_lanes=4)
    assert "kernel void proj_kernel(" in _compile(metal, METAL).mod.imports[0].inspect_source()
    cuda = _compile(func, CUDA).mod.imports[0]
    src = cuda.inspect_source()
    assert cuda.kind == "cuda" and "proj_kernel(" in src
    if dtype == "float16":
        assert "uint4" in src  # the 8 fp16 activations of a lane arrive in one 16-byte load
    if kind == "q4":
        assert "(uint4*)(qw_ptr + " in src  # a lane-chunk's 4 weight words per row: one 16-byte load
    if shutil.which("nvcc"):
        cu = tmp_path / "proj.cu"
        cu.write_text(src)
        res = subprocess.run(["nvcc", "-cubin", "-arch=sm_90", "-Xptxas", "-v", "-o", str(cu.with_suffix(".cubin")),
                              str(cu)], capture_output=True, text=True)
        assert res.returncode == 0, res.stderr[-2000:]
        regs = int(re.search(r"Used (\d+) registers", res.stderr).group(1))
        assert regs <= 96 and "0 bytes spill stores" in res.stderr, res.stderr


# ---------------------------------------------------------------- attention (kernels/attention_gpu.py)
def _attention_case(rng, rows_list, extra_counts, heads=4, kv_heads=2, dim=64):
    """Tokens of one sequence seeing ``rows`` cached rows each (through a shuffled page table),
    plus ``extra`` further slots (a tree's ancestors); kv random. Returns the kernel's inputs
    and each token's list of slots."""
    from speccompile.runtime.contract import KV_PAGE_SIZE as PAGE

    most = max(r for r in rows_list) + max(extra_counts)
    pages = -(-most // PAGE) + 2
    slots = pages * PAGE
    kv = rng.standard_normal((1, 2, slots, kv_heads, dim)).astype(np.float32)
    pt = rng.permutation(pages).astype(np.int32)[None, :]  # [1 sequence, pages]
    n, e = len(rows_list), max(max(extra_counts), 1)
    q = rng.standard_normal((n, heads, dim)).astype(np.float32)
    extra = np.zeros((n, e), np.int32)
    seen = []
    for t, (r, x) in enumerate(zip(rows_list, extra_counts)):
        extra[t, :x] = rng.choice(slots, x, replace=False)
        seen.append([pt[0, i // PAGE] * PAGE + i % PAGE for i in range(r)] + extra[t, :x].tolist())
    args = dict(q=q, kv=kv, pt=pt, seq=np.zeros(n, np.int32), prefix=np.array(rows_list, np.int32), extra=extra,
                extra_len=np.array(extra_counts, np.int32))
    return args, seen


def _attention_reference(args, seen):
    q, kv = args["q"].astype(np.float64), args["kv"].astype(np.float64)
    heads, dim = q.shape[1], q.shape[2]
    group = heads // kv.shape[3]
    out = np.zeros_like(q)
    for t, slots in enumerate(seen):
        for h in range(heads):
            k, v = kv[0, 0, slots, h // group], kv[0, 1, slots, h // group]
            s = k @ q[t, h] / np.sqrt(dim)
            p = np.exp(s - s.max())
            out[t, h] = p @ v / p.sum()
    return out


@needs_opencl
@pytest.mark.parametrize("dim", [64, 128, 48])
def test_gpu_attention_matches_numpy_and_each_token_is_bit_identical_alone(tmp_path, dim):
    """Row counts around the 32-row blocks, the 8-warp passes and the chunks (1, 31..33,
    255..257, 700; 2,049 rows: 9 passes in 5 chunks of 2; 4,000: 16 passes in 8 chunks; trees
    with extra slots): close to float64 softmax attention, and each token's output
    bit-identical whether it runs alone (its chunks side by side), with the others (a chunk
    after another), or in another order -- the property prefill, decode and verify sharing
    this kernel rests on. Head dims 64 and 128 take the tiled V sum (4 and 2 row groups), 48
    the row-by-row one."""
    import tvm

    from speccompile.kernels.attention_gpu import SPLITS, attention_gpu, attention_merge_gpu

    rng = np.random.default_rng(7)
    rows = [1, 31, 32, 33, 255, 256, 257, 700, 2049, 4000, 40, 300]
    extras = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 3, 9]
    args, seen = _attention_case(rng, rows, extras, dim=dim)
    heads, dim = args["q"].shape[1:]
    mod = tvm.IRModule({
        "att": attention_gpu(1, heads, args["kv"].shape[3], dim, "float32").with_attr("global_symbol", "att"),
        "merge": attention_merge_gpu(heads, dim, "float32").with_attr("global_symbol", "merge")})
    lib = tmp_path / "att.so"
    tvm.compile(mod, target=tvm.target.Target(OPENCL)).export_library(str(lib))
    module, dev = tvm.runtime.load_module(str(lib)), tvm.device("opencl", 0)
    kv, pt = tvm.runtime.tensor(args["kv"], dev), tvm.runtime.tensor(args["pt"], dev)

    def run(idx):
        t = lambda a: tvm.runtime.tensor(np.ascontiguousarray(a), dev)
        out = tvm.runtime.empty((len(idx), heads, dim), "float32", dev)
        part = tvm.runtime.empty((len(idx), heads, SPLITS, dim + 2), "float32", dev)
        prefix, extra_len = t(args["prefix"][idx]), t(args["extra_len"][idx])
        module["att"](t(args["q"][idx]), kv, pt, t(args["seq"][idx]), prefix, t(args["extra"][idx]), extra_len, 0,
                      out, part)
        module["merge"](out, part, prefix, extra_len)
        return out.numpy()

    every = list(range(len(rows)))
    together = run(every)
    ref = _attention_reference(args, seen)
    assert np.abs(together - ref).max() < 1e-4, np.abs(together - ref).max()
    alone = np.concatenate([run([i]) for i in every])
    assert np.array_equal(together, alone), "a token's attention changed with the tokens beside it"
    assert np.array_equal(run(every[::-1]), together[::-1]), "the order of the tokens changed bits"
