"""Libraries compiled with ``--device opencl`` executed on a CPU OpenCL device (PoCL, which
`make install` sets up) through speccompile's own OpenCL runtime (runtime/opencl).

What it proves: the GPU code path -- our TensorIR kernels as OpenCL C, TVM's host code,
the kernel-blob loader and device API -- computes what the CPU build and HF transformers
compute, bit-identically across batch and verify shapes, so every speculative mode is
lossless on it. The tiny model carries most of the modes and shapes; SmolLM2 (real
weights) checks greedy tokens against transformers and the trained heads on the device.

Without an OpenCL device these tests skip, unless SPECCOMPILE_REQUIRE_OPENCL=1 (what
`make test` sets): then a missing runtime or device fails them.
"""
from __future__ import annotations

import os
import struct
from pathlib import Path

import numpy as np
import pytest

from reference import forward
from speccompile.models.config import PRESETS, preset
from conftest import HEADS, fixed_costs, opencl_missing
from speccompile.runtime.device_runtime import opencl_device_names
from speccompile.runtime.engine import Engine
from speccompile.runtime.model import Model, ModelLoadError
from test_eagle_medusa import build_head, check_lossless, make_eagle_checkpoint, make_medusa_checkpoint
from test_tiny_model import IDS, check_batch_invariance, check_padded_pages, reference_weights


_MISSING = opencl_missing()
_DEVICES = [] if _MISSING else opencl_device_names()
pytestmark = pytest.mark.skipif(_MISSING is not None, reason=f"OpenCL unavailable: {_MISSING}")

NEW_TOKENS = 24


@pytest.fixture(scope="module", autouse=True)
def synthetic_costs():
    """Speculative engines here get a fixed cost profile instead of timing forwards of 1-32
    rows at load: on a CPU OpenCL device that costs minutes per engine, and these tests fix
    the draft length (the cost model and its measurement are tested on the CPU build)."""
    with fixed_costs():
        yield


PROMPTS = [  # not from bench/: the GPU checks keep bench/'s prompts for measurement
    "Name the planets of the solar system in order.",
    "Write a short Python function that reverses a string.",
    "What does a compiler do? Answer in two sentences.",
    "Give me three tips for learning to cook.",
]


def test_a_cpu_opencl_device_is_visible():
    import tvm

    assert _DEVICES and tvm.device("opencl", 0).exist
    assert tvm.device("opencl", len(_DEVICES)).exist is False  # one past the last is absent, not an error
    dev = tvm.device("opencl", 0)
    assert dev.device_name == _DEVICES[0] and dev.max_threads_per_block >= 128


def _kernel_blob(lib: Path) -> tuple[dict, str]:
    """The opencl module `compile` embedded (kind "opencl", a uint64 size, then TVM's format:
    format string, function table, source), read independently of our C++ reader."""
    data = lib.read_bytes()
    at = data.find(b"\x06\x00\x00\x00\x00\x00\x00\x00opencl")
    assert at >= 0, "no opencl module in the library"
    size, = struct.unpack_from("<Q", data, at + 14)
    blob, pos = data[at + 22: at + 22 + size], 0

    def u64():
        nonlocal pos
        pos += 8
        return struct.unpack_from("<Q", blob, pos - 8)[0]

    def string():
        nonlocal pos
        n = u64()
        pos += n
        return blob[pos - n: pos].decode()

    assert string() == "cl"
    table = {}
    for _ in range(u64()):
        key, name = string(), string()
        n = u64()
        types = [struct.unpack_from("<BBH", blob, pos + 4 * i) for i in range(n)]
        pos += 4 * n
        tags = [string() for _ in range(u64())]
        extra = u64()  # (not `pos += 4 * u64()`: u64 moves pos itself)
        pos += 4 * extra
        table[key] = (name, types, tags)
    source = string()
    assert pos == len(blob), "unread bytes: TVM's format changed"
    return table, source


def test_kernel_blob_format_is_what_the_loader_reads(build_tiny):
    """The format this TVM writes, pinned: a change fails here, not at a user's first kernel."""
    import tvm

    lib = build_tiny("tiny-qwen2", "q4f16_1", "opencl").lib  # shared with test_targets; never run here
    table, source = _kernel_blob(lib)
    assert table["q4_matmul_kernel"][2] == ["blockIdx.y", "blockIdx.x", "threadIdx.y", "threadIdx.x"]
    assert all(t in ((3, 64, 1), (0, 64, 1), (0, 32, 1), (2, 32, 1)) for _, types, _ in table.values() for t in types)
    pending, cl = [tvm.runtime.load_module(str(lib))], []
    while pending:  # the VM executable imports the host library, which imports the kernels
        mod = pending.pop()
        cl += [m for m in mod.imports if m.kind == "opencl"]
        pending += list(mod.imports)
    assert len(cl) == 1 and cl[0].inspect_source() == source
    assert all(cl[0].implements_function(name) for name in table) and not cl[0].implements_function("nope")


