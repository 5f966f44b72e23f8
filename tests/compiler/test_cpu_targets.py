"""Build here, run there: the CPU a library is compiled for (--mcpu, "llvm -mcpu=X"), the
features it records, the refusal on a CPU without them, and the promise that our q4
kernels give the same tokens on AVX2 and AVX-512 VNNI (checked on any host that runs both).

The --device parser shared by compile and the runtime (runtime/device.py) is tested here too.
"""
from __future__ import annotations

import platform
from pathlib import Path

import numpy as np
import pytest
import tvm

from speccompile.compiler.compile import CompileError
from speccompile.kernels.cpu_matmul_int8 import int8_dot_isa
from speccompile.runtime import cpu
from speccompile.runtime.cpu import CPUFeatureError, check_cpu_features, host_cpu_features, suggest_mcpu
from speccompile.runtime.device import DeviceError, parse_device
from speccompile.runtime.model import Model, ModelLoadError, resolve_device
from speccompile.compiler.targets import cpu_target, plan_target, required_cpu_features

X86 = cpu.cpu_arch(platform.machine()) == "x86_64"
needs_x86 = pytest.mark.skipif(not X86, reason="the AVX2/AVX-512 builds need an x86-64 host")
# x86-64-v3 (AVX2) in /proc/cpuinfo spelling, as the library built for it records it
V3 = {"pni", "ssse3", "sse4_1", "sse4_2", "popcnt", "cx16", "lahf_lm", "avx", "avx2", "fma", "f16c", "bmi1", "bmi2",
      "abm", "movbe"}
AVX512 = {"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"}


# ------------------------------------------------------------ --device strings
@pytest.mark.parametrize("text, kind, index", [
    ("auto", "auto", None), ("cpu", "llvm", None), ("cpu:0", "llvm", 0), ("llvm", "llvm", None),
    ("cuda", "cuda", None), ("cuda:1", "cuda", 1), ("CUDA:0", "cuda", 0), ("opencl", "opencl", None),
    ("metal", "metal", None), ("vulkan:2", "vulkan", 2), ("rocm", "rocm", None)])
def test_runtime_device_forms(text, kind, index):
    spec = parse_device(text)
    assert (spec.kind, spec.index, spec.attrs) == (kind, index, {})
    assert spec.tvm_device_type == ("cpu" if kind == "llvm" else kind)


@pytest.mark.parametrize("text, kind, attrs", [
    ("llvm -mcpu=znver3", "llvm", {"mcpu": "znver3"}),
    ("cpu -mcpu=x86-64-v4 -mattr=+avx512vnni,-avx512fp16", "llvm",
     {"mcpu": "x86-64-v4", "mattr": ["+avx512vnni", "-avx512fp16"]}),
    ('{"kind": "llvm", "mcpu": "skylake-avx512", "num-cores": 8}', "llvm", {"mcpu": "skylake-avx512", "num-cores": 8}),
    ("llvm -mtriple=aarch64-linux-gnu -mcpu=apple-m1", "llvm", {"mtriple": "aarch64-linux-gnu", "mcpu": "apple-m1"}),
    ("cuda -arch=sm_89", "cuda", {"arch": "sm_89"}), ("android", "android", {}), ("iphone", "iphone", {})])
def test_compile_target_strings(text, kind, attrs):
    spec = parse_device(text, for_compile=True)
    assert spec.kind == kind and spec.attrs == attrs


@pytest.mark.parametrize("text, for_compile, words", [
    ("tpu", False, "unknown --device 'tpu'; use auto, cpu"),
    ("", True, "--device is empty"),
    ("cuda:x", False, "index after ':' must be a number"),
    ("cpu:1", False, "single device"),
    ("auto:0", True, "auto takes no index"),
    ("llvm -mcpu=znver3", False, "compile target string; at run time use"),
    ('{"kind": "llvm"}', False, "is a compile target"),
    ("android", False, "names a compile target"),
    ("rocm", True, "cannot compile for rocm"),
    ("llvm -mcpu", True, "not of the form -key=value"),
    ("llvm mcpu=znver3", True, "not of the form -key=value"),
    ("llvm -mcpu=a -mcpu=b", True, "-mcpu is given twice"),
    ("llvm -march=znver3", True, "unknown attribute -march for llvm; it takes -mcpu, -mtriple, -mattr, -num-cores"),
    ("opencl -mcpu=znver3", True, "unknown attribute -mcpu for opencl; it takes no attributes"),
    ("llvm -mattr=avx2", True, "+feature/-feature"),
    ("llvm -num-cores=zero", True, "-num-cores takes an integer"),
    ('{"mcpu": "znver3"}', True, 'needs a "kind"'),
    ("{kind: llvm}", True, "not valid JSON")])
