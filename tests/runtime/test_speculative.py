"""Greedy speculative decoding is token-for-token the target's own greedy output.

SmolLM2-135M-Instruct is the target. Drafts: the target itself, a random-weight model
with the same vocabulary, the suffix index (chains and trees) and n-gram lookup; batch 1
and 4; k = 1, 7 and adaptive.
"""
import numpy as np
import pytest

from speccompile.runtime.engine import Engine, GenerationError

pytestmark = pytest.mark.real_model

PROMPTS = [
    "What is the capital of France?",
    "Write a Python function that returns the n-th Fibonacci number.",
    "Repeat after me: the quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy dog.",
    "List the days of the week.",
    "Summarize: The cat sat on the mat. The mat was red. The cat liked the red mat very much.",
    "Translate 'good morning' into French and Spanish.",
    "Explain what a hash table is in one paragraph.",
    "Count from one to twenty in words.",
]
NEW_TOKENS = 32


@pytest.fixture(scope="module")
def target(smollm2_q4):
    return smollm2_q4


@pytest.fixture(scope="module")
def reference(target):
    model_dir, lib = target
    eng = Engine(model_dir, lib)
    prompts = [eng.encode_prompt(p) for p in PROMPTS]
    return prompts, [eng.generate(ids, NEW_TOKENS, ignore_eos=True).token_ids for ids in prompts]


def _engine(target, mode, random_draft=None):
    model_dir, lib = target
    if mode in ("ngram", "suffix"):
        return Engine(model_dir, lib, speculative_mode=mode)
    if mode == "suffix-tree":
        return Engine(model_dir, lib, speculative_mode="suffix", spec_tree_width=3)
    draft = (str(model_dir), str(lib)) if mode.endswith("self") else random_draft
    # suffix-self: the index merged with a draft model (runtime/drafters/merged.py), one tree per step
    return Engine(model_dir, lib, speculative_mode="suffix" if mode == "suffix-self" else "small_draft",
                  additional_models=[draft])


@pytest.mark.parametrize("mode, ks", [("self", (1, 7, 0)), ("random", (1, 0)), ("suffix", (1, 7, 0)),
                                      ("suffix-tree", (7, 0)), ("ngram", (0,)), ("suffix-self", (3,))])
def test_greedy_speculation_is_lossless(target, reference, random_draft, mode, ks):
    """k: shortest, longest fixed, adaptive (a random draft, rarely right, n-gram lookup, the
    suffix index's predecessor, and the index merged with a draft, adaptive on the tiny heads
    in test_eagle_medusa.py, fewer: CI time)."""
    prompts, expected = reference
    eng = _engine(target, mode, random_draft)
    for k in ks:
        eng.set_draft_length(k)
        for i, ids in enumerate(prompts):  # batch 1
            res = eng.generate(ids, NEW_TOKENS, ignore_eos=True)
            assert res.token_ids == expected[i], f"{mode} k={k} prompt {i}"
            if mode == "self" and k > 0:
                st = res.stats.spec
                assert st.accept_rate >= 0.98 and st.mean_accepted_length >= 0.98 * (k + 1)
            if mode in ("suffix", "suffix-tree") and k == 7 and i == 2:  # "Repeat after me": the answer copies the prompt
                assert res.stats.spec.mean_accepted_length > 2, res.stats.spec
        for start in (0, 4):  # batch 4
            results = eng.generate_batch(prompts[start:start + 4], NEW_TOKENS, ignore_eos=True)
            assert [r.token_ids for r in results] == expected[start:start + 4], f"{mode} k={k} batch at {start}"
        if mode == "suffix-self":  # both sources had drafts accepted (k fixed: the self draft always drafts)
            hits = eng.policy.acceptance.hits.sum(axis=1)
            assert (hits > 0).all(), hits


def test_stop_tokens_and_max_tokens_inside_an_accepted_run(target, reference):
    prompts, expected = reference
    eng = _engine(target, "self")
    eng.set_draft_length(7)
    res = eng.generate(prompts[0], 5, ignore_eos=True)
    assert res.token_ids == expected[0][:5] and res.finish_reason == "length"
    stop_tok = expected[3][6]
    eng.stop_token_ids = {stop_tok}
    res = eng.generate(prompts[3], NEW_TOKENS)
    cut = expected[3].index(stop_tok)
    assert res.token_ids == expected[3][:cut] and res.finish_reason == "stop"


