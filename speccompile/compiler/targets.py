"""--device -> TVM target, output format, and how the device code is packaged.

--device is read by runtime/device.py (MLC-LLM's forms, shared with the runtime):

| --device        | TVM target                      | artifact                                    |
|-----------------|---------------------------------|---------------------------------------------|
| llvm, cpu       | --mcpu, default the build host  | .so, or .tar (a system library)             |
| "llvm -mcpu=X"  | the same, as a target string    | .so, or .tar                                |
| llvm --host T   | a CPU of triple T (cross build) | .so linked by ``T-g++`` (or --cc), or .tar  |
| cuda            | cuda, arch = lowest --cuda-arch | .so; fatbin for every arch if nvcc is found, |
|                 |                                 | else CUDA source compiled at load time      |
| opencl          | opencl                          | .so with the OpenCL C kernels               |
| android         | opencl, host aarch64-linux-android | .tar of objects (linked by the app's NDK) |
| metal           | metal, host arm64-apple-macos   | .tar (a Mach-O link needs macOS)            |
| iphone          | metal, host arm64-apple-ios     | .tar                                        |
| vulkan          | vulkan (GLSL -> SPIR-V, ours)   | .so with the SPIR-V kernels                 |
| auto            | cuda if a CUDA GPU is visible, else the host CPU                              |

A cross build (``--host aarch64-linux-gnu``: Raspberry Pi, Jetson, ARM servers) is linked
into a ``.so`` by the triple's cross compiler, found as ``<triple>-g++`` on PATH or named
with ``--cc``; a ``.tar`` (objects of a TVM system library) needs no linker here: the app
links it (Android and iOS apps, which link their CPU code statically).

A CPU library runs only where its -mcpu's instructions exist: the features it implies are
recorded in ``_metadata`` (``cpu_features``, runtime/cpu.py) and checked at load.
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
from tvm.target import codegen

from speccompile.runtime.cpu import cpu_arch, feature_table, host_cpu_features
from speccompile.runtime.device import DeviceError, parse_device

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
    cc: str | None = None  # the linker of a cross-built .so (--cc, or <triple>-g++ on PATH)

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


def find_cross_cc(host: str, cc: str | None) -> str:
    """The C++ compiler that links a .so for ``host``: ``cc`` when given, else the first of
    ``<host>-g++``, ``<host>-c++``, ``<host>-clang++`` on PATH."""
    if cc is not None:
        found = shutil.which(cc)
        if not found:
            raise CompileError(f"--cc {cc}: no such compiler (give a path, or a name on PATH)")
        return found
    for name in (f"{host}-g++", f"{host}-c++", f"{host}-clang++"):
        found = shutil.which(name)
        if found:
            return found
    raise CompileError(
        f"linking a .so for {host} needs its cross compiler, and {host}-g++ is not on PATH: install it "
        f"(Debian/Ubuntu: apt-get install g++-{host}; `make arm-system` does it for aarch64-linux-gnu), "
        f"name one with --cc, or write a .tar (-o x.tar) and link it on the device")


def _check_archs(archs: list[str]) -> list[str]:
    for a in archs:
        if not (a.startswith("sm_") and a[3:].rstrip("af").isdigit()):
            raise CompileError(f"--cuda-arch {a!r} is not of the form sm_XX (e.g. sm_80,sm_89)")
    return sorted(set(archs), key=lambda a: int(a[3:].rstrip("af")))


def cpu_target(mcpu: str | None, triple: str | None, mattr: list[str] | None = None,
               num_cores: int | None = None) -> dict:
    """The llvm target dict for --mcpu (any LLVM CPU name; None or "native": the build host).

    For the build host we also switch off (-mattr) features its CPU name implies but this
    machine does not report -- a VM may hide AVX-512 from a CPU that has it -- as clang's
    -march=native does, so a library built here always loads here."""
    check_triple = triple or codegen.llvm_get_system_triple()
    spec: dict = {"kind": "llvm", "num-cores": num_cores or (4 if triple else os.cpu_count() or 1)}
    if triple:
        spec["mtriple"] = triple
    if mcpu == "native" and triple:
        raise CompileError(f"--mcpu native means this machine's CPU, not one of {triple}: name an LLVM CPU "
                           "(e.g. cortex-a76, apple-m1) or leave --mcpu out for the triple's generic CPU")
    native = mcpu in (None, "native") and not triple
    if native:
        mcpu = codegen.llvm_get_system_cpu()
    if mcpu is not None:
        if not codegen.llvm_is_valid_cpu(mcpu, check_triple):
            raise CompileError(_unknown_cpu(mcpu, check_triple))
        spec["mcpu"] = mcpu
    mattr = list(mattr or [])
    if native:
        host = host_cpu_features()
        if host is not None:
            table = feature_table(check_triple)
            implied = codegen.llvm_get_cpu_features(tvm.target.Target(spec))
            mattr += [f"-{llvm}" for llvm, flag in table.items() if llvm in implied and flag not in host]
    if mattr:
        spec["mattr"] = mattr
    return spec


def _unknown_cpu(mcpu: str, triple: str) -> str:
    import difflib

    names = [str(n) for n in codegen.llvm_get_cpu_archlist(tvm.target.Target({"kind": "llvm", "mtriple": triple}))]
    close = difflib.get_close_matches(mcpu, names, n=4)
    msg = f"--mcpu {mcpu!r} is not a CPU LLVM knows for {triple}"
    if close:
        msg += f"; did you mean {', '.join(close)}?"
    if cpu_arch(triple) != "aarch64" and codegen.llvm_is_valid_cpu(mcpu, "aarch64-linux-gnu"):
        msg += f" ({mcpu} is an aarch64 CPU: add --host aarch64-linux-gnu, or arm64-apple-macos for a Mac)"
    return msg + ". Generic choices: x86-64-v2, x86-64-v3 (AVX2), x86-64-v4 (AVX-512); or leave --mcpu out for this machine's CPU"


def required_cpu_features(target: tvm.target.Target) -> list[str]:
    """The CPU features (in /proc/cpuinfo spelling) that code built for ``target`` may use:
    what its -mcpu and -mattr imply, restricted to runtime/cpu.py's table."""
    implied = set(codegen.llvm_get_cpu_features(target))
    table = feature_table(str(target.attrs.get("mtriple", "")) or codegen.llvm_get_system_triple())
    return sorted({flag for llvm, flag in table.items() if llvm in implied})


