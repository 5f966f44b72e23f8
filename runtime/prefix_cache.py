"""The prefix cache: finished sequences kept, so that a later prompt that starts with the same
tokens reuses their KV instead of prefilling it again.

Why: a chat client resends the whole conversation every turn (``chat``, and every OpenAI
client of ``serve``), an agent resends its growing context, and many requests share a system
prompt. On a 2-core Zen 4, Qwen2.5-Coder-1.5B prefills ~200 tokens a second: the fifth turn
of a coding chat (941 prompt tokens) waited 5.1-5.6 s for its first token, nearly all of it
recomputing KV the engine had just freed; taking the kept sequence over, 0.16 s
(bench/results/*prefix-cache*-s17.json).

How (MLC-LLM's "recycling" sequences, ``prefix_cache_max_num_recycling_seqs``): at most
``capacity`` finished sequences keep their pages -- the target's and their proposer's state --
and the token ids those pages hold. A new sequence whose prompt shares at least
``MIN_REUSE`` leading tokens with one of them takes it over: its sequence id, its pages and
its proposer state, rolled back to the shared prefix (``Proposer.resume`` says how far its
own state holds); only the rest of the prompt is prefilled. One request takes a kept
sequence whole, so no page is ever shared by two live sequences: nothing is copied or
reference-counted, and a prompt that shares only a system prompt with a kept conversation
uses it up (least recently kept entries go first, and so do entries past ``capacity``).

Exactness: a token's KV rows depend only on the tokens up to it, and the kernels compute a
token's rows the same way in a prefill chunk, a decode step or a verify (batch invariance:
greedy losslessness already rests on it), so the kept rows are bit for bit what prefilling
the prompt would write, and every output is what a fresh engine would give
(tests/runtime/test_prefix_cache.py checks each speculative mode).

Memory: kept pages count as free (runtime/kv_cache.py): a reservation that lacks pages
reclaims kept sequences, oldest first, before it fails, so the cache never costs a
request room. The proposers' own caches are at least the target's size
(``head_kv_tokens``, a draft model's cache) and hold at most a kept sequence's rows, so
they never fill before the target's does.
"""
from __future__ import annotations

from collections import OrderedDict

import numpy as np

MIN_REUSE = 16  # fewer shared tokens are not worth using up a kept sequence for


def shared_prefix(a: list[int], b: list[int]) -> int:
    """How many leading tokens ``a`` and ``b`` have in common."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(diff[0]) if diff.size else n


class PrefixCache:
    """The engine's kept sequences: ``keep`` at a sequence's end, ``take`` at a new one's
    start, ``reclaim`` when the target's KV cache needs pages."""

    def __init__(self, engine, capacity: int):
        self.engine, self.capacity = engine, capacity
        # seq id -> (the tokens its KV rows hold, the proposer holding its state or None, its tenant), oldest first
        self.kept: OrderedDict[int, tuple[list[int], object, str | None]] = OrderedDict()
        engine.kv.reclaim = self.reclaim

    def keep(self, seq) -> bool:
        """Keep a finished sequence instead of freeing it (False: not kept, free it). Its
        KV is cut to the tokens of its history (a stop may end the text before the last
        accepted draft) less the last one, which no forward has read."""
        kv, sid = self.engine.kv, seq.seq_id
        if self.capacity <= 0 or sid not in kv.seqs:
            return False
        n = min(kv.length(sid), len(seq.history) - 1)
        kv.popn(sid, kv.length(sid) - n)
        proposer = self.engine.proposer
        self.kept[sid] = (list(seq.history[:n]), proposer, seq.tenant)
        kv.recycle(sid)
        if proposer is not None:
            proposer.on_finish(sid)
            if self.engine.policy is not None:
                self.engine.policy.acceptance.forget(sid)
        while len(self.kept) > self.capacity:
            self.reclaim()
        return True

    def take(self, seq) -> int:
        """Give ``seq`` (a new request, not yet attached) the kept sequence sharing the most
        leading tokens with its prompt, if at least MIN_REUSE: ``seq`` takes its id, and its
        KV holds the shared tokens. Of those sharing as many, the one that loses the fewest
        tokens past them: a new conversation sharing only the system prompt takes the shortest
        kept one, not the long conversation its user may continue. Returns how many prompt
        tokens need no prefill (0: none taken). At least the prompt's last token is always
        prefilled (its logits give the first output token)."""
        engine, best, shared, lost = self.engine, None, 0, 0
        if engine.feature_sink is not None:  # capturing features for training: every prompt token's are wanted
            return 0
        for sid, (tokens, proposer, tenant) in self.kept.items():
            # state kept with speculation off has no proposer side; and one API key's requests never
            # take another's (as the suffix store keeps tenants apart), not even a shared system prompt
            if proposer is engine.proposer and tenant == seq.tenant:
                n = min(shared_prefix(tokens, seq.history), len(seq.history) - 1)
                if n > shared or (n == shared and best is not None and len(tokens) - n < lost):
                    best, shared, lost = sid, n, len(tokens) - n
        if best is None or shared < MIN_REUSE:
            return 0
        del self.kept[best]
        engine.kv.adopt(best)
        seq.seq_id = best
        if engine.proposer is not None:
            shared = engine.proposer.resume(best, seq.history, shared, seq.tenant)
            if engine.policy is not None:
                engine.policy.acceptance.new_prompt(best)
        engine.kv.popn(best, engine.kv.length(best) - shared)
        return shared

    def reclaim(self) -> bool:
        """Free the oldest kept sequence (False if none is kept)."""
        if not self.kept:
            return False
        sid, (_, proposer, _) = self.kept.popitem(last=False)
        self.engine.kv.remove_sequence(sid)
        if proposer is not None:
            proposer.remove_sequence(sid)
        return True
