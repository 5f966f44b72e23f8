"""The C runtime's proposers (runtime/capi/src/drafters/proposers.cc) twinned with
runtime/drafters/proposers.py:
at a fixed draft length, the same requests draft the same tokens and have the same accepted
ones, so every per-request count of the two (drafted, accepted, verify and plain steps) and the
output are equal. small_draft is checked with SmolLM2 drafting for itself (every draft accepted:
the catch-up after a full chain) and with a random-weight draft (most drafts rejected: the
rollback of its cache), through a conversation's turns (its state resumed by the prefix cache),
and at T > 0 the drafts are verified against their own distribution."""
from __future__ import annotations

import json
import subprocess

import pytest
from capi_ctypes import SPC_ERR_INCOMPATIBLE, SPC_ERR_INVALID_ARGUMENT, Capi, CapiError, run_example

from speccompile.runtime.engine import Engine
from speccompile.runtime.sampling import SamplingParams

pytestmark = pytest.mark.real_model

K = 4
MAX_TOKENS = 32
PROMPTS = ["Describe a lighthouse at night in three sentences.", "Count down from ten to one, in words."]
# the counts, and the metrics defined from them (runtime/metrics.py; src/metrics.h)
COUNTS = ("draft_tokens", "accepted_tokens", "verify_steps", "plain_steps", "accept_rate", "mean_accepted_length")


def spc_generate(capi_build, model_dir, lib, prompt: str, *flags: str) -> subprocess.CompletedProcess:
    return run_example(capi_build / "spc_generate", model_dir, lib, "--prompt", prompt, "--max-tokens", str(MAX_TOKENS),
                       "--json", *flags)


@pytest.mark.parametrize("draft", ["self", "random"])
def test_small_draft_drafts_what_python_drafts(capi_build, smollm2_q4, random_draft, draft):
    model_dir, lib = smollm2_q4
    d_dir, d_lib = (str(model_dir), str(lib)) if draft == "self" else random_draft
    py = Engine(model_dir, lib, speculative_mode="small_draft", additional_models=[(d_dir, d_lib)],
                spec_draft_length=K)
    for prompt in PROMPTS:
        ref = py.generate(py.encode_prompt(prompt), MAX_TOKENS, SamplingParams(temperature=0.0)).to_dict()
        proc = spc_generate(capi_build, model_dir, lib, prompt, "--speculative-mode", "small_draft",
                            "--additional-models", f"{d_dir},{d_lib}", "--spec-draft-length", str(K))
        assert proc.returncode == 0, proc.stderr
        c = json.loads(proc.stdout)
        assert c["token_ids"] == ref["token_ids"] and c["text"] == ref["text"]
        assert {k: c["stats"][k] for k in COUNTS} == {k: ref["stats"][k] for k in COUNTS}
        s = c["stats"]
        assert s["verify_steps"] > 0
        if draft == "self":  # the target drafting for itself: every draft is accepted
            assert s["accepted_tokens"] == s["draft_tokens"] > 0
        else:
            assert s["accepted_tokens"] < s["draft_tokens"]


def test_small_draft_resumes_across_a_conversation(capi_build, smollm2_q4, random_draft):
    """The prefix cache hands the draft's cache back too (cut to the shared tokens): each turn's
    answer and counts are a cold Python engine's."""
    model_dir, lib = smollm2_q4
    d_dir, d_lib = random_draft
    capi = Capi(capi_build)
    model, draft = capi.model(model_dir, lib), capi.model(d_dir, d_lib)
    session = capi.session(model, speculative_mode=2, draft_length=K, draft_model=draft)
    messages = []
    try:
        for turn, text in enumerate(["Name a color.", "Name another one.", "Which is warmer?"]):
            messages.append({"role": "user", "content": text})
            answer, stats = capi.chat(session, messages, 16)
            py = Engine(model_dir, lib, speculative_mode="small_draft", additional_models=[(d_dir, d_lib)],
                        spec_draft_length=K)
            ref = py.generate(py.tokenizer.encode(py.render(messages), add_special_tokens=False).ids, 16)
            assert answer == ref.text
            assert (stats.draft_tokens, stats.accepted_tokens) == (ref.stats.spec.draft_tokens,
                                                                   ref.stats.spec.accepted_tokens)
            assert (stats.cached_prompt_tokens > 0) == (turn > 0)
            messages.append({"role": "assistant", "content": answer})
    finally:
        capi.lib.spc_session_free(session)
        capi.lib.spc_model_free(draft)
        capi.lib.spc_model_free(model)


