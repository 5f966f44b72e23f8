"""``n`` > 1: the choices of one prompt share its prefill.

Why: a request for several choices is one sequence per choice, all with the same prompt
(serving/choices.py). Prefilled separately, the prompt is computed ``n`` times -- on a
2-core CPU the prefill is most of a short answer's time. Here one choice prefills; every
other choice waits for it, then gets a copy of its prompt rows in the KV cache (the
``copy_kv_slots`` kernel a tree commit uses: copied pages, never shared ones, so nothing is
reference-counted and each choice goes on writing only its own) and samples its first token
from the same last-row logits, with its own sampling parameters and random stream.

Exactness: a KV row depends only on the tokens up to it, and the kernels compute it with the
same bits in any batch (batch invariance), so the copied rows and the logits row are what the
choice's own prefill would have given: each choice's output is what it gives alone.

Not shared: a head drafter (EAGLE, Medusa) reads every prompt token's features, which only
the target's prefill computes, so with one the choices prefill on their own. A draft model's
cache catches up, priced by its proposer, as after any prefill it skipped. A choice whose
source finished or was preempted before its prefill ended prefills on its own.
"""
from __future__ import annotations

from .penalties import adjust_first
from .sampling import sample


def take_shared(engine, seqs: list) -> tuple[list, list]:
    """Split the sequences about to prefill into (the choices that copied their source's
    prompt rows now and got their first token; the sequences that prefill). A choice whose
    source is still prefilling in this batch is in neither: it waits a step."""
    shared, rest = [], []
    for s in seqs:
        src = s.prefill_from
        if src is None or s.result.token_ids or engine.kv.length(s.seq_id) or engine._features():
            rest.append(s)  # not a choice, resumed, holding a kept prefix already, or a head drafts
            continue
        n = len(s.history)
        if src.to_prefill and any(x is src for x in seqs):  # its source is still prefilling: wait
            continue
        if (src.first_logits is None or src.seq_id not in engine.kv.seqs or engine.kv.length(src.seq_id) < n
                or src.history[:n] != s.history):
            s.prefill_from = None  # the source is gone or was never prefilled here: prefill alone
            rest.append(s)
            continue
        engine.model.copy_kv(engine.kv, *engine.kv.fork(src.seq_id, s.seq_id, n))
        s.to_prefill = []
        s.result.stats.cached_prompt_tokens += n
        engine.totals.cached_prompt_tokens += n
        row = adjust_first(src.first_logits.copy(), s)  # penalties, bias, grammar, min-p: the choice's own
        engine._emit(s, [sample(row, s.sampling, s.rng)], row[None])
        shared.append(s)
    return shared, rest
