"""``make gpu-check`` as far as a CPU takes it: the payload's size accounting, its parts'
round trip, conversion without TVM's compiler, and the whole check as a dry run on the tiny
models (the path the GPU machine takes, with llvm libraries and torch on the CPU)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest

from conftest import opencl_missing
from speccompile.gpu_check.check import Check
from speccompile.gpu_check.payload import (DEVICE_LIMIT, MARGIN, MAX_PART, MIN_PART, PayloadError, assemble, check_parts,
                                     join, part_budget, split_file, stage)

REPO = Path(__file__).resolve().parents[2]
MiB = 1 << 20


def test_part_budget_leaves_room_for_the_tree():
    assert part_budget(0) == MAX_PART
    assert part_budget(24 * MiB) == DEVICE_LIMIT - 24 * MiB - MARGIN
    with pytest.raises(PayloadError, match="working tree that travels"):
        part_budget(DEVICE_LIMIT - MARGIN - MIN_PART + 1)  # today's 92 MiB tree is far past this
    with pytest.raises(PayloadError, match="working tree"):
        part_budget(92 * MiB)


def test_a_part_over_the_limit_is_refused():
    check_parts([30 * MiB, 30 * MiB], tree_bytes=30 * MiB)
    with pytest.raises(PayloadError, match="part 2 is 33.0 MiB"):
        check_parts([30 * MiB, 33 * MiB], tree_bytes=30 * MiB)


def test_parts_round_trip_and_a_missing_part_is_named(tmp_path):
    src = tmp_path / "src" / "payload"
    src.mkdir(parents=True)
    (src / "data.bin").write_bytes(np.random.default_rng(0).bytes(10_000))
    blob = tmp_path / "p.tgz"
    with tarfile.open(blob, "w:gz") as tar:
        tar.add(src, "payload")
    parts = split_file(blob, tmp_path / "parts", 3_000, {"commit": "x"})
    sizes = [sum(f.stat().st_size for f in p.iterdir() if f.name.startswith("payload.tgz.")) for p in parts]
    assert len(parts) >= 4 and max(sizes) <= 3_000 and sum(sizes) == blob.stat().st_size
    staging = tmp_path / "staging"
    for p in parts[:2] + parts[3:]:  # part 3 never staged: the machine was given back, say
        manifest = stage(p, staging)
    with pytest.raises(PayloadError, match="lacks part 3 of this payload"):
        join(staging, manifest, tmp_path / "install")
    stage(parts[2], staging)
    out = join(staging, manifest, tmp_path / "install")
    assert (out / "data.bin").read_bytes() == (src / "data.bin").read_bytes()
    (staging / "payload.tgz.002").write_bytes(b"another build")
    with pytest.raises(PayloadError, match="from another build"):
        join(staging, manifest, tmp_path / "install")


def test_convert_weight_takes_the_layout_from_a_library_without_tvm(build_tiny, tmp_path):
    """What the GPU machine does with a random checkpoint: no TVM compiler there, so the
    parameter list comes from the library, and the weights fit it (same fingerprint)."""
    built = build_tiny("tiny-qwen2", "q4f32_1")
    code = f"""
import sys, json
sys.modules["tvm"] = sys.modules["tvm_ffi"] = None  # any TVM import fails
from speccompile.compiler.convert_weight import convert_weight
from speccompile.runtime.contract import baked_metadata
path = convert_weight({str(built.hf_dir)!r}, "q4f32_1", {str(tmp_path / "out")!r}, progress=False,
                      layout_from={str(built.lib)!r})
index = json.loads(open(path).read())
print(index["metadata"]["layout_fingerprint"], baked_metadata({str(built.lib)!r})["layout_fingerprint"])
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    ours, lib = done.stdout.split()
    assert ours == lib
    from speccompile.compiler.convert_weight import convert_weight
    from speccompile.compiler.sources import SourceError

    other = build_tiny("tiny-llama", "q4f32_1")
    with pytest.raises(SourceError, match="was built for llama q4f32_1, not qwen2 q4f32_1"):
        convert_weight(built.hf_dir, "q4f32_1", tmp_path / "o2", progress=False, layout_from=other.lib)