def test_sampled_small_draft_is_seeded_and_verified(capi_build, smollm2_q4):
    """At T > 0 the draft samples and the target accepts by rejection sampling against the
    draft's distribution; with itself as the draft (q = p) every draft is accepted."""
    model_dir, lib = smollm2_q4
    flags = ["--speculative-mode", "small_draft", "--additional-models", f"{model_dir},{lib}",
             "--spec-draft-length", str(K), "--temperature", "0.9", "--seed", "11"]
    a, b = (json.loads(spc_generate(capi_build, model_dir, lib, PROMPTS[0], *flags).stdout) for _ in range(2))
    assert a["token_ids"] == b["token_ids"]
    assert a["stats"]["accepted_tokens"] == a["stats"]["draft_tokens"] > 0


def test_a_draft_of_another_vocabulary_is_refused(capi_build, smollm2_q4, tiny_draft_other_vocab):
    model_dir, lib = smollm2_q4
    capi = Capi(capi_build)
    model, other = capi.model(model_dir, lib), capi.model(*tiny_draft_other_vocab)
    try:
        with pytest.raises(CapiError) as err:
            capi.session(model, speculative_mode=2, draft_model=other)
        assert err.value.code == SPC_ERR_INCOMPATIBLE and "vocab" in err.value.message
        with pytest.raises(CapiError) as err:
            capi.session(model, speculative_mode=2)
        assert err.value.code == SPC_ERR_INVALID_ARGUMENT and "draft" in err.value.message
        capi.lib.spc_model_free(other)
        with pytest.raises(CapiError) as err:
            capi.session(model, speculative_mode=2, draft_model=other)
        assert err.value.code == SPC_ERR_INVALID_ARGUMENT and "freed" in err.value.message
    finally:
        capi.lib.spc_model_free(other)
        capi.lib.spc_model_free(model)


@pytest.fixture(scope="module")
def tiny_draft_other_vocab(build_tiny):
    built = build_tiny("tiny-llama", "q4f32_1")
    return str(built.model_dir), str(built.lib)


@pytest.mark.parametrize("k", [2, 5])
def test_suffix_drafts_what_python_drafts(capi_build, smollm2_q4, k):
    """The suffix index (the default mode's drafter) as a chain at a fixed depth: the same
    drafts per request as runtime/drafters/suffix.py, on text that repeats and text that does not."""
    model_dir, lib = smollm2_q4
    py = Engine(model_dir, lib, speculative_mode="suffix", spec_draft_length=k)
    prompts = PROMPTS + ["Repeat exactly, three times: red fish, blue fish, red fish, blue fish."]
    drafted = 0
    for prompt in prompts:
        ref = py.generate(py.encode_prompt(prompt), MAX_TOKENS, SamplingParams(temperature=0.0)).to_dict()
        proc = spc_generate(capi_build, model_dir, lib, prompt, "--speculative-mode", "suffix",
                            "--spec-draft-length", str(k))
        assert proc.returncode == 0, proc.stderr
        c = json.loads(proc.stdout)
        assert c["token_ids"] == ref["token_ids"]
        assert {key: c["stats"][key] for key in COUNTS} == {key: ref["stats"][key] for key in COUNTS}, prompt
        drafted += c["stats"]["accepted_tokens"]
    assert drafted > 0
