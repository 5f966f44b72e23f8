"""The C API in the GPU payload: built here, run by the check beside the Python engine.

Why. Issue 32 asks that a cuda library load through the C API wherever the CUDA driver is,
tested on the GPU machine -- which has no TVM, no compiler toolchain for our sources and no
registry. So ``make gpu-payload`` carries a prebuilt C API (runtime/capi, CMake Release,
linked against this venv's wheel: ``libspeccompile_capi.so`` and its example ``spc_generate``)
and the check runs ``spc_generate`` on the model's library, plain and with n-gram speculation,
comparing its greedy token ids with the Python engine's on the same library.

Where its libraries come from there. The build bakes this machine's wheel folders into
RUNPATH and ``SPC_TVM_LIB_DIR`` (where device_runtime.cc looks for libtvm_runtime_cuda.so
first); neither exists on the GPU machine, where the payload's ``tvm/lib`` and the installed
``tvm_ffi/lib`` hold the same files. So the check runs it with LD_LIBRARY_PATH naming those
folders (searched before RUNPATH): libtvm_runtime.so and libtvm_ffi.so resolve there, and the
C API's plain-name dlopen of libtvm_runtime_cuda.so -- its fallback when the baked path is
absent -- finds the payload's copy. libcudart.so.13's folder is added as the check process
found it (the C API does not search the NVIDIA pip wheels the Python side does). The first
run is made with LD_DEBUG=libs, and the files the dynamic linker initialised are recorded,
so the JSON shows which copies were used. A binary built against this Debian 12's glibc
2.36 / libstdc++ runs on the newer ones there.
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CAPI_SRC = REPO / "runtime" / "capi"
EXE, LIB = "spc_generate", "libspeccompile_capi.so"
# the files whose origin the check records (from the dynamic linker's own log)
WATCHED = ("libspeccompile_capi.so", "libtvm_runtime.so", "libtvm_ffi.so", "libtvm_runtime_cuda.so",
           "libcudart.so.13", "libcuda.so.1", "libstdc++.so.6")


class CapiBuildError(RuntimeError):
    """The C API cannot be built here (no cmake or compiler, or the build failed)."""


# ------------------------------------------------------------------------ building
def capi_key(python: str = sys.executable) -> str:
    """The C API's sources, the wheel versions and the python asked where they live."""
    from importlib.metadata import version

    h = hashlib.sha256()
    for path in sorted(CAPI_SRC.rglob("*")):
        if path.is_file():
            h.update(path.relative_to(CAPI_SRC).as_posix().encode() + b"\0" + path.read_bytes())
    h.update(f"{python}\0{version('apache-tvm')}\0{version('apache-tvm-ffi')}".encode())
    return h.hexdigest()[:10]