def test_transformers5_rope_parameters_are_read():
    from speccompile.models.config import LlamaConfig

    cfg = LlamaConfig.from_hf_dict({"model_type": "qwen2", "hidden_size": 64, "intermediate_size": 128,
                                    "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 272,
                                    "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}})
    assert cfg.rope_theta == 1000000.0


@pytest.mark.hf
def test_torch_dequantize_matches_the_codec():
    from speccompile.gpu_check.torch_side import dequantize
    from speccompile.models.quant_codec import dequantize_q4, quantize_q4

    w = np.random.default_rng(0).standard_normal((48, 96)).astype(np.float32)
    q, s = quantize_q4(w, "float16")
    np.testing.assert_array_equal(dequantize(q, s, "cpu").numpy(), dequantize_q4(q, s))


class _FakeEngine:
    """What check_capi asks of the engine: prompt ids and greedy results."""

    def encode_prompt(self, prompt):
        return [1, 2, len(prompt) % 7]

    def generate(self, ids, max_tokens, sampling):
        from types import SimpleNamespace

        stats = SimpleNamespace(to_dict=lambda: {"decode_tokens_per_s": 9.0})
        return SimpleNamespace(token_ids=[5, 6, 7, 8], stats=stats)


def test_capi_mismatch_and_failure_are_recorded_not_raised(tmp_path):
    """A C API run that fails or differs is a finding in the JSON (the check goes on)."""
    from speccompile.gpu_check.capi import WATCHED, check_capi

    exe = tmp_path / "capi" / "bin" / "spc_generate"
    exe.parent.mkdir(parents=True)
    exe.write_text(f"""#!{sys.executable}
import json, sys
if "ngram" in sys.argv:  # --speculative-mode ngram
    sys.exit("spc_generate: loading the model: cannot load TVM's CUDA runtime")
print(json.dumps({{"token_ids": [5, 6, 9, 8], "stats": {{"decode_tokens_per_s": 3.0, "accept_rate": 0.0,
                  "verify_steps": 0}}}}))
""")
    exe.chmod(0o755)
    rec = check_capi(_FakeEngine(), tmp_path, {"exe": "capi/bin/spc_generate", "baked_tvm_lib_dir": "/nowhere"},
                     tmp_path, tmp_path / "m.so", ["a", "bb"], 4, tmp_path)
    assert rec["identical"] == [0, 4] and rec["tok_s"] == 3.0 and rec["ngram_tok_s"] is None
    assert rec["python_tok_s"] == 9.0 and rec["baked_tvm_lib_dir_exists"] is False
    assert [r["first_difference"] for r in rec["runs"] if r["ok"]] == [2, 2]
    assert "prompt 0 ngram: exit 1: spc_generate: loading the model: cannot load TVM's CUDA runtime" in rec["error"]
    assert rec["ld_library_path"][0].endswith("/tvm/lib") and rec["ld_library_path"][1].endswith("/tvm_ffi/lib")
    assert set(rec["libraries"]) <= set(WATCHED)  # the first run's linker log, watched names only
    assert not list(tmp_path.glob("capi-ld.*"))  # and removed


@pytest.fixture(scope="module")
def capi_prefix():
    """The C API as the payload carries it, cached with `make gpu-payload`'s models (build/gpu-work)."""
    from speccompile.gpu_check.capi import CapiBuildError, build_capi

    try:
        return build_capi(REPO / "build" / "gpu-work")
    except CapiBuildError as err:
        if "not installed" in str(err):
            return None  # the payload goes without it; the check records why
        raise


@pytest.mark.hf
def test_dry_run_end_to_end(build_tiny, capi_prefix, tmp_path, monkeypatch):
    """The check on the tiny models: a q4 model whose weights travel (and a second build of it,
    measured beside the first), a random one made and converted where the check runs; TVM from
    the payload's runtime-only package; the C API the payload carries against the engine on the
    real-weight model."""
    from speccompile.compiler.compile import compile_model

    real = build_tiny("tiny-llama", "q4f32_1")
    random = build_tiny("tiny-qwen2", "q4f32_1")
    config_only = tmp_path / "qwen-config"
    config_only.mkdir()
    for f in random.model_dir.iterdir():
        if f.name == "speccompile-config.json" or f.name.startswith("tokenizer"):
            shutil.copy(f, config_only / f.name)
    generic = tmp_path / "tiny-llama-x86-64-v2.so"  # an alternative build of the same model (alt_libs)
    compile_model(real.model_dir / "speccompile-config.json", "llvm", generic, verbose=False, mcpu="x86-64-v2")
    models = [{"name": "tiny-llama", "weights": "real", "dir": real.model_dir, "lib": real.lib, "heads": {},
               "alt_libs": {"x86-64-v2": generic}},
              {"name": "tiny-qwen2", "weights": "random", "seed": 0, "dir": config_only, "lib": random.lib}]
    files = {}
    if opencl_missing() is None:  # the kernel bench, as a cuda payload carries it, of the portable kernel on PoCL
        from speccompile.gpu_check import kernels_bench

        monkeypatch.setattr(kernels_bench, "CONTEXTS", (40,))
        monkeypatch.setattr(kernels_bench, "PREFILL", 20)
        info = kernels_bench.build(tmp_path / "bench", device="opencl", dtype="float32", variants=["portable"],
                                   shapes={"tiny": {"qkv": (96, 256)}}, attention={"tiny": (4, 2, 64)},
                                   vocabs={"tiny": 1000})
        files = {f"{kernels_bench.FILE}{ext}": info.with_suffix(ext) for ext in (".so", ".json")}
    parts = assemble(tmp_path / "payload", tmp_path / "work", models, [], "cpu", "q4f32_1", tree_bytes=0,
                     capi=capi_prefix, files=files)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "OUT")}
    done = subprocess.run([sys.executable, "-m", "speccompile.gpu_check.payload", "run", *map(str, parts),
                           "--staging", str(tmp_path / "staging"), "--install", str(tmp_path / "install"),
                           "--out", str(tmp_path / "out"), "--check-args", "--quick --torch-compile-timeout 0"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (path,) = (tmp_path / "out").glob("gpu-check-*.json")
    assert path.with_suffix(".png").exists() and path.with_suffix(".log").exists()
    result = json.loads(path.read_text())
    assert {"device", "driver", "commit", "date", "models"} <= set(result) and result["status"] == "complete"
    assert result["device"].startswith("CPU dry run") and result["copy_bandwidth_gb_s"] > 0
    for name, weights in (("tiny-llama", "real"), ("tiny-qwen2", "random")):
        r = result["models"][name]
        assert r["weights"] == weights and r["quantization"] == "q4f32_1"
        for key in ("decode_tok_s", "decode_tok_s_sampled", "roofline_tok_s", "prefill_tok_s", "host_ms_per_step"):
            assert r[key] > 0, (name, key)
        assert list(r["forward_cost_vs_rows"]) == ["1", "2", "4", "8", "16", "32"]
        assert r["forward_cost_vs_rows"]["1"] == 1.0 and min(r["forward_cost_vs_rows"].values()) > 0
        # q4 kernels with int8 activations on AVX2/VNNI CPUs: ~2% of the largest logit
        assert r["logits_max_abs_diff_vs_torch"] < 0.05 * max(1.0, r["logits"]["max_abs_logit"])
        assert r["logits"]["argmax_agree"] >= 8
        assert r["peers"]["hf_fp16_tok_s"] > 0 and r["peers"]["torch_compile_tok_s"] is None
        assert "torch_compile" in r["skipped"]
    alt = result["models"]["tiny-llama"]["alt_libs"]["x86-64-v2"]  # the same model built another way
    assert alt["decode_tok_s"] > 0 and list(alt["forward_cost_vs_rows"])[:1] == ["1"] and alt["prefill_tok_s"] > 0
    assert isinstance(alt["greedy_ids_equal"], bool) and "errors" not in alt
    if files:  # run in a process of its own; no tensor-core kernel in it, so that is said, and
        # a model without a portable library keeps its default
        assert result["kernels"]["functions"]["portable__tiny_qkv"]["invariant"]
        assert result["kernels"]["attention"]["attn__tiny"]["invariant"]
        assert result["kernels"]["accept"]["accept__tiny"]["correct"]
        assert result["tensor_core_refused"] == "the kernel bench measured no tensor-core kernel"
        assert result["models"]["tiny-llama"]["library"] == "models/tiny-llama.so"
    else:
        assert result["skipped"]["kernels"] == "the payload carries no kernel bench"
    assert result["models"]["tiny-qwen2"]["random_init"]["params"] > 0
    assert "speculative" not in result["models"]["tiny-qwen2"]  # random weights: acceptance means nothing
    speculative = result["models"]["tiny-llama"]["speculative"]
    assert list(speculative)[:2] == ["suffix", "ngram"]  # the default first, then the n-gram peer mode
    for mode in ("suffix", "ngram"):
        rec = speculative[mode]
        assert rec["identical"] == [1, 1] and rec["speedup"] > 0 and 0 <= rec["acceptance"] <= 1
        # the policy prices drafting by costs measured at load: on a tiny model it may decide nothing pays
        if rec["verify_steps"]:
            assert rec["mean_accepted_length"] >= 1 and rec["draft_tokens"] > 0
        else:
            assert rec["mean_accepted_length"] == 0 and rec["acceptance"] == 0
    assert "capi" not in result["models"]["tiny-qwen2"]  # random weights: the tokens mean nothing
    capi = result["models"]["tiny-llama"]["capi"]
    if capi_prefix is None:
        pytest.skip("no cmake / C compiler: the dry run went without the C API")
    # spc_generate's greedy ids equal the engine's, plain and --ngram, on 2 prompts; the wheel's
    # libraries it ran with are the installed payload's (LD_LIBRARY_PATH), not the build's RUNPATH
    assert capi["identical"] == [4, 4] and capi["error"] is None, capi
    assert capi["tok_s"] > 0 and capi["ngram_tok_s"] > 0 and capi["python_tok_s"] > 0
    assert capi["libraries"]["libtvm_runtime.so"].startswith(str(tmp_path / "install" / "payload"))
    assert capi["libraries"]["libspeccompile_capi.so"].startswith(str(tmp_path / "install" / "payload"))


def test_a_refused_tensor_core_kernel_sends_models_and_heads_to_their_portable_libraries(tmp_path):
    """Check.lib_of: the default library, unless the kernel bench refused the tensor-core kernel
    and a portable build is there (models and heads alike)."""
    check = object.__new__(Check)  # lib_of reads these two attributes alone
    check.payload, check.refused = tmp_path, None
    model = {"lib": "models/m.so", "alt_libs": {"portable": "models/m-portable.so"}}
    head = {"dir": "models/m-eagle", "lib": "models/m-eagle.so", "alt_libs": {"portable": "models/m-eagle-portable.so"}}
    assert check.lib_of(model) == tmp_path / "models/m.so" and check.lib_of(head) == tmp_path / "models/m-eagle.so"
    check.refused = "tc__qwen15_o: rows differ from the same rows alone"
    assert check.lib_of(model) == tmp_path / "models/m-portable.so"
    assert check.lib_of(head) == tmp_path / "models/m-eagle-portable.so"
    assert check.lib_of({"lib": "models/x.so", "alt_libs": {}}) == tmp_path / "models/x.so"  # nothing to fall back on


def test_the_profiles_engine_steps_are_plain_and_speculative_as_named(build_tiny):
    """speccompile/gpu_check/profile.py's engine phases (run under CUPTI on a GPU): the plain
    step's sequence never drafts; the speculative one's verifies n-gram drafts (at most the fixed
    4) in every step, each step emitting what it accepted plus one."""
    from speccompile.gpu_check.profile import REPEATED, _engine_steps
    from speccompile.runtime.engine import Engine

    built = build_tiny("tiny-llama", "q0f32")
    fn, reps, plain = _engine_steps(Engine(built.model_dir, built.lib, max_num_sequence=4), "Hello", 24)
    for _ in range(reps + 1):
        fn()
    assert len(plain.result.token_ids) == reps + 2 and plain.result.stats.spec is None  # never speculated
    engine = Engine(built.model_dir, built.lib, max_num_sequence=1, speculative_mode="ngram", spec_draft_length=4)
    fn, reps, spec = _engine_steps(engine, REPEATED, 24, speculative=True)
    for _ in range(reps + 1):
        fn()
    s = spec.result.stats.spec
    # every step verified a draft of at most 4 (this random tiny model answers one token over and
    # over, whose latest match is the token before it: drafts of 1 after the prompt)
    assert s.verify_steps == reps + 1 and reps + 1 <= s.draft_tokens <= 4 * (reps + 1)
    assert len(spec.result.token_ids) == 1 + (reps + 1) + s.accepted_tokens


def test_on_cuda_the_default_mode_is_measured_again_with_graphs_off(tmp_path, monkeypatch):
    """Check.speculative on a cuda device: suffix, then suffix with ``cuda_graph=off`` given to
    every process (its plain runs too), then ngram and the heads; the CPU dry run has no graphs
    to turn off and skips that mode."""
    import types

    from speccompile.bench import oneshot

    calls = []

    def fake(model_dir, lib, spec, prompts, max_tokens, overrides=None):
        calls.append((spec["speculative_mode"], overrides))
        return None  # as a failed run: nothing is recorded

    monkeypatch.setattr(oneshot, "run_one_shot", fake)
    for device, expected in (("cuda", [("suffix", None), ("suffix", "cuda_graph=off"), ("ngram", None),
                                       ("eagle", None)]),
                             ("cpu", [("suffix", None), ("ngram", None), ("eagle", None)])):
        calls.clear()
        check = object.__new__(Check)
        check.device, check.quick, check.work, check.payload, check.refused = device, True, tmp_path, tmp_path, None
        check.args = types.SimpleNamespace(prompts=1, modes=None)
        check.result = {"models": {"m": {"speculative": {}}}}
        check.left, check.save, check.log = (lambda: 1e9), (lambda: None), (lambda msg: None)
        m = {"name": "m", "lib": "m.so", "heads": {"eagle": {"dir": "h", "lib": "h.so"}}}
        check.speculative(m, tmp_path)
        assert calls == expected
