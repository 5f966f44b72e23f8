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
    """attention_gpu(1 layer, HEADS, KV_HEADS, dim, fp16) built for the CPU; ``run(args, idx)``
    attends the tokens ``idx`` of a case from _attention_case."""

    def __init__(self, dim: int, tmp_path: Path):
        import tvm

        from speccompile.kernels.attention_gpu import WARP, WARPS, attention_gpu

        mod = tvm.IRModule({"att": attention_gpu(1, HEADS, KV_HEADS, dim, "float16").with_attr(
            "global_symbol", "att")})
        src = tvm.compile(mod, target=tvm.target.Target(CUDA)).mod.imports[0].inspect_source()
        body = src[src.index('extern "C" __global__'):]
        body = re.sub(r"__shared__ (alignas\(\d+\) )?", r"\1static ", body)
        params = [p.split() for p in re.search(r"att_kernel\(([^)]*)\)", body).group(1).split(",")]
        self.names = [p[-1].removesuffix("_ptr") for p in params]  # buffers by name, then shape scalars
        call = ", ".join(f"({p[0]})args[{i}]" if p[0].endswith("*") else f"(int64_t)scalars[{i}]"
                         for i, p in enumerate(params))
        cpp = tmp_path / f"att_{dim}.cpp"
        cpp.write_text(f'#include <cmath>\n#include "{EMULATOR}"\n{body}\n'
                       'extern "C" void run(void** args, int64_t* scalars, int gx, int gy) {\n'
                       f'  emu_launch(gx, gy, {WARP}, {WARPS}, [&] {{ att_kernel({call}); }});\n}}\n')
        so = cpp.with_suffix(".so")
        res = subprocess.run(["g++", "-std=c++20", "-O1", "-shared", "-fPIC", "-pthread", "-w", "-o", str(so),
                              str(cpp)], capture_output=True, text=True)
        assert res.returncode == 0, res.stderr[-3000:]
        self.lib, self.dim = ctypes.CDLL(str(so)), dim

    def run(self, args: dict, idx: list[int]) -> np.ndarray:
        n = len(idx)
        arrays = {"q": args["q"][idx].astype(np.float16), "kv": args["kv"].astype(np.float16), "pt": args["pt"],
                  "seq": args["seq"][idx], "prefix": args["prefix"][idx], "extra": args["extra"][idx],
                  "extra_len": args["extra_len"][idx],
                  "out": np.full((n, HEADS, self.dim), np.nan, np.float16)}
        arrays = {k: np.ascontiguousarray(v) for k, v in arrays.items()}
        sizes = {"n": n, "layer": 0, "slots": args["kv"].shape[2], "pages": args["pt"].shape[1],
                 "e": args["extra"].shape[1], "b": args["pt"].shape[0]}
        ptrs = (ctypes.c_void_p * len(self.names))(*[arrays[k].ctypes.data if k in arrays else 0
                                                      for k in self.names])
        scalars = (ctypes.c_int64 * len(self.names))(*[sizes.get(k, 0) for k in self.names])
        self.lib.run(ptrs, scalars, ctypes.c_int(n), ctypes.c_int(HEADS))
        return arrays["out"]


@needs_cxx
@pytest.mark.parametrize("dim", [64, 128])
def test_emulated_cuda_fp16_attention_matches_numpy_and_each_token_is_bit_identical_alone(dim, tmp_path):
    """Head dims 64 and 128 (SmolLM2 / Qwen2.5-1.5B): rows around the 32-row blocks, more than
    one 256-row pass, tree tokens with extra slots."""
    rng = np.random.default_rng(dim)
    rows, extras = [1, 31, 33, 257, 300, 40], [0, 0, 0, 0, 9, 3]
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
