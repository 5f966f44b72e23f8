"""--device -> TVM target, output format, and how the device code is packaged.

| --device        | TVM target                      | artifact                                    |
|-----------------|---------------------------------|---------------------------------------------|
| llvm, cpu       | host CPU (mcpu, cores detected) | .so                                         |
| cuda            | cuda, arch = lowest --cuda-arch | .so; fatbin for every arch if nvcc is found, |
|                 |                                 | else CUDA source compiled at load time      |
| opencl          | opencl                          | .so with the OpenCL C kernels               |
| android         | opencl, host aarch64-linux-android | .tar of objects (linked by the app's NDK) |
| metal           | metal, host arm64-apple-macos   | .tar (a Mach-O link needs macOS)            |
| iphone          | metal, host arm64-apple-ios     | .tar                                        |
| vulkan          | refused: this TVM has no SPIR-V codegen                                       |
| auto            | cuda if a CUDA GPU is visible, else the host CPU                              |
"""
from __future__ import annotations

import os
import platform
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import tvm
import tvm_ffi

DEVICES = ("auto", "llvm", "cpu", "cuda", "opencl", "android", "metal", "iphone", "vulkan")
DEFAULT_CUDA_ARCHS = ("sm_75", "sm_80", "sm_86", "sm_89", "sm_90")
_DEFAULT_HOSTS = {"android": "aarch64-linux-android", "metal": "arm64-apple-macos", "iphone": "arm64-apple-ios"}


class CompileError(ValueError):
    pass


@dataclass
class TargetPlan:
    device: str  # what the user asked for, resolved (never "auto")
    target: tvm.target.Target
    output_format: str  # "so" or "tar"
    cuda_archs: list[str] = field(default_factory=list)
    nvcc: str | None = None  # set when CUDA kernels are compiled ahead of time

    @property
    def cuda_binary(self) -> str | None:
        if self.target.kind.name != "cuda":
            return None
        return "fatbin" if self.nvcc else "source"


def find_nvcc() -> str | None:
    found = shutil.which("nvcc")
    if found:
        return found
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root and Path(root, "bin", "nvcc").exists():
            return str(Path(root, "bin", "nvcc"))
    return None


def _check_archs(archs: list[str]) -> list[str]:
    for a in archs:
        if not (a.startswith("sm_") and a[3:].rstrip("af").isdigit()):
            raise CompileError(f"--cuda-arch {a!r} is not of the form sm_XX (e.g. sm_80,sm_89)")
    return sorted(set(archs), key=lambda a: int(a[3:].rstrip("af")))


def plan_target(device: str, output: Path, host: str | None = None, cuda_archs: list[str] | None = None) -> TargetPlan:
    """Resolve --device/--host/--cuda-arch, refusing what cannot be built before any work."""
    if device not in DEVICES:
        raise CompileError(f"unknown --device {device!r}; choose one of {', '.join(DEVICES)}")
    if device == "auto":
        device = "cuda" if tvm.cuda(0).exist else "llvm"
    if device == "vulkan":
        if tvm_ffi.get_global_func("target.build.vulkan", allow_missing=True) is None:
            raise CompileError(
                "vulkan is not available: this TVM wheel (apache-tvm " + tvm.__version__ + ") was built without "
                "SPIR-V codegen (target.build.vulkan is missing). Build TVM from source with USE_VULKAN=ON "
                "(it needs the Vulkan SDK and SPIRV-Tools), or pick --device opencl/cuda/metal.")
    host = host or _DEFAULT_HOSTS.get(device)
    host_target: dict = {"kind": "llvm"}
    if host:
        host_target["mtriple"] = host
    if device in ("llvm", "cpu"):
        spec: dict = {"kind": "llvm", "mcpu": tvm.target.codegen.llvm_get_system_cpu(), "num-cores": os.cpu_count() or 1}
        if host:  # cross-compiling for another CPU: no host mcpu
            spec = {"kind": "llvm", "mtriple": host, "num-cores": 4}
        device = "llvm"
    elif device == "cuda":
        cuda_archs = _check_archs(list(cuda_archs or DEFAULT_CUDA_ARCHS))
        spec = {"kind": "cuda", "arch": cuda_archs[0], "host": host_target}
    elif device in ("opencl", "android"):
        spec = {"kind": "opencl", "host": host_target}
    elif device == "vulkan":
        spec = {"kind": "vulkan", "host": host_target}
    else:  # metal, iphone
        spec = {"kind": "metal", "host": host_target}
    foreign_host = bool(host) and not host.startswith(platform.machine())
    needs_tar = device in ("metal", "iphone", "android") or foreign_host
    suffix = output.suffix.lower()
    if needs_tar and suffix != ".tar":
        raise CompileError(
            f"--device {device} (host {host}) cannot be linked into a shared library on this machine: "
            f"use -o {output.with_suffix('.tar').name}; the app links the objects in the archive (see runtime/capi/README.md)")
    if not needs_tar and suffix not in (".so", ".tar"):
        raise CompileError(f"output {output} should end in .so (or .tar for an archive of objects)")
    plan = TargetPlan(device, tvm.target.Target(spec), "tar" if suffix == ".tar" else "so", list(cuda_archs or []))
    if plan.target.kind.name == "cuda":
        plan.nvcc = find_nvcc()
    return plan


