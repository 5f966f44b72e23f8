"""The C API (runtime/capi): built with CMake against the wheel's TVM runtime, its example
program must generate exactly the Python Engine's greedy tokens on SmolLM2, plain and
with n-gram speculation, and refuse bad input with a clear message. An opencl library
runs through the OpenCL runtime the C API loads itself (src/device_runtime.cc), with the
Python Engine's tokens, on whatever OpenCL device is present (PoCL's CPU device here)."""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from capi_ctypes import run_example
from conftest import opencl_missing

from speccompile.runtime.engine import Engine
from speccompile.runtime.sampling import SamplingParams

pytestmark = pytest.mark.real_model

CAPI = Path(__file__).resolve().parents[2] / "runtime" / "capi"
MAX_TOKENS = 48
PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    # text that repeats, so prompt lookup finds long matches
    "Repeat this sentence three times: the quick brown fox jumps over the lazy dog.",
]


@pytest.fixture(scope="module")
def capi_bin(capi_build) -> Path:
    exe = capi_build / "spc_generate"
    assert exe.exists()
    return exe


@pytest.fixture(scope="module")
def engine(smollm2_q4) -> Engine:
    model_dir, lib = smollm2_q4
    return Engine(model_dir, lib)


def run_c(exe: Path, model_dir, lib, ids: list[int], max_tokens: int, *flags: str,
          env_extra: dict | None = None) -> subprocess.CompletedProcess:
    """spc_generate with token ids in (--prompt-ids), plainly unless --ngram is among flags."""
    mode = "ngram" if "--ngram" in flags else "disable"
    return run_example(exe, model_dir, lib, "--prompt-ids", ",".join(map(str, ids)), "--max-tokens", str(max_tokens),
                       "--speculative-mode", mode, "--json", *[f for f in flags if f != "--ngram"], env_extra=env_extra)


def run_text(exe: Path, model_dir, lib, prompt: str, max_tokens: int, *flags: str) -> subprocess.CompletedProcess:
    """spc_generate as `speccompile generate`: text in, --json out."""
    return run_example(exe, model_dir, lib, "--prompt", prompt, "--max-tokens", str(max_tokens), "--json", *flags)


def generate_c(exe: Path, model_dir, lib, ids: list[int], max_tokens: int, *flags: str) -> dict:
    proc = run_c(exe, model_dir, lib, ids, max_tokens, *flags)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_library_links_only_the_tvm_runtime(capi_bin):
    lib = capi_bin.parent / "libspeccompile_capi.so"
    needed = subprocess.run(["readelf", "-d", str(lib)], capture_output=True, text=True).stdout \
        if shutil.which("readelf") else ""
    if not needed:
        pytest.skip("readelf is not installed")
    assert "libtvm_runtime.so" in needed and "libtvm_ffi.so" in needed
    assert "libtvm_compiler" not in needed and "[libtvm.so]" not in needed


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_tokens_identical_to_python(capi_bin, engine, smollm2_q4, prompt):
    model_dir, lib = smollm2_q4
    ids = engine.encode_prompt(prompt)
    ref = engine.generate(ids, max_tokens=MAX_TOKENS, sampling=SamplingParams(temperature=0.0))
    assert ref.token_ids
    plain = generate_c(capi_bin, model_dir, lib, ids, MAX_TOKENS)
    assert plain["token_ids"] == ref.token_ids
    assert plain["text"] == ref.text
    assert plain["finish_reason"] == ref.finish_reason
    assert plain["stats"]["prefill_tokens"] == len(ids)
    assert plain["stats"]["decode_tokens"] == len(ref.token_ids) - 1  # the first token comes from prefill
    assert plain["stats"]["draft_tokens"] == 0 and plain["stats"]["verify_steps"] == 0

    spec = generate_c(capi_bin, model_dir, lib, ids, MAX_TOKENS, "--ngram")
    assert spec["token_ids"] == ref.token_ids
    assert spec["text"] == ref.text
    s = spec["stats"]
    assert 0 <= s["accepted_tokens"] <= s["draft_tokens"]
    # every token after the first is emitted by a plain step or a verify step
    assert s["plain_steps"] + s["verify_steps"] <= len(ref.token_ids)