def test_bad_device_strings_are_refused_by_name(text, for_compile, words):
    with pytest.raises(DeviceError) as err:
        parse_device(text, for_compile=for_compile)
    assert words in str(err.value)


def test_runtime_device_index_and_kind_checks(tmp_path):
    lib = tmp_path / "m.so"
    cpu_meta = {"target": "llvm", "device": "llvm"}
    assert resolve_device(cpu_meta, "cpu:0", lib) == tvm.cpu()
    assert resolve_device(cpu_meta, "auto", lib) == tvm.cpu()
    with pytest.raises(ModelLoadError, match="run it with --device cpu or compile it for cuda"):
        resolve_device(cpu_meta, "cuda:1", lib)
    with pytest.raises(ModelLoadError, match="unknown --device 'gpu'"):
        resolve_device(cpu_meta, "gpu", lib)
    cuda_meta = {"target": "cuda", "device": "cuda", "cuda_archs": ["sm_80"]}
    if not tvm.cuda(7).exist:  # no eighth GPU here: the index is honoured, not dropped
        with pytest.raises(ModelLoadError, match="no cuda:7 device is visible"):
            resolve_device(cuda_meta, "cuda:7", lib)
    with pytest.raises(ModelLoadError, match="not for this CPU"):
        resolve_device(cuda_meta, "cpu", lib)


# ------------------------------------------------------------ compile side: the CPU chosen
@needs_x86
def test_recorded_features_follow_mcpu():
    def feats(**kw):
        return set(required_cpu_features(tvm.target.Target(cpu_target(**kw))))

    assert feats(mcpu="x86-64-v3", triple=None) == V3  # exactly the psABI level, whatever the build host
    skx = feats(mcpu="skylake-avx512", triple=None)
    assert AVX512 <= skx and "avx512_vnni" not in skx and "amx_tile" not in skx
    spr = feats(mcpu="sapphirerapids", triple=None)
    assert {"avx512_vnni", "avx512_fp16", "avx512_bf16", "avx_vnni", "amx_tile", "amx_int8"} <= spr
    assert not AVX512 & feats(mcpu="znver3", triple=None)
    # -mattr adds to (or takes from) what the CPU name implies
    assert feats(mcpu="x86-64-v4", triple=None, mattr=["+avx512vnni"]) == V3 | AVX512 | {"avx512_vnni"}
    arm = feats(mcpu="apple-m1", triple="aarch64-linux-gnu")
    assert {"asimd", "asimddp", "asimdhp"} <= arm and not arm & V3


@needs_x86
@pytest.mark.parametrize("device, mcpu, isa", [
    ("llvm", "x86-64-v3", "avx2"), ("llvm", "znver3", "avx2"), ("llvm", "skylake-avx512", "avx2"),
    ("llvm", "cascadelake", "avx512vnni"), ("llvm", "sapphirerapids", "avx512vnni"), ("llvm", "x86-64-v2", None),
    ("llvm -mcpu=znver4", None, "avx512vnni"), ("llvm -mcpu=x86-64-v4 -mattr=+avx512vnni", None, "avx512vnni"),
    ('{"kind": "llvm", "mcpu": "x86-64-v3"}', None, "avx2")])
def test_q4_kernel_isa_follows_the_chosen_cpu(tmp_path, device, mcpu, isa):
    """The kernel choice depends on the CPU built for, never on the build host."""
    plan = plan_target(device, tmp_path / "m.so", mcpu=mcpu)
    assert plan.device == "llvm" and int8_dot_isa(plan.target) == isa


