"""The prefix cache (runtime/prefix_cache.py) on the fake model of test_engine.py, whose next
token is read from the tokens *stored in its KV slots*: a kept sequence rolled back to the
wrong length, or a prompt prefilled from the wrong position, changes every later token.
Real kernels and the heads' own state: test_eagle_medusa.py and test_speculative.py."""
from __future__ import annotations

import pytest

from speccompile.runtime.engine import Engine
from speccompile.runtime.kv_cache import PAGE
from speccompile.runtime.prefix_cache import MIN_REUSE, shared_prefix
from test_engine import model_dir, reference  # noqa: F401  (the fixture)

PROMPT = list(range(30, 70))  # 40 tokens
MODES = ["disable", "ngram", "suffix"]


def _engine(model_dir, mode, **options):
    return Engine(model_dir, model_dir / "lib.so", speculative_mode=mode, **options)


def test_shared_prefix():
    assert shared_prefix([1, 2, 3], [1, 2, 4]) == 2
    assert shared_prefix([1, 2], [1, 2, 3]) == 2
    assert shared_prefix([], [1]) == 0 and shared_prefix([5], [6]) == 0


@pytest.mark.parametrize("mode", MODES)
def test_a_next_turn_prefills_only_what_is_new_and_says_what_a_fresh_engine_says(model_dir, mode):
    eng = _engine(model_dir, mode)
    first = eng.generate(PROMPT, 30)
    assert first.token_ids == reference(PROMPT, 30) and first.stats.cached_prompt_tokens == 0
    turn = PROMPT + first.token_ids + [7, 8, 9, 10, 11]  # the conversation resent, with a new message
    second = eng.generate(turn, 30)
    assert second.token_ids == reference(turn, 30)
    held = len(PROMPT) + len(first.token_ids) - 1  # the last answer token was never forwarded
    assert second.stats.cached_prompt_tokens == held
    assert second.stats.prefill_tokens == len(turn) - held
    # the same prompt again: everything but its last token comes from the cache
    again = eng.generate(turn, 30)
    assert again.token_ids == second.token_ids and again.stats.cached_prompt_tokens == len(turn) - 1


@pytest.mark.parametrize("mode", MODES)
def test_a_prompt_that_parts_from_the_kept_one_rolls_it_back(model_dir, mode):
    eng = _engine(model_dir, mode)
    eng.generate(PROMPT, 20)
    other = PROMPT[:MIN_REUSE + 5] + [150, 151, 152, 153]
    res = eng.generate(other, 25)
    assert res.token_ids == reference(other, 25)
    assert res.stats.cached_prompt_tokens == MIN_REUSE + 5
    short = PROMPT[:MIN_REUSE - 1] + [99, 98]  # too little in common with anything kept
    res = eng.generate(short, 10)
    assert res.token_ids == reference(short, 10) and res.stats.cached_prompt_tokens == 0


def test_kept_sequences_give_way_to_new_ones(model_dir):
    """A cache of 6 pages: every kept sequence is reclaimed when a new one needs its pages,
    and the pages count as free meanwhile; at most the capacity is kept."""
    eng = _engine(model_dir, "ngram", max_total_seq_length=6 * PAGE, max_num_sequence=2)
    for start in (10, 60, 110):
        prompt = list(range(start, start + 40))
        assert eng.generate(prompt, 20).token_ids == reference(prompt, 20)
        assert eng.kv.num_free_pages() == eng.kv.num_pages  # kept pages are free to take
    assert 1 <= len(eng.prefix_cache.kept) <= 2
    big = list(range(120, 120 + 5 * PAGE))  # needs every page: the kept ones are reclaimed
    assert eng.generate(big, 8).token_ids == reference(big, 8)
    assert len(eng.prefix_cache.kept) == 1 and eng.prefix_cache.kept.popitem()[1][0] == big + reference(big, 8)[:-1]


