"""``n`` > 1: choices of one prompt prefill it once (runtime/shared_prefill.py), and each
choice still gives what it gives alone -- sampled with its own seed, greedy, speculating,
under penalties -- and a choice whose source went away prefills on its own."""
from __future__ import annotations

import pytest

from speccompile.runtime.sampling import SamplingParams
from speccompile.runtime.scheduler import Scheduler
from test_scheduler import drain

pytestmark = pytest.mark.tiny

PROMPT = "Tell me a story about a lighthouse keeper and the sea, in a few sentences."


def _run(eng, ids, samplings, max_tokens=24, share=True, **kw):
    sched = Scheduler(eng, max_num_sequence=4, prefill_tokens_per_step=64)
    reqs = []
    for i, sp in enumerate(samplings):
        reqs.append(sched.submit(ids, max_tokens if i else kw.pop("first_max", max_tokens), sp, None,
                                 lambda r, e: None, ignore_eos=True,
                                 prefill_from=reqs[0] if share and reqs else None))
    drain(sched)
    assert sched.engine_errors == 0
    return [r.seq.result for r in reqs]


@pytest.mark.parametrize("mode", [None, "suffix"])
def test_choices_copy_one_prefill_and_decode_as_alone(build_tiny, mode):
    from speccompile.runtime.engine import Engine

    built = build_tiny("tiny-llama", "q0f32")
    eng = Engine(built.model_dir, built.lib, speculative_mode=mode) if mode else Engine(built.model_dir, built.lib)
    eng.prefix_cache.capacity = 0  # the copies, not kept sequences, are what is tested
    ids = eng.encode_prompt(PROMPT)
    samplings = [SamplingParams(temperature=2.0, seed=10 + i, frequency_penalty=0.3 * (i == 2))
                 for i in range(3)]
    results = _run(eng, ids, samplings)
    if mode is None:  # (a sampled run's draws follow what was drafted, which the other choices' text changes)
        alone = [eng.generate(ids, 24, sp, ignore_eos=True) for sp in samplings]
        assert [r.token_ids for r in results] == [a.token_ids for a in alone]
    assert len({tuple(r.token_ids) for r in results}) == 3  # the seeds differ
    assert results[0].stats.prefill_tokens == len(ids) and results[0].stats.cached_prompt_tokens == 0
    for r in results[1:]:  # copied, not prefilled
        assert r.stats.prefill_tokens == 0 and r.stats.cached_prompt_tokens == len(ids)
    greedy = _run(eng, ids, [SamplingParams()] * 3)
    assert all(r.token_ids == eng.generate(ids, 24, ignore_eos=True).token_ids for r in greedy)
    assert not eng.kv.seqs  # every copy's pages came back


def test_a_choice_whose_source_is_gone_prefills_alone(build_tiny):
    """The source finishes at its first token (max_tokens 1) and frees its pages before the
    other choices are admitted (one sequence at a time): they prefill on their own."""
    from speccompile.runtime.engine import Engine

    built = build_tiny("tiny-llama", "q0f32")
    eng = Engine(built.model_dir, built.lib)
    eng.prefix_cache.capacity = 0
    ids = eng.encode_prompt(PROMPT)
    sched = Scheduler(eng, max_num_sequence=1, prefill_tokens_per_step=64)
    first = sched.submit(ids, 1, SamplingParams(seed=1), None, lambda r, e: None, ignore_eos=True)
    other = sched.submit(ids, 12, SamplingParams(temperature=0.7, seed=2), None, lambda r, e: None, ignore_eos=True,
                         prefill_from=first)
    drain(sched)
    assert other.seq.result.stats.prefill_tokens == len(ids)
    assert other.seq.result.token_ids == eng.generate(ids, 12, SamplingParams(temperature=0.7, seed=2),
                                                      ignore_eos=True).token_ids


def test_a_draft_model_catches_up_on_a_copied_prompt(build_tiny):
    """small_draft: the draft model's cache never saw the copied choices' prompts; drafting still
    gives plain greedy output (its catch-up runs as after any prefill it skipped)."""
    from speccompile.runtime.engine import Engine

    built = build_tiny("tiny-llama", "q0f32")
    eng = Engine(built.model_dir, built.lib, speculative_mode="small_draft",
                 additional_models=[(str(built.model_dir), str(built.lib))])
    eng.set_draft_length(3)
    eng.prefix_cache.capacity = 0
    ids = eng.encode_prompt(PROMPT)
    results = _run(eng, ids, [SamplingParams()] * 3)
    plain = Engine(built.model_dir, built.lib).generate(ids, 24, ignore_eos=True).token_ids
    assert all(r.token_ids == plain for r in results)
    assert results[2].stats.prefill_tokens == 0 and results[2].stats.spec.accepted_tokens > 0