@pytest.mark.parametrize("kwargs, words", [
    ({"mcpu": "znver9"}, "--mcpu 'znver9' is not a CPU LLVM knows for"),
    ({"mcpu": "skylake-avx"}, "did you mean skylake-avx512"),
    ({"device": "cuda", "mcpu": "znver3"}, "--mcpu names the CPU of a --device llvm build"),
    ({"device": "llvm -mcpu=znver3", "mcpu": "znver4"}, "--mcpu znver4 contradicts --device 'llvm -mcpu=znver3'"),
    ({"device": "cuda -arch=sm_80", "cuda_archs": ["sm_89"]}, "--cuda-arch sm_89 contradicts"),
    ({"mcpu": "native", "host": "aarch64-linux-gnu"}, "--mcpu native means this machine's CPU"),
    ({"device": "npu"}, "unknown --device 'npu'")])
def test_bad_cpu_choices_are_refused_before_compiling(tmp_path, kwargs, words):
    kwargs = dict(kwargs)
    device = kwargs.pop("device", "llvm")
    with pytest.raises(CompileError) as err:
        plan_target(device, tmp_path / "m.so", **kwargs)
    assert words in str(err.value)


@needs_x86
def test_arm_cpu_name_on_x86_points_to_host():
    with pytest.raises(CompileError, match="apple-m1 is an aarch64 CPU: add --host aarch64-linux-gnu"):
        plan_target("llvm", Path("m.so"), mcpu="apple-m1")
    plan = plan_target("llvm", Path("m.tar"), host="aarch64-linux-gnu", mcpu="apple-m1")
    assert plan.target.attrs["mcpu"] == "apple-m1" and plan.output_format == "tar"


@needs_x86
def test_native_build_leaves_out_features_the_host_hides(monkeypatch):
    """A VM may hide AVX-512 from a CPU whose name implies it: a default build then must not
    use (nor record) what this machine does not report, so it always loads where it was built."""
    monkeypatch.setenv(cpu.HOST_FEATURES_ENV, " ".join(sorted(V3 - {"movbe"})))
    spec = cpu_target(None, None)
    assert spec["mcpu"] == tvm.target.codegen.llvm_get_system_cpu()
    assert set(required_cpu_features(tvm.target.Target(spec))) <= V3 - {"movbe"}


# ------------------------------------------------------------ runtime side: the check
@pytest.mark.parametrize("host, advice", [
    (V3, "--mcpu x86-64-v3"), (V3 | AVX512, "--mcpu x86-64-v4"),
    (V3 | AVX512 | {"avx512_vnni"}, '--device "llvm -mcpu=x86-64-v4 -mattr=+avx512vnni"'),
    ({"pni", "ssse3", "sse4_1", "sse4_2", "popcnt", "cx16", "lahf_lm", "avx"}, "--mcpu x86-64-v2"),
    ({"sse3"}, "--mcpu x86-64")])
def test_suggested_mcpu_is_one_the_host_runs(host, advice):
    assert suggest_mcpu(host, "x86_64") == advice


def test_host_features_read_from_proc_cpuinfo(monkeypatch):
    monkeypatch.delenv(cpu.HOST_FEATURES_ENV, raising=False)
    feats = host_cpu_features()
    if platform.system() != "Linux":
        pytest.skip("/proc/cpuinfo is Linux's")
    assert feats, "no flags/Features line read from /proc/cpuinfo"
    if X86:
        assert {"sse2", "cx8"} <= feats  # in every x86-64 CPU's flags
    monkeypatch.setenv(cpu.HOST_FEATURES_ENV, "avx, avx2  fma")
    assert host_cpu_features() == {"avx", "avx2", "fma"}