def build_capi(root: Path, python: str = sys.executable) -> Path:
    """CMake (Release) build and stripped install of the C API under ``root/capi-<key>`` (cached):
    ``bin/spc_generate`` (RUNPATH $ORIGIN/../lib), ``lib/libspeccompile_capi.so`` and
    ``capi-build.json`` (what it was linked against)."""
    prefix = root / f"capi-{capi_key(python)}"
    if (prefix / "bin" / EXE).exists() and (prefix / "lib" / LIB).exists():
        return prefix
    missing = [t for t in ("cmake", "c++", "cc") if shutil.which(t) is None]
    if missing:
        raise CapiBuildError(f"{' and '.join(missing)} not installed: the C API is built with CMake and a C/C++ "
                             "compiler")
    build, tmp = root / f"{prefix.name}-build", root / f"{prefix.name}-tmp"
    for d in (build, tmp):
        shutil.rmtree(d, ignore_errors=True)
    # SPC_OPENCL_RUNTIME empty: no path of this checkout baked in (the payload has no OpenCL runtime)
    steps = [["cmake", "-S", str(CAPI_SRC), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release",
              f"-DPython_EXECUTABLE={python}", "-DSPC_OPENCL_RUNTIME=", "-DSPC_VULKAN_RUNTIME=", "-DSPC_BUILD_EXAMPLE=ON"],
             ["cmake", "--build", str(build), "-j", str(os.cpu_count() or 2)],
             ["cmake", "--install", str(build), "--prefix", str(tmp), "--strip"]]
    for cmd in steps:
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise CapiBuildError(f"{' '.join(cmd[:2])} failed: {(done.stdout + done.stderr).strip()[-2000:]}")
    cache = (build / "CMakeCache.txt").read_text()

    def cached(name: str) -> str:
        m = re.search(rf"^{name}:\w+=(.*)$", cache, re.M)
        return m.group(1) if m else ""

    tvm_runtime = cached("TVM_RUNTIME_LIB")
    (tmp / "capi-build.json").write_text(json.dumps({
        "tvm_runtime_lib": tvm_runtime, "tvm_ffi_lib": cached("TVM_FFI_LIB"),
        "baked_tvm_lib_dir": str(Path(tvm_runtime).parent), "build_type": "Release",
        "glibc": "-".join(platform.libc_ver()), "compiler": cached("CMAKE_CXX_COMPILER")}, indent=1))
    shutil.rmtree(prefix, ignore_errors=True)
    tmp.rename(prefix)
    shutil.rmtree(build, ignore_errors=True)
    return prefix


def add_to_tar(tar, prefix: Path, dest: str = "payload/capi") -> dict:
    """Put the built C API in the payload; returns its payload.json entry (paths inside it)."""
    tar.add(prefix / "bin" / EXE, f"{dest}/bin/{EXE}")
    tar.add(prefix / "lib" / LIB, f"{dest}/lib/{LIB}")
    built = json.loads((prefix / "capi-build.json").read_text())
    rel = dest.split("/", 1)[1]
    return {"exe": f"{rel}/bin/{EXE}", "lib": f"{rel}/lib/{LIB}", **built,
            "bytes": sum((prefix / p).stat().st_size for p in (f"bin/{EXE}", f"lib/{LIB}"))}


# ------------------------------------------------------------------- on the machine
def package_lib_dir(module: str) -> Path:
    """``<module>/lib`` of the package this process would import (found without importing it)."""
    import importlib.util

    return Path(importlib.util.find_spec(module).origin).parent / "lib"


def loaded_library(name_prefix: str) -> str | None:
    """The file of a shared library mapped into this process (e.g. the libcudart TVM loaded)."""
    try:
        for line in Path("/proc/self/maps").read_text().splitlines():
            fields = line.split(None, 5)
            if len(fields) == 6 and Path(fields[5]).name.startswith(name_prefix):
                return fields[5]
    except OSError:
        pass
    return None


def capi_env(cudart: str | None) -> dict:
    """The environment spc_generate runs in: the installed wheel folders (and libcudart's)
    ahead of whatever RUNPATH names."""
    dirs = [str(package_lib_dir("tvm")), str(package_lib_dir("tvm_ffi"))]
    if cudart:
        dirs.append(str(Path(cudart).parent))
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(dirs + ([env["LD_LIBRARY_PATH"]] if env.get("LD_LIBRARY_PATH") else []))
    return env


def initialised_libraries(log_prefix: Path) -> dict:
    """From LD_DEBUG=libs logs (``prefix.<pid>``): which file of each watched name was loaded."""
    found = {}
    for log in sorted(log_prefix.parent.glob(log_prefix.name + ".*")):
        for m in re.finditer(r"calling init: (\S+)", log.read_text(errors="replace")):
            name = Path(m.group(1)).name
            if name in WATCHED:
                found.setdefault(name, m.group(1))
        log.unlink()
    return found