def test_the_mlps_fused_projection_and_activation_change_no_bit(build_tiny, tmp_path, monkeypatch):
    """The portable build runs each MLP's gate/up projection and activation as one kernel
    (passes/fuse_gated_projection.py); a build without that pass gives the same logits bit for
    bit, for a prompt's rows and for a decode row after it."""
    import tvm

    from speccompile.compiler.compile import compile_model
    from speccompile.passes import pipeline

    built = build_tiny("tiny-llama", "q4f32_1", "opencl")
    table, _ = _kernel_blob(built.lib)
    assert "q4_matmul_silu_kernel" in table and not any("swiglu" in name for name in table), sorted(table)
    monkeypatch.setattr(pipeline, "FuseGatedProjection",
                        lambda *_: tvm.transform.module_pass(lambda mod, _ctx: mod, opt_level=0, name="unfused"))
    unfused = tmp_path / "unfused.so"
    compile_model(built.model_dir / "speccompile-config.json", "opencl", unfused, verbose=False)
    table, _ = _kernel_blob(unfused)
    assert "q4_matmul_silu_kernel" not in table and any("swiglu" in name for name in table)
    logits = []
    for lib in (built.lib, unfused):
        model = Model(built.model_dir, lib)
        kv = model.create_kv_cache(256)
        kv.add_sequence(0)
        prompt = model.forward(kv, [0], [IDS])
        logits.append((prompt, model.forward(kv, [0], [[int(prompt[-1].argmax())]])))
    assert np.array_equal(logits[0][0], logits[1][0]) and np.array_equal(logits[0][1], logits[1][1])


@pytest.mark.parametrize("name, quant", [("tiny-qwen2", "q0f32"), ("tiny-llama", "q4f32_1")])
def test_tiny_logits_match_numpy_and_the_cpu_build(build_tiny, name, quant):
    built = build_tiny(name, quant, "opencl")
    model = Model(built.model_dir, built.lib)
    assert model.device.dlpack_device_type() == 4 and model.meta["target"] == "opencl"  # kDLOpenCL
    kv = model.create_kv_cache(256)
    kv.add_sequence(0)
    ours = model.forward(kv, [0], [IDS])
    ref = forward(reference_weights(built), preset(name), IDS)
    assert np.abs(ours - ref).max() < 1e-4 * max(1.0, np.abs(ref).max())
    if quant == "q0f32":  # the same fp32 arithmetic as the CPU build (whose q4 kernels quantize activations);
        # tiny-qwen2's untied lm_head varies its greedy tokens (tiny-llama's tied one repeats the prompt's last)
        ids = IDS[:9]
        cpu = build_tiny(name, quant)
        eng, eng_cpu = Engine(built.model_dir, built.lib), Engine(cpu.model_dir, cpu.lib)
        assert eng.generate(ids, 32, ignore_eos=True).token_ids == eng_cpu.generate(ids, 32, ignore_eos=True).token_ids


@pytest.mark.parametrize("quant", ["q0f32", "q4f32_1"])
def test_tiny_batch_invariance_is_bit_exact_on_opencl(build_tiny, quant):
    built = build_tiny("tiny-llama", quant, "opencl")
    check_batch_invariance(Model(built.model_dir, built.lib))


def test_long_contexts_are_bit_exact_on_opencl(build_tiny):
    """A 300-token prompt: its decode and verify rows see 301-308 rows, two chunks of the GPU
    attention merged after (kernels/attention_gpu.py), beside a short sequence of one chunk in the
    same launch; prefill, decode, verify, batch and tree still give a token the same bits."""
    built = build_tiny("tiny-llama", "q4f32_1", "opencl")
    check_batch_invariance(Model(built.model_dir, built.lib), prompt=(IDS * 15)[:300])


def test_padded_page_tables_give_the_same_bits_on_opencl(build_tiny):
    built = build_tiny("tiny-llama", "q4f32_1", "opencl")  # built for the logits test too
    check_padded_pages(Model(built.model_dir, built.lib))