def test_feature_check_cases(monkeypatch, tmp_path):
    lib = tmp_path / "m.so"
    monkeypatch.setenv(cpu.HOST_FEATURES_ENV, " ".join(V3))
    here = platform.machine()
    # libraries built before the key existed, and GPU libraries, are not checked
    check_cpu_features({"target": "llvm"}, lib)
    check_cpu_features({"target": "cuda", "cpu_features": ["avx512f"]}, lib)
    check_cpu_features({"target": "llvm", "mtriple": f"{here}-linux-gnu", "cpu_features": sorted(V3)}, lib)
    with pytest.raises(CPUFeatureError) as err:
        check_cpu_features({"target": "llvm", "mcpu": "cascadelake", "mtriple": f"{here}-linux-gnu",
                            "cpu_features": sorted(V3 | {"avx512f", "avx512_vnni"})}, lib)
    msg = str(err.value)
    assert "-mcpu cascadelake" in msg and "lacks: avx512_vnni, avx512f;" in msg
    assert f"rebuild with: speccompile compile <model_dir>/speccompile-config.json {suggest_mcpu(V3, here)} -o {lib}" in msg
    other = "aarch64" if X86 else "x86_64"
    with pytest.raises(CPUFeatureError, match=f"built for {other} CPUs"):
        check_cpu_features({"target": "llvm", "mtriple": f"{other}-linux-gnu", "cpu_features": ["avx"]}, lib)
    monkeypatch.setattr(cpu, "host_cpu_features", lambda: None)
    with pytest.warns(RuntimeWarning, match="cannot read this CPU's features"):
        check_cpu_features({"target": "llvm", "cpu_features": ["avx512f"]}, lib)


def test_library_is_refused_before_it_is_opened_or_any_weight_read(build_tiny, monkeypatch):
    """A library asking for a feature the (faked) host lacks is refused with the message,
    before dlopen and before a single weight is read."""
    from speccompile.runtime import model as model_mod

    built = build_tiny("tiny-llama", "q4f32_1")
    meta = model_mod.baked_metadata(built.lib)
    assert meta["cpu_features"] and meta["mcpu"] == tvm.target.codegen.llvm_get_system_cpu()
    Model(built.model_dir, built.lib)  # loads on its own build host
    dropped = "avx2" if "avx2" in meta["cpu_features"] else meta["cpu_features"][-1]
    monkeypatch.setenv(cpu.HOST_FEATURES_ENV, " ".join(f for f in meta["cpu_features"] if f != dropped))

    def forbidden(*args, **kwargs):
        raise AssertionError("the library was opened or weights were read before the CPU check")

    monkeypatch.setattr(model_mod, "load_params", forbidden)
    monkeypatch.setattr(model_mod.tvm.runtime, "load_module", forbidden)
    with pytest.raises(ModelLoadError) as err:
        Model(built.model_dir, built.lib)
    msg = str(err.value)
    assert f"uses CPU features this machine lacks: {dropped};" in msg
    assert f"-mcpu {meta['mcpu']}" in msg and "rebuild with: speccompile compile" in msg and "--mcpu" in msg


# ------------------------------------------------------------ AVX2 vs host: same tokens
def _host_runs(features) -> bool:
    host = host_cpu_features()
    return host is not None and set(features) <= host


def _greedy(engine, prompts, max_tokens):
    from speccompile.runtime.sampling import SamplingParams

    out = []
    for p in prompts:
        res = engine.generate(engine.encode_prompt(p), max_tokens=max_tokens, sampling=SamplingParams(temperature=0.0))
        out.append((res.token_ids, res.stats.to_dict()))
    return out


def _compare_builds(model_dir, lib_avx2, lib_host, prompts, max_tokens, full_length=False):
    """Prefill logits bit-identical, greedy tokens identical plain and with ngram speculation."""
    from speccompile.runtime.engine import Engine

    results = {}
    for name, lib in (("avx2", lib_avx2), ("host", lib_host)):
        plain = Engine(model_dir, lib)
        ids = plain.encode_prompt(prompts[0])
        plain.kv.add_sequence(999)
        logits = plain.model.prefill(plain.kv, [999], [ids])
        plain.kv.remove_sequence(999)
        spec = Engine(model_dir, lib, speculative_mode="ngram", spec_draft_length=4)
        results[name] = (logits, _greedy(plain, prompts, max_tokens), _greedy(spec, prompts, max_tokens))
    (la, pa, sa), (lh, ph, sh) = results["avx2"], results["host"]
    np.testing.assert_array_equal(la, lh)
    assert [t for t, _ in pa] == [t for t, _ in ph]
    assert [t for t, _ in sa] == [t for t, _ in pa]  # lossless, and the same on both ISAs
    assert [t for t, _ in sh] == [t for t, _ in ph]
    assert all(len(t) == max_tokens if full_length else t for t, _ in pa)
    assert sum(s["draft_tokens"] for _, s in sa) > 0 and sum(s["draft_tokens"] for _, s in sh) > 0


