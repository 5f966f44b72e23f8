"""One draft per step from two sources: the suffix index and a drafter (a draft model or an
EAGLE/Medusa head), merged into one token tree (``--speculative-mode suffix`` with
``--additional-models``, and the commands' default when a drafter is given).

Why. The best source differs per prompt and within one answer: a summary copies spans of
its document (the index drafts them for free, a head guesses), then writes new text (the
head drafts, the index has nothing); code repeats identifiers (the index) between new
lines (the head). Picking one mode per process leaves the other's steps on the table.

How a step runs.
- The index drafts first: host work only, no forward. Its nodes join the step's plan, so
  they raise the rate the drafter's forwards must beat.
- The drafter then sees the step through ``SourcePlan``: its nodes are priced by their own
  calibration (source 1: a head's probability 0.5 and an index match of confidence 0.5 are
  accepted at different rates), and its first forward is weighed by what the index leaves
  uncovered -- a sequence whose index draft's first token is accepted with probability 0.9
  expects a tenth of the drafter's first-token value. Where the index has a long confident
  match the drafter's forwards are skipped for that step by the plan itself, not by a
  threshold.
- The two drafts are merged as a trie: a node proposed by both is one node carrying the
  source whose calibrated acceptance is higher, so a shared prefix costs one verify row.
  The plan (runtime/adaptive.py) then keeps the nodes worth their rows, as for any draft.

Sampling (T > 0): deterministic drafts (the index, EAGLE and Medusa heads: one-hot q) merge
exactly, since recursive rejection sampling tests each sibling against the residual
distribution whatever chose it. A draft model's sampled tokens carry their own q, and a
sibling with the same token drawn by another source would double-count it, so for such a
sequence the step takes whichever of the two drafts expects more accepted tokens.
"""
from __future__ import annotations

import time

from ..acceptance import Draft
from ..adaptive import node_probs

INDEX, DRAFTER = 0, 1  # the sources (runtime/adaptive.py SOURCES)


class SourcePlan:
    """The step's plan as the drafter sees it: its nodes priced by the drafter's calibration,
    and its first-token value reduced to what the index's draft leaves uncovered."""

    def __init__(self, plan, covered: dict):
        self._plan, self._covered = plan, covered  # seq id -> P that the index's depth-1 nodes hold the next token

    def __getattr__(self, name):
        return getattr(self._plan, name)

    def p(self, conf: float, seq=None, source: int = DRAFTER) -> float:
        return self._plan.p(conf, seq, source)

    def first(self, seq=None) -> float:
        return self._plan.first(seq) * (1.0 - self._covered.get(seq, 0.0))


