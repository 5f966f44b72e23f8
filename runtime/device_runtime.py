"""The TVM device runtime a compiled library needs, loaded before the library is.

Why. A cuda or opencl library's kernels are a blob that TVM hands to a loader registered
by name (``ffi.Module.load_from_bytes.<kind>``), and its buffers come from a device API
(``device_api.<kind>``). Those live in separate shared libraries that something must load
first: TVM's full import loads ``libtvm_runtime_cuda.so`` when it can, but the runtime-only
import that ``generate``, ``chat`` and ``serve`` use (runtime/tvm_import.py) does not, and
the wheel has no OpenCL or Vulkan runtime at all -- speccompile builds its own
(runtime/opencl, ``libspeccompile_opencl.so``; runtime/vulkan, ``libspeccompile_vulkan.so``). So the runtime loads the piece a library
was built for, whatever imported TVM, and names what is missing when it cannot.

The C API does the same in C++ (runtime/capi/src/device_runtime.cc), from the same file
names and search order.
"""
from __future__ import annotations

import ctypes
import glob
import os
import sys
from pathlib import Path

# the kinds whose kernels need a runtime library beside libtvm_runtime
CUDA_RUNTIME = "libtvm_runtime_cuda.so"
OPENCL_RUNTIME = "libspeccompile_opencl.so"
CUDART = "libcudart.so.13"  # what the wheel's libtvm_runtime_cuda.so was linked against
OPENCL_RUNTIME_ENV = "SPECCOMPILE_OPENCL_RUNTIME"
VULKAN_RUNTIME = "libspeccompile_vulkan.so"
VULKAN_RUNTIME_ENV = "SPECCOMPILE_VULKAN_RUNTIME"


class DeviceRuntimeError(RuntimeError):
    """A device runtime piece that is missing or does not load, with how to get it."""


def _registered(name: str) -> bool:
    import tvm_ffi

    return tvm_ffi.get_global_func(name, allow_missing=True) is not None


def _tvm_lib_dir() -> Path:
    """The wheel's lib folder, found without touching the tvm module (whose attributes beyond
    tvm.runtime belong to the compiler)."""
    import importlib.util

    return Path(importlib.util.find_spec("tvm").origin).parent / "lib"


def _load_global(path: str) -> None:
    ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)


def cudart_candidates() -> list[str]:
    """Where libcudart.so.13 may be, after the dynamic linker's own search: a CUDA toolkit
    (CUDA_HOME, /usr/local/cuda) and the NVIDIA pip wheels torch and others install."""
    roots = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    out = []
    for root in filter(None, roots):
        out += [f"{root}/lib64/{CUDART}", f"{root}/targets/x86_64-linux/lib/{CUDART}",
                f"{root}/targets/sbsa-linux/lib/{CUDART}"]
    for site in sys.path:
        out += sorted(glob.glob(f"{site}/nvidia/*/lib/{CUDART}")) + sorted(glob.glob(f"{site}/nvidia/cu13/lib/{CUDART}"))
    return [p for p in out if os.path.exists(p)]


def _ensure_cudart() -> None:
    try:
        _load_global(CUDART)
        return
    except OSError:
        pass
    for path in cudart_candidates():
        try:
            _load_global(path)
            return
        except OSError:
            continue
    raise DeviceRuntimeError(
        f"a cuda library needs the CUDA 13 runtime ({CUDART}), which is not on this machine's library path: "
        "install the CUDA 13 toolkit or `pip install nvidia-cuda-runtime` (cu13), or add its lib folder to "
        "LD_LIBRARY_PATH (CUDA_HOME is searched too)")


def runtime_candidates(kind: str) -> list[Path]:
    """Our OpenCL or Vulkan runtime: $SPECCOMPILE_<KIND>_RUNTIME alone when set; else beside this
    package (an installed build), or where `make install` builds it in a checkout (build/<kind>/)."""
    name, var = (OPENCL_RUNTIME, OPENCL_RUNTIME_ENV) if kind == "opencl" else (VULKAN_RUNTIME, VULKAN_RUNTIME_ENV)
    here = Path(__file__).resolve().parent
    env = os.environ.get(var)
    if env:  # strict: a wrong path is reported, not quietly replaced by another build (the C API agrees)
        return [Path(env)]
    return [here / "lib" / name, here.parent / "build" / kind / name]