@needs_x86
def test_tiny_model_avx2_and_host_builds_give_identical_tokens(build_tiny, tmp_path):
    from speccompile.compiler.compile import compile_model
    from speccompile.runtime.model import baked_metadata

    if not _host_runs(V3):
        pytest.skip("this host cannot run an x86-64-v3 (AVX2) library")
    built = build_tiny("tiny-llama", "q4f32_1")  # compiled for the host
    lib = tmp_path / "tiny-avx2.so"
    meta = compile_model(built.model_dir / "speccompile-config.json", "llvm", lib, verbose=False, mcpu="x86-64-v3")
    assert meta["q4_int8_isa"] == "avx2" and set(meta["cpu_features"]) == V3 and meta["mcpu"] == "x86-64-v3"
    assert baked_metadata(built.lib)["q4_int8_isa"] in ("avx512vnni", "avx2")
    _compare_builds(built.model_dir, lib, built.lib, ["hello there", "abcabcabcabc"], 24, full_length=True)


@pytest.mark.real_model
@needs_x86
def test_smollm2_avx2_and_host_builds_give_identical_tokens(smollm2_q4):
    from speccompile.compiler.fetch import prepare
    from speccompile.runtime.model import baked_metadata

    if not _host_runs(V3):
        pytest.skip("this host cannot run an x86-64-v3 (AVX2) library")
    model_dir, host_lib = smollm2_q4
    _, avx2_lib = prepare("SmolLM2-135M-Instruct", "q4f32_1", quiet=True, mcpu="x86-64-v3")
    assert "x86-64-v3" in avx2_lib.name and avx2_lib != host_lib
    assert baked_metadata(avx2_lib)["q4_int8_isa"] == "avx2"
    host_isa = baked_metadata(host_lib)["q4_int8_isa"]
    if host_isa != "avx512vnni":
        pytest.skip(f"this host has no AVX-512 VNNI (its build uses {host_isa}): nothing to compare across ISAs")
    _compare_builds(model_dir, avx2_lib, host_lib,
                    ["What is the capital of France?",
                     "Repeat this sentence three times: the quick brown fox jumps over the lazy dog."], 48)


def test_cli_mcpu_and_device_forms(build_tiny, tmp_path):
    """compile takes --mcpu and target strings, refuses a bad CPU at once; the runtime
    commands take MLC-LLM device forms and refuse a compile target string."""
    from click.testing import CliRunner

    from speccompile.cli.main import main

    built = build_tiny("tiny-llama", "q4f32_1")
    config, lib, r = str(built.model_dir / "speccompile-config.json"), tmp_path / "m.so", CliRunner()
    res = r.invoke(main, ["compile", config, "--mcpu", "znver9", "-o", str(lib)])
    assert res.exit_code == 2 and "--mcpu 'znver9' is not a CPU LLVM knows" in res.output and not lib.exists()
    if X86 and _host_runs(V3):
        res = r.invoke(main, ["compile", config, "--device", "llvm -mcpu=x86-64-v3", "-o", str(lib)])
        assert res.exit_code == 0, res.output
        assert "x86-64-v3, q4 kernels: int8 activations on avx2" in res.output
        gen = ["generate", str(built.model_dir), "--model-lib", str(lib), "--prompt", "hi", "--max-tokens", "4", "--json"]
        res = r.invoke(main, gen + ["--device", "cpu:0"])
        assert res.exit_code == 0, res.output
        res = r.invoke(main, gen + ["--device", "llvm -mcpu=znver3"])
        assert res.exit_code == 2 and "compile target string; at run time use" in res.output
