"""Does this CPU have the instructions a model library was compiled to use?

A library compiled with ``--mcpu sapphirerapids`` may contain AVX-512 and AMX code; copied
to an AVX2-only box it would stop with an illegal instruction deep inside a kernel. So
``compile`` records in ``_metadata`` the CPU features its ``-mcpu`` (and ``-mattr``)
imply, in the spelling Linux uses in /proc/cpuinfo (``cpu_features``), and the loader
compares them with the running CPU's before any weight is read (``check_cpu_features``).

Only features the generated code may use are recorded (vector and bit-manipulation
extensions LLVM emits), not the baseline of the architecture (sse2 on x86-64) nor
tuning flags or system instructions (xsave, rdpid, ...) that kernels never contain:
recording those would refuse libraries for no reason on VMs that hide them.

The C API (runtime/capi/src/cpu_features.cc) performs the same check with the same words.
"""
from __future__ import annotations

import os
import platform
import warnings
from pathlib import Path

# LLVM feature name -> /proc/cpuinfo flag, per architecture
X86_FEATURES = {
    "sse3": "pni", "ssse3": "ssse3", "sse4.1": "sse4_1", "sse4.2": "sse4_2", "popcnt": "popcnt",
    "cx16": "cx16", "sahf": "lahf_lm", "pclmul": "pclmulqdq", "aes": "aes", "sha": "sha_ni",
    "avx": "avx", "avx2": "avx2", "fma": "fma", "f16c": "f16c", "bmi": "bmi1", "bmi2": "bmi2",
    "lzcnt": "abm", "movbe": "movbe", "adx": "adx", "prfchw": "3dnowprefetch",
    "avx512f": "avx512f", "avx512cd": "avx512cd", "avx512bw": "avx512bw", "avx512dq": "avx512dq",
    "avx512vl": "avx512vl", "avx512vnni": "avx512_vnni", "avx512bf16": "avx512_bf16",
    "avx512fp16": "avx512_fp16", "avx512ifma": "avx512ifma", "avx512vbmi": "avx512vbmi",
    "avx512vbmi2": "avx512_vbmi2", "avx512bitalg": "avx512_bitalg", "avx512vpopcntdq": "avx512_vpopcntdq",
    "avxvnni": "avx_vnni", "gfni": "gfni", "vaes": "vaes", "vpclmulqdq": "vpclmulqdq",
    "amx-tile": "amx_tile", "amx-int8": "amx_int8", "amx-bf16": "amx_bf16",
}
AARCH64_FEATURES = {
    "neon": "asimd", "fullfp16": "asimdhp", "dotprod": "asimddp", "i8mm": "i8mm", "bf16": "bf16",
    "sve": "sve", "sve2": "sve2", "rdm": "asimdrdm", "fp16fml": "asimdfhm", "complxnum": "fcma",
    "jsconv": "jscvt", "lse": "atomics", "crc": "crc32", "rcpc": "lrcpc",
    "aes": "aes", "sha2": "sha2", "sha3": "sha3",
}
# x86-64 micro-architecture levels (psABI), in /proc/cpuinfo spelling; xsave/osxsave are
# left out of v3 because kernels never execute them
X86_LEVELS = (
    ("x86-64-v4", ("avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl")),
    ("x86-64-v3", ("avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe")),
    ("x86-64-v2", ("cx16", "lahf_lm", "popcnt", "sse4_1", "sse4_2", "ssse3", "pni")),
)
HOST_FEATURES_ENV = "SPECCOMPILE_HOST_CPU_FEATURES"


class CPUFeatureError(ValueError):
    """The library needs CPU features this machine lacks."""


def cpu_arch(triple_or_machine: str) -> str:
    """"x86_64" or "aarch64" (or the input's first component) from a triple or uname -m."""
    arch = triple_or_machine.split("-")[0].lower()
    if arch in ("x86_64", "amd64", "x86-64"):
        return "x86_64"
    if arch in ("aarch64", "arm64", "arm64e"):
        return "aarch64"
    return arch


def feature_table(arch: str) -> dict[str, str]:
    return {"x86_64": X86_FEATURES, "aarch64": AARCH64_FEATURES}.get(cpu_arch(arch), {})


def host_cpu_features() -> set[str] | None:
    """This CPU's features in /proc/cpuinfo spelling, or None when they cannot be read.

    ``SPECCOMPILE_HOST_CPU_FEATURES`` (comma or space separated) replaces the detection:
    the tests use it to play an older CPU, and it is the way out on a system whose
    /proc/cpuinfo is missing or wrong."""
    forced = os.environ.get(HOST_FEATURES_ENV)
    if forced is not None:
        return set(forced.replace(",", " ").split())
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):  # x86, aarch64: the first CPU speaks for all
            return set(value.split())
    return None


def suggest_mcpu(host: set[str], arch: str) -> str:
    """A --mcpu this CPU can run: the newest generic level it fully supports (x86-64), with
    AVX-512 VNNI added when present (our q4 kernels use it); "generic" elsewhere."""
    if cpu_arch(arch) != "x86_64":
        return "--mcpu generic"
    for i, (level, _) in enumerate(X86_LEVELS):
        if all(f in host for _, feats in X86_LEVELS[i:] for f in feats):
            if level == "x86-64-v4" and "avx512_vnni" in host:
                return f'--device "llvm -mcpu={level} -mattr=+avx512vnni"'
            return f"--mcpu {level}"
    return "--mcpu x86-64"


def check_cpu_features(meta: dict, lib_path) -> None:
    """Refuse a CPU library whose ``cpu_features`` this machine lacks (see module doc).

    Libraries built before the key existed load as before; where the host's features
    cannot be read (no /proc/cpuinfo) a warning says the check was skipped."""
    needed = meta.get("cpu_features")
    if meta.get("target") != "llvm" or not needed:
        return
    lib_arch = cpu_arch(meta.get("mtriple") or platform.machine())
    here = cpu_arch(platform.machine())
    if lib_arch != here:
        raise CPUFeatureError(
            f"{lib_path} was built for {lib_arch} CPUs (-mcpu {meta.get('mcpu') or 'generic'}), and this machine is "
            f"{here}: compile it here with `speccompile compile <model_dir>/speccompile-config.json --device llvm "
            f"-o {lib_path}`")
    host = host_cpu_features()
    if host is None:
        warnings.warn(f"cannot read this CPU's features (no /proc/cpuinfo on {platform.system()}), so the check that "
                      f"it has {', '.join(needed)} (what {lib_path} was compiled for) is skipped; set "
                      f"{HOST_FEATURES_ENV} to enable it", RuntimeWarning, stacklevel=3)
        return
    missing = [f for f in needed if f not in host]
    if missing:
        raise CPUFeatureError(
            f"{lib_path} was compiled for -mcpu {meta.get('mcpu') or 'generic'} and uses CPU features this machine "
            f"lacks: {', '.join(missing)}; running it would stop with an illegal instruction. Rebuild it for a CPU "
            f"this machine supports -- rebuild with: speccompile compile <model_dir>/speccompile-config.json "
            f"{suggest_mcpu(host, here)} -o {lib_path} (or compile on this machine with --device llvm and no "
            "--mcpu: the default is the CPU you build on)")
