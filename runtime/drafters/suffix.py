"""Suffix drafting: continuations of the current text found in the text seen so far.

Why. An answer often copies: a summary repeats spans of its document, code repeats the
prompt's identifiers and its own earlier lines, a second request resembles the first. Where
it copies, the text already holds the next tokens, and drafting them costs no model at all.
The n-gram proposer found the latest match of the last 1-4 tokens and proposed what followed
it once, as one chain; this index counts *every* continuation of every context of up to
``MAX_MATCH`` tokens, so a draft follows the most frequent one, branches where the text
branched (a token tree, best-first by frequency), and says how sure it is.

- ``SuffixIndex``: for one token stream, the successor counts of each context of 1..max_n
  tokens, extended token by token as the stream grows (O(max_n) per token).
- ``SuffixStore``: the indexes of recent finished requests, one per tenant (in a server, the
  API key a request came with: one tenant's text never drafts for another's), bounded in
  tokens; the oldest request is forgotten first (its counts subtracted).
- ``SuffixProposer`` (``--speculative-mode suffix``): per step, a tree grown best-first from
  the sequence's own index, the index of the client's prediction (runtime/prediction.py), and
  its tenant's store -- at each node the source whose context matches longest -- up to the draft depth, ``spec_tree_width`` children per node and the
  node budget; the plan (runtime/adaptive.py) keeps the nodes worth their rows. A node's
  confidence is its continuation's smoothed frequency, discounted by how short the matched
  context is; the acceptance model calibrates it like any proposer's.

Drafts need not be right to be safe: verification keeps only what the target itself
produces (greedy) or its distribution (sampling), so the index can be approximate.
"""
from __future__ import annotations

import heapq
from collections import OrderedDict
from pathlib import Path

import numpy as np

from ..acceptance import Draft
from ..costs import time_min
from ..speculative import DEFAULT_SUFFIX_STORE_TOKENS, drafter_mode, proposer_class

MAX_MATCH = 8  # longest context (tokens) a sequence's own index matches
# A prediction (Predicted Outputs) drafts only where at least this many tokens of context match
# it: an unrelated prediction still shares one- and two-token contexts ("```", a newline and an
# indent) with any answer, and drafting from those cost a code answer 26% of its speed
# (Qwen2.5-Coder-1.5B, a README as the prediction, Zen 5).
PREDICTION_MIN_MATCH = 3
STORE_MATCH = 4  # ... and a tenant's store (its memory grows with this)
PACK = 1 << 32  # a context's single successor and its count, packed: token * PACK + count


class SuffixIndex:
    """Successor counts of every context of 1..max_n tokens of one token stream.

    Memory is what bounds it (a sequence of 8k tokens has ~60k contexts), so a context is kept
    by its hash and, while it has one successor (most do), that successor and its count as one
    packed int; a second successor makes it a dict. Two contexts whose hashes collide merely
    draft a wrong token, which verification rejects. ~0.9 KB per token at max_n 8."""

    def __init__(self, max_n: int = MAX_MATCH):
        self.max_n = max_n
        self.tokens: list[int] = []
        self.next: dict[int, int | dict[int, int]] = {}  # hash(context) -> packed (token, count) or {token: count}

    def __len__(self) -> int:
        return len(self.tokens)

    def extend(self, tokens: list[int], sign: int = 1) -> None:
        """Append ``tokens`` to the stream, counting each after its 1..max_n preceding tokens
        (``sign`` -1 subtracts a stream's counts again: ``SuffixStore`` forgetting one)."""
        seq, nxt = self.tokens, self.next
        for tok in tokens:
            end = len(seq)
            for n in range(1, min(self.max_n, end) + 1):
                key = hash(tuple(seq[end - n:]))
                have = nxt.get(key)
                if have is None:
                    if sign > 0:
                        nxt[key] = tok * PACK + 1
                elif type(have) is int:
                    t, c = divmod(have, PACK)
                    if t != tok:
                        if sign > 0:
                            nxt[key] = {t: c, tok: 1}
                    elif c + sign > 0:
                        nxt[key] = have + sign
                    else:
                        del nxt[key]
                else:
                    c = have.get(tok, 0) + sign
                    if c > 0:
                        have[tok] = c
                    else:
                        have.pop(tok, None)
                        if len(have) == 1:
                            ((t, c),) = have.items()
                            nxt[key] = t * PACK + c
            seq.append(tok)

    def successors(self, context: list[int] | tuple[int, ...]) -> dict[int, int] | None:
        """{next token: count} after exactly this context (None if never continued)."""
        have = self.next.get(hash(tuple(context)))
        if have is None:
            return None
        if type(have) is int:
            t, c = divmod(have, PACK)
            return {t: c}
        return have

    def match(self, context: list[int] | tuple[int, ...]) -> tuple[int, dict[int, int] | None]:
        """(n, successor counts) of the longest suffix of ``context`` (up to max_n tokens)
        seen in the stream with a continuation; (0, None) if none."""
        for n in range(min(self.max_n, len(context)), 0, -1):
            succ = self.successors(context[len(context) - n:])
            if succ:
                return n, succ
        return 0, None