def check_capi(engine, payload: Path, info: dict, model_dir: Path, lib: Path, prompts: list[str], max_tokens: int,
               work: Path, timeout: float = 300) -> dict:
    """spc_generate vs the engine's greedy tokens, for each prompt plain and with --ngram.

    Returns {"identical": [runs whose ids equal the engine's, runs], "tok_s" (spc_generate's plain
    decode tok/s, median), "ngram_tok_s", "python_tok_s" (the engine's, same runs), "error"
    (None, or why runs failed), "runs", "libraries" (file loaded per watched name), ...}."""
    from speccompile.runtime.sampling import SamplingParams

    exe = payload / info["exe"]
    baked = info.get("baked_tvm_lib_dir", "")
    cudart = loaded_library("libcudart.so")
    rec = {"identical": None, "tok_s": None, "ngram_tok_s": None, "python_tok_s": None, "error": None,
           "max_tokens": max_tokens, "baked_tvm_lib_dir": baked, "baked_tvm_lib_dir_exists": bool(baked) and
           Path(baked).is_dir(), "cudart": cudart, "runs": []}
    env = capi_env(cudart)
    rec["ld_library_path"] = env["LD_LIBRARY_PATH"].split(os.pathsep)[:3]
    errors, same, python_tok_s = [], 0, []
    for i, prompt in enumerate(prompts):
        ids = engine.encode_prompt(prompt)
        ref = engine.generate(ids, max_tokens=max_tokens, sampling=SamplingParams(temperature=0.0))
        python_tok_s.append(ref.stats.to_dict()["decode_tokens_per_s"])
        for mode in ("plain", "ngram"):
            run_env = env
            if not rec["runs"]:  # the first run: which files the dynamic linker loads
                run_env = dict(env, LD_DEBUG="libs", LD_DEBUG_OUTPUT=str(work / "capi-ld"))
            cmd = [str(exe), str(model_dir), "--model-lib", str(lib), "--prompt-ids", ",".join(map(str, ids)),
                   "--max-tokens", str(max_tokens), "--json", "--speculative-mode",
                   "ngram" if mode == "ngram" else "disable"]
            try:
                done = subprocess.run(cmd, capture_output=True, text=True, errors="replace", env=run_env,
                                      timeout=timeout)
            except (OSError, subprocess.TimeoutExpired) as err:
                errors.append(f"prompt {i} {mode}: {type(err).__name__}: {err}")
                rec["runs"].append({"prompt": i, "mode": mode, "ok": False})
                continue
            if run_env is not env:
                rec["libraries"] = initialised_libraries(work / "capi-ld")
            if done.returncode != 0:
                errors.append(f"prompt {i} {mode}: exit {done.returncode}: {done.stderr.strip()[-700:]}")
                rec["runs"].append({"prompt": i, "mode": mode, "ok": False})
                continue
            out = json.loads(done.stdout)
            s = out["stats"]
            ok = out["token_ids"] == ref.token_ids
            same += ok
            rec["runs"].append({"prompt": i, "mode": mode, "ok": True, "identical": ok, "tokens": len(out["token_ids"]),
                                "python_tokens": len(ref.token_ids), "decode_tok_s": round(s["decode_tokens_per_s"], 1),
                                "accept_rate": round(s["accept_rate"], 3), "verify_steps": s["verify_steps"],
                                **({} if ok else {"first_difference": next(
                                    (k for k, (a, b) in enumerate(zip(out["token_ids"], ref.token_ids)) if a != b),
                                    min(len(out["token_ids"]), len(ref.token_ids)))})})
    rec["identical"] = [same, len(rec["runs"])]
    for mode, key in (("plain", "tok_s"), ("ngram", "ngram_tok_s")):
        vals = [r["decode_tok_s"] for r in rec["runs"] if r["mode"] == mode and r["ok"]]
        rec[key] = round(statistics.median(vals), 1) if vals else None
    rec["python_tok_s"] = round(statistics.median(python_tok_s), 1) if python_tok_s else None
    if errors:
        rec["error"] = "; ".join(errors)[-1500:]
    return rec
