"""Libraries compiled with ``--device vulkan`` executed on a CPU Vulkan device (Mesa's lavapipe,
which `make install` sets up) through speccompile's own SPIR-V path: our TensorIR kernels as
GLSL compute shaders compiled to SPIR-V at compile time (speccompile/compiler/glsl.py,
vulkan_codegen.py) and our Vulkan runtime (runtime/vulkan, libspeccompile_vulkan.so).

What it proves: the kernels compute what the CPU build, numpy and HF transformers compute,
bit-identically across batch and verify shapes, so speculation is lossless there too; the C
API runs the same library; what cannot run is refused with a clear message.

Without a Vulkan device these tests skip, unless SPECCOMPILE_REQUIRE_VULKAN=1 (what `make test`
sets): then a missing runtime or device fails them.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import fixed_costs, vulkan_missing
from reference import forward
from speccompile.models.config import PRESETS, preset
from speccompile.runtime.engine import Engine
from speccompile.runtime.model import Model, ModelLoadError
from test_eagle_medusa import build_head, check_lossless, make_eagle_checkpoint, make_medusa_checkpoint
from test_tiny_model import IDS, check_batch_invariance, reference_weights

_MISSING = vulkan_missing()
pytestmark = pytest.mark.skipif(_MISSING is not None, reason=f"Vulkan unavailable: {_MISSING}")

ROOT = Path(__file__).resolve().parents[2]
NEW_TOKENS = 16
PROMPTS = ["Name the planets of the solar system in order.", "Write a short Python function that reverses a string."]


@pytest.fixture(scope="module", autouse=True)
def synthetic_costs():
    """Speculative engines here get a fixed cost profile instead of timing forwards of 1-32 rows
    at load on a CPU Vulkan device; these tests fix the draft length."""
    with fixed_costs():
        yield


def test_the_runtime_runs_hand_written_kernels():
    """runtime/vulkan/tests/check_vulkan_runtime.py: hand-written shaders on every path of the
    runtime (push-constant and indirect arguments, shared memory, fp16, batching, staging copies,
    frees during a batch, the module's round trip through a library) and its refusals."""
    env = dict(os.environ, XDG_RUNTIME_DIR=os.environ.get("XDG_RUNTIME_DIR", "/tmp"))
    proc = subprocess.run([sys.executable, str(ROOT / "runtime" / "vulkan" / "tests" / "check_vulkan_runtime.py")],
                          capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


@pytest.mark.parametrize("name, quant", [("tiny-qwen2", "q0f32"), ("tiny-llama", "q4f32_1"), ("tiny-qwen2", "q4f16_1")])
def test_tiny_logits_match_numpy_and_the_cpu_build(build_tiny, name, quant):
    built = build_tiny(name, quant, "vulkan")
    model = Model(built.model_dir, built.lib)
    assert model.device.dlpack_device_type() == 7 and model.meta["target"] == "vulkan"  # kDLVulkan
    kv = model.create_kv_cache(256)
    kv.add_sequence(0)
    ours = model.forward(kv, [0], [IDS])
    ref = forward(reference_weights(built), preset(name), IDS)
    err = np.abs(ours - ref).max()
    if "f16" in quant:  # fp16 arithmetic: as far from the fp32 reference as the CPU build's fp16 is, give or take
        cpu = Model(build_tiny(name, quant).model_dir, build_tiny(name, quant).lib)
        kv_cpu = cpu.create_kv_cache(256)
        kv_cpu.add_sequence(0)
        assert err < 2 * np.abs(cpu.forward(kv_cpu, [0], [IDS]) - ref).max() + 1e-3, err
    else:
        assert err < 1e-4 * max(1.0, np.abs(ref).max())
    if quant == "q0f32":  # the same fp32 arithmetic as the CPU build: the same greedy tokens
        cpu = build_tiny(name, quant)
        eng, eng_cpu = Engine(built.model_dir, built.lib), Engine(cpu.model_dir, cpu.lib)
        assert eng.generate(IDS[:9], 24, ignore_eos=True).token_ids == \
            eng_cpu.generate(IDS[:9], 24, ignore_eos=True).token_ids


@pytest.mark.parametrize("quant", ["q0f32", "q4f16_1"])
def test_tiny_batch_invariance_is_bit_exact_on_vulkan(build_tiny, quant):
    built = build_tiny("tiny-qwen2", quant, "vulkan")
    check_batch_invariance(Model(built.model_dir, built.lib))


@pytest.fixture(scope="module")
def tiny16(build_tiny, tmp_path_factory):
    """tiny-qwen2 q4f16_1 on Vulkan (fp16 arithmetic) with EAGLE and Medusa heads on Vulkan, and
    the plain greedy tokens of two prompts."""
    built = build_tiny("tiny-qwen2", "q4f16_1", "vulkan")
    root = tmp_path_factory.mktemp("vulkan-heads")
    t = PRESETS["tiny-qwen2"]
    lm_head = built.weights["lm_head.weight"]
    eng = Engine(built.model_dir, built.lib)
    prompts = [eng.encode_prompt(p) for p in PROMPTS]
    expected = [eng.generate(ids, NEW_TOKENS, ignore_eos=True).token_ids for ids in prompts]
    make_eagle_checkpoint(root / "eagle-hf", t, layers=1, repeat=0.5)
    make_medusa_checkpoint(root / "medusa-hf", t["hidden_size"], t["vocab_size"], heads=3, lm_head=lm_head, noise=0.2)
    heads = {m: build_head(m, root / f"{m}-hf", built.hf_dir, "q4f16_1", root / m, device="vulkan")
             for m in ("eagle", "medusa")}
    return built, heads, prompts, expected


@pytest.mark.parametrize("mode", ["eagle", "medusa"])
def test_fp16_heads_chains_and_trees_identical_to_plain(tiny16, mode):
    built, heads, prompts, expected = tiny16
    stats = check_lossless(built.model_dir, built.lib, heads[mode], mode, prompts, expected, ks=(3,), nodes=8,
                           batches=(1,), new_tokens=NEW_TOKENS)
    assert sum(s.draft_tokens for _, s in stats) > 0


@pytest.mark.parametrize("mode", ["suffix", "ngram"])
def test_fp16_default_and_ngram_identical_to_plain(tiny16, mode):
    built, heads, prompts, expected = tiny16
    extra = {"additional_models": [heads["eagle"]]} if mode == "suffix" else {}
    eng = Engine(built.model_dir, built.lib, speculative_mode=mode, **extra)
    eng.set_draft_length(3)
    assert [eng.generate(p, NEW_TOKENS, ignore_eos=True).token_ids for p in prompts] == expected


def test_the_c_api_runs_a_vulkan_library(build_tiny, capi_build):
    from capi_ctypes import run_example

    built = build_tiny("tiny-qwen2", "q0f32", "vulkan")
    ids = IDS[:9]
    ref = Engine(built.model_dir, built.lib).generate(ids, 16, ignore_eos=True).token_ids
    for flags in ([], ["--speculative-mode", "ngram", "--spec-draft-length", "3"]):
        proc = run_example(capi_build / "spc_generate", built.model_dir, built.lib, "--prompt-ids",
                           ",".join(map(str, ids)), "--max-tokens", "16", "--ignore-eos", "--json", *flags)
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout)["token_ids"] == ref, flags


def _in_child(code: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], env=dict(os.environ, **env), capture_output=True, text=True,
                          timeout=300)