class SuffixStore:
    """Recent finished requests' text, one ``SuffixIndex`` per tenant, each bounded to
    ``max_tokens``. Requests are separate streams: no context spans two of them."""

    def __init__(self, max_tokens: int = DEFAULT_SUFFIX_STORE_TOKENS, max_n: int = STORE_MATCH):
        self.max_tokens, self.max_n = max_tokens, max_n
        self.tenants: dict[str, tuple[SuffixIndex, OrderedDict]] = {}

    def add(self, tenant: str, key: int, tokens: list[int]) -> None:
        """Keep ``tokens`` (a request's prompt and answer) under ``key``, replacing what that
        key held (a preempted request that finished later is kept once)."""
        if self.max_tokens <= 0 or not tokens:
            return
        index, kept = self.tenants.setdefault(tenant, (SuffixIndex(self.max_n), OrderedDict()))
        self._forget(index, kept, key)
        tokens = list(tokens[-self.max_tokens:])
        kept[key] = tokens
        index.extend(tokens)
        index.tokens = []  # streams are separate: the next one starts without context
        total = sum(len(t) for t in kept.values())
        while total > self.max_tokens:
            oldest = next(iter(kept))
            total -= len(kept[oldest])
            self._forget(index, kept, oldest)

    @staticmethod
    def _forget(index: SuffixIndex, kept: OrderedDict, key: int) -> None:
        tokens = kept.pop(key, None)
        if tokens is not None:
            index.extend(tokens, sign=-1)
            index.tokens = []

    def index(self, tenant: str | None) -> SuffixIndex | None:
        entry = self.tenants.get(tenant) if tenant is not None else None
        return entry[0] if entry else None


def confidence(count: int, total: int, n: int) -> float:
    """A continuation seen ``count`` of ``total`` times after an ``n``-token context:
    smoothed frequency (one sighting is weak evidence), discounted for short contexts."""
    return (count + 1) / (total + 2) * (1.0 - 0.5 ** n)


