"""The proposers' own behaviour, apart from the engine (runtime/drafters/proposers.py, eagle.py, medusa.py).

What a proposer promises the engine: drafts of at most k tokens (or a tree of at most
``node_limit`` nodes, parents first), a confidence per node, a draft forward only when the
step's plan says yes, and state that follows the committed history (rollback, catch-up).
The plan is a scripted stand-in here, so nothing depends on measured costs. The draft
model is the real SmolLM2 drafting for itself, checked against its own greedy decoding;
the EAGLE and Medusa heads are fakes with known logits, which is enough for their
bookkeeping (the compiled heads are tested end to end in test_eagle_medusa.py).
"""
from __future__ import annotations

import itertools
from types import SimpleNamespace

import numpy as np
import pytest

from speccompile.runtime.drafters.eagle import EagleProposer, HostDraftCalls, top_tokens
from speccompile.runtime.kv_cache import PAGE, PagedKV
from speccompile.runtime.drafters.medusa import MedusaProposer
from speccompile.runtime.drafters.proposers import NGramProposer, SmallDraftProposer
from speccompile.runtime.sampling import SamplingParams

GREEDY = SamplingParams()


class Plan:
    """A StepPlan stand-in: ``should_draft`` answers from a script (yes once it runs out,
    or always), predicted acceptance is the confidence itself, and what was asked is kept."""

    FIRST = 0.6  # every sequence's first-token estimate

    def __init__(self, answers: list[bool] | None = None):
        self.answers = list(answers or [])
        self.asked: list[int] = []  # rows of each draft forward asked about
        self.expansions: list[list] = []  # and the nodes it would extend
        self.cost = SimpleNamespace(catch_up=lambda tokens: 0.0)

    def should_draft(self, rows, expansions, catch_up_tokens=0) -> bool:
        self.asked.append(rows)
        self.expansions.append(list(expansions))
        return self.answers.pop(0) if self.answers else True

    def p(self, conf: float, seq=None) -> float:
        return conf

    def first(self, seq=None) -> float:
        return self.FIRST

    def spent(self, seconds: float) -> None:
        pass

    def drafted(self, probs) -> None:
        pass


def parents_first(parents: list[int]) -> bool:
    return all(-1 <= p < j for j, p in enumerate(parents))


# ------------------------------------------------------------------- n-gram
def test_ngram_lookup():
    ng = NGramProposer(1, 3)
    hist = [1, 2, 3, 4, 9, 9, 1, 2, 3]
    tokens, conf = ng.lookup(hist, 2)
    assert tokens == [4, 9]
    # one earlier occurrence of the 3-gram, followed by 4: agreement (1 + 1) / (1 + 2), and
    # the match the i-th token rests on is 3 + i tokens long
    assert conf == pytest.approx([2 / 3 * (1 - 0.5 ** 3), 2 / 3 * (1 - 0.5 ** 4)])
    assert ng.lookup([5, 6, 7], 3) == ([], [])
    assert ng.lookup([1, 2, 1], 4)[0] == [2, 1]
    # a 1-gram seen three times, followed by 7, 7 and 8: the latest continuation (8) is
    # proposed, with the agreement of one in three
    tokens, conf = ng.lookup([5, 7, 5, 7, 5, 8, 5], 1)
    assert tokens == [8] and conf == pytest.approx([(1 + 1) / (3 + 2) * 0.5])
    with pytest.raises(ValueError):
        NGramProposer(3, 2)


def test_ngram_prefers_the_longest_match_and_respects_k_and_min_n():
    ng = NGramProposer(1, 4)
    # "2 3" was last followed by 8, but the longer suffix "1 2 3" only by 4
    hist = [1, 2, 3, 4, 5, 2, 3, 8, 1, 2, 3]
    assert ng.lookup(hist, 1)[0] == [4]
    assert ng.lookup(hist, 3)[0] == [4, 5, 2]
    assert ng.lookup(hist, 0) == ([], [])
    assert NGramProposer(2, 4).lookup([7, 1, 7], 2) == ([], [])  # only a 1-gram repeats
    drafts = ng.propose([0, 1], [hist, [1, 2, 3]], [2, 2], [GREEDY] * 2, [None] * 2, Plan())
    assert drafts[0].tokens == [4, 5] and drafts[0].parents is None and len(drafts[0].conf) == 2
    assert drafts[1].tokens == [] and ng.forwards == 0