def test_draft_validation_errors(target, tmp_path):
    import shutil

    model_dir, lib = target
    with pytest.raises(GenerationError, match="needs the draft"):
        Engine(model_dir, lib, speculative_mode="small_draft")
    other = tmp_path / "other"
    shutil.copytree(model_dir, other)
    cfg = (other / "speccompile-config.json").read_text().replace('"vocab_size": 49152', '"vocab_size": 49153')
    (other / "speccompile-config.json").write_text(cfg)
    with pytest.raises(GenerationError, match="vocab size"):
        Engine(model_dir, lib, speculative_mode="small_draft", additional_models=[(str(other), str(lib))])
    with pytest.raises(GenerationError, match="token budget"):
        Engine(model_dir, lib, speculative_mode="ngram", spec_draft_length=8, max_batch_tokens=4)


def test_sampling_with_speculation_is_reproducible_and_valid(target):
    from speccompile.runtime.sampling import SamplingParams

    eng = _engine(target, "self")
    eng.set_draft_length(3)
    ids = eng.encode_prompt(PROMPTS[1])
    sp = SamplingParams(temperature=0.8, top_p=0.95, seed=11)
    a = eng.generate(ids, 24, sp, ignore_eos=True)
    b = eng.generate(ids, 24, sp, ignore_eos=True)
    assert a.token_ids == b.token_ids and len(a.token_ids) == 24
    assert np.all(np.asarray(a.token_ids) < 49152)


def test_draft_model_prefills_with_the_target(target, reference):
    """The draft model's KV cache is filled in the target's prefill chunks, so the first
    decode step catches up on one token, not on the whole prompt (a server's running
    batch would stall on it), and the output is still the target's."""
    prompts, expected = reference
    eng = _engine(target, "self")
    eng.set_draft_length(3)
    seq = eng.new_sequence(prompts[4], NEW_TOKENS, ignore_eos=True)
    eng.attach(seq)
    while seq.to_prefill:
        eng.prefill([seq], 7)  # small chunks: the draft follows chunk by chunk
    assert eng.proposer.cached[seq.seq_id] == prompts[4]
    assert eng.proposer.kv.length(seq.seq_id) == len(prompts[4])
    eng.step([seq])
    assert eng.proposer.last_catch_up == 1
    while not seq.done:
        eng.step([seq])
    eng.detach(seq)
    assert seq.result.token_ids == expected[4]


def _costs(verify_ms: dict, draft_ms: float, catch_up_ms: float = 0.0):
    """A synthetic cost profile (rows -> ms): what the policy decides from, not timed."""
    from speccompile.runtime.costs import CostModel, CostTable

    return CostModel(CostTable({r: v * 1e-3 for r, v in verify_ms.items()}),
                     CostTable({1: draft_ms * 1e-3, 8: 8 * draft_ms * 1e-3}), catch_up_ms * 1e-3)


CHEAP = {1: 10, 2: 10.2, 4: 10.5, 8: 11, 16: 12, 32: 14}  # extra verified rows nearly free


def _adaptive(eng, cost):
    """The engine with this cost profile and fresh acceptance estimates, adaptive length.
    The pace factor still follows real forwards, but one factor scales every cost alike,
    so the decisions follow the profile's shape."""
    eng.cost = cost
    eng.set_draft_length(0)
    return eng


def _prefilled(eng, prompt, chunk):
    """A sequence attached and prefilled in chunks of ``chunk`` tokens, not yet decoded."""
    seq = eng.new_sequence(prompt, NEW_TOKENS, ignore_eos=True)
    eng.attach(seq)
    while seq.to_prefill:
        eng.prefill([seq], chunk)
    return seq


def _finish(eng, seq):
    while not seq.done:
        eng.step([seq])
    eng.detach(seq)


def test_a_fresh_engine_drafts_from_its_first_step_when_the_costs_say_so(target, reference):
    """No warm-up, no learning of costs: with a profile where drafting pays, the first
    decode step of a fresh engine drafts (the target drafting for itself: every token is
    accepted), and with one where the draft costs more than a target step it never does."""
    prompts, expected = reference
    for draft_ms, drafts in ((0.5, True), (12.0, False)):
        eng = _adaptive(_engine(target, "self"), _costs(CHEAP, draft_ms))
        seq = _prefilled(eng, prompts[1], 64)
        eng.step([seq])
        spec = seq.result.stats.spec
        assert (spec.draft_tokens > 0) == drafts
        # the target drafting for itself: all accepted (how many it drafts follows the measured
        # pace, which a loaded machine slows: not asserted)
        assert spec.accepted_tokens == spec.draft_tokens
        _finish(eng, seq)
        assert seq.result.token_ids == expected[1]
        assert (seq.result.stats.spec.draft_tokens > 0) == drafts