def _merge(option: str, given, attr, device: str):
    """A setting given both as an option and as a target-string attribute must agree."""
    if given is not None and attr is not None and given != attr:
        raise CompileError(f"{option} {given} contradicts --device {device!r}; give it once")
    return given if given is not None else attr


def plan_target(device: str, output: Path, host: str | None = None, cuda_archs: list[str] | None = None,
                mcpu: str | None = None, cc: str | None = None) -> TargetPlan:
    """Resolve --device/--mcpu/--host/--cuda-arch, refusing what cannot be built before any work."""
    try:
        parsed = parse_device(device, for_compile=True)
    except DeviceError as err:
        raise CompileError(str(err)) from None
    attrs = parsed.attrs
    device = parsed.kind
    host = _merge("--host", host, attrs.get("mtriple"), parsed.text)
    mcpu = _merge("--mcpu", mcpu, attrs.get("mcpu"), parsed.text)
    if "arch" in attrs:
        if cuda_archs and list(cuda_archs) != [attrs["arch"]]:
            raise CompileError(f"--cuda-arch {','.join(cuda_archs)} contradicts --device {parsed.text!r}; give it once")
        cuda_archs = [attrs["arch"]]
    if mcpu is not None and device not in ("llvm", "auto"):
        raise CompileError(f"--mcpu names the CPU of a --device llvm build; {device} kernels do not use it"
                           + (" (for cuda choose --cuda-arch)" if device == "cuda" else ""))
    if device == "auto":
        device = "cuda" if tvm.cuda(0).exist else "llvm"
    if device == "vulkan":
        # our SPIR-V path (the wheel has none): kernels as GLSL, compiled and validated by the pip
        # packages' glslangValidator and spirv-val, run by runtime/vulkan
        from speccompile.compiler import vulkan_codegen

        try:
            vulkan_codegen.check_tools()
        except vulkan_codegen.VulkanCodegenError as err:
            raise CompileError(f"--device vulkan: {err}") from None
    host = host or _DEFAULT_HOSTS.get(device)
    host_target: dict = {"kind": "llvm"}
    if host:
        host_target["mtriple"] = host
    if mcpu is not None and device != "llvm":
        raise CompileError(f"--device auto chose {device} here; --mcpu applies to --device llvm only")
    if device == "llvm":
        spec = cpu_target(mcpu, host, attrs.get("mattr"), attrs.get("num-cores"))
    elif device == "cuda":
        cuda_archs = _check_archs(list(cuda_archs or DEFAULT_CUDA_ARCHS))
        spec = {"kind": "cuda", "arch": cuda_archs[0], "host": host_target}
    elif device in ("opencl", "android"):
        spec = {"kind": "opencl", "host": host_target}
    elif device == "vulkan":
        spec = {"kind": "vulkan", "host": host_target}
    else:  # metal, iphone
        spec = {"kind": "metal", "host": host_target}
    foreign_host = bool(host) and cpu_arch(host) != cpu_arch(platform.machine())
    # Apple's Mach-O and an app's own link (iOS, Android) happen outside this machine
    needs_tar = device in ("metal", "iphone", "android") or (bool(host) and "apple" in host)
    suffix = output.suffix.lower()
    if needs_tar and suffix != ".tar":
        raise CompileError(
            f"--device {device} (host {host}) cannot be linked into a shared library on this machine: "
            f"use -o {output.with_suffix('.tar').name}; the app links the objects in the archive (see runtime/capi/README.md)")
    if suffix not in (".so", ".tar"):
        raise CompileError(f"output {output} should end in .so (or .tar for an archive of objects)")
    if cc is not None and suffix == ".tar":
        raise CompileError(f"--cc links a .so; {output.name} is an archive of objects that is not linked here")
    linker = find_cross_cc(host or "", cc) if suffix == ".so" and (foreign_host or cc is not None) else None
    plan = TargetPlan(device, tvm.target.Target(spec), "tar" if suffix == ".tar" else "so", list(cuda_archs or []),
                      cc=linker)
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
    """The first GPU kernel module under ``mod`` (cuda, opencl, vulkan or metal), or None."""
    if mod.kind in ("cuda", "opencl", "vulkan", "metal"):
        return mod
    for sub in mod.imports:
        found = find_device_module(sub)
        if found is not None:
            return found
    return None
