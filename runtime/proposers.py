"""Proposers: everything that drafts tokens for the target to verify.

One narrow interface (``Proposer``) serves every mode; the engine never branches on the
mode name. ``ngram`` looks up the sequence's own history; ``small_draft`` runs a second
compiled model with the same vocabulary; ``eagle`` and ``medusa`` (runtime/eagle.py,
runtime/medusa.py) are heads on the target's hidden states, which the engine hands to
proposers that set ``needs_hidden_states``.
"""
from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Protocol

import numpy as np

from .kv_cache import KVCacheFull
from .model import Model, read_metadata
from .sampling import SamplingParams, probs_from_logits
from .verify import Draft


class Proposer(Protocol):
    name: str
    has_draft_model: bool
    needs_hidden_states: bool  # True: the engine calls observe_hidden with the target's features

    def add_sequence(self, seq_id: int, prompt: list[int]) -> None: ...

    def remove_sequence(self, seq_id: int) -> None: ...

    def propose(self, seq_ids: list[int], histories: list[list[int]], ks: list[int],
                sampling: list[SamplingParams], rngs: list[np.random.Generator],
                node_limit: int | None = None) -> list[Draft]:
        """histories[i]: every committed token of sequence i, the last one not yet forwarded
        by the target. Returns one draft per sequence: a chain of at most ks[i] tokens, or a
        token tree at most ks[i] deep with at most node_limit nodes."""
        ...

    def prefill(self, seq_ids: list[int], chunks: list[list[int]], starts: list[int]) -> None:
        """The target just prefilled these prompt chunks (at positions starts[i].., in order
        per sequence). A draft model prefills them too, in the same bounded chunk, so that no
        decode step of a running batch ever stalls on a new request's whole prompt."""
        ...

    def backlog(self, seq_id: int, history: list[int]) -> int:
        """Committed tokens a draft *model* would have to catch up on before drafting for
        this sequence (0 for proposers whose catch-up is free or cheap)."""
        ...

    def observe_hidden(self, seq_id: int, position: int, hidden: np.ndarray) -> None:
        """The target's final-normed hidden states [m, hidden] of the tokens at positions
        position..position+m-1, as the target forwarded and committed them (only called
        when ``needs_hidden_states``)."""
        ...

    def accept(self, seq_id: int, history: list[int]) -> None:
        """The sequence's committed history after a verify step (to resynchronize state)."""
        ...


class NGramProposer:
    """Prompt lookup: find the latest earlier occurrence of the longest suffix n-gram
    (max_n down to min_n) in prompt + output, and propose the tokens that followed it."""

    name = "ngram"
    has_draft_model = False
    needs_hidden_states = False

    def __init__(self, min_n: int = 1, max_n: int = 4):
        if not 1 <= min_n <= max_n:
            raise ValueError("ngram sizes need 1 <= min_n <= max_n")
        self.min_n, self.max_n = min_n, max_n
        self.seconds = 0.0

    def add_sequence(self, seq_id: int, prompt: list[int]) -> None:
        pass

    def remove_sequence(self, seq_id: int) -> None:
        pass

    def accept(self, seq_id: int, history: list[int]) -> None:
        pass

    def prefill(self, seq_ids: list[int], chunks: list[list[int]], starts: list[int]) -> None:
        pass

    def backlog(self, seq_id: int, history: list[int]) -> int:
        return 0

    def observe_hidden(self, seq_id: int, position: int, hidden: np.ndarray) -> None:
        pass

    def propose(self, seq_ids, histories, ks, sampling, rngs, node_limit: int | None = None) -> list[Draft]:
        return [Draft(self.lookup(h, k)) for h, k in zip(histories, ks)]

    def lookup(self, history: list[int], k: int) -> list[int]:
        if k <= 0 or len(history) < self.min_n + 1:
            return []
        arr = np.asarray(history, dtype=np.int64)
        n_tok = arr.size
        for n in range(min(self.max_n, n_tok - 1), self.min_n - 1, -1):
            suffix = arr[n_tok - n:]
            # windows ending before the suffix itself; latest match first
            windows = np.lib.stride_tricks.sliding_window_view(arr[: n_tok - 1], n)
            hits = np.flatnonzero((windows == suffix).all(axis=1))
            if hits.size:
                start = int(hits[-1]) + n
                return arr[start: start + k].tolist()
        return []