def test_ngram_drafts_only_confident_matches_worth_their_rows(target, reference):
    """The repetitive prompt gives long, often-seen n-gram matches: verified at cheap rows.
    Where a verified row costs as much as a step, none is verified. Output is the target's."""
    prompts, expected = reference
    for verify, drafts in ((CHEAP, True), ({1: 10, 2: 20, 4: 40, 8: 80, 16: 160, 32: 320}, False)):
        eng = _adaptive(_engine(target, "ngram"), _costs(verify, 0.0))
        res = eng.generate(prompts[2], NEW_TOKENS, ignore_eos=True)
        assert res.token_ids == expected[2]
        assert (res.stats.spec.accepted_tokens > 8) == drafts
        assert (res.stats.spec.draft_tokens > 0) == drafts


def test_a_lagging_draft_model_never_catches_up_inside_a_step(target, reference, monkeypatch):
    """Where the costs say drafting does not pay at the batch size, the draft model does not
    prefill new prompts; a sequence that far behind then decodes plainly rather than stall
    the batch on a catch-up (at batch 8 one took a second), even at a fixed draft length.
    Where drafting pays, the draft prefills with the target and drafts. The output is the
    target's either way."""
    from speccompile.runtime.drafters.proposers import SmallDraftProposer

    monkeypatch.setattr(SmallDraftProposer, "MAX_BACKLOG", 16)  # the test prompt is shorter than the default
    prompts, expected = reference
    for draft_ms, drafts in ((12.0, False), (0.5, True)):
        eng = _adaptive(_engine(target, "self"), _costs(CHEAP, draft_ms))
        seq = _prefilled(eng, prompts[4], 7)
        assert (eng.proposer.backlog(seq.seq_id, seq.history) > 16) != drafts
        eng.policy.fixed_k = 2  # would draft if it could
        _finish(eng, seq)
        assert (seq.result.stats.spec.draft_tokens > 0) == drafts and seq.result.token_ids == expected[4]


def test_a_draft_model_catch_up_is_priced(target, reference):
    """After a plain stretch a draft model must prefill what it missed before it drafts
    again. The plan prices that catch-up per token: at a prohibitive price the sequence
    keeps decoding plainly, at a cheap one the draft catches up and drafts. Either way the
    output is the target's."""
    prompts, expected = reference
    for catch_up_ms, drafts_after in ((50.0, False), (0.01, True)):
        eng = _adaptive(_engine(target, "self"), _costs(CHEAP, 0.5, catch_up_ms))
        eng.policy.off_until[1] = (8, 1e9)  # as if the guard had switched drafting off for 8 steps ...
        seq = _prefilled(eng, prompts[4], 7)  # ... so the draft model skips the prompt
        proposer = eng.proposer
        assert proposer.cached[seq.seq_id] == []
        for _ in range(8):
            eng.step([seq])
        assert seq.result.stats.spec.draft_tokens == 0 and proposer.backlog(seq.seq_id, seq.history) > 2
        eng.step([seq])
        assert (seq.result.stats.spec.draft_tokens > 0) == drafts_after
        _finish(eng, seq)
        assert seq.result.token_ids == expected[4]


def test_learned_acceptance_belongs_to_the_weights_it_was_learned_with(target, tmp_path, monkeypatch):
    """The cost profile is keyed by the libraries, and two drafts of one shape share a library:
    what one draft's acceptance was learned to be must not steer another's (a random head's
    "nothing is accepted" once kept a trained head of the same shape from ever drafting)."""
    import shutil

    monkeypatch.setenv("SPECCOMPILE_CACHE", str(tmp_path / "cache"))
    model_dir, lib = target
    other = tmp_path / "other"  # the same library, other weights (by its tensor-cache.json)
    shutil.copytree(model_dir, other)
    with open(other / "tensor-cache.json", "a") as f:
        f.write("\n")

    def engine(draft_dir):
        return Engine(model_dir, lib, speculative_mode="small_draft", additional_models=[(str(draft_dir), str(lib))])

    first = engine(model_dir)
    for _ in range(40):  # what a process learned: confidence 0.95 is never accepted
        first.policy.acceptance.observe([0.95], [-1], [])
    first.policy.save()
    learned = first.policy.acceptance.predict(0.95)
    assert learned < 0.5
    again = engine(model_dir)
    assert again.cost.path == first.cost.path and again.policy.acceptance.predict(0.95) < 0.9
    assert again.policy.acceptance.predict(0.95) == pytest.approx(
        type(first.policy.acceptance)().restore(first.cost.acceptance).predict(0.95))
    fresh = engine(other)
    assert fresh.cost.path == first.cost.path  # same costs...
    assert fresh.cost.acceptance is None and fresh.policy.acceptance.predict(0.95) == pytest.approx(0.95)  # ...prior