def test_ngram_drafts_on_repeating_text(capi_bin, engine, smollm2_q4):
    model_dir, lib = smollm2_q4
    ref = engine.generate(engine.encode_prompt(PROMPTS[2]), max_tokens=MAX_TOKENS)
    proc = run_text(capi_bin, model_dir, lib, PROMPTS[2], MAX_TOKENS, "--speculative-mode", "ngram",
                    "--spec-draft-length", "6", "--stream")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["token_ids"] == ref.token_ids
    assert proc.stderr == ref.text  # the callback streamed exactly the final text
    s = out["stats"]
    assert s["draft_tokens"] > 0 and s["verify_steps"] > 0
    assert s["accepted_tokens"] > 0  # the repeated sentence is found in the prompt
    assert s["mean_accepted_length"] > 1.0
    # accepted drafts save target forwards: fewer steps than tokens
    assert s["plain_steps"] + s["verify_steps"] < len(ref.token_ids)


def test_sampling_is_seeded(capi_bin, engine, smollm2_q4):
    model_dir, lib = smollm2_q4
    ids = engine.encode_prompt(PROMPTS[1])
    a = generate_c(capi_bin, model_dir, lib, ids, 16, "--temperature", "0.8", "--seed", "7", "--ngram")
    b = generate_c(capi_bin, model_dir, lib, ids, 16, "--temperature", "0.8", "--seed", "7", "--ngram")
    assert a["token_ids"] == b["token_ids"]
    assert a["token_ids"] and all(0 <= t < engine.model.vocab_size for t in a["token_ids"])


def test_out_of_range_token_is_refused(capi_bin, engine, smollm2_q4):
    model_dir, lib = smollm2_q4
    proc = run_c(capi_bin, model_dir, lib, [1, engine.model.vocab_size + 5], 4)
    assert proc.returncode != 0
    assert "out of range for vocab size" in proc.stderr