class SmallDraftProposer:
    """A smaller compiled model with the target's vocabulary drafts k tokens autoregressively.

    Its KV cache holds a prefix of the committed history; ``propose`` first feeds whatever
    it has not seen (1 token normally, 2 after a fully accepted chain), then samples
    (or takes the argmax of) k tokens, returning q for rejection sampling."""

    name = "small_draft"
    has_draft_model = True
    needs_hidden_states = False

    def __init__(self, model: Model, max_total_tokens: int):
        self.model = model
        self.kv = model.create_kv_cache(max_total_tokens)
        self.cached: dict[int, list[int]] = {}  # tokens in the draft's KV cache, per sequence
        self.forwards = 0
        self.last_catch_up = 0  # most tokens one sequence had to catch up on in the last propose
        self._token_seconds: list[float] = []  # recent prefill seconds per token (prompt chunks, catch-ups)

    @property
    def catch_up_seconds_per_token(self) -> float | None:
        """What feeding the draft one committed token costs inside a multi-token forward:
        the price of switching drafting back on after a plain stretch (median of recent
        prefills; None before the first)."""
        return statistics.median(self._token_seconds) if self._token_seconds else None

    def _timed_prefill(self, seq_ids: list[int], chunks: list[list[int]]):
        t0 = time.perf_counter()
        logits = self.model.prefill(self.kv, seq_ids, chunks)
        tokens = sum(len(c) for c in chunks)
        if tokens > 4:  # a 1-2 token feed is a decode-sized forward, not a per-token price
            self._token_seconds.append((time.perf_counter() - t0) / tokens)
            del self._token_seconds[:-9]
        return logits

    def add_sequence(self, seq_id: int, prompt: list[int]) -> None:
        self.kv.add_sequence(seq_id)
        self.cached[seq_id] = []

    def remove_sequence(self, seq_id: int) -> None:
        self.kv.remove_sequence(seq_id)
        self.cached.pop(seq_id, None)

    def accept(self, seq_id: int, history: list[int]) -> None:
        # keep the longest prefix of the cache that agrees with the committed history
        cached = self.cached[seq_id]
        agreed = 0
        limit = min(len(cached), len(history))
        while agreed < limit and cached[agreed] == history[agreed]:
            agreed += 1
        self.kv.popn(seq_id, len(cached) - agreed)
        del cached[agreed:]

    def backlog(self, seq_id: int, history: list[int]) -> int:
        return len(history) - len(self.cached.get(seq_id, ()))

    def prefill(self, seq_ids: list[int], chunks: list[list[int]], starts: list[int]) -> None:
        # only sequences whose draft cache holds everything before the chunk (attached while
        # speculation was enabled, no earlier chunk skipped): the rest catch up when they draft
        pairs = [(s, c) for s, c, st in zip(seq_ids, chunks, starts) if len(self.cached.get(s, (None,))) == st]
        if not pairs:
            return
        seq_ids, chunks = [s for s, _ in pairs], [c for _, c in pairs]
        try:
            self._timed_prefill(seq_ids, chunks)
        except KVCacheFull:
            return  # nothing was written; propose catches up later
        for sid, chunk in zip(seq_ids, chunks):
            self.cached[sid].extend(chunk)

    def observe_hidden(self, seq_id: int, position: int, hidden: np.ndarray) -> None:
        pass

    def propose(self, seq_ids, histories, ks, sampling, rngs, node_limit: int | None = None) -> list[Draft]:
        active = [i for i, k in enumerate(ks) if k > 0]
        drafts = [Draft() for _ in seq_ids]
        if not active:
            return drafts
        ids = [seq_ids[i] for i in active]
        for i, sid in zip(active, ids):
            self.accept(sid, histories[i])
        pending = [histories[i][len(self.cached[seq_ids[i]]):] for i in active]
        self.last_catch_up = max(len(p) for p in pending)
        logits = self._timed_prefill(ids, pending)
        self.forwards += 1
        for i, sid, chunk in zip(active, ids, pending):
            self.cached[sid].extend(chunk)
        probs: dict[int, list[np.ndarray]] = {i: [] for i in active}
        live = list(active)
        for step in range(max(ks[i] for i in active)):
            tokens = []
            for row, i in enumerate(live):
                if sampling[i].greedy:
                    tok = int(np.argmax(logits[row]))
                else:
                    q = probs_from_logits(logits[row], sampling[i])
                    tok = int(rngs[i].choice(q.shape[-1], p=q))
                    probs[i].append(q)
                drafts[i].tokens.append(tok)
                tokens.append(tok)
            keep = [(row, i) for row, i in enumerate(live) if len(drafts[i].tokens) < ks[i]]
            if not keep:
                break
            live = [i for _, i in keep]
            logits = self.model.decode(self.kv, [seq_ids[i] for i in live], [tokens[row] for row, _ in keep])
            self.forwards += 1
            for row, i in keep:
                self.cached[seq_ids[i]].append(tokens[row])
        for i in active:
            if not sampling[i].greedy:
                drafts[i].probs = np.stack(probs[i])
        return drafts


class HeadMismatch(ValueError):
    """A draft head that does not belong to the target (or is not the mode's kind)."""


def load_head(cls, kind: str, head_dir: Path, head_lib: Path, target: Model, device: str = "auto") -> Model:
    """Load an EAGLE/Medusa head after checking, from its library's metadata alone, that
    it is the right kind and was built for this target: same hidden size, vocabulary and
    activation dtype (hidden states pass between the two as they are)."""
    _, meta = read_metadata(Path(head_lib))
    if meta.get("model_type") != kind:
        raise HeadMismatch(f"{head_lib} is a {meta.get('model_type')} library, --speculative-mode {kind} needs "
                           f"a {kind} head (convert_weight --model-type {kind})")
    for key, have in (("hidden_size", target.hidden_size), ("vocab_size", target.vocab_size),
                      ("model_dtype", target.dtype)):
        if meta.get(key) != have:
            raise HeadMismatch(f"the {kind} head {head_lib} has {key} {meta.get(key)} but the target has {have}: "
                               "it was built for another model")
    return cls(Path(head_dir), Path(head_lib), device)