class SuffixProposer:
    """``--speculative-mode suffix``: token trees from the sequence's text and its tenant's
    recent requests (module docstring). No model, no forward: its cost is host time. Given a
    drafter (``--additional-models``), SpeculativeConfig.build merges the two:
    runtime/drafters/merged.py."""

    name = "suffix"
    supports_trees = True
    additional_model = "a drafter (a draft model, or an EAGLE or Medusa head) to merge with, optionally"
    additional_model_form = "DIR,LIB"
    additional_model_optional = True
    free_drafts = True
    features = ""

    @classmethod
    def check(cls, config, model_dir: Path) -> None:
        """The drafter's own checks, if one is given."""
        if config.additional_models:
            proposer_class(drafter_mode(config.additional_models)).check(config, model_dir)

    merges_drafter = True  # with --additional-models, SpeculativeConfig.build merges it with that drafter

    @classmethod
    def build(cls, config, target, kv_tokens: int, max_num_sequence: int, device: str):
        """The index alone (SpeculativeConfig.build composes it with a drafter)."""
        return cls(config.spec_tree_width, config.spec_tree_nodes, SuffixStore(config.suffix_store_tokens))

    def __init__(self, tree_width: int = 1, max_nodes: int = 64, store: SuffixStore | None = None):
        self.width, self.max_nodes = tree_width, max_nodes
        self.store = store if store is not None else SuffixStore()
        self.seqs: dict[int, SuffixIndex] = {}
        self.tenant: dict[int, str | None] = {}
        self.predicted: dict[int, SuffixIndex] = {}  # a sequence's prediction (Predicted Outputs)
        self.forwards = 0  # it runs none

    def measure(self, rows: list[int]) -> tuple[dict[int, float], float]:
        """Host seconds of drafting ``r`` sequences (a 512-token text with repeats)."""
        seq = SuffixIndex()
        seq.extend((np.arange(512) * 7919 % 211).tolist())
        one = time_min(lambda: self._tree(seq, [], seq.tokens, 8), 3)
        return {r: r * one for r in rows}, 0.0

    def add_sequence(self, seq_id: int, prompt: list[int], tenant: str | None = None) -> None:
        index = SuffixIndex()
        index.extend(prompt)
        self.seqs[seq_id], self.tenant[seq_id] = index, tenant

    def predict(self, seq_id: int, prediction: list[int]) -> None:
        """The client's prediction of the answer becomes a source for this sequence."""
        index = SuffixIndex()
        index.extend(prediction)
        self.predicted[seq_id] = index

    def remove_sequence(self, seq_id: int) -> None:
        """The sequence's text joins its tenant's store (if it has one)."""
        self.predicted.pop(seq_id, None)
        index, tenant = self.seqs.pop(seq_id, None), self.tenant.pop(seq_id, None)
        if index is not None and tenant is not None:
            self.store.add(tenant, seq_id, index.tokens)

    def on_finish(self, seq_id: int) -> None:
        """The finished text joins its tenant's store now, as at removal (the store keeps
        one text per sequence id: a later removal replaces it)."""
        index, tenant = self.seqs.get(seq_id), self.tenant.get(seq_id)
        if index is not None and tenant is not None:
            self.store.add(tenant, seq_id, index.tokens)

    def resume(self, seq_id: int, prompt: list[int], keep: int, tenant: str | None = None) -> int:
        """A new request's index over its prompt (what was kept is the earlier request's text:
        it does not join the store, the new prompt holds it; nor does its prediction carry over)."""
        self.predicted.pop(seq_id, None)
        self.add_sequence(seq_id, prompt, tenant)
        return keep

    def on_commit(self, seq_id: int, history: list[int]) -> None:
        index = self.seqs[seq_id]
        index.extend(history[len(index):])

    def prefill(self, seq_ids: list[int], chunks: list[list[int]], starts: list[int]) -> None:
        pass

    def observe_hidden(self, seq_id: int, position: int, hidden: np.ndarray) -> None:
        pass

    def propose(self, seq_ids, histories, ks, sampling, rngs, plan, node_limit: int | None = None) -> list[Draft]:
        budget = min(self.max_nodes, node_limit or self.max_nodes)
        drafts = []
        for sid, history, k in zip(seq_ids, histories, ks):
            index = self.seqs[sid]
            index.extend(history[len(index):])  # committed tokens the engine has not reported yet
            others = [(self.predicted.get(sid), PREDICTION_MIN_MATCH), (self.store.index(self.tenant.get(sid)), 1)]
            drafts.append(self._tree(index, [o for o in others if o[0] is not None], history, k, budget))
        return drafts

    def _tree(self, own: SuffixIndex, others: list[tuple[SuffixIndex, int]], history: list[int], depth: int,
              budget: int = 64) -> Draft:
        """Best-first by path frequency: the candidate node with the highest product of
        confidences along its path joins next, then its own continuations become candidates."""
        if depth <= 0 or budget <= 0:
            return Draft()
        tail = history[-MAX_MATCH:]
        tokens: list[int] = []
        parents: list[int] = []
        conf: list[float] = []
        heap: list = []
        order = 0  # tie-break: earlier candidates first (deterministic drafts)

        def push(parent: int, path: tuple[int, ...], p: float) -> None:
            nonlocal order
            for tok, c in self._continuations(own, others, tail, path):
                heapq.heappush(heap, (-p * c, order, parent, path, tok, c))
                order += 1

        push(-1, (), 1.0)
        while heap and len(tokens) < budget:
            neg, _, parent, path, tok, c = heapq.heappop(heap)
            tokens.append(tok)
            parents.append(parent)
            conf.append(c)
            if len(path) + 1 < depth:
                push(len(tokens) - 1, path + (tok,), -neg)
        if not tokens:
            return Draft()
        chain = all(p == i - 1 for i, p in enumerate(parents))
        return Draft(tokens, None if chain else parents, conf=conf)

    def _continuations(self, own: SuffixIndex, others: list[tuple[SuffixIndex, int]], tail: list[int],
                       path: tuple[int, ...]) -> list[tuple[int, float]]:
        """The ``width`` likeliest next tokens after ``tail + path``, with their confidences:
        from the source whose context matches longest (the first, the sequence's own, on a tie;
        then the prediction, then the tenant's store), among those matching at least their
        floor (each other source's second item)."""
        context = (tail + list(path))[-MAX_MATCH:]
        n, succ = own.match(context)
        for other, floor in others:
            n2, succ2 = other.match(context)
            if n2 > n and n2 >= floor:
                n, succ = n2, succ2
        if not succ:
            return []
        total = sum(succ.values())
        best = heapq.nlargest(self.width, succ.items(), key=lambda kv: kv[1])
        return [(tok, confidence(count, total, n)) for tok, count in best]
