"""The merged draft (runtime/drafters/merged.py): the suffix index's and a drafter's proposals as one
tree, each node priced by its own source's calibration, and the drafter's first forward
weighed by what the index leaves uncovered. End to end (lossless with real heads and a
draft model): tests/runtime/test_eagle_medusa.py and test_speculative.py."""
from __future__ import annotations

import numpy as np
import pytest

from speccompile.runtime.acceptance import Draft
from speccompile.runtime.adaptive import AcceptanceModel, node_probs
from speccompile.runtime.drafters.merged import DRAFTER, INDEX, SourcePlan, merge

pytestmark = pytest.mark.unit


def flat(conf, source):
    """A calibration that is the confidence itself, but for the drafter's nodes at half."""
    return conf if source == INDEX else 0.5 * conf


def test_a_shared_prefix_is_one_node_carrying_the_likelier_source():
    own = Draft([5, 6, 7], conf=[0.9, 0.8, 0.7])  # index chain 5 6 7
    head = Draft([5, 8, 6], parents=[-1, 0, 0], conf=[0.95, 0.6, 0.3])  # head: 5, then 8 or 6
    m = merge(own, head, 64, flat)
    assert m.tokens == [5, 6, 7, 8] and m.parents == [-1, 0, 1, 0]
    # node 5: index 0.9 against head 0.95 * 0.5; node 6 (under 5): index 0.8 against 0.15
    assert m.source == [INDEX, INDEX, INDEX, DRAFTER] and m.conf == [0.9, 0.8, 0.7, 0.6]
    trusted = merge(own, head, 64, lambda c, s: c)  # equal calibrations: the head's 0.95 wins node 5
    assert trusted.source[0] == DRAFTER and trusted.conf[0] == 0.95


def test_one_empty_side_gives_the_other_tagged_and_a_merged_chain_stays_a_chain():
    own = Draft([1, 2], conf=[0.5, 0.5])
    assert merge(own, Draft(), 64, flat).source == [INDEX, INDEX]
    assert merge(Draft(), own, 64, flat).source == [DRAFTER, DRAFTER]
    m = merge(Draft([1, 2], conf=[0.5, 0.5]), Draft([1, 2, 3], conf=[0.9, 0.9, 0.9]), 64, flat)
    assert m.tokens == [1, 2, 3] and m.parents is None and m.source == [INDEX, INDEX, DRAFTER]


def test_the_budget_keeps_the_likeliest_nodes_as_a_tree():
    own = Draft([1, 2, 3, 4], conf=[0.9] * 4)
    head = Draft([7, 8], parents=[-1, 0], conf=[0.2, 0.9])
    m = merge(own, head, 3, flat)
    assert m.tokens == [1, 2, 3] and m.parents is None
    probs, _ = node_probs(m, flat)
    assert len(m) == 3 and min(probs) > 0.1 * 0.9


def test_sampled_drafts_are_not_mixed_the_likelier_source_is_taken():
    q = np.full((2, 4), 0.25)
    sampled = Draft([1, 2], probs=q, conf=[0.3, 0.3])
    long_index = Draft([1, 3, 3], conf=[0.9, 0.9, 0.9])
    assert merge(long_index, sampled, 64, flat).tokens == [1, 3, 3]  # the index expects more
    assert merge(Draft([0], conf=[0.1]), sampled, 64, flat).probs is q


def test_each_source_learns_its_own_calibration_and_prompt_scaling():
    acc = AcceptanceModel()
    for _ in range(40):  # the head is confidently wrong here, the index right
        acc.observe([0.75, 0.75], [-1, -1], [0], sources=[INDEX, DRAFTER])
    assert acc.predict(0.75, None, INDEX) > 0.8 > 0.2 > acc.predict(0.75, None, DRAFTER)
    assert acc.trials[INDEX].sum() == pytest.approx(acc.trials[DRAFTER].sum())
    old = AcceptanceModel().restore({"hits": [0.0] * 10, "trials": [30.0] * 10, "first_hits": 0, "first_trials": 0})
    assert old.predict(0.95, None, INDEX) < 0.2 and old.predict(0.95, None, DRAFTER) > 0.9  # a one-curve state is the index's


class _Plan:
    def __init__(self):
        self.seen = []

    def first(self, seq=None):
        return 0.6

    def p(self, conf, seq=None, source=0):
        self.seen.append(source)
        return conf


def test_the_drafter_sees_its_own_calibration_and_what_the_index_leaves_uncovered():
    plan = _Plan()
    view = SourcePlan(plan, {7: 0.9})
    assert view.first(7) == pytest.approx(0.06) and view.first(8) == pytest.approx(0.6)
    view.p(0.5, 7)
    assert plan.seen == [DRAFTER]
