"""Libraries for other machines, built here: CPU system libraries (``.tar``) for x86, aarch64
Linux, Android and iOS, each compiled and inspected (format, architecture, prefixed symbols),
the x86 one run linked into an app; the q4 kernel's ISA per ARM CPU; the cross-link refusals.
tests/runtime/test_arm.py builds the cross-linked aarch64 ``.so`` and runs it under qemu.
"""
from __future__ import annotations

import os
import platform
import shutil
import struct
import tarfile
from pathlib import Path

import pytest

from speccompile.compiler.compile import CompileError, compile_model
from speccompile.compiler.targets import plan_target
from speccompile.kernels.cpu_matmul_int8 import int8_dot_isa
from speccompile.runtime import cpu

ELF_MACHINE = {"x86_64": 62, "aarch64": 183}
MACHO_ARM64 = 0x0100000C


def _elf_machine(data: bytes) -> tuple[int, int]:
    """(e_type, e_machine) of an ELF file: 1 relocatable object, 3 shared object."""
    assert data[:4] == b"\x7fELF", "not an ELF file"
    return struct.unpack_from("<HH", data, 16)


@pytest.mark.parametrize("mcpu, isa", [("cortex-a76", "dotprod"), ("apple-m1", "dotprod"), ("neoverse-n1", "dotprod"),
                                       ("cortex-a72", "neon"), ("cortex-a53", "neon"), (None, "neon")])
def test_arm_q4_kernel_follows_the_cpu(tmp_path, mcpu, isa):
    """sdot where the CPU has the dot-product extension, else the NEON integer kernel: both
    int8 activations, so ARM gives x86's numbers (never the float kernel)."""
    plan = plan_target("llvm", tmp_path / "m.tar", host="aarch64-linux-gnu", mcpu=mcpu)
    assert int8_dot_isa(plan.target) == isa


@pytest.fixture(scope="module")
def archive(build_tiny, tmp_path_factory):
    """archive(host) -> (metadata, .tar) of the tiny q4f32_1 model, each compiled once."""
    made: dict = {}
    root = tmp_path_factory.mktemp("archives")

    def get(host):
        if host not in made:
            built = build_tiny("tiny-llama", "q4f32_1")
            lib = root / (host or "native") / "tiny-cpu.tar"
            made[host] = compile_model(built.model_dir / "speccompile-config.json", "llvm", lib, verbose=False,
                                       host=host), lib
        return made[host]

    return get


@pytest.mark.parametrize("host, arch", [(None, platform.machine()), ("aarch64-linux-gnu", "aarch64"),
                                        ("aarch64-linux-android", "aarch64"), ("arm64-apple-ios", "macho")])
def test_cpu_system_library_archives(archive, host, arch):
    """A .tar of objects an app links statically (TVM system library, symbols prefixed by the
    output's stem), for every CPU an app is built for."""
    meta, lib = archive(host)
    assert meta["system_lib_prefix"] == "tiny_cpu_" and meta["q4_activations"] == "int8"
    with tarfile.open(lib) as tar:
        objs = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.name.endswith(".o")}
    assert "lib0.o" in objs and any(n.endswith("devc.o") for n in objs)
    code = objs["lib0.o"]
    if arch == "macho":
        assert struct.unpack_from("<II", code, 0) == (0xFEEDFACF, MACHO_ARM64)
    else:
        assert _elf_machine(code) == (1, ELF_MACHINE[cpu.cpu_arch(arch)])
    # the kernels' symbols carry the prefix (what the app's system:// load looks up)
    assert b"tiny_cpu_q4_take" in code and b"tiny_cpu_q4_matmul" in code and b"tiny_cpu_attention" in code


def test_cross_link_refusals(build_tiny, tmp_path, monkeypatch):
    config = build_tiny("tiny-llama", "q4f32_1").model_dir / "speccompile-config.json"
    with pytest.raises(CompileError, match="--cc /nowhere/g\\+\\+: no such compiler"):
        compile_model(config, "llvm", tmp_path / "a.so", verbose=False, host="aarch64-linux-gnu", cc="/nowhere/g++")
    with pytest.raises(CompileError, match="--cc links a .so"):
        compile_model(config, "llvm", tmp_path / "a.tar", verbose=False, host="aarch64-linux-gnu", cc="g++")
    with pytest.raises(CompileError, match="cannot be linked into a shared library on this machine: use -o a.tar"):
        compile_model(config, "llvm", tmp_path / "a.so", verbose=False, host="arm64-apple-ios")
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(CompileError, match="aarch64-linux-gnu-g\\+\\+ is not on PATH: install it .*g\\+\\+-aarch64-linux-gnu"):
        compile_model(config, "llvm", tmp_path / "a.so", verbose=False, host="aarch64-linux-gnu")
    assert not list(tmp_path.iterdir())  # refused before any work


def test_cpu_system_library_runs_linked_into_an_app(build_tiny, archive, capi_build, tmp_path):
    """What an app does with the .tar: link its objects in, then load ``system://<prefix>``
    through the C API. Here the objects are linked into a shared object preloaded into
    spc_generate; its greedy tokens (n-gram speculation on) equal those of the .so build."""
    import json
    import subprocess

    import tvm_ffi

    built = build_tiny("tiny-llama", "q4f32_1")
    _, lib = archive(None)  # this CPU's .tar (prefix tiny_cpu_)
    with tarfile.open(lib) as tar:
        tar.extractall(tmp_path / "objs")
    ffi_lib = Path(tvm_ffi.__file__).parent / "lib"
    app = tmp_path / "libapp_model.so"
    subprocess.run(["g++", "-shared", "-o", str(app), *map(str, sorted((tmp_path / "objs").glob("*.o"))),
                    f"-L{ffi_lib}", "-ltvm_ffi", f"-Wl,-rpath,{ffi_lib}"], check=True)
    # a fixed draft length: what is tested is the linked library, not whether the adaptive policy
    # drafts on a machine the other test worker keeps busy (it did not, once)
    args = ["--prompt-ids", "1,2,3,1,2,3,1,2", "--max-tokens", "12", "--speculative-mode", "ngram",
            "--spec-draft-length", "4", "--json"]
    exe = str(capi_build / "spc_generate")
    linked = subprocess.run([exe, str(built.model_dir), "--model-lib", "system://tiny_cpu_", *args], capture_output=True,
                            text=True, errors="replace", env={**os.environ, "LD_PRELOAD": str(app)})
    assert linked.returncode == 0, linked.stderr
    shared = subprocess.run([exe, str(built.model_dir), "--model-lib", str(built.lib), *args], capture_output=True,
                            text=True, errors="replace")
    assert shared.returncode == 0, shared.stderr
    assert json.loads(linked.stdout)["token_ids"] == json.loads(shared.stdout)["token_ids"]
    assert json.loads(linked.stdout)["stats"]["draft_tokens"] > 0