# -------------------------------------------------------------- small draft
@pytest.fixture(scope="module")
def smol(smollm2_q4):
    """SmolLM2 as its own draft, a prompt, and the model's greedy continuation of it."""
    from speccompile.runtime.model import Model
    from speccompile.runtime.tokenizer import load_tokenizer

    model_dir, lib = smollm2_q4
    model = Model(model_dir, lib)
    ids = load_tokenizer(model_dir).encode("The quick brown fox jumps over the lazy dog. Then the fox").ids
    kv = model.create_kv_cache(256)
    kv.add_sequence(0)
    logits = model.prefill(kv, [0], [ids])
    ref = []
    for _ in range(12):
        ref.append(int(np.argmax(logits[0])))
        logits = model.decode(kv, [0], [ref[-1]])
    return model, ids, ref


def _prefilled(model, prompt: list[int], chunk: int = 7) -> SmallDraftProposer:
    prop = SmallDraftProposer(model, 1024)
    prop.add_sequence(0, prompt)
    for start in range(0, len(prompt), chunk):
        prop.prefill([0], [prompt[start:start + chunk]], [start])
    return prop


@pytest.mark.real_model
def test_small_draft_follows_the_target_prefill_then_drafts_its_greedy_tokens(smol):
    model, prompt, ref = smol
    prop = _prefilled(model, prompt)
    assert prop.cached[0] == prompt and prop.kv.length(0) == len(prompt)
    history = prompt + ref[:1]
    plan = Plan()
    [d] = prop.propose([0], [history], [4], [GREEDY], [None], plan)
    assert d.tokens == ref[1:5] and d.probs is None
    assert len(d.conf) == 4 and all(0 < c <= 1 for c in d.conf)
    # one forward catching up the pending token, one per further draft, each asked first
    assert prop.forwards == 4 and plan.asked == [1, 1, 1, 1] and prop.last_catch_up == 1
    assert prop.cached[0] == history + ref[1:4] and prop.kv.length(0) == len(history) + 3

    # the target took two drafts and a bonus that differs from the third: roll back to them
    bonus = (ref[3] + 1) % model.vocab_size
    prop.on_commit(0, history + ref[1:3] + [bonus])
    assert prop.cached[0] == history + ref[1:3] and prop.kv.length(0) == len(history) + 2
    assert prop.backlog(0, history + ref[1:3] + [bonus]) == 1
    # ... or all four and its own bonus: nothing to roll back, two tokens to catch up on
    prop = _prefilled(model, prompt)
    prop.propose([0], [history], [4], [GREEDY], [None], Plan())
    full = prompt + ref[:6]
    prop.on_commit(0, full)
    assert prop.cached[0] == prompt + ref[:4] and prop.backlog(0, full) == 2
    [d] = prop.propose([0], [full], [2], [GREEDY], [None], Plan())
    assert prop.last_catch_up == 2 and d.tokens == ref[6:8]


@pytest.mark.real_model
def test_small_draft_runs_only_the_forwards_the_plan_allows(smol):
    model, prompt, ref = smol
    prop = _prefilled(model, prompt)
    history = prompt + ref[:1]
    [d] = prop.propose([0], [history], [4], [GREEDY], [None], Plan([False]))
    assert d.tokens == [] and prop.forwards == 0 and prop.cached[0] == prompt
    [d] = prop.propose([0], [history], [4], [GREEDY], [None], Plan([True, True, False]))
    assert d.tokens == ref[1:3] and prop.forwards == 2  # the catch-up and one decode
    [d] = prop.propose([0], [history], [0], [GREEDY], [None], Plan())
    assert d.tokens == [] and prop.forwards == 2  # k = 0: this sequence is not drafted for