class MergedProposer:
    """The suffix index (runtime/drafters/suffix.py) and a drafter, one tree per step (module doc).
    Composed by ``SpeculativeConfig.build`` when ``--additional-models`` names a drafter."""

    name = "suffix"
    supports_trees = True
    free_drafts = True  # the index's

    def __init__(self, index, drafter):
        self.index, self.drafter = index, drafter  # a SuffixProposer, a drafter's proposer
        for attr in ("additional_model", "additional_model_form", "additional_model_optional"):
            setattr(self, attr, getattr(index, attr))
        self.features = drafter.features  # the target forward returns what the drafter reads

    @property
    def forwards(self) -> int:
        return self.drafter.forwards

    def measure(self, rows: list[int]) -> tuple[dict[int, float], float]:
        """The drafter's forwards are what a plan prices per draft forward; the index's host
        time (microseconds) is charged to each step as it is spent."""
        return self.drafter.measure(rows)

    def add_sequence(self, seq_id: int, prompt: list[int], tenant: str | None = None) -> None:
        self.index.add_sequence(seq_id, prompt, tenant)
        self.drafter.add_sequence(seq_id, prompt, tenant)

    def remove_sequence(self, seq_id: int) -> None:
        self.index.remove_sequence(seq_id)
        self.drafter.remove_sequence(seq_id)

    def on_finish(self, seq_id: int) -> None:
        self.index.on_finish(seq_id)
        self.drafter.on_finish(seq_id)

    def predict(self, seq_id: int, prediction: list[int]) -> None:
        """Predicted Outputs: the client's draft text is one more source of the index."""
        self.index.predict(seq_id, prediction)

    def resume(self, seq_id: int, prompt: list[int], keep: int, tenant: str | None = None) -> int:
        return min(self.index.resume(seq_id, prompt, keep, tenant), self.drafter.resume(seq_id, prompt, keep, tenant))

    def prefill(self, seq_ids: list[int], chunks: list[list[int]], starts: list[int]) -> None:
        self.drafter.prefill(seq_ids, chunks, starts)

    def observe_hidden(self, seq_id: int, position: int, hidden) -> None:
        self.drafter.observe_hidden(seq_id, position, hidden)

    def on_commit(self, seq_id: int, history: list[int]) -> None:
        self.index.on_commit(seq_id, history)
        self.drafter.on_commit(seq_id, history)

    def propose(self, seq_ids, histories, ks, sampling, rngs, plan, node_limit: int | None = None) -> list[Draft]:
        t0 = time.perf_counter()
        own = self.index.propose(seq_ids, histories, ks, sampling, rngs, plan, node_limit)
        covered = {}
        for sid, d in zip(seq_ids, own):
            probs, depths = node_probs(d, lambda c, src: plan.p(c, sid, INDEX))
            plan.drafted(probs)
            covered[sid] = min(1.0, sum(p for p, depth in zip(probs, depths) if depth == 1))
        plan.spent(time.perf_counter() - t0)
        other = self.drafter.propose(seq_ids, histories, ks, sampling, rngs, SourcePlan(plan, covered), node_limit)
        budget = min(self.index.max_nodes, node_limit or self.index.max_nodes)
        return [merge(a, b, budget, lambda c, src, sid=sid: plan.p(c, sid, src))
                for sid, a, b in zip(seq_ids, own, other)]


def merge(own: Draft, other: Draft, budget: int, predict) -> Draft:
    """The index's draft ``own`` and the drafter's ``other`` as one draft of at most
    ``budget`` nodes, each node tagged with its source; ``predict(conf, source)``: a node's
    acceptance."""
    own = _tagged(own, INDEX)
    other = _tagged(other, DRAFTER)
    if not len(other):
        return own
    if not len(own):
        return other
    if other.probs is not None:  # sampled draft tokens: one source's draft, the likelier (module doc)
        return max((own, other), key=lambda d: sum(node_probs(d, predict)[0]))
    tokens, parents, conf, source = [], [], [], []
    at: dict[tuple[int, int], int] = {}  # (merged parent, token) -> merged node
    for d in (own, other):
        local: list[int] = []
        for j, (tok, par) in enumerate(zip(d.tokens, d.parent_list())):
            key = (local[par] if par >= 0 else -1, tok)
            m = at.get(key)
            if m is None:
                m = at[key] = len(tokens)
                tokens.append(tok)
                parents.append(key[0])
                conf.append(d.conf[j])
                source.append(d.source[j])
            elif predict(d.conf[j], d.source[j]) > predict(conf[m], source[m]):
                conf[m], source[m] = d.conf[j], d.source[j]
            local.append(m)
    merged = Draft(tokens, parents, conf=conf, source=source)
    if len(merged) > budget:  # the likeliest nodes: a child is never likelier than its parent
        probs, depths = node_probs(merged, predict)
        keep = sorted(range(len(merged)), key=lambda j: (-probs[j], depths[j], j))[:budget]
        merged = merged.subset(sorted(keep))
    if all(p == j - 1 for j, p in enumerate(merged.parent_list())):
        merged.parents = None
    return merged


def _tagged(d: Draft, source: int) -> Draft:
    """The draft with every node's source (and a confidence: 1.0 where it gave none)."""
    conf = d.conf if d.conf is not None else [1.0] * len(d)
    return Draft(d.tokens, d.parents, d.probs, conf, [source] * len(d))
