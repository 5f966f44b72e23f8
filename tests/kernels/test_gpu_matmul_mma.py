"""The tensor-core projections of kernels/gpu_matmul_mma.py (q4 and dense fp16), their CUDA source run on the CPU.

CI has no NVIDIA GPU, so the CUDA C that TVM generates for the kernel is compiled with the
host C++ compiler against tests/kernels/cuda_emulator.h (threads as OS threads, mma.sync and
sub.f16x2 emulated from the PTX ISA's fragment layouts). What it proves: the lanes load,
decode and place every weight, activation and output where the fragment layouts say, for
every token count (partial tiles, partial chunks, several chunks), partial feature tiles and
each k split the kernel picks; each row of an M-row result equals that row projected alone;
and results match numpy. What it cannot prove: the tensor core's own rounding and its
independence of a token's column -- the GPU check measures those on the device.
"""
from __future__ import annotations

import ctypes
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from speccompile.kernels import gpu_matmul_mma as K

CUDA = {"kind": "cuda", "arch": "sm_90", "host": {"kind": "llvm"}}
EMULATOR = Path(__file__).with_name("cuda_emulator.h")
needs_cxx = pytest.mark.skipif(shutil.which("g++") is None, reason="no g++ to build the emulated kernel")


def cuda_source(kind: str, n: int, k: int, **split) -> str:
    import tvm

    func = (K.q4_mma if kind == "q4" else K.dense_mma)(n, k, **split)
    mod = tvm.IRModule({"proj": func.with_attr("global_symbol", "proj")})
    return tvm.compile(mod, target=tvm.target.Target(CUDA)).mod.imports[0].inspect_source()


