"""aarch64 builds, run: model libraries cross-compiled here (``compile --host
aarch64-linux-gnu``) and the C API cross-built for aarch64 (``make capi
HOST=aarch64-linux-gnu``), run under qemu-aarch64 emulating a Cortex-A76 (dot product: the
sdot q4 kernel), a Cortex-A72 (none: the NEON integer kernel), or qemu's "max" CPU for a
Cortex-A710 build (int8 matrix multiply: the smmla kernel).

The promise held here: one model and one prompt give the same numbers on ARM as on x86 --
the tiny model's logits bit for bit against the Python runtime on this x86 host, and
SmolLM2's greedy tokens, plain and with n-gram speculation.

qemu-user shows the host's /proc/cpuinfo, so each run names the emulated CPU's features
explicitly with SPECCOMPILE_HOST_CPU_FEATURES (the documented override; it replaces the
detection, and the load check still runs against it).
"""
from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from speccompile.compiler.compile import compile_model

ROOT = Path(__file__).resolve().parents[2]
TRIPLE = "aarch64-linux-gnu"
SYSROOT = Path("/usr") / TRIPLE
# /proc/cpuinfo "Features" of the cores qemu emulates (as Linux prints them on those cores)
CPU_FEATURES = {
    "cortex-a76": "fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp",
    "cortex-a72": "fp asimd evtstrm aes pmull sha1 sha2 crc32 cpuid",
    "cortex-a710": "fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm jscvt fcma lrcpc "
                   "dcpop sha3 sm3 sm4 asimddp sha512 sve asimdfhm dit uscat ilrcpc flagm ssbs sb paca pacg dcpodp "
                   "sve2 sveaes svepmull svebitperm svesha3 svesm4 flagm2 frint svei8mm svebf16 i8mm bf16 dgh bti",
}
# qemu 7.2 has no Cortex-A710 model: its "max" CPU has every feature above
QEMU_CPU = {"cortex-a710": "max"}
# within the byte tokenizer's vocabulary; 11 rows: the int8 kernels' passes of 4, 4, 2 and 1
IDS = [1, 5, 9, 23, 42, 7, 7, 7, 100, 3, 250]


