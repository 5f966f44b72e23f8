"""The q4 matmul kernels alone, at every row count a verify can bring.

The kernel splits x's rows into passes (blocks of 8 rows on AVX-512 VNNI, 4 on AVX2, the
remainder in one pass or two), and greedy losslessness needs each row's output to be the
same bits whichever pass computes it: the model-level batch-invariance test sees only a
few row counts, so every split from 1 to 19 rows is checked here, against the row alone
and against a float reference.
"""
from __future__ import annotations

import platform

import numpy as np
import pytest
import tvm

from speccompile.kernels import cpu_matmul_int8 as K
from speccompile.runtime import cpu
from speccompile.compiler.targets import cpu_target

pytestmark = pytest.mark.skipif(cpu.cpu_arch(platform.machine()) != "x86_64",
                                reason="the int8 q4 kernels are x86 (AVX2 / AVX-512 VNNI)")

N, KDIM = 48, 96  # three 16-row tiles, three 32-wide groups


def _build(isa: str):
    target = tvm.target.Target(cpu_target(None, None))
    have = K.int8_dot_isa(target)
    # "neon" is plain integer TIR (no intrinsics): it builds and runs on any CPU
    if isa != "neon" and (have is None or (isa == "avx512vnni" and have != "avx512vnni")):
        pytest.skip(f"this host cannot run the {isa} kernel (it has {have})")
    func = K.q4_matmul_int8(N, KDIM, "float32", isa).with_attr("global_symbol", "main")
    return tvm.compile(tvm.IRModule({"main": func}), target=target)["main"]


def _tiled_weights(rng):
    """Random q4 words and scales in the kernel's tiled order, and their dequantized [N, K]."""
    qw = rng.integers(0, 2 ** 32, (N, KDIM // 8), dtype=np.uint32)
    qs = rng.uniform(0.01, 0.1, (N, KDIM // 32)).astype(np.float32)
    nib = (qw[:, :, None] >> (4 * np.arange(8, dtype=np.uint32))) & 0xF  # [N, K/8, 8], low bits first
    w = (nib.reshape(N, KDIM).astype(np.float32) - 7) * np.repeat(qs, 32, axis=1)
    tile = lambda a: np.ascontiguousarray(a.reshape(N // 16, 16, -1).transpose(0, 2, 1))  # [N/16, cols, 16]
    return tile(qw).reshape(N, -1), tile(qs).reshape(N, -1), w


@pytest.mark.parametrize("isa", ["avx512vnni", "avx2", "neon"])
def test_q4_int8_matmul_rows_are_bit_identical_at_every_row_count(isa):
    fn = _build(isa)
    rng = np.random.default_rng(3)
    qw, qs, w = _tiled_weights(rng)
    dev = tvm.cpu()
    qw_d, qs_d = tvm.runtime.tensor(qw, dev), tvm.runtime.tensor(qs, dev)
    x = rng.standard_normal((19, KDIM)).astype(np.float32)

    def run(rows: np.ndarray) -> np.ndarray:
        y = tvm.runtime.empty((rows.shape[0], N), "float32", dev)
        fn(tvm.runtime.tensor(np.ascontiguousarray(rows), dev), qw_d, qs_d, y)
        return y.numpy()

    alone = np.stack([run(x[i:i + 1])[0] for i in range(len(x))])
    ref = x @ w.T  # int8 activations round x to 1/127 of each group's max: a loose tolerance
    assert np.abs(alone - ref).max() < 0.02 * np.abs(ref).max()
    for m in range(2, len(x) + 1):
        got = run(x[:m])
        assert np.array_equal(got, alone[:m]), f"{m} rows: some row differs from that row computed alone"


def test_q4_int8_isas_give_the_same_bits():
    """The promise that makes tokens equal across CPUs: every ISA's kernel computes the same
    exact integer sums and the same float epilogue, so the outputs are equal bit for bit.
    Here the ISAs this host runs; aarch64's sdot kernel is held to x86 by
    tests/runtime/test_arm.py under qemu."""
    have = K.int8_dot_isa(tvm.target.Target(cpu_target(None, None)))
    isas = {"avx512vnni": ["avx512vnni", "avx2", "neon"], "avx2": ["avx2", "neon"]}.get(have)
    if isas is None:
        pytest.skip(f"this host runs no x86 int8 kernel (it has {have})")
    rng = np.random.default_rng(5)
    qw, qs, _ = _tiled_weights(rng)
    dev = tvm.cpu()
    x = rng.standard_normal((11, KDIM)).astype(np.float32) * rng.uniform(0.1, 10, (11, 1)).astype(np.float32)
    outs = {}
    for isa in isas:
        fn = _build(isa)
        y = tvm.runtime.empty((len(x), N), "float32", dev)
        fn(tvm.runtime.tensor(x, dev), tvm.runtime.tensor(qw, dev), tvm.runtime.tensor(qs, dev), y)
        outs[isa] = y.numpy()
    for isa in isas[1:]:
        assert np.array_equal(outs[isa], outs[isas[0]]), f"{isa} differs from {isas[0]}"