@pytest.mark.real_model
def test_small_draft_catch_up_and_its_backlog_limit(smol, monkeypatch):
    """A sequence the draft never saw (attached while drafting was off, its prefill chunks
    skipped) must catch up on its whole history before drafting; over MAX_BACKLOG / batch
    tokens it is left out of the step instead, and the others still draft."""
    model, prompt, ref = smol
    prop = _prefilled(model, prompt)
    prop.add_sequence(1, prompt)
    prop.prefill([1], [prompt[7:14]], [7])  # a chunk after one the draft skipped: not taken
    assert prop.cached[1] == []
    history = prompt + ref[:1]
    monkeypatch.setattr(SmallDraftProposer, "MAX_BACKLOG", 2 * (len(history) - 1))
    a, b = prop.propose([0, 1], [history, history], [2, 2], [GREEDY] * 2, [None] * 2, Plan())
    assert a.tokens == ref[1:3] and b.tokens == [] and prop.cached[1] == []
    monkeypatch.setattr(SmallDraftProposer, "MAX_BACKLOG", 256)
    prop.on_commit(0, prompt)  # (rolled back to before the pending token, as in the first step)
    a, b = prop.propose([0, 1], [history, history], [2, 2], [GREEDY] * 2, [None] * 2, Plan())
    assert prop.last_catch_up == len(history) and a.tokens == b.tokens == ref[1:3]


@pytest.mark.real_model
def test_small_draft_sampling_gives_q_and_is_seeded(smol):
    model, prompt, ref = smol
    prop = _prefilled(model, prompt)
    history = prompt + ref[:1]
    sp = SamplingParams(temperature=0.9, top_p=0.9)
    [d] = prop.propose([0], [history], [3], [sp], [np.random.default_rng(4)], Plan())
    assert d.probs.shape == (3, model.vocab_size)
    assert np.allclose(d.probs.sum(axis=1), 1, atol=1e-5)
    assert d.conf == pytest.approx([float(d.probs[i, t]) for i, t in enumerate(d.tokens)])
    assert all(d.probs[i, t] > 0 for i, t in enumerate(d.tokens))
    prop.on_commit(0, prompt)  # roll back to before the pending token and draft again
    [again] = prop.propose([0], [history], [3], [sp], [np.random.default_rng(4)], Plan())
    assert again.tokens == d.tokens and np.array_equal(again.probs, d.probs)


# -------------------------------------------------------------------- heads
def test_top_tokens_order_ties_and_log_probabilities():
    row = np.array([1.0, 3.0, 3.0, 0.5, 2.0])
    idx, logp = top_tokens(row, 3)
    assert idx.tolist() == [1, 2, 4]  # equal logits: the lower id first
    lse = np.log(np.exp(row).sum())
    assert logp == pytest.approx(row[[1, 2, 4]] - lse)
    idx, logp = top_tokens(row, 1)
    assert idx.tolist() == [1] and logp == pytest.approx([3.0 - lse])


V, H = 16, 4


def ramp(states: np.ndarray) -> np.ndarray:
    """Logits whose ranking starts at each row's state: token s, then s+1, ... (mod V)."""
    return -((np.arange(V)[None, :] - np.asarray(states)[:, None]) % V).astype(np.float64)


class Out:
    def __init__(self, a):
        self.a = a

    def numpy(self):
        return self.a