@pytest.fixture(scope="module")
def tiny(build_tiny, tmp_path_factory):
    """The tiny target on OpenCL with EAGLE / Medusa heads and a draft model, all on OpenCL."""
    built = build_tiny("tiny-llama", "q0f32", "opencl")
    root = tmp_path_factory.mktemp("opencl-heads")
    t = PRESETS["tiny-llama"]
    make_eagle_checkpoint(root / "eagle-hf", t, layers=2, repeat=0.5)
    make_medusa_checkpoint(root / "medusa-hf", t["hidden_size"], t["vocab_size"], heads=3,
                           lm_head=built.weights["model.embed_tokens.weight"], noise=0.2)
    eagle = build_head("eagle", root / "eagle-hf", built.hf_dir, "q0f32", root / "eagle", device="opencl")
    medusa = build_head("medusa", root / "medusa-hf", built.hf_dir, "q0f32", root / "medusa", device="opencl")
    draft = build_tiny("tiny-llama", "q4f32_1", "opencl")  # the same weights in q4: a draft that is often right
    eng = Engine(built.model_dir, built.lib)
    prompts = [eng.encode_prompt(p) for p in PROMPTS]
    expected = [eng.generate(ids, NEW_TOKENS, ignore_eos=True).token_ids for ids in prompts]
    return built, {"eagle": eagle, "medusa": medusa, "small_draft": (str(draft.model_dir), str(draft.lib))}, \
        prompts, expected


@pytest.mark.parametrize("mode", ["eagle", "medusa"])
def test_tiny_heads_chains_and_trees_identical_to_plain(tiny, mode):
    built, heads, prompts, expected = tiny
    stats = check_lossless(built.model_dir, built.lib, heads[mode], mode, prompts, expected, ks=(1, 3))
    for width in (1, 3):
        seen = [s for w, s in stats if w == width]
        drafted, accepted = sum(s.draft_tokens for s in seen), sum(s.accepted_tokens for s in seen)
        assert 0 < accepted < drafted, f"{mode} width {width}: {accepted} of {drafted}"


@pytest.mark.parametrize("mode", ["ngram", "small_draft"])
def test_tiny_ngram_and_draft_model_identical_to_plain(tiny, mode):
    built, heads, prompts, expected = tiny
    extra = {} if mode == "ngram" else {"additional_models": [heads["small_draft"]]}
    eng = Engine(built.model_dir, built.lib, speculative_mode=mode, **extra)
    drafted = 0
    for k in (2, 5):
        eng.set_draft_length(k)
        for i, ids in enumerate(prompts):
            res = eng.generate(ids, NEW_TOKENS, ignore_eos=True)
            assert res.token_ids == expected[i], f"{mode} k={k} prompt {i}"
            drafted += res.stats.spec.draft_tokens
        results = eng.generate_batch(prompts, NEW_TOKENS, ignore_eos=True)
        assert [r.token_ids for r in results] == expected, f"{mode} k={k} batch of 4"
    assert drafted > 0


@pytest.mark.parametrize("mode", ["ngram", "small_draft", "eagle"])
def test_tiny_sampling_with_speculation_is_reproducible_on_opencl(tiny, mode):
    """Temperature 0.8, top-p 0.95 on the OpenCL library: every step runs the GPU sampling and
    rejection-sampling kernels (a block per sequence). A seeded request gives the same tokens
    twice, alone and in a batch of two with another seed; drafts were verified."""
    from speccompile.runtime.sampling import SamplingParams

    built, heads, prompts, _ = tiny
    extra = {"additional_models": [heads[mode]]} if mode in heads else {}
    eng = Engine(built.model_dir, built.lib, speculative_mode=mode, **extra)
    eng.set_draft_length(3)
    sp, other = SamplingParams(temperature=0.8, top_p=0.95, seed=11), SamplingParams(temperature=0.8, seed=5)
    a = eng.generate(prompts[0], NEW_TOKENS, sp, ignore_eos=True)
    b = eng.generate(prompts[0], NEW_TOKENS, sp, ignore_eos=True)
    pair = eng.generate_batch([prompts[0], prompts[1]], NEW_TOKENS, [sp, other], ignore_eos=True)
    assert a.token_ids == b.token_ids == pair[0].token_ids and len(a.token_ids) == NEW_TOKENS
    assert max(a.token_ids + pair[1].token_ids) < PRESETS["tiny-llama"]["vocab_size"]
    assert a.stats.spec.draft_tokens > 0, mode


