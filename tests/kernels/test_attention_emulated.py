"""The GPU attention of kernels/attention_gpu.py in fp16, its CUDA source run on the CPU.

Why: the OpenCL tests (test_gpu_kernels.py) run it in fp32, because PoCL has no fp16; a
GPU library of a q4f16_1 model runs the fp16 build, whose V sum loads 16-byte vectors of
eight halves. Here TVM's CUDA C for that build is compiled with the host C++ compiler against
cuda_emulator.h (threads as OS threads, __syncthreads a barrier) and checked as the OpenCL
test checks the fp32 build: close to float64 attention, and each token's output bit-identical
alone, beside the others and in reverse order.
"""
from __future__ import annotations

import ctypes
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from test_gpu_kernels import _attention_case, _attention_reference

CUDA = {"kind": "cuda", "arch": "sm_90", "host": {"kind": "llvm"}}
EMULATOR = Path(__file__).with_name("cuda_emulator.h")
needs_cxx = pytest.mark.skipif(shutil.which("g++") is None, reason="no g++ to build the emulated kernel")
HEADS, KV_HEADS = 4, 2


class EmulatedAttention:
    """attention_gpu(1 layer, HEADS, KV_HEADS, dim, fp16) and attention_merge_gpu built for the
    CPU; ``run(args, idx)`` attends the tokens ``idx`` of a case from _attention_case as a model
    does: the chunks (Z work-groups per token and head, as the GPU launch has them), then the merge."""

    def __init__(self, dim: int, tmp_path: Path):
        import tvm

        from speccompile.kernels.attention_gpu import attention_gpu, attention_merge_gpu

        mod = tvm.IRModule({
            "att": attention_gpu(1, HEADS, KV_HEADS, dim, "float16").with_attr("global_symbol", "att"),
            "merge": attention_merge_gpu(HEADS, dim, "float16").with_attr("global_symbol", "merge")})
        src = tvm.compile(mod, target=tvm.target.Target(CUDA)).mod.imports[0].inspect_source()
        body = src[src.index('extern "C" __global__'):]
        body = re.sub(r"__shared__ (alignas\(\d+\) )?", r"\1static ", body)
        self.names, calls = {}, []
        for name in ("att", "merge"):
            params = [p.split() for p in re.search(name + r"_kernel\(([^)]*)\)", body).group(1).split(",")]
            self.names[name] = [p[-1].removesuffix("_ptr") for p in params]  # buffers by name, then shape scalars
            call = ", ".join(f"({p[0]})args[{i}]" if p[0].endswith("*") else f"(int64_t)scalars[{i}]"
                             for i, p in enumerate(params))
            calls.append(f'extern "C" void run_{name}(void** args, int64_t* scalars, int gx, int gy, int gz, int bx, '
                         f'int by) {{\n  emu_launch(gx, gy, bx, by, [&] {{ {name}_kernel({call}); }}, gz);\n}}\n')
        cpp = tmp_path / f"att_{dim}.cpp"
        cpp.write_text(f'#include <cmath>\n#include "{EMULATOR}"\n{body}\n' + "".join(calls))
        so = cpp.with_suffix(".so")
        res = subprocess.run(["g++", "-std=c++20", "-O1", "-shared", "-fPIC", "-pthread", "-w", "-o", str(so),
                              str(cpp)], capture_output=True, text=True)
        assert res.returncode == 0, res.stderr[-3000:]
        self.lib, self.dim = ctypes.CDLL(str(so)), dim

    def _launch(self, name: str, arrays: dict, sizes: dict, grid: tuple[int, int, int], block: tuple[int, int]):
        names = self.names[name]
        ptrs = (ctypes.c_void_p * len(names))(*[arrays[k].ctypes.data if k in arrays else 0 for k in names])
        scalars = (ctypes.c_int64 * len(names))(*[sizes.get(k, 0) for k in names])
        getattr(self.lib, f"run_{name}")(ptrs, scalars, *[ctypes.c_int(v) for v in grid + block])

    def run(self, args: dict, idx: list[int]) -> np.ndarray:
        from speccompile.kernels.attention_gpu import SPLIT_ROWS, SPLITS, WARP, WARPS

        n = len(idx)
        arrays = {"q": args["q"][idx].astype(np.float16), "kv": args["kv"].astype(np.float16), "pt": args["pt"],
                  "seq": args["seq"][idx], "prefix": args["prefix"][idx], "extra": args["extra"][idx],
                  "extra_len": args["extra_len"][idx],
                  "out": np.full((n, HEADS, self.dim), np.nan, np.float16),
                  "part": np.full((n, HEADS, SPLITS, self.dim + 2), np.nan, np.float32)}
        arrays = {k: np.ascontiguousarray(v) for k, v in arrays.items()}
        sizes = {"n": n, "layer": 0, "slots": args["kv"].shape[2], "pages": args["pt"].shape[1],
                 "e": args["extra"].shape[1], "b": args["pt"].shape[0]}
        self._launch("att", arrays, sizes, (n, HEADS, max(1, min(SPLITS, SPLIT_ROWS // n))), (WARP, WARPS))
        self._launch("merge", arrays, sizes, (n, HEADS, 1), (WARP, 1))
        return arrays["out"]


@needs_cxx
@pytest.mark.parametrize("dim", [64, 128])
def test_emulated_cuda_fp16_attention_matches_numpy_and_each_token_is_bit_identical_alone(dim, tmp_path):
    """Head dims 64 and 128 (SmolLM2 / Qwen2.5-1.5B): rows around the 32-row blocks, more than
    one 256-row pass, chunks (2,049 rows: 9 passes in 5 chunks), tree tokens with extra slots."""
    rng = np.random.default_rng(dim)
    rows, extras = [1, 31, 33, 257, 300, 2049, 40], [0, 0, 0, 0, 9, 0, 3]
    args, seen = _attention_case(rng, rows, extras, heads=HEADS, kv_heads=KV_HEADS, dim=dim)
    att = EmulatedAttention(dim, tmp_path)
    every = list(range(len(rows)))
    together = att.run(args, every)
    half = {k: (v.astype(np.float16).astype(np.float32) if k in ("q", "kv") else v) for k, v in args.items()}
    ref = _attention_reference(half, seen)
    err = np.abs(together.astype(np.float64) - ref).max()
    assert err < 4e-3, err  # fp16 output rounding of values of order 1
    alone = np.concatenate([att.run(args, [i]) for i in every])
    assert np.array_equal(together, alone), "a token's attention changed with the tokens beside it"
    assert np.array_equal(att.run(args, every[::-1]), together[::-1]), "the order of the tokens changed bits"
