"""The suffix index and its proposer (runtime/drafters/suffix.py), against brute force: counts of
every context, a tenant's store after additions and evictions, trees grown best-first."""
from collections import Counter

import numpy as np
import pytest

from speccompile.runtime.drafters.suffix import SuffixIndex, SuffixProposer, SuffixStore, confidence


def brute_counts(streams: list[list[int]], max_n: int) -> dict:
    """context -> Counter of next tokens, over every stream (no context spans two)."""
    out: dict = {}
    for s in streams:
        for i in range(1, len(s)):
            for n in range(1, min(max_n, i) + 1):
                out.setdefault(tuple(s[i - n:i]), Counter())[s[i]] += 1
    return {k: dict(v) for k, v in out.items()}


def same_counts(index: SuffixIndex, expected: dict) -> bool:
    """The index holds exactly these contexts with these successor counts."""
    return len(index.next) == len(expected) and all(index.successors(k) == v for k, v in expected.items())


def test_index_counts_every_context_as_the_stream_grows():
    rng = np.random.default_rng(0)
    stream = rng.integers(0, 6, 300).tolist()  # a small vocabulary: many repeated contexts
    index = SuffixIndex(max_n=5)
    for a, b in ((0, 1), (1, 40), (40, 41), (41, 300)):  # extended in pieces, as commits arrive
        index.extend(stream[a:b])
    assert index.tokens == stream and same_counts(index, brute_counts([stream], 5))


def test_match_takes_the_longest_context_with_a_continuation():
    index = SuffixIndex(max_n=4)
    index.extend([1, 2, 3, 9, 2, 3, 5, 1, 2, 3])
    assert index.match([7, 1, 2, 3]) == (3, {9: 1})  # "1 2 3" was followed by 9 (its last occurrence has no successor)
    assert index.match([8, 2, 3]) == (2, {9: 1, 5: 1})  # "8 2 3" unseen: "2 3" was followed by 9 and 5
    assert index.match([42]) == (0, None)


def test_store_keeps_recent_requests_per_tenant_within_its_budget():
    store = SuffixStore(max_tokens=100, max_n=3)
    a1, a2, a3 = list(range(40)), list(range(30, 80)), list(range(60, 100))
    store.add("a", 1, a1)
    store.add("a", 2, a2)
    assert same_counts(store.index("a"), brute_counts([a1, a2], 3))
    store.add("a", 3, a3)  # 130 tokens: the oldest request goes
    assert same_counts(store.index("a"), brute_counts([a2, a3], 3))
    store.add("a", 2, a2 + [7, 7])  # the same request again (preempted, then finished): kept once
    assert same_counts(store.index("a"), brute_counts([a3, a2 + [7, 7]], 3))
    store.add("b", 1, [5, 6, 7])
    assert same_counts(store.index("b"), brute_counts([[5, 6, 7]], 3)) and store.index("c") is None
    assert store.index(None) is None
    off = SuffixStore(max_tokens=0)  # a server that keeps nothing
    off.add("a", 1, a1)
    assert off.index("a") is None


def test_chain_follows_the_most_frequent_continuation():
    text = [1, 2, 3, 4, 5, 6, 7, 1, 2, 3, 9, 9, 1, 2, 3, 4, 5]
    prop = SuffixProposer(tree_width=1)
    prop.add_sequence(0, text[:10])
    prop.on_commit(0, text)
    (draft,) = prop.propose([0], [text], [6], [None], [None], None)
    assert draft.tokens == [6, 7, 1, 2, 3, 9] and draft.parents is None
    assert len(draft.conf) == 6 and all(0 < c < 1 for c in draft.conf)
    (short,) = prop.propose([0], [text], [2], [None], [None], None)
    assert short.tokens == [6, 7]
    (none,) = prop.propose([0], [text + [42]], [4], [None], [None], None)  # 42 never seen: nothing to draft
    assert none.tokens == []