def test_off_keeps_nothing(model_dir):
    eng = _engine(model_dir, "suffix", prefix_cache_max_num_recycling_seqs=0)
    first = eng.generate(PROMPT, 20)
    res = eng.generate(PROMPT + first.token_ids, 20)
    assert res.stats.cached_prompt_tokens == 0 and not eng.kv.seqs


def test_a_stream_closed_early_is_not_kept(model_dir):
    eng = _engine(model_dir, "ngram")
    stream = eng.generate_stream(PROMPT, 30)
    next(stream)
    stream.close()
    assert not eng.prefix_cache.kept and not eng.kv.seqs


def test_state_kept_without_speculation_serves_only_plain_runs(model_dir):
    """``speculation_disabled`` (bench's plain runs): the proposer never saw that sequence,
    so a speculative run does not take it over."""
    eng = _engine(model_dir, "suffix")
    with eng.speculation_disabled():
        first = eng.generate(PROMPT, 20)
    turn = PROMPT + first.token_ids + [3, 4]
    res = eng.generate(turn, 20)
    assert res.token_ids == reference(turn, 20) and res.stats.cached_prompt_tokens == 0
    with eng.speculation_disabled():
        again = eng.generate(turn + [5], 20)
    assert again.token_ids == reference(turn + [5], 20) and again.stats.cached_prompt_tokens > 0


def test_no_take_over_while_features_are_captured(model_dir):
    """``capture_features`` (training data) wants every prompt token's features, and its sink
    is keyed by the id a sequence had before ``attach``: nothing is taken over meanwhile."""
    eng = _engine(model_dir, "ngram")
    eng.generate(PROMPT, 20)
    eng.feature_sink = lambda *args: None  # what capture_features sets (the fake has no feature layers)
    seq = eng.new_sequence(PROMPT + [1, 2], 8)
    sid = seq.seq_id
    eng.attach(seq)
    assert seq.seq_id == sid and seq.result.stats.cached_prompt_tokens == 0 and seq.to_prefill == PROMPT + [1, 2]
    eng.detach(seq)
    eng.feature_sink = None
    seq = eng.new_sequence(PROMPT + [1, 2], 8)
    eng.attach(seq)
    assert seq.seq_id != sid and seq.result.stats.cached_prompt_tokens == len(PROMPT)


def test_one_tenant_never_takes_another_tenants_sequence(model_dir):
    """A server's API keys (``tenant``) are kept apart, as in the suffix store."""
    eng = _engine(model_dir, "suffix")
    for tenant, expect in (("a", 0), ("b", 0), ("a", len(PROMPT) + 1)):  # all but the last prompt token
        seq = eng.new_sequence(PROMPT + [1, 2], 8, tenant=tenant)
        eng.attach(seq)
        assert seq.result.stats.cached_prompt_tokens == expect, tenant
        while seq.prefilling:
            eng.prefill([seq], 64)
        while not seq.done:
            eng.step([seq])
        assert seq.result.token_ids == reference(PROMPT + [1, 2], 8)
        eng.detach(seq, keep=True)


def test_a_prompt_sharing_a_short_prefix_takes_the_kept_sequence_it_costs_least(model_dir):
    """Two kept sequences share the first 20 tokens with a new prompt: it takes the shorter
    one, and the longer (a conversation its user may continue) stays kept."""
    eng = _engine(model_dir, "ngram")
    long_prompt, short_prompt = PROMPT + list(range(100, 140)), PROMPT[:20] + [7, 7, 7]
    eng.generate_batch([long_prompt, short_prompt], 20)  # attached together: neither takes the other
    assert len(eng.prefix_cache.kept) == 2
    kept_long = next(tokens for tokens, *_ in eng.prefix_cache.kept.values() if len(tokens) > 60)
    res = eng.generate(PROMPT[:20] + [9, 9], 10)
    assert res.stats.cached_prompt_tokens == 20 and res.token_ids == reference(PROMPT[:20] + [9, 9], 10)
    assert kept_long in [tokens for tokens, *_ in eng.prefix_cache.kept.values()]