class FakeEagleHead(HostDraftCalls):
    """Feature f, token t -> predicted feature [(3 f[0] + t) mod V, 0...]; its logits rank
    tokens from that state on. Every forward's tokens, features and rows are recorded. It
    drafts through the host path (HostDraftCalls), as a head without draft_step does."""

    vocab_ids = None
    hidden_size = H
    features = "hidden"  # an EAGLE-1 head: rows built from the target's final hidden states
    max_forward_tokens = 2048  # rows one call takes (a library's prefill_chunk_size)

    def __init__(self):
        self.calls = []

    def create_kv_cache(self, tokens: int) -> PagedKV:
        return PagedKV(None, -(-tokens // PAGE))

    def forward(self, target, kv, batch, tokens, feats):
        self.calls.append([np.asarray(tokens).tolist(), np.asarray(feats)[:, 0].tolist(), batch.arrays[0].size])
        out = np.zeros((len(tokens), H))
        out[:, 0] = (3 * np.asarray(feats)[:, 0] + np.asarray(tokens)) % V
        return Out(out)

    def forward_target(self, target, kv, batch, tokens, feats):  # an EAGLE-1 head reads them as they are
        return self.forward(target, kv, batch, tokens, feats)

    def logits(self, target, feats):
        return ramp(np.asarray(feats)[:, 0])


def _eagle(width: int, max_nodes: int = 64, limit: int = 2048):
    head = FakeEagleHead()
    head.max_forward_tokens = limit
    prop = EagleProposer(head, SimpleNamespace(vocab_size=V, max_forward_tokens=2048), 512, width, max_nodes)
    prompt = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9]  # drafts' scratch rows cross a page
    prop.add_sequence(0, prompt)
    feats = np.zeros((len(prompt), H))
    feats[:, 0] = np.arange(len(prompt))
    prop.observe_hidden(0, 0, feats)  # the target's features of the prompt, at prefill
    return prop, head, prompt + [6]  # + the token the prefill gave


def test_eagle_catches_up_on_true_features_then_drafts_on_scratch_rows():
    prop, head, history = _eagle(width=1)
    P = len(history) - 1
    [d] = prop.propose([0], [history], [3], [GREEDY], [None], Plan())
    # row i pairs feature i with token i + 1: the head input is shifted one token left
    assert head.calls[0][:2] == [history[1:], list(range(P))]
    assert d.parents is None and len(d.tokens) == 3 and len(head.calls) == 3 and prop.forwards == 3
    s = (3 * (P - 1) + history[-1]) % V  # the last true row's predicted state
    assert d.tokens[0] == s and d.conf[0] == pytest.approx(np.exp(top_tokens(ramp([s])[0], 1)[1][0]))
    # drafting wrote scratch rows only: the cache holds the true rows, no page beyond them
    assert prop.kv.length(0) == P and len(prop.kv.seqs[0].pages) == -(-P // PAGE)
    with pytest.raises(RuntimeError, match=f"position 3 arrived, {P} expected"):
        prop.observe_hidden(0, 3, np.zeros((1, H)))
    # verified: one draft and a bonus; the target's features of [last, draft] arrive next
    history2 = history + [d.tokens[0], 11]
    prop.observe_hidden(0, P, np.full((2, H), 5.0))
    prop.propose([0], [history2], [1], [GREEDY], [None], Plan())
    assert head.calls[3][:2] == [history2[P + 1:], [5.0, 5.0]] and prop.kv.length(0) == P + 2
    prop.observe_hidden(99, 0, np.zeros((1, H)))  # a sequence attached with drafting off: ignored


def test_vocab_coverage_scales_the_first_token_estimate_by_recent_in_vocabulary_tokens():
    from speccompile.runtime.drafters.eagle_heads import COVERAGE_DECAY, VocabCoverage

    full = VocabCoverage(None)  # a head over the whole vocabulary: the estimate stays the plan's
    full.add(0, [1, 2])
    assert full.first_tokens([0], [[1, 2, 3]], Plan()) == [(1.0, Plan.FIRST)]
    cov = VocabCoverage(np.array([2, 5, 7]))
    cov.add(0, [100, 200, 300])  # the prompt's tokens do not count, even out of the vocabulary
    assert cov.first_tokens([0], [[100, 200, 300]], Plan()) == [(1.0, Plan.FIRST)]
    d = COVERAGE_DECAY
    # two new tokens out of the vocabulary (one past its largest id), then one in it
    [(_, a)] = cov.first_tokens([0], [[100, 200, 300, 9, 10**6]], Plan())
    assert a == pytest.approx(Plan.FIRST * d * d)
    assert cov.update(0, [100, 200, 300, 9, 10**6, 5]) == pytest.approx(d ** 3 + (1 - d))
    assert cov.update(0, [100, 200, 300, 9, 10**6, 5]) == pytest.approx(d ** 3 + (1 - d))  # counted once
    cov.remove(0)
    assert cov.update(0, [1, 2]) == 1.0  # unknown sequence: counted from now on


def test_eagle_asks_the_plan_with_its_vocabulary_coverage():
    """A head with a reduced vocabulary: the first should_draft of a step weighs the
    first-token estimate times the sequence's recent in-vocabulary rate."""
    head = FakeEagleHead()
    head.vocab_ids = np.arange(8)  # tokens 0..7 of V = 16
    prop = EagleProposer(head, SimpleNamespace(vocab_size=V, max_forward_tokens=2048), 512)
    prompt = [3, 1, 4]
    prop.add_sequence(0, prompt)
    prop.observe_hidden(0, 0, np.zeros((len(prompt), H)))
    plan = Plan([False])
    [d] = prop.propose([0], [prompt + [12, 13, 14]], [3], [GREEDY], [None], plan)
    assert len(d) == 0
    from speccompile.runtime.drafters.eagle_heads import COVERAGE_DECAY

    assert plan.expansions[0] == [(1.0, pytest.approx(Plan.FIRST * COVERAGE_DECAY ** 3))] and head.calls == []


def test_eagle_catch_up_over_more_rows_than_one_head_call_is_split():
    """15 pending rows and a head that takes 4 per call: the catch-up runs as chain forwards
    of 4, 4, 4 and 3 rows over the same pairs, and drafts the same."""
    whole, _, history = _eagle(width=1)
    split, head, _ = _eagle(width=1, limit=4)
    [a] = whole.propose([0], [history], [3], [GREEDY], [None], Plan())
    [b] = split.propose([0], [history], [3], [GREEDY], [None], Plan())
    assert (a.tokens, a.conf) == (b.tokens, b.conf)
    assert [c[:2] for c in head.calls[:4]] == [[history[1 + i: 5 + i], list(range(i, min(i + 4, 15)))]
                                              for i in range(0, 15, 4)]
    assert split.kv.length(0) == whole.kv.length(0) == len(history) - 1 and split.forwards == whole.forwards + 3


def test_eagle_tree_keeps_the_most_probable_nodes_parents_first():
    prop, _, history = _eagle(width=2)
    [tree] = prop.propose([0], [history], [3], [GREEDY], [None], Plan())
    assert parents_first(tree.parents) and 2 < len(tree) <= 2 + 4 + 8
    s = (3 * (len(history) - 2) + history[-1]) % V
    roots = [t for t, p in zip(tree.tokens, tree.parents) if p < 0]
    assert roots == [s, (s + 1) % V]  # the root's two best tokens
    prop3, _, _ = _eagle(width=2)
    [small] = prop3.propose([0], [history], [3], [GREEDY], [None], Plan(), node_limit=3)
    chain, _, _ = _eagle(width=1)
    [top1] = chain.propose([0], [history], [3], [GREEDY], [None], Plan())
    # P(top-1 child of top-1) = 0.63^2 beats the second root token's 0.23: three deep
    assert small.parents == [-1, 0, 1] and small.tokens == top1.tokens


def test_scratch_rows_plan_what_plan_tree_plans():
    """The head's scratch rows planned depth by depth (ScratchRows, from per-row arrays) get
    the metadata plan_tree gives the whole tree at once, row for row, across pages and for
    several sequences of different lengths."""
    from speccompile.runtime.drafters.eagle import ScratchRows

    rng = np.random.default_rng(0)
    kv = PagedKV(None, 64)
    lengths = {7: 5, 8: PAGE - 2, 9: 0}
    for s, n in lengths.items():
        kv.add_sequence(s)
        kv.plan_chain([s], [n])
    rows = ScratchRows(kv, list(lengths))
    parents = {s: [] for s in lengths}  # local parent row of each scratch row, per sequence
    index: list[tuple[int, int]] = []  # (sequence, local row) of each planned row
    planned = []
    frontier = {s: [-1] for s in lengths}
    for depth in range(4):
        seqs, par = [], []
        for b, s in enumerate(lengths):
            for p in frontier[s]:
                for _ in range(int(rng.integers(1, 4))):
                    seqs.append(b)
                    par.append(-1 if p < 0 else index.index((s, p)))
        batch, new = rows.plan(np.asarray(seqs), np.asarray(par))
        frontier = {s: [] for s in lengths}
        for b_row, (b, p) in enumerate(zip(seqs, par)):
            s = list(lengths)[b]
            frontier[s].append(len(parents[s]))
            index.append((s, len(parents[s])))
            parents[s].append(-1 if p < 0 else index[p][1])
        planned.append(batch)
    full = kv.plan_tree(list(lengths), [parents[s] for s in lengths])
    offset = np.concatenate([[0], np.cumsum([len(parents[s]) for s in lengths])])
    order = [offset[list(lengths).index(s)] + j for s, j in index]  # plan_tree's row of each planned row
    got = {k: np.concatenate([b.named[k] for b in planned]) for k in ("positions", "write_slots", "token_prefix",
                                                                      "extra_len")}
    for k, a in got.items():
        assert a.tolist() == full.named[k][order].tolist(), k
    extra = [row[:n].tolist() for b in planned for row, n in zip(b.named["extra_slots"], b.named["extra_len"])]
    assert extra == [full.named["extra_slots"][i, : full.named["extra_len"][i]].tolist() for i in order]
    last = planned[-1]
    assert last.named["page_table"].tolist() == full.named["page_table"].tolist()
    assert [list(lengths)[i] for i in last.named["token_seq"]] == [s for s, _ in index[-len(last.named["positions"]):]]


class FakeMedusaHeads:
    """Head j ranks tokens from (feature + j + 1) on."""

    num_heads, vocab_ids, hidden_size = 3, None, H

    def forward(self, feats):
        return np.stack([ramp(np.asarray(feats)[:, 0] + j + 1) for j in range(self.num_heads)])


def test_medusa_tree_is_the_most_probable_rank_paths_parents_first():
    prop = MedusaProposer(FakeMedusaHeads(), tree_width=3, max_nodes=64)
    acc = prop.accuracy()
    every = [p for d in range(1, 4) for p in itertools.product(range(3), repeat=d)]
    prob = {p: np.prod([acc[j, r] for j, r in enumerate(p)]) for p in every}
    for budget in (1, 2, 5, 13, 40, 200):
        paths = prop.tree(3, budget)
        assert len(paths) == min(budget, len(every))
        assert paths == sorted(paths, key=lambda p: (len(p), p))
        assert all(p[:-1] in paths[:i] for i, p in enumerate(paths) if len(p) > 1)
        rest = [prob[p] for p in every if p not in paths]
        assert not rest or min(prob[p] for p in paths) >= max(rest) - 1e-12


def test_medusa_drafts_each_heads_ranked_tokens_from_the_last_feature():
    prop = MedusaProposer(FakeMedusaHeads(), tree_width=2, max_nodes=5)
    prop.add_sequence(0, [1, 2, 3])
    prop.observe_hidden(0, 0, np.array([[0.0] * H, [0.0] * H, [7.0] + [0.0] * (H - 1)]))
    history = [1, 2, 3, 4]
    [d] = prop.propose([0], [history], [3], [GREEDY], [None], Plan())
    paths = prop.tree(3, 5)
    assert len(d) == 5 and parents_first(d.parents)
    for token, path in zip(d.tokens, paths):  # head (depth - 1), rank path[-1], from state 7
        assert token == (7 + len(path) + path[-1]) % V
    with pytest.raises(RuntimeError, match="position 2"):
        prop.propose([0], [history + [5]], [3], [GREEDY], [None], Plan())
    chain = MedusaProposer(FakeMedusaHeads(), tree_width=1)
    chain.add_sequence(0, [1, 2, 3])
    chain.observe_hidden(0, 2, np.array([[7.0] + [0.0] * (H - 1)]))
    [c] = chain.propose([0], [history], [2], [GREEDY], [None], Plan())
    assert c.tokens == [8, 9] and c.parents is None
    # scored once committed: head 0 said 8 for position 4, head 1 said 9 for position 5
    tries = chain.tries.copy()
    chain.on_commit(0, history + [8])
    assert (chain.tries - tries).tolist() == [1, 0, 0] and chain.proposed[0]
    chain.on_commit(0, history + [8, 2])
    assert (chain.tries - tries).tolist() == [1, 1, 0] and not chain.proposed[0]