def test_a_missing_opencl_runtime_is_a_clear_error(build_tiny, tmp_path, monkeypatch):
    """In a fresh process (this one has the runtime loaded already): the error names the file."""
    import subprocess
    import sys

    built = build_tiny("tiny-llama", "q0f32", "opencl")
    env = dict(os.environ, SPECCOMPILE_OPENCL_RUNTIME=str(tmp_path / "nowhere.so"))
    code = ("import sys; from speccompile.runtime.model import Model, ModelLoadError\n"
            f"try:\n Model({str(built.model_dir)!r}, {str(built.lib)!r})\n"
            "except ModelLoadError as e:\n print(e); sys.exit(3)")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert "built for opencl" in proc.stdout and "libspeccompile_opencl.so" in proc.stdout
    assert "make install" in proc.stdout


def test_fp16_on_a_device_without_it_is_refused_before_loading(build_tiny):
    from speccompile.runtime.device_runtime import opencl_has_fp16

    if opencl_has_fp16(0):
        pytest.skip("this OpenCL device computes in fp16")
    built = build_tiny("tiny-qwen2", "q4f16_1", "opencl")
    with pytest.raises(ModelLoadError, match=r"no cl_khr_fp16\): compile the model with q4f32_1 or q0f32"):
        Model(built.model_dir, built.lib)


def test_a_missing_opencl_device_index_is_a_clear_error(build_tiny):
    built = build_tiny("tiny-llama", "q0f32", "opencl")
    with pytest.raises(ModelLoadError, match=f"no opencl:{len(_DEVICES)} device is visible"):
        Model(built.model_dir, built.lib, device=f"opencl:{len(_DEVICES)}")


# ---------------------------------------------------------------------- SmolLM2
# Raw prompts (no chat template) keep prefill short: on a CPU OpenCL device these kernels cost a
# forward per row (the GPU kernels read the weights once per row), so SmolLM2 runs few rows here.
SMOL_PROMPTS = ["The planets of the solar system are", "def reverse(s):", "A compiler is a program that",
                "Three tips for learning to cook:"]
SMOL_TOKENS, SMOL_SPEC_TOKENS = 32, 16


@pytest.fixture(scope="module")
def smol_opencl(smollm2, tmp_path_factory):
    """SmolLM2-135M q0f32 compiled for opencl, its greedy reference from transformers."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from speccompile.compiler.compile import compile_model

    gguf, model_dir, _ = smollm2
    lib = tmp_path_factory.mktemp("smol-opencl") / "smol-q0f32-opencl.so"
    compile_model(model_dir / "speccompile-config.json", "opencl", lib, verbose=False)
    eng = Engine(model_dir, lib)
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    prompts = [eng.encode_prompt(p, raw=True) for p in SMOL_PROMPTS]
    expected = []
    with torch.no_grad():
        for ids in prompts:
            out = hf.generate(torch.tensor([ids]), max_new_tokens=SMOL_TOKENS, do_sample=False, eos_token_id=None,
                              pad_token_id=0)
            expected.append(out[0, len(ids):].tolist())
    return gguf, model_dir, lib, eng, prompts, expected


@pytest.mark.real_model
@pytest.mark.hf
def test_smollm2_greedy_identical_to_transformers_on_opencl(smol_opencl):
    _, _, _, eng, prompts, expected = smol_opencl
    results = eng.generate_batch(prompts, SMOL_TOKENS, ignore_eos=True)  # batch 4
    assert [r.token_ids for r in results] == expected


@pytest.mark.real_model
@pytest.mark.hf
def test_smollm2_trained_heads_and_ngram_identical_to_plain_on_opencl(smol_opencl, tmp_path_factory):
    """The committed SmolLM2 EAGLE and Medusa heads compiled for opencl, chains and trees, and
    prompt lookup: the target's own greedy tokens (transformers' too), with drafts accepted."""
    gguf, model_dir, lib, _, prompts, expected = smol_opencl
    root = tmp_path_factory.mktemp("smol-opencl-heads")
    prompts, expected = prompts[1:2], [expected[1][:SMOL_SPEC_TOKENS]]  # code: the heads draft well there
    for mode, width in (("eagle", 1), ("medusa", 2)):  # a chain and a tree (the tiny heads above do both each)
        head = build_head(mode, HEADS / f"SmolLM2-135M-Instruct-{mode}", gguf, "q4f32_1", root / mode, device="opencl")
        stats = check_lossless(model_dir, lib, head, mode, prompts, expected, widths=(width,), ks=(2,), nodes=4,
                               batches=(1,), new_tokens=SMOL_SPEC_TOKENS)
        assert sum(s.accepted_tokens for _, s in stats) > 0, mode
    eng = Engine(model_dir, lib, speculative_mode="ngram")
    eng.set_draft_length(3)
    assert eng.generate(prompts[0], SMOL_SPEC_TOKENS, ignore_eos=True).token_ids == expected[0]