def test_library_for_other_weights_is_refused(capi_bin, smollm2_q4, tmp_path):
    model_dir, lib = smollm2_q4
    other = tmp_path / "other"
    other.mkdir()
    for f in Path(model_dir).iterdir():
        if f.name != "tensor-cache.json":
            (other / f.name).symlink_to(f)
    index = json.loads((Path(model_dir) / "tensor-cache.json").read_text())
    index["metadata"]["layout_fingerprint"] = "0" * 16
    rec = index["records"][0]["records"][0]
    rec["shape"] = [rec["shape"][0] // 2, rec["shape"][1]]
    (other / "tensor-cache.json").write_text(json.dumps(index))
    proc = run_c(capi_bin, other, lib, [1, 2, 3], 4)
    assert proc.returncode != 0
    assert "was compiled for other weights" in proc.stderr and rec["name"] in proc.stderr


def test_missing_library_is_reported(capi_bin, smollm2_q4, tmp_path):
    model_dir, _ = smollm2_q4
    proc = run_c(capi_bin, model_dir, tmp_path / "nope.so", [1, 2, 3], 4)
    assert proc.returncode != 0
    assert "not found" in proc.stderr


def test_library_needing_a_missing_cpu_feature_is_refused(capi_bin, smollm2_q4, monkeypatch):
    """runtime/capi/src/cpu_features.cc: the same check, the same words as the Python runtime,
    on a (faked) host lacking one feature the library's -mcpu implies."""
    from speccompile.runtime.cpu import HOST_FEATURES_ENV
    from speccompile.runtime.model import Model, ModelLoadError, baked_metadata

    model_dir, lib = smollm2_q4
    needed = baked_metadata(lib)["cpu_features"]
    dropped = "avx2" if "avx2" in needed else needed[-1]
    monkeypatch.setenv(HOST_FEATURES_ENV, ",".join(f for f in needed if f != dropped))
    with pytest.raises(ModelLoadError) as err:
        Model(model_dir, lib)
    proc = run_c(capi_bin, model_dir, lib, [1, 2, 3], 4)
    assert proc.returncode != 0
    assert f"uses CPU features this machine lacks: {dropped};" in proc.stderr
    assert "rebuild with: speccompile compile" in proc.stderr
    assert str(err.value) in proc.stderr  # word for word the Python runtime's message
    monkeypatch.setenv(HOST_FEATURES_ENV, ",".join(needed))
    assert generate_c(capi_bin, model_dir, lib, [1, 2, 3], 4)["token_ids"]


# ------------------------------------------------------------------ OpenCL libraries
OPENCL_PROMPTS = ["What is the capital of France?", "Repeat: abc abc abc abc abc"]


@pytest.fixture(scope="module")
def opencl_device() -> list[str]:
    """The OpenCL devices our runtime sees; skips (with why) where there are none."""
    from speccompile.runtime.device_runtime import opencl_device_names

    why = opencl_missing()  # raises under `make test`: the device is part of the setup
    if why:
        pytest.skip(why)
    return opencl_device_names()


@pytest.fixture(scope="module")
def tiny_opencl(build_tiny, tmp_path_factory):
    """(Built, opencl library) of tiny-qwen2: its untied lm_head makes greedy tokens vary
    from step to step, where tiny-llama's tied embeddings just repeat the last prompt token
    (a comparison of those would prove little). Compiling needs no OpenCL device."""
    built = build_tiny("tiny-qwen2", "q0f32")
    return built, build_tiny("tiny-qwen2", "q0f32", "opencl").lib


@pytest.fixture(scope="module")
def tiny_heads_opencl(tiny_opencl, tmp_path_factory):
    """{mode: (dir, opencl lib)} of an EAGLE head (a "repeat" head over half the vocabulary plus
    every token the target emits on OPENCL_PROMPTS, so its fused draft_step serves) and Medusa
    heads (near-identity blocks and the target's lm_head) for tiny-qwen2."""
    import numpy as np
    from test_eagle_medusa import build_head, make_eagle_checkpoint, make_medusa_checkpoint

    from speccompile.models.config import PRESETS

    built, lib = tiny_opencl
    root = tmp_path_factory.mktemp("openclheads")
    t = PRESETS["tiny-qwen2"]
    lm_head = built.weights["lm_head.weight"]
    eng = Engine(built.model_dir, built.lib)
    used = {tok for p in OPENCL_PROMPTS for tok in eng.generate(eng.encode_prompt(p), 24).token_ids}
    ids = np.array(sorted(used | set(range(0, t["vocab_size"], 2))))
    make_eagle_checkpoint(root / "eagle-hf", t, layers=1, repeat=0.5, draft_vocab=(ids, lm_head[ids]))
    make_medusa_checkpoint(root / "medusa-hf", t["hidden_size"], t["vocab_size"], heads=3, lm_head=lm_head, noise=0.2)
    return {mode: build_head(mode, root / f"{mode}-hf", built.hf_dir, "q0f32", root / mode, device="opencl")
            for mode in ("eagle", "medusa")}


def test_opencl_library_gives_the_python_tokens(capi_bin, tiny_opencl, tiny_heads_opencl, opencl_device):
    """The C API loads the OpenCL runtime, puts the weights and KV cache on the device and
    generates the Python Engine's greedy tokens on the same library, which are also the
    llvm build's. (The Engine runs first: PoCL compiles the kernels once, ~15 s, and caches
    them for the C processes.)"""
    built, lib = tiny_opencl
    eng = Engine(built.model_dir, lib)
    assert eng.model.device.dlpack_device_type() == 4  # kDLOpenCL: really on the OpenCL device
    cpu = Engine(built.model_dir, built.lib)
    for prompt in OPENCL_PROMPTS:
        ids = eng.encode_prompt(prompt)
        ref = eng.generate(ids, max_tokens=24, sampling=SamplingParams(temperature=0.0))
        assert len(set(ref.token_ids)) > 3  # varied tokens, so equality below means something
        assert cpu.generate(ids, max_tokens=24, sampling=SamplingParams(temperature=0.0)).token_ids == ref.token_ids
        out = generate_c(capi_bin, built.model_dir, lib, ids, 24)  # device "auto": the library's kind
        assert out["token_ids"] == ref.token_ids
        assert out["finish_reason"] == ref.finish_reason
        assert generate_c(capi_bin, built.model_dir, lib, ids, 24, "--ngram", "--device", "opencl:0")["token_ids"] \
            == ref.token_ids
        for mode in (["suffix"], ["small_draft", "--additional-models", f"{built.model_dir},{lib}"]):
            # every mode of the C runtime on the device (the model drafting for itself: all accepted)
            out = generate_c(capi_bin, built.model_dir, lib, ids, 24, "--speculative-mode", *mode,
                             "--spec-draft-length", "4")
            assert out["token_ids"] == ref.token_ids, mode
            assert mode[0] != "small_draft" or out["stats"]["accepted_tokens"] == out["stats"]["draft_tokens"] > 0
        for mode, width in (("eagle", 2), ("medusa", 1), ("suffix", 2)):
            # the heads on the device, a tree and a chain, and the default merging the index with one:
            # Python's drafts, node for node (the counts), and its tokens
            head = tiny_heads_opencl["medusa" if mode == "medusa" else "eagle"]
            flags = ["--speculative-mode", mode, "--additional-models", ",".join(head), "--spec-draft-length", "3",
                     "--spec-tree-width", str(width)]
            out = generate_c(capi_bin, built.model_dir, lib, ids, 24, *flags)
            py = Engine(built.model_dir, lib, speculative_mode=mode, additional_models=[head], spec_draft_length=3,
                        spec_tree_width=width).generate(ids, 24).to_dict()
            assert out["token_ids"] == py["token_ids"] == ref.token_ids, mode
            counts = ("draft_tokens", "accepted_tokens", "verify_steps")
            assert [out["stats"][n] for n in counts] == [py["stats"][n] for n in counts], mode
            assert out["stats"]["draft_tokens"] > 0
        assert generate_c(capi_bin, built.model_dir, built.lib, ids, 24)["token_ids"] == ref.token_ids
    missing = len(opencl_device)
    proc = run_c(capi_bin, built.model_dir, lib, [1, 2, 3], 4, "--device", f"opencl:{missing}")
    assert proc.returncode != 0
    assert f"no opencl:{missing} device is visible on this machine" in proc.stderr


def test_wrong_opencl_runtime_path_is_reported(capi_bin, tiny_opencl, tmp_path):
    """An explicit SPECCOMPILE_OPENCL_RUNTIME is taken at its word: a missing file is an error
    naming it and how to get the runtime, before the library is loaded (no device needed)."""
    built, lib = tiny_opencl
    wrong = tmp_path / "nowhere" / "libspeccompile_opencl.so"
    proc = run_c(capi_bin, built.model_dir, lib, [1, 2, 3], 4, env_extra={"SPECCOMPILE_OPENCL_RUNTIME": str(wrong)})
    assert proc.returncode != 0
    assert f"{lib} was built for opencl (opencl): an opencl library needs speccompile's OpenCL runtime" in proc.stderr
    assert f"SPECCOMPILE_OPENCL_RUNTIME names {wrong}, which does not exist" in proc.stderr
    assert "`make opencl`" in proc.stderr


def test_opencl_library_on_the_cpu_is_refused(capi_bin, tiny_opencl):
    built, lib = tiny_opencl
    proc = run_c(capi_bin, built.model_dir, lib, [1, 2, 3], 4, "--device", "cpu")
    assert proc.returncode != 0
    assert f"{lib} was built for opencl (opencl), not for this CPU; compile with --device llvm" in proc.stderr