def test_tree_is_best_first_within_width_depth_and_budget():
    rng = np.random.default_rng(1)
    text = rng.integers(0, 4, 400).tolist()
    for width, depth, budget in ((3, 5, 20), (2, 8, 64), (4, 2, 7)):
        prop = SuffixProposer(tree_width=width, max_nodes=64)
        prop.add_sequence(0, text)
        (d,) = prop.propose([0], [text], [depth], [None], [None], None, node_limit=budget)
        parents = d.parent_list()
        assert 0 < len(d) <= budget and max(d.depths()) <= depth
        assert all(p < i for i, p in enumerate(parents))  # parents first
        assert all(c <= width for c in Counter(parents).values())
        path = []
        for i, p in enumerate(parents):
            path.append(d.conf[i] * (path[p] if p >= 0 else 1.0))
        assert all(a >= b - 1e-12 for a, b in zip(path, path[1:]))  # joined in order of path probability
        for i, p in enumerate(parents):  # each node is a continuation the text holds after its context
            ctx = text[-8:] + [d.tokens[j] for j in _ancestors(parents, i)]
            n, succ = prop.seqs[0].match(ctx)
            assert d.tokens[i] in succ and d.conf[i] == confidence(succ[d.tokens[i]], sum(succ.values()), n)


def _ancestors(parents, i):
    out = []
    while parents[i] >= 0:
        i = parents[i]
        out.append(i)
    return out[::-1]


def test_a_tenants_finished_requests_draft_for_its_next_one_only():
    prop = SuffixProposer(tree_width=1)
    answer = [50, 51, 52, 53, 54, 55, 56, 57]
    prop.add_sequence(0, [1, 2, 3] + answer, tenant="alice")
    prop.remove_sequence(0)  # finished: its text joins alice's store
    prop.add_sequence(1, [9, 9, 50, 51], tenant="alice")
    prop.add_sequence(2, [9, 9, 50, 51], tenant="bob")
    prop.add_sequence(3, [9, 9, 50, 51])  # no tenant (a one-off process): its own text only
    drafts = prop.propose([1, 2, 3], [[9, 9, 50, 51]] * 3, [4] * 3, [None] * 3, [None] * 3, None)
    assert drafts[0].tokens == [52, 53, 54, 55]
    assert drafts[1].tokens == [] and drafts[2].tokens == []


def test_measure_prices_every_row_count():
    table, catch_up = SuffixProposer().measure([1, 2, 4])
    assert catch_up == 0.0 and 0 < table[1] < table[2] < table[4]


def test_a_drafter_for_a_mode_without_one_is_refused_and_suffix_takes_one_optionally(tmp_path):
    from speccompile.runtime.sequence import GenerationError
    from speccompile.runtime.speculative import SpeculativeConfig

    with pytest.raises(GenerationError, match="drafts without a model"):
        SpeculativeConfig(speculative_mode="ngram", additional_models=[("d", "l")]).check(tmp_path, 64)
    SpeculativeConfig(speculative_mode="suffix").check(tmp_path, 64)  # the index alone
    with pytest.raises(GenerationError, match="speccompile-config.json not found"):  # the drafter's own checks run
        SpeculativeConfig(speculative_mode="suffix", additional_models=[(str(tmp_path / "d"), "l")]).check(tmp_path, 64)


def test_the_drafter_merged_with_the_index_is_driven_by_its_own_mode(tmp_path):
    """``--additional-models`` with the suffix index (the commands' default): the drafter's
    converted config says which proposer drives it (runtime/drafters/merged.py)."""
    import json

    from speccompile.runtime.speculative import drafter_mode

    for kind, mode in (("eagle", "eagle"), ("eagle3", "eagle"), ("medusa", "medusa"), ("qwen2", "small_draft")):
        (tmp_path / kind).mkdir()
        (tmp_path / kind / "speccompile-config.json").write_text(json.dumps({"model_type": kind}))
        assert drafter_mode(f"{tmp_path / kind},{tmp_path / kind}.so") == mode
    with pytest.raises(ValueError, match="not found"):
        drafter_mode(f"{tmp_path / 'none'},x.so")
