"""GPU and mobile targets: each artifact is built, then opened and checked (nothing runs here:
there is no GPU). Checks: kernel code present (OpenCL C / Metal source, or a CUDA fatbin
whose kernels nvcc compiled), entry points and ``_metadata`` baked in, the verification
kernels included, and the runtime refusing the library on this CPU with a clear error."""
from __future__ import annotations

import re
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from speccompile.compile import CompileError, compile_model
from speccompile.runtime.model import Model, ModelLoadError, baked_metadata

ENTRY_POINTS = ("prefill", "decode", "verify", "verify_greedy", "copy_kv_slots", "get_logits", "embed")
FATBIN_MAGIC = bytes.fromhex("50ed55ba")  # 0xBA55ED50, little endian


def _payload(lib: Path) -> bytes:
    if lib.suffix == ".tar":
        with tarfile.open(lib) as tar:
            return b"".join(tar.extractfile(m).read() for m in tar.getmembers() if m.isfile())
    return lib.read_bytes()


def _check_common(lib: Path, device: str, kind: str) -> tuple[dict, bytes]:
    meta = baked_metadata(lib)
    assert meta is not None, "no _metadata baked into the library"
    assert meta["device"] == device and meta["target"] == kind
    assert set(ENTRY_POINTS) <= set(meta["entry_points"])
    data = _payload(lib)
    for name in ENTRY_POINTS + ("_metadata",):
        assert name.encode() in data, f"entry point {name} missing from {lib.name}"
    return meta, data


def _refused(model_dir: Path, lib: Path, words: str) -> None:
    with pytest.raises(ModelLoadError, match=words):
        Model(model_dir, lib)


@pytest.fixture(scope="module")
def tiny(build_tiny):
    return build_tiny("tiny-qwen2", "q4f16_1")


def test_opencl(tiny, tmp_path):
    lib, src = tmp_path / "m-opencl.so", tmp_path / "m.cl"
    compile_model(tiny.model_dir / "speccompile-config.json", "opencl", lib, verbose=False, dump_source=src)
    _, data = _check_common(lib, "opencl", "opencl")
    text = src.read_text()
    assert "__kernel void greedy_verify_kernel(" in text and "__kernel void q4_matmul_kernel(" in text
    assert b"greedy_verify_kernel" in data and b"__kernel" in data  # the OpenCL C rides inside the .so
    _refused(tiny.model_dir, lib, "built for opencl")


@pytest.mark.parametrize("device, host", [("metal", "arm64-apple-macos"), ("iphone", "arm64-apple-ios"),
                                          ("android", "aarch64-linux-android")])
def test_archives(tiny, tmp_path, device, host):
    lib = tmp_path / f"m-{device}.tar"
    compile_model(tiny.model_dir / "speccompile-config.json", device, lib, verbose=False)
    meta, data = _check_common(lib, device, "opencl" if device == "android" else "metal")
    assert host in meta["host"] and meta["system_lib_prefix"] == f"m_{device}_"
    with tarfile.open(lib) as tar:
        names = tar.getnames()
    assert "lib0.o" in names and any(n.endswith("devc.o") for n in names)
    # the kernel source (Metal, or OpenCL C for android), its names carrying the library prefix
    kernel = rb"__kernel void \w*greedy_verify_kernel\(" if device == "android" else rb"kernel void \w*greedy_verify_kernel\("
    assert re.search(kernel, data)
    assert f"m_{device}_append_kv".encode() in data  # system-library symbols carry the prefix
    _refused(tiny.model_dir, lib, "archive of objects")


def test_tar_needed_for_apple(tiny, tmp_path):
    with pytest.raises(CompileError, match=r"use -o m-metal\.tar"):
        compile_model(tiny.model_dir / "speccompile-config.json", "metal", tmp_path / "m-metal.so", verbose=False)


def test_vulkan_is_a_clear_error(tiny, tmp_path):
    with pytest.raises(CompileError, match="SPIR-V"):
        compile_model(tiny.model_dir / "speccompile-config.json", "vulkan", tmp_path / "m.so", verbose=False)


def test_bad_cuda_arch(tiny, tmp_path):
    with pytest.raises(CompileError, match="sm_XX"):
        compile_model(tiny.model_dir / "speccompile-config.json", "cuda", tmp_path / "m.so", verbose=False,
                      cuda_archs=["80"])


def _nvcc_resources(src: Path, arch: str) -> dict[str, str]:
    """nvcc compiles the dumped CUDA source; ptxas reports each kernel's registers and smem."""
    res = subprocess.run(["nvcc", "-cubin", f"-arch={arch}", "-Xptxas", "-v", "-o", str(src.with_suffix(".cubin")),
                          str(src)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-2000:]
    usage, current = {}, None
    for line in res.stderr.splitlines():
        m = re.search(r"Compiling entry function '(\w+)'", line)
        if m:
            current = m.group(1)
        m = re.search(r"Used (\d+) registers.*", line)
        if m and current:
            usage[current] = m.group(0)
    return usage


@pytest.mark.parametrize("which", ["tiny", "smollm2"])
def test_cuda(which, tiny, smollm2_q4, tmp_path):
    model_dir = tiny.model_dir if which == "tiny" else smollm2_q4[0]
    lib, src = tmp_path / "m-cuda.so", tmp_path / "m.cu"
    out = compile_model(model_dir / "speccompile-config.json", "cuda", lib, verbose=False,
                        cuda_archs=["sm_80", "sm_89"], dump_source=src)
    meta, data = _check_common(lib, "cuda", "cuda")
    assert meta["cuda_archs"] == ["sm_80", "sm_89"]
    text = src.read_text()
    for kernel in ("greedy_verify_kernel", "greedy_verify_kernel_1", "q4_matmul_kernel", "attention_kernel"):
        assert f"void __launch_bounds__" in text and f" {kernel}(" in text, kernel
    if shutil.which("nvcc"):
        assert meta["cuda_binary"] == "fatbin" and out["build"]["fatbin_bytes"] > 0
        start = data.find(FATBIN_MAGIC)
        assert start >= 0, "no fatbin embedded"
        assert b"greedy_verify_kernel" in data[start:]  # kernel symbols live in the fatbin's cubins
        assert b"__global__" not in data  # no CUDA source shipped: the device needs no compiler
        usage = _nvcc_resources(src, "sm_80")
        assert "greedy_verify_kernel" in usage and "q4_matmul_kernel" in usage
    else:
        assert meta["cuda_binary"] == "source" and b"__global__" in data
    _refused(model_dir, lib, "built for cuda")
