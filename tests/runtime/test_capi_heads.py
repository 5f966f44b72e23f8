"""The C runtime's head drafters (runtime/capi/src/drafters/eagle.cc, medusa.cc, merged.cc)
twinned with runtime/drafters/eagle.py, medusa.py and merged.py: with SmolLM2-135M and its
committed EAGLE and Medusa heads, at a fixed draft length, `spc_generate` drafts what
`speccompile generate` drafts -- chains and token trees, each head alone and merged with the
suffix index (the default mode with --additional-models) -- so the output and every draft and
acceptance count are equal. A tree's shape follows the acceptance model's predictions
(runtime/adaptive.py, src/adaptive.cc), learned step by step from the verdicts: equal counts
over a whole answer hold those two equal too. A head resumed by the prefix cache drafts as a
cold one; and a head that cannot serve the target is refused before any drafting."""
from __future__ import annotations

import json

import pytest
from capi_ctypes import SPC_ERR_INCOMPATIBLE, SPC_ERR_INVALID_ARGUMENT, Capi, CapiError, run_example

from speccompile.runtime.engine import Engine

pytestmark = pytest.mark.real_model

MAX_TOKENS = 32
PROMPT = "Explain how a bicycle's gears make climbing a hill easier."
COUNTS = ("draft_tokens", "accepted_tokens", "verify_steps", "plain_steps")
EAGLE, MEDUSA = 0, 1
MODE_IDS = {"suffix": 3, "eagle": 4, "medusa": 5}


@pytest.mark.parametrize("mode, head, width, k", [("eagle", EAGLE, 1, 4), ("eagle", EAGLE, 2, 3),
                                                  ("medusa", MEDUSA, 2, 3), ("suffix", EAGLE, 1, 4),
                                                  ("suffix", MEDUSA, 2, 3)])
def test_heads_draft_what_python_drafts(capi_build, smollm2_q4, smollm2_heads, mode, head, width, k):
    model_dir, lib = smollm2_q4
    head_dir, head_lib = smollm2_heads[head]
    py = Engine(model_dir, lib, speculative_mode=mode, additional_models=[(head_dir, head_lib)], spec_draft_length=k,
                spec_tree_width=width)
    ref = py.generate(py.encode_prompt(PROMPT), MAX_TOKENS).to_dict()
    proc = run_example(capi_build / "spc_generate", model_dir, lib, "--prompt", PROMPT, "--max-tokens", str(MAX_TOKENS),
                       "--json", "--speculative-mode", mode, "--additional-models", f"{head_dir},{head_lib}",
                       "--spec-draft-length", str(k), "--spec-tree-width", str(width))
    assert proc.returncode == 0, proc.stderr
    c = json.loads(proc.stdout)
    assert c["token_ids"] == ref["token_ids"] and c["text"] == ref["text"]
    assert {n: c["stats"][n] for n in COUNTS} == {n: ref["stats"][n] for n in COUNTS}
    assert 0 < c["stats"]["accepted_tokens"] < c["stats"]["draft_tokens"]
    if width > 1:  # trees: more nodes verified per step than the depth
        assert c["stats"]["draft_tokens"] > k * c["stats"]["verify_steps"]


def test_a_conversation_resumes_the_eagle_head(capi_build, smollm2_q4, smollm2_heads):
    """Each turn prefills only its new message (the prefix cache keeps the head's rows too),
    and drafts, node for node, what a cold Python engine drafts over the whole conversation."""
    model_dir, lib = smollm2_q4
    capi = Capi(capi_build)
    model, head = capi.model(model_dir, lib), capi.model(*smollm2_heads[EAGLE])
    session = capi.session(model, speculative_mode=MODE_IDS["eagle"], draft_length=3, draft_model=head)
    messages = []
    try:
        for turn, text in enumerate(["Name a planet.", "How far is it from the Sun?"]):
            messages.append({"role": "user", "content": text})
            answer, stats = capi.chat(session, messages, 24)
            py = Engine(model_dir, lib, speculative_mode="eagle", additional_models=[smollm2_heads[EAGLE]],
                        spec_draft_length=3)
            ref = py.generate(py.tokenizer.encode(py.render(messages), add_special_tokens=False).ids, 24)
            assert answer == ref.text
            assert (stats.draft_tokens, stats.accepted_tokens) == (ref.stats.spec.draft_tokens,
                                                                   ref.stats.spec.accepted_tokens)
            assert (stats.cached_prompt_tokens > 0) == (turn > 0)
            messages.append({"role": "assistant", "content": answer})
    finally:
        capi.lib.spc_session_free(session)
        capi.lib.spc_model_free(head)
        capi.lib.spc_model_free(model)


def test_heads_that_cannot_serve_are_refused(capi_build, smollm2_q4, smollm2_heads, build_tiny):
    model_dir, lib = smollm2_q4
    capi = Capi(capi_build)
    model, eagle, medusa = capi.model(model_dir, lib), capi.model(*smollm2_heads[EAGLE]), capi.model(*smollm2_heads[MEDUSA])
    tiny = build_tiny("tiny-llama", "q4f32_1")
    other = capi.model(tiny.model_dir, tiny.lib)
    cases = [(dict(speculative_mode=MODE_IDS["eagle"], draft_model=medusa), SPC_ERR_INCOMPATIBLE, "needs a eagle head"),
             (dict(speculative_mode=MODE_IDS["medusa"], draft_model=eagle), SPC_ERR_INCOMPATIBLE, "needs a medusa head"),
             (dict(speculative_mode=2, draft_model=eagle), SPC_ERR_INCOMPATIBLE, "small_draft needs a draft model"),
             (dict(speculative_mode=MODE_IDS["eagle"]), SPC_ERR_INVALID_ARGUMENT, "needs its EAGLE head"),
             (dict(speculative_mode=1, draft_model=eagle), SPC_ERR_INVALID_ARGUMENT, "drafts without a model"),
             (dict(speculative_mode=MODE_IDS["eagle"], draft_model=eagle, spec_tree_width=99), SPC_ERR_INCOMPATIBLE,
              "wider than the head's compiled top-"),
             (dict(speculative_mode=1, spec_tree_width=2), SPC_ERR_INVALID_ARGUMENT, "apply to the suffix, eagle"),
             (dict(speculative_mode=MODE_IDS["eagle"], draft_model=eagle, spec_tree_nodes=0), SPC_ERR_INVALID_ARGUMENT,
              "spec_tree_nodes")]
    try:
        for config, code, words in cases:
            with pytest.raises(CapiError) as err:
                capi.session(model, **config)
            assert err.value.code == code and words in err.value.message, (config, err.value)
        with pytest.raises(CapiError) as err:  # a head built for SmolLM2, on a target of another shape
            capi.session(other, speculative_mode=MODE_IDS["suffix"], draft_model=eagle)
        assert err.value.code == SPC_ERR_INCOMPATIBLE and "was built for another model" in err.value.message
    finally:
        for handle in (other, medusa, eagle, model):
            capi.lib.spc_model_free(handle)