class Emulated:
    """The kernel's CUDA C built for the CPU; ``run(x)`` projects the fp16 rows of x with the
    weight operands given by name (``qw``/``qs`` for q4, ``w`` for dense)."""

    def __init__(self, kind: str, n: int, k: int, weights: dict[str, np.ndarray], tmp_path: Path, **split):
        src = cuda_source(kind, n, k, **split)
        body = src[src.index('extern "C" __global__'):]  # the kernel; TVM's asm helpers stay behind
        # shared memory: one static array (blocks run one at a time); C++ wants the attribute first
        body = re.sub(r"__shared__ (alignas\(\d+\) )?", r"\1static ", body)
        params = [p.split() for p in re.search(r"proj_kernel\(([^)]*)\)", body).group(1).split(",")]
        self.names = [p[-1].removesuffix("_ptr") for p in params]  # x, y, the weights by name; m_dim
        assert sorted(self.names) == sorted(["m_dim", "x", "y", *weights]), self.names
        call = ", ".join("m" if p[-1] == "m_dim" else f"({p[0]})args[{i}]" for i, p in enumerate(params))
        cpp = tmp_path / f"proj_{kind}_{n}_{k}.cpp"
        cpp.write_text(f'#include "{EMULATOR}"\n{body}\n'
                       'extern "C" void run(void** args, int64_t m, int gx, int gy, int bx, int by) {\n'
                       f'  emu_launch(gx, gy, bx, by, [&] {{ proj_kernel({call}); }});\n}}\n')
        so = cpp.with_suffix(".so")
        res = subprocess.run(["g++", "-std=c++20", "-O1", "-shared", "-fPIC", "-pthread", "-w", "-o", str(so), str(cpp)],
                             capture_output=True, text=True)
        assert res.returncode == 0, res.stderr[-3000:]
        self.lib = ctypes.CDLL(str(so))
        self.n, self.weights = n, {name: np.ascontiguousarray(a) for name, a in weights.items()}
        self.n_out = n // 2 if split.get("gated") else n  # gated: act(gate) * up, [m, n / 2]
        self.block = (32, split.get("warps") or K.warps_for(k // K.GROUP))

    def run(self, x: np.ndarray) -> np.ndarray:
        x = np.ascontiguousarray(x, dtype=np.float16)
        y = np.full((x.shape[0], self.n_out), np.nan, dtype=np.float16)
        arrays = {"x": x, "y": y, **self.weights}
        args = (ctypes.c_void_p * len(self.names))(*[arrays[n].ctypes.data if n != "m_dim" else 0 for n in self.names])
        grid = (-(-self.n // K.FEAT), -(-x.shape[0] // K.CHUNK))
        self.lib.run(args, ctypes.c_int64(x.shape[0]), *[ctypes.c_int(v) for v in grid + self.block])
        return y


def _weights(kind: str, n: int, k: int, rng) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """(the kernel's weight operands by name, the float64 weight they encode)."""
    if kind == "dense":
        w = (rng.standard_normal((n, k)) * 0.05).astype(np.float16)
        return {"w": w}, w.astype(np.float64)
    qw = rng.integers(0, 2**32, (n, k // K.PACK), dtype=np.uint64).astype(np.uint32)
    qs = (rng.standard_normal((n, k // K.GROUP)) * 0.05).astype(np.float16)
    nib = (qw[:, :, None] >> (np.arange(K.PACK, dtype=np.uint32) * 4)) & 15
    w = (nib.reshape(n, k).astype(np.float64) - 7) * np.repeat(qs.astype(np.float64), K.GROUP, axis=1)
    return {"qw": qw, "qs": qs}, w


@needs_cxx
@pytest.mark.parametrize("kind, n, k, split", [
    ("q4", 48, 256, {}), ("q4", 40, 768, {}), ("q4", 32, 2048, {}), ("q4", 32, 1024, {"warps": 16, "unroll": 1}),
    ("q4", 16, 768, {"warps": 4, "unroll": 4}), ("dense", 40, 768, {}), ("dense", 16, 256, {"warps": 4, "unroll": 1})])
def test_emulated_mma_projection_matches_numpy_and_rows_are_invariant(kind, n, k, split, tmp_path):
    """q4: k = 256, 768, 2048 take the default 4 and 8 warps per block (the k split), whole and
    partial last steps; the GPU check's other splits (16 warps, 1 or 4 groups loaded ahead);
    n = 40: a partial feature tile. dense fp16 the same way. Token counts across partial tiles
    and chunks, up to two chunks of 32."""
    rng = np.random.default_rng(n * k)
    weights, w = _weights(kind, n, k, rng)
    proj = Emulated(kind, n, k, weights, tmp_path, **split)
    x = rng.standard_normal((40, k)).astype(np.float16)
    alone = np.concatenate([proj.run(x[i:i + 1]) for i in range(len(x))])
    ref = x.astype(np.float64) @ w.T
    scale = np.abs(x.astype(np.float64)) @ np.abs(w).T
    err = np.abs(alone.astype(np.float64) - ref)
    assert (err <= 2**-10 * np.abs(ref) + 1e-5 * scale).all(), f"max error {err.max()} (scale {scale.max()})"
    for m in (2, 3, 7, 8, 9, 16, 31, 32, 33, 40):
        y = proj.run(x[:m])
        same = (y == alone[:m]).all(axis=1)
        assert same.all(), f"M={m}: rows {np.flatnonzero(~same).tolist()} differ from the same rows alone"
    assert np.array_equal(proj.run(x[::-1].copy()), alone[::-1]), "reversed rows changed bits"


@needs_cxx
@pytest.mark.parametrize("inter, k, act", [(24, 768, "silu"), (20, 256, "gelu_pytorch_tanh")])
def test_emulated_gated_mma_is_the_activation_of_the_projection(inter, k, act, tmp_path):
    """The gate/up projection with its activation in the epilogue (``gated``): each output is
    act(gate) * up of the plain kernel's fp16 gate and up values for the same token, within
    the activation's rounding; every row equals itself alone. inter = 20: a partial tile of
    gate rows (and of up rows); k = 768: the k split over 8 warps."""
    rng = np.random.default_rng(inter * k)
    weights, _ = _weights("q4", 2 * inter, k, rng)
    x = rng.standard_normal((40, k)).astype(np.float16)
    gu = Emulated("q4", 2 * inter, k, weights, tmp_path).run(x).astype(np.float64)
    g, u = gu[:, :inter], gu[:, inter:]
    ref = (g / (1 + np.exp(-g)) if act == "silu" else
           0.5 * g * (1 + np.tanh(0.7978845608028654 * (g + 0.044715 * g**3)))) * u
    (tmp_path / "gated").mkdir()  # its own directory: the plain kernel's source has the same name
    proj = Emulated("q4", 2 * inter, k, weights, tmp_path / "gated", gated=act)
    alone = np.concatenate([proj.run(x[i:i + 1]) for i in range(len(x))])
    err = np.abs(alone.astype(np.float64) - ref)
    # fp16 output rounding, and fp32 cancellation in gelu's 1 + tanh for negative gates
    assert (err <= 2**-10 * np.abs(ref) + 2**-20 * np.abs(g * u)).all(), f"max error {err.max()}"
    for m in (2, 7, 9, 32, 33, 40):
        assert np.array_equal(proj.run(x[:m]), alone[:m]), f"M={m}: a row differs from the same row alone"


@pytest.mark.parametrize("kind", ["q4", "dense"])
def test_the_kernel_builds_for_sm90_without_spills(kind, tmp_path):
    """ptxas (where nvcc is installed) compiles the Qwen2.5-1.5B down projection's kernel, the
    widest (8 warps, 16 KiB of shared memory), with no spills."""
    src = cuda_source(kind, 1536, 8960)
    assert "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32" in src
    assert ("fma.rn.f16x2" in src and "prmt.b32" in src) == (kind == "q4")  # the nibble decode
    if not shutil.which("nvcc"):
        pytest.skip("no nvcc: the CUDA source was generated but not assembled")
    cu = tmp_path / "proj.cu"
    cu.write_text(src)
    res = subprocess.run(["nvcc", "-cubin", "-arch=sm_90", "-Xptxas", "-v", "-o", str(cu.with_suffix(".cubin")), str(cu)],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-2000:]
    assert int(re.search(r"Used (\d+) registers", res.stderr).group(1)) <= 96 and "0 bytes spill stores" in res.stderr