def opencl_runtime_candidates() -> list[Path]:
    return runtime_candidates("opencl")


def ensure_device_runtime(kind: str) -> None:
    """Make TVM able to load and run a library built for ``kind`` ("llvm", "cuda", "opencl",
    ...) in this process, or raise DeviceRuntimeError naming the missing piece."""
    if kind == "llvm":
        return
    if _registered(f"ffi.Module.load_from_bytes.{kind}") and _registered(f"device_api.{kind}"):
        return
    if kind == "cuda":
        lib = _tvm_lib_dir() / CUDA_RUNTIME
        if not lib.exists():
            raise DeviceRuntimeError(f"this TVM installation has no CUDA runtime ({lib} is missing): install "
                                     "the apache-tvm wheel speccompile depends on")
        try:
            _load_global("libcuda.so.1")
        except OSError:
            raise DeviceRuntimeError("a cuda library needs the NVIDIA driver (libcuda.so.1), which is not on this "
                                     "machine: run it where an NVIDIA GPU and its driver are") from None
        _ensure_cudart()
        try:
            _load_global(str(lib))
        except OSError as err:
            raise DeviceRuntimeError(f"cannot load TVM's CUDA runtime {lib}: {err}") from None
    elif kind in ("opencl", "vulkan"):
        paths = runtime_candidates(kind)
        name = OPENCL_RUNTIME if kind == "opencl" else VULKAN_RUNTIME
        lib = next((p for p in paths if p.exists()), None)
        if lib is None:
            raise DeviceRuntimeError(
                f"an {kind} library needs speccompile's {kind} runtime ({name}), not built here: run "
                f"`make install` (or `make {kind}`), or set SPECCOMPILE_{kind.upper()}_RUNTIME; looked in "
                + ", ".join(str(p) for p in paths))
        try:
            _load_global(str(lib))
        except OSError as err:
            hint = (" (the OpenCL ICD loader is missing: apt-get install ocl-icd-libopencl1, plus a driver such "
                    "as pocl-opencl-icd)" if "libOpenCL" in str(err) else "")
            raise DeviceRuntimeError(f"cannot load {lib}: {err}{hint}") from None
    else:
        raise DeviceRuntimeError(f"speccompile has no {kind} device runtime: libraries built for {kind} cannot "
                                 "run through it (compile for llvm, cuda, opencl or vulkan)")
    if not _registered(f"ffi.Module.load_from_bytes.{kind}"):
        raise DeviceRuntimeError(f"the {kind} runtime loaded but registered no {kind} module loader")


def opencl_device_names() -> list[str]:
    """The OpenCL devices our runtime sees, in the order opencl:0, opencl:1, ... name them."""
    ensure_device_runtime("opencl")
    import tvm_ffi

    return [str(n) for n in tvm_ffi.get_global_func("speccompile.opencl.device_names")()]


def opencl_has_fp16(index: int) -> bool:
    """Whether opencl:<index> computes in half precision (cl_khr_fp16): q4f16_1 and q0f16
    libraries need it, and CPU OpenCL devices such as PoCL often lack it."""
    ensure_device_runtime("opencl")
    import tvm_ffi

    return "cl_khr_fp16" in str(tvm_ffi.get_global_func("speccompile.opencl.device_extensions")(index)).split()


def vulkan_device_names() -> list[str]:
    """The Vulkan devices our runtime sees, in the order vulkan:0, vulkan:1, ... name them."""
    ensure_device_runtime("vulkan")
    import tvm_ffi

    return [str(n) for n in tvm_ffi.get_global_func("speccompile.vulkan.device_names")()]


def vulkan_device_info(index: int) -> dict:
    """What vulkan:<index> supports (features and limits), as our runtime reads them."""
    import json

    ensure_device_runtime("vulkan")
    import tvm_ffi

    return json.loads(str(tvm_ffi.get_global_func("speccompile.vulkan.device_info")(index)))