def _arm_missing() -> str | None:
    for tool in (f"{TRIPLE}-g++", "qemu-aarch64"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (make install sets up the cross toolchain and qemu-user)"
    if not (SYSROOT / "lib" / "libc.so.6").exists():
        return f"no aarch64 libc under {SYSROOT} (libc6-dev-arm64-cross)"
    return None


@pytest.fixture(scope="session")
def arm_capi() -> Path:
    """build/capi-aarch64-linux-gnu (make install builds it; rebuilt here if missing, under a lock)."""
    why = _arm_missing()
    if why:
        if os.environ.get("SPECCOMPILE_REQUIRE_ARM") == "1":
            pytest.fail(why)
        pytest.skip(why)
    build = ROOT / "build" / f"capi-{TRIPLE}"
    with (ROOT / "build" / "capi-arm.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (build / "spc_forward_logits").exists():
            proc = subprocess.run(["make", "-C", str(ROOT), "capi", f"HOST={TRIPLE}"], capture_output=True, text=True)
            assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return build


def qemu(exe: Path, *args: str, cpu: str = "cortex-a76", features: str | None = None) -> subprocess.CompletedProcess:
    """An aarch64 program under qemu-user, as on a board with that CPU."""
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    env["SPECCOMPILE_HOST_CPU_FEATURES"] = CPU_FEATURES[cpu] if features is None else features
    env["TVM_NUM_THREADS"] = "1"  # emulated threads only contend for the host's cores
    return subprocess.run(["qemu-aarch64", "-cpu", QEMU_CPU.get(cpu, cpu), "-L", str(SYSROOT), str(exe), *args],
                          capture_output=True, text=True, errors="replace", env=env, timeout=900)


def _python_logits(model_dir: Path, lib: Path, ids: list[int]) -> np.ndarray:
    """The twin of spc_forward_logits: runtime/model.py Model.forward over one fresh sequence."""
    from speccompile.runtime.engine import Engine

    eng = Engine(model_dir, lib)
    eng.kv.add_sequence(7)
    out = eng.model.forward(eng.kv, [7], [ids])
    return np.asarray(out, np.float32).reshape(len(ids), -1)


@pytest.fixture(scope="module")
def arm_tiny(build_tiny, tmp_path_factory):
    """arm_tiny(quant, mcpu) -> (this host's Built, the aarch64 library), each compiled once."""
    made: dict = {}
    root = tmp_path_factory.mktemp("arm")

    def get(quant: str, mcpu: str):
        built = build_tiny("tiny-llama", quant)  # this host's build (AVX-512 VNNI or AVX2 q4 kernels)
        if (quant, mcpu) not in made:
            lib = root / f"tiny-{quant}-{mcpu}.so"
            compile_model(built.model_dir / "speccompile-config.json", "llvm", lib, verbose=False, host=TRIPLE, mcpu=mcpu)
            made[quant, mcpu] = lib
        return built, made[quant, mcpu]

    return get


def test_cross_linked_library(arm_tiny):
    """An aarch64 ELF shared object whose _metadata names the triple, the ISA and the features;
    refused on this x86 host by name, before it is opened."""
    import platform
    import struct

    from speccompile.runtime import cpu
    from speccompile.runtime.model import Model, ModelLoadError, baked_metadata

    built, lib = arm_tiny("q4f32_1", "cortex-a76")
    data = lib.read_bytes()
    assert data[:4] == b"\x7fELF" and struct.unpack_from("<HH", data, 16) == (3, 183)  # shared object, AArch64
    baked = baked_metadata(lib)
    assert baked["mtriple"] == TRIPLE and baked["q4_int8_isa"] == "dotprod" and baked["q4_activations"] == "int8"
    assert {"asimd", "asimddp"} <= set(baked["cpu_features"])
    if cpu.cpu_arch(platform.machine()) != "aarch64":
        with pytest.raises(ModelLoadError, match="was built for aarch64 CPUs"):
            Model(built.model_dir, lib)


@pytest.mark.parametrize("quant, mcpu, isa", [("q0f32", "cortex-a76", None), ("q4f32_1", "cortex-a76", "dotprod"),
                                              ("q4f32_1", "cortex-a72", "neon"),
                                              ("q4f32_1", "cortex-a710", "i8mm")])
def test_tiny_model_logits_equal_x86_bit_for_bit(arm_capi, arm_tiny, tmp_path, quant, mcpu, isa):
    from speccompile.runtime.model import baked_metadata

    built, lib = arm_tiny(quant, mcpu)
    assert baked_metadata(lib)["q4_int8_isa"] == isa
    out = tmp_path / "logits.bin"
    proc = qemu(arm_capi / "spc_forward_logits", str(built.model_dir), str(lib), str(out), *map(str, IDS), cpu=mcpu)
    assert proc.returncode == 0, proc.stderr
    arm = np.fromfile(out, np.float32).reshape(len(IDS), -1)
    x86 = _python_logits(built.model_dir, built.lib, IDS)
    assert np.isfinite(x86).all() and arm.shape == x86.shape
    assert np.array_equal(arm.view(np.uint32), x86.view(np.uint32)), \
        f"{int((arm != x86).sum())} of {arm.size} logits differ; max |diff| {np.abs(arm - x86).max()}"


def test_library_for_a_richer_cpu_is_refused_under_emulation(arm_capi, arm_tiny):
    """A dot-product build on a Cortex-A72 stops before loading, naming the missing feature."""
    built, lib = arm_tiny("q4f32_1", "cortex-a76")
    proc = qemu(arm_capi / "spc_generate", str(built.model_dir), "--model-lib", str(lib), "--prompt-ids", "1,2,3",
                "--max-tokens", "2", cpu="cortex-a72")
    assert proc.returncode != 0 and "asimddp" in proc.stderr and "illegal instruction" in proc.stderr, proc.stderr


@pytest.fixture(scope="module")
def smollm2_arm(smollm2_q4):
    """SmolLM2-135M q4f32_1 for a Cortex-A76 (Raspberry Pi 5), beside this host's build."""
    from speccompile.compiler.fetch import prepare

    model_dir, x86_lib = smollm2_q4
    _, arm_lib = prepare("SmolLM2-135M-Instruct", "q4f32_1", quiet=True, mcpu="cortex-a76", host=TRIPLE)
    return model_dir, x86_lib, arm_lib


def test_smollm2_greedy_tokens_equal_x86(arm_capi, smollm2_arm):
    """16 tokens (emulated, SmolLM2 decodes ~4 tok/s): plain, then n-gram speculation on a
    prompt that repeats, both equal to the Python runtime's tokens from this host's build."""
    from speccompile.runtime.engine import Engine
    from speccompile.runtime.sampling import SamplingParams

    model_dir, x86_lib, arm_lib = smollm2_arm
    eng = Engine(model_dir, x86_lib)
    ids = eng.encode_prompt("the cat sat on the mat. the cat sat on the")
    want = eng.generate(ids, max_tokens=16, sampling=SamplingParams(temperature=0.0)).token_ids
    for mode in ("disable", "ngram"):
        proc = qemu(arm_capi / "spc_generate", str(model_dir), "--model-lib", str(arm_lib), "--prompt-ids",
                    ",".join(map(str, ids)), "--max-tokens", "16", "--speculative-mode", mode, "--spec-draft-length", "4",
                    "--json")
        assert proc.returncode == 0, proc.stderr
        got = json.loads(proc.stdout)
        assert got["token_ids"] == want, (mode, got["token_ids"], want)
        if mode == "ngram":
            assert got["stats"]["draft_tokens"] > 0  # it speculated, and stayed exact