def test_what_cannot_run_is_refused_clearly(build_tiny, tmp_path):
    """No runtime library; an fp16 library on a device without shaderFloat16; a device index
    that is not there; a tensor larger than the device can allocate."""
    import tvm

    built = build_tiny("tiny-qwen2", "q0f32", "vulkan")
    load = ("import sys; from speccompile.runtime.model import Model, ModelLoadError\n"
            "try:\n Model({d!r}, {lib!r})\nexcept ModelLoadError as e:\n print(e); sys.exit(3)")
    proc = _in_child(load.format(d=str(built.model_dir), lib=str(built.lib)),
                     SPECCOMPILE_VULKAN_RUNTIME=str(tmp_path / "nowhere.so"))
    assert proc.returncode == 3 and "libspeccompile_vulkan.so" in proc.stdout and "make install" in proc.stdout, \
        proc.stdout + proc.stderr[-2000:]
    half = build_tiny("tiny-qwen2", "q4f16_1", "vulkan")
    proc = _in_child(load.format(d=str(half.model_dir), lib=str(half.lib)), SPECCOMPILE_VULKAN_HIDE_FEATURES="float16")
    assert proc.returncode == 3 and "shaderFloat16" in proc.stdout and "q4f32_1 or q0f32" in proc.stdout, \
        proc.stdout + proc.stderr[-2000:]
    from speccompile.runtime.device_runtime import vulkan_device_info, vulkan_device_names

    n = len(vulkan_device_names())
    with pytest.raises(ModelLoadError, match=f"no vulkan:{n} device is visible"):
        Model(built.model_dir, built.lib, device=f"vulkan:{n}")
    too_big = int(vulkan_device_info(0)["maxMemoryAllocationSize"]) + 4096
    with pytest.raises(Exception, match="maxMemoryAllocationSize|too large|exceeds"):
        tvm.runtime.empty((too_big,), "uint8", tvm.device("vulkan", 0))


# ---------------------------------------------------------------------- SmolLM2
SMOL_PROMPTS = ["The planets of the solar system are", "def reverse(s):", "A compiler is a program that",
                "Three tips for learning to cook:"]  # raw (no chat template): short prefills on a CPU device


@pytest.mark.real_model
@pytest.mark.hf
def test_smollm2_greedy_identical_to_transformers_on_vulkan(smollm2, tmp_path_factory):
    """SmolLM2-135M q0f32 compiled for vulkan, 4 prompts x 32 tokens in one batch: transformers'
    fp32 greedy tokens."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from speccompile.compiler.compile import compile_model

    gguf, model_dir, _ = smollm2
    lib = tmp_path_factory.mktemp("smol-vulkan") / "smol-q0f32-vulkan.so"
    compile_model(model_dir / "speccompile-config.json", "vulkan", lib, verbose=False)
    eng = Engine(model_dir, lib, max_total_seq_length=1024)
    prompts = [eng.encode_prompt(p, raw=True) for p in SMOL_PROMPTS]
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    expected = []
    with torch.no_grad():
        for ids in prompts:
            out = hf.generate(torch.tensor([ids]), max_new_tokens=32, do_sample=False, eos_token_id=None, pad_token_id=0)
            expected.append(out[0, len(ids):].tolist())
    assert [r.token_ids for r in eng.generate_batch(prompts, 32, ignore_eos=True)] == expected