# ----------------------------------------------------------------- CUDA fatbin
def compile_fatbin(nvcc: str, source: str, archs: list[str]) -> bytes:
    """One fatbin holding SASS for every arch plus PTX of the newest (for future GPUs)."""
    with tempfile.TemporaryDirectory() as tmp:
        src, out = Path(tmp, "kernels.cu"), Path(tmp, "kernels.fatbin")
        src.write_text(source)
        cmd = [nvcc, "-fatbin", "-O3", "-o", str(out), str(src)]
        for a in archs:
            cmd += ["-gencode", f"arch=compute_{a[3:]},code={a}"]
        cmd += ["-gencode", f"arch=compute_{archs[-1][3:]},code=compute_{archs[-1][3:]}"]
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode != 0:
            raise CompileError(f"nvcc failed to compile the CUDA kernels:\n{res.stderr[-2000:]}")
        return out.read_bytes()


def _lp(data: bytes) -> bytes:
    return len(data).to_bytes(8, "little") + data


def embed_fatbin(blob: bytes, source: str, fatbin: bytes) -> bytes:
    """Rewrite the serialized import tree so its CUDA module holds ``fatbin`` instead of source.

    The CUDA module is stored as ``kind "cuda", u64 size, [fmt, function map, data]``; the
    runtime's loader reads fmt and hands data to cuModuleLoadData, so fmt "fatbin" with the
    binary as data makes the device need no compiler. The leading u64 is the blob size.
    """
    src = source.encode()
    tail = _lp(src)
    marker = _lp(b"cuda")
    pos = blob.find(marker)
    while pos >= 0:
        size = int.from_bytes(blob[pos + len(marker): pos + len(marker) + 8], "little")
        start = pos + len(marker) + 8
        payload = blob[start:start + size]
        if payload.startswith(_lp(b"cuda")) and payload.endswith(tail):
            fmap = payload[len(_lp(b"cuda")):len(payload) - len(tail)]
            new_payload = _lp(b"fatbin") + fmap + _lp(fatbin)
            out = blob[:pos + len(marker)] + len(new_payload).to_bytes(8, "little") + new_payload + blob[start + size:]
            return (len(out) - 8).to_bytes(8, "little") + out[8:]
        pos = blob.find(marker, pos + 1)
    raise CompileError("internal: the compiled library has no CUDA module to embed the fatbin into")


def fatbin_packer(nvcc: str, archs: list[str], report: dict):
    """An ``export_library(fpack_imports=...)`` hook that embeds a fatbin (see embed_fatbin)."""

    def pack(mod, is_system_lib: bool, prefix: str, workspace: str) -> str:
        pack_tensor = tvm_ffi.get_global_func("runtime.ModulePackImportsToTensor")
        blob = bytes(pack_tensor(mod).numpy())
        source = find_device_module(mod).inspect_source()
        fatbin = compile_fatbin(nvcc, source, archs)
        blob = embed_fatbin(blob, source, fatbin)
        report["fatbin_bytes"] = len(fatbin)
        symbol = tvm_ffi.get_global_func("runtime.ModuleImportsBlobName")()
        path = Path(workspace, f"{prefix}devc.c")
        rows = ",\n".join(",".join(f"0x{b:02x}" for b in blob[i:i + 32]) for i in range(0, len(blob), 32))
        path.write_text(
            f'#ifdef __cplusplus\nextern "C" {{\n#endif\n'
            f"extern const unsigned char {symbol}[];\n"
            f"const unsigned char {symbol}[{len(blob)}] = {{\n{rows}\n}};\n"
            f"#ifdef __cplusplus\n}}\n#endif\n")
        return str(path)

    return pack


def find_device_module(mod):
    """The first GPU kernel module under ``mod`` (cuda, opencl or metal), or None."""
    if mod.kind in ("cuda", "opencl", "metal"):
        return mod
    for sub in mod.imports:
        found = find_device_module(sub)
        if found is not None:
            return found
    return None
