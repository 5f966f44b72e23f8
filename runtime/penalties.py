"""A request's changes to the target's logits -- penalties, logit biases, min-p -- row by row.

Why per row: a verify forward scores several positions of one sequence at once, and a
penalty depends on the tokens before the position. So every verify row is adjusted as of its
own prefix -- the committed output plus the draft path to that row's node -- exactly as the
grammar masks rows (runtime/grammar.py). Each row's adjusted logits are then the very logits
plain decoding would adjust and sample at that position (the rows themselves are bit-identical
to a decode step's: batch-invariant kernels), so greedy speculation stays identical to plain
greedy decoding, and rejection sampling draws from the adjusted target distribution.

Order, per row (float32, on the host): repetition penalty (HF: a seen token's positive logit
divided by it, a negative one multiplied), frequency and presence penalties (OpenAI: over the
output so far), logit bias, the grammar's mask, then min-p (tokens whose probability at the
request's temperature is below ``min_p`` times the likeliest's are dropped: ``z < max z + T ln
min_p``, so the probability kernels need no change). "Seen" for the repetition penalty means
the prompt and the output, as HF and vLLM count it; the frequency and presence penalties count
the output only, as OpenAI and vLLM do.
"""
from __future__ import annotations

import math

import numpy as np

from .acceptance import Draft
from .grammar import apply_masks, mask_rows
from .sequence import GenerationError


def node_paths(draft: Draft, rows: int) -> list[list[int]]:
    """The draft tokens before each of the first ``rows`` verify rows: [] for row 0 (the last
    committed token's), then each node's path from the root, the node included."""
    paths: list[list[int]] = [[]]
    for j, p in enumerate(draft.parent_list()[: rows - 1]):
        paths.append((paths[p + 1] if p >= 0 else []) + [draft.tokens[j]])
    return paths


def penalize(rows: np.ndarray, seq, paths: list[list[int]]) -> None:
    """Penalties and logit bias on one sequence's rows [n, vocab], in place (module doc)."""
    sp = seq.sampling
    output = seq.history[len(seq.result.prompt_token_ids):]
    counted = sp.frequency_penalty or sp.presence_penalty
    base = np.bincount(output, minlength=rows.shape[1]) if counted and output else None
    seen = np.unique(seq.history) if sp.repetition_penalty != 1.0 else None
    bias_ids = np.array([t for t, _ in sp.logit_bias], np.int64)
    bias = np.array([b for _, b in sp.logit_bias], np.float32)
    for row, path in zip(rows, paths):
        if seen is not None:
            idx = np.union1d(seen, path) if path else seen
            vals = row[idx]
            row[idx] = np.where(vals > 0, vals / np.float32(sp.repetition_penalty),
                                vals * np.float32(sp.repetition_penalty))
        if counted and (base is not None or path):
            idx = np.unique(np.concatenate([np.flatnonzero(base) if base is not None else np.zeros(0, np.int64),
                                            np.asarray(path, np.int64)]))
            counts = (base[idx] if base is not None else 0) + np.array([path.count(int(t)) for t in idx])
            row[idx] -= (np.float32(sp.frequency_penalty) * counts.astype(np.float32)
                         + np.float32(sp.presence_penalty) * (counts > 0).astype(np.float32))
        if len(bias_ids):
            row[bias_ids] += bias


def min_p_filter(rows: np.ndarray, seq) -> None:
    """min-p as a logits mask (module doc), in place; sampled requests only."""
    sp = seq.sampling
    if sp.greedy or not sp.min_p:
        return
    cut = rows.max(axis=1, keepdims=True) + np.float32(sp.temperature * math.log(sp.min_p))
    rows[rows < cut] = -np.inf


def check_ids(sp, vocab_size: int) -> None:
    """A logit_bias naming a token the model does not have is refused (GenerationError names it)."""
    bad = [t for t, _ in sp.logit_bias if t >= vocab_size]
    if bad:
        raise GenerationError(f"logit_bias names token {bad[0]}, and the model's vocabulary has {vocab_size} tokens "
                         f"(ids 0..{vocab_size - 1})")


def adjust_step(logits: np.ndarray, seqs: list, drafts: list[Draft], masks: list | None) -> np.ndarray:
    """A step's host logits [rows, vocab] with every sequence's adjustments, grammar masks
    included, in place (rows: ``[last] + draft`` of each sequence, in order)."""
    starts = np.cumsum([0] + [len(d) + 1 for d in drafts])
    for s, d, a in zip(seqs, drafts, starts):
        if s.sampling.adjusts_logits:
            penalize(logits[a: a + len(d) + 1], s, node_paths(d, len(d) + 1))
    if masks is not None:
        mask_rows(logits, seqs, drafts, masks)
    for s, d, a in zip(seqs, drafts, starts):
        min_p_filter(logits[a: a + len(d) + 1], s)
    return logits


def adjust_first(row: np.ndarray, seq) -> np.ndarray:
    """The prompt's last row [vocab] (a copy) as the first token is chosen from it."""
    if seq.grammar is None and not seq.sampling.adjusts_logits:
        return row
    rows = row[None].copy()
    penalize(rows, seq, [[]])
    if seq.grammar is not None:
        apply_masks(rows, seq.grammar.root_mask()[None])
    min_p_filter(rows, seq)
    return rows[0]
