"""Proposers: everything that drafts tokens for the target to verify.

One narrow interface (``Proposer``) serves every mode; the engine never branches on the
mode name. ``ngram`` looks up the sequence's own history; ``small_draft`` runs a second
compiled model with the same vocabulary; ``eagle`` and ``medusa`` (runtime/drafters/eagle.py,
runtime/drafters/medusa.py) are heads on the target's features, which the engine hands to
proposers that name them in ``features``; ``suffix`` (runtime/drafters/suffix.py) drafts token trees
from the text seen so far.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Protocol

import numpy as np

from ..kv_cache import KVCacheFull
from ..model import Model, read_metadata
from ..sampling import SamplingParams, draw, probs_from_logits
from ..adaptive import StepPlan
from ..costs import time_min
from ..acceptance import Draft
from ..contract import read_model_config


class Proposer(Protocol):
    """What the engine reads of a proposer; nothing else (no optional attributes)."""

    name: str  # the --speculative-mode it serves (runtime/speculative.py registers it)
    supports_trees: bool  # drafts may be token trees (--spec-tree-width/--spec-tree-nodes apply)
    additional_model: str  # what --additional-models names ("" = nothing)
    additional_model_form: str  # how, e.g. "DRAFT_DIR,DRAFT_LIB"
    additional_model_optional: bool  # the mode also drafts without it
    # some of its drafts cost no draft forward (an index over the text): a step's proposing is
    # never skipped for what draft forwards cost (Policy.hopeless), only for what verify rows cost
    free_drafts: bool
    # which target features the engine hands to observe_hidden: "" none (the target runs its
    # fused logits entry points), "hidden" its final-normed hidden states [m, hidden] (EAGLE-1,
    # Medusa), "layers" its low/mid/high layer outputs [m, 3 * hidden] (EAGLE-3)
    features: str
    forwards: int  # draft forwards run so far (metrics)

    @classmethod
    def check(cls, config, model_dir: Path) -> None:
        """Refuse this mode's bad options (a SpeculativeConfig) with a ValueError saying how
        to fix them, before any model loads."""
        ...

    @classmethod
    def build(cls, config, target: Model, kv_tokens: int, max_num_sequence: int, device: str) -> "Proposer":
        """The proposer for this target: loads its draft model or head if it has one;
        ``kv_tokens`` is the target cache's capacity, shared by at most
        ``max_num_sequence`` sequences."""
        ...

    def measure(self, rows: list[int]) -> tuple[dict[int, float], float]:
        """Seconds of one draft forward over each of these row counts, the proposer's host
        work included, measured on scratch state; and a draft model's per-token price of
        catching up on committed tokens (0 if it never has to). Called once per library
        and host (the result is cached: runtime/costs.py)."""
        ...

    def add_sequence(self, seq_id: int, prompt: list[int], tenant: str | None = None) -> None:
        """A new sequence (or one resumed after preemption: its prompt is then its history).
        ``tenant``: whose earlier requests may draft for it (a server's API key); None: none."""
        ...

    def remove_sequence(self, seq_id: int) -> None: ...

    def on_finish(self, seq_id: int) -> None:
        """The sequence finished and is kept, state and all, for a later prompt that starts
        the same way (runtime/prefix_cache.py); ``resume`` or ``remove_sequence`` follows."""
        ...

    def resume(self, seq_id: int, prompt: list[int], keep: int, tenant: str | None = None) -> int:
        """Sequence ``seq_id`` finished earlier and was kept (the engine's prefix cache); a new
        request takes it over, whose ``prompt`` starts with the first ``keep`` tokens the
        sequence held. Forget what followed them, serve ``prompt`` from now on, and return
        how many of its leading tokens (<= keep) the target may keep: from there on it
        prefills, and the proposer receives those tokens' features and chunks as a new
        sequence's."""
        ...

    def propose(self, seq_ids: list[int], histories: list[list[int]], ks: list[int],
                sampling: list[SamplingParams], rngs: list[np.random.Generator], plan: StepPlan,
                node_limit: int | None = None) -> list[Draft]:
        """histories[i]: every committed token of sequence i, the last one not yet forwarded
        by the target. Returns one draft per sequence -- a chain of at most ks[i] tokens, or
        a token tree at most ks[i] deep with at most node_limit nodes -- with each node's
        confidence; ``plan.should_draft`` says before each draft forward whether to run it."""
        ...

    def prefill(self, seq_ids: list[int], chunks: list[list[int]], starts: list[int]) -> None:
        """The target just prefilled these prompt chunks (at positions starts[i].., in order
        per sequence). A draft model prefills them too, in the same bounded chunk, so that no
        decode step of a running batch ever stalls on a new request's whole prompt."""
        ...

    def observe_hidden(self, seq_id: int, position: int, hidden: np.ndarray) -> None:
        """The target's features (as ``features`` names them) of the tokens at positions
        position..position+m-1, as the target forwarded and committed them (only called
        when ``features`` names some)."""
        ...

    def on_commit(self, seq_id: int, history: list[int]) -> None:
        """The sequence's committed history after a step (the proposer resynchronizes its own
        state: a draft model rolls back rejected tokens, Medusa scores its proposals)."""
        ...


def pick(logits: np.ndarray, sampling: SamplingParams, rng: np.random.Generator) -> tuple[int, float, np.ndarray | None]:
    """(token, the draft's probability of it, q for rejection sampling or None if greedy)."""
    if sampling.greedy:
        tok = int(np.argmax(logits))
        z = np.exp(logits.astype(np.float32) - logits[tok])
        return tok, float(1.0 / z.sum()), None
    q = probs_from_logits(logits, sampling)
    tok = draw(q, rng)
    return tok, float(q[tok]), q


class NGramProposer:
    """Prompt lookup: find the latest earlier occurrence of the longest suffix n-gram
    (max_n down to min_n) in prompt + output, and propose the tokens that followed it.

    Confidence of the i-th proposed token: how often the suffix was followed by the same
    token across all its earlier occurrences (smoothed), discounted by the match length
    the token rests on (n + i - 1: a 1-token match is weak, a 4-token match strong)."""

    name = "ngram"
    supports_trees = False
    additional_model = additional_model_form = ""
    additional_model_optional = False
    free_drafts = True
    features = ""

    @classmethod
    def check(cls, config, model_dir: Path) -> None:
        """Nothing beyond SpeculativeConfig's own checks (sizes in range, min <= max)."""

    @classmethod
    def build(cls, config, target: Model, kv_tokens: int, max_num_sequence: int, device: str) -> "NGramProposer":
        return cls(config.ngram_min, config.ngram_max)

    def __init__(self, min_n: int = 1, max_n: int = 4):
        if not 1 <= min_n <= max_n:
            raise ValueError("ngram sizes need 1 <= min_n <= max_n")
        self.min_n, self.max_n = min_n, max_n
        self.forwards = 0

    def measure(self, rows: list[int]) -> tuple[dict[int, float], float]:
        history = (np.arange(512) * 7919 % 997).tolist()
        one = time_min(lambda: self.lookup(history, 8), 3)
        return {r: r * one for r in rows}, 0.0

    def add_sequence(self, seq_id: int, prompt: list[int], tenant: str | None = None) -> None:
        pass

    def remove_sequence(self, seq_id: int) -> None:
        pass

    def on_finish(self, seq_id: int) -> None:
        pass

    def resume(self, seq_id: int, prompt: list[int], keep: int, tenant: str | None = None) -> int:
        return keep  # the lookup reads the history itself

    def on_commit(self, seq_id: int, history: list[int]) -> None:
        pass

    def prefill(self, seq_ids: list[int], chunks: list[list[int]], starts: list[int]) -> None:
        pass

    def observe_hidden(self, seq_id: int, position: int, hidden: np.ndarray) -> None:
        pass

    def propose(self, seq_ids, histories, ks, sampling, rngs, plan, node_limit: int | None = None) -> list[Draft]:
        drafts = []
        for h, k in zip(histories, ks):
            tokens, conf = self.lookup(h, k)
            drafts.append(Draft(tokens, conf=conf))
        return drafts

    def lookup(self, history: list[int], k: int) -> tuple[list[int], list[float]]:
        if k <= 0 or len(history) < self.min_n + 1:
            return [], []
        arr = np.asarray(history, dtype=np.int64)
        n_tok = arr.size
        for n in range(min(self.max_n, n_tok - 1), self.min_n - 1, -1):
            suffix = arr[n_tok - n:]
            # windows ending before the suffix itself; latest match first
            windows = np.lib.stride_tricks.sliding_window_view(arr[: n_tok - 1], n)
            hits = np.flatnonzero((windows == suffix).all(axis=1))
            if hits.size:
                start = int(hits[-1]) + n
                tokens = arr[start: start + k].tolist()
                nxt = arr[hits + n]  # every earlier occurrence's next token (hits end before the suffix)
                agree = (int((nxt == tokens[0]).sum()) + 1) / (hits.size + 2)
                return tokens, [agree * (1 - 0.5 ** (n + i)) for i in range(len(tokens))]
        return [], []


class SmallDraftProposer:
    """A smaller compiled model with the target's vocabulary drafts autoregressively.

    Its KV cache holds a prefix of the committed history; ``propose`` first feeds whatever
    it has not seen (1 token normally, 2 after a fully accepted chain, more after a plain
    stretch: the catch-up, priced per token in the plan), then drafts token by token while
    the plan says the next one pays, returning q for rejection sampling.

    A sequence more than ``MAX_BACKLOG / batch`` tokens behind is not drafted for: a
    catch-up that long inside a decode step stalls a server's whole batch (8 sequences x
    120 tokens took a second)."""

    name = "small_draft"
    supports_trees = False
    additional_model, additional_model_form = "the draft model", "DRAFT_DIR,DRAFT_LIB"
    additional_model_optional = False
    free_drafts = False
    features = ""
    MAX_BACKLOG = 256  # tokens of catch-up one step may carry, shared by the batch

    @classmethod
    def check(cls, config, model_dir: Path) -> None:
        """Same vocabulary and tokenizer as the target, or a clear error before anything loads."""
        draft_dir = Path(config.additional_models[0][0])
        t_cfg, d_cfg = read_model_config(model_dir), read_model_config(draft_dir)
        if t_cfg["vocab_size"] != d_cfg["vocab_size"]:
            raise ValueError(f"draft vocab size {d_cfg['vocab_size']} differs from the target's {t_cfg['vocab_size']}; "
                             "small_draft needs a draft model with the same vocabulary")
        d_path = draft_dir / "tokenizer.json"
        if not d_path.exists():
            raise ValueError(f"{d_path} not found: run gen_config for the draft model")
        t_tok = json.loads((Path(model_dir) / "tokenizer.json").read_text())["model"].get("vocab")
        if t_tok != json.loads(d_path.read_text())["model"].get("vocab"):
            raise ValueError("the draft's tokenizer differs from the target's (different vocabularies); "
                             "small_draft needs the same tokenizer")

    @classmethod
    def build(cls, config, target: Model, kv_tokens: int, max_num_sequence: int, device: str) -> "SmallDraftProposer":
        d_dir, d_lib = config.additional_models[0]
        draft = Model(Path(d_dir), Path(d_lib), device)
        if draft.vocab_size != target.vocab_size:
            raise ValueError(f"the draft library's vocab size {draft.vocab_size} differs from the target's "
                             f"{target.vocab_size}")
        return cls(draft, kv_tokens)

    def __init__(self, model: Model, max_total_tokens: int):
        self.model = model
        self.kv = model.create_kv_cache(max_total_tokens)
        self.cached: dict[int, list[int]] = {}  # tokens in the draft's KV cache, per sequence
        self.forwards = 0
        self.last_catch_up = 0  # most tokens one sequence had to catch up on in the last propose

    def measure(self, rows: list[int]) -> tuple[dict[int, float], float]:
        scratch = [-1 - i for i in range(max(rows))]
        for s in scratch:
            self.kv.add_sequence(s)
        try:
            self.model.prefill(self.kv, scratch, [[0, 1, 2, 3]] * len(scratch))
            greedy, rng = SamplingParams(), np.random.default_rng(0)

            def step(r):
                logits = self.model.decode(self.kv, scratch[:r], [5] * r)
                for row in logits:
                    pick(row, greedy, rng)
                for s in scratch[:r]:
                    self.kv.popn(s, 1)

            table = {r: time_min(lambda: step(r)) for r in rows}

            def catch_up():
                self.model.prefill(self.kv, scratch[:1], [list(range(6, 38))])
                self.kv.popn(scratch[0], 32)

            per_token = max(time_min(catch_up) - table[min(rows)], 0.0) / 31
        finally:
            for s in scratch:
                self.kv.remove_sequence(s)
        return table, per_token

    def add_sequence(self, seq_id: int, prompt: list[int], tenant: str | None = None) -> None:
        self.kv.add_sequence(seq_id)
        self.cached[seq_id] = []

    def remove_sequence(self, seq_id: int) -> None:
        self.kv.remove_sequence(seq_id)
        self.cached.pop(seq_id, None)

    def on_finish(self, seq_id: int) -> None:
        pass

    def resume(self, seq_id: int, prompt: list[int], keep: int, tenant: str | None = None) -> int:
        self.on_commit(seq_id, prompt[:keep])  # the draft's cache keeps what agrees with the kept tokens
        return keep  # it prefills (or catches up on) the rest from tokens alone

    def on_commit(self, seq_id: int, history: list[int]) -> None:
        # keep the longest prefix of the cache that agrees with the committed history
        cached = self.cached[seq_id]
        agreed = 0
        limit = min(len(cached), len(history))
        while agreed < limit and cached[agreed] == history[agreed]:
            agreed += 1
        self.kv.popn(seq_id, len(cached) - agreed)
        del cached[agreed:]

    def backlog(self, seq_id: int, history: list[int]) -> int:
        """Committed tokens the draft must catch up on before drafting for this sequence."""
        return len(history) - len(self.cached.get(seq_id, ()))

    def prefill(self, seq_ids: list[int], chunks: list[list[int]], starts: list[int]) -> None:
        # only sequences whose draft cache holds everything before the chunk (attached while
        # speculation was enabled, no earlier chunk skipped): the rest catch up when they draft
        pairs = [(s, c) for s, c, st in zip(seq_ids, chunks, starts) if len(self.cached.get(s, (None,))) == st]
        if not pairs:
            return
        seq_ids, chunks = [s for s, _ in pairs], [c for _, c in pairs]
        try:
            self.model.prefill(self.kv, seq_ids, chunks)
        except KVCacheFull:
            return  # nothing was written; propose catches up later
        for sid, chunk in zip(seq_ids, chunks):
            self.cached[sid].extend(chunk)

    def observe_hidden(self, seq_id: int, position: int, hidden: np.ndarray) -> None:
        pass

    def propose(self, seq_ids, histories, ks, sampling, rngs, plan, node_limit: int | None = None) -> list[Draft]:
        drafts = [Draft(conf=[]) for _ in seq_ids]
        most = self.MAX_BACKLOG // max(len(seq_ids), 1)
        for i, sid in enumerate(seq_ids):
            if ks[i] > 0:
                self.on_commit(sid, histories[i])
        active = [i for i, k in enumerate(ks) if k > 0 and self.backlog(seq_ids[i], histories[i]) <= most]
        if not active:
            return drafts
        pending = [histories[i][len(self.cached[seq_ids[i]]):] for i in active]
        fed = sum(len(p) for p in pending)
        if not plan.should_draft(len(active), [(1.0, plan.first(seq_ids[i])) for i in active], fed - len(active)):
            return drafts
        ids = [seq_ids[i] for i in active]
        t0 = time.perf_counter()
        logits = self.model.prefill(self.kv, ids, pending)
        self.forwards += 1
        self.last_catch_up = max(len(p) for p in pending)
        for sid, chunk in zip(ids, pending):
            self.cached[sid].extend(chunk)
        path = {i: 1.0 for i in active}  # P of each sequence's last drafted node
        probs: dict[int, list[np.ndarray]] = {i: [] for i in active}
        live = list(active)
        while True:
            new, last_p = [], []
            for row, i in enumerate(live):
                tok, conf, q = pick(logits[row], sampling[i], rngs[i])
                drafts[i].tokens.append(tok)
                drafts[i].conf.append(conf)
                if q is not None:
                    probs[i].append(q)
                path[i] *= plan.p(conf, seq_ids[i])
                new.append(path[i])
            plan.spent(time.perf_counter() - t0)
            plan.drafted(new)
            live = [i for i in live if len(drafts[i].tokens) < ks[i]]
            if not live or not plan.should_draft(len(live), [(path[i], plan.p(drafts[i].conf[-1], seq_ids[i]))
                                                             for i in live]):
                break
            t0 = time.perf_counter()
            logits = self.model.decode(self.kv, [seq_ids[i] for i in live], [drafts[i].tokens[-1] for i in live])
            self.forwards += 1
            for i in live:
                self.cached[seq_ids[i]].append(drafts[i].tokens[-1])
        for i in active:
            if probs[i]:
                drafts[i].probs = np.stack(probs[i])
        return drafts


class HeadMismatch(ValueError):
    """A draft head that does not belong to the target (or is not the mode's kind)."""


def load_head(classes: dict, mode: str, head_dir: Path, head_lib: Path, target: Model, device: str = "auto") -> Model:
    """Load an EAGLE/Medusa head after checking, from its library's metadata alone, that
    it is a kind the mode drives (``classes``: model_type -> its loader class) and was
    built for this target: same hidden size, vocabulary and activation dtype (features
    pass between the two as they are)."""
    _, meta = read_metadata(Path(head_lib))
    kind = meta.get("model_type")
    if kind not in classes:
        raise HeadMismatch(f"{head_lib} is a {kind} library, --speculative-mode {mode} needs a {mode} head "
                           f"(convert_weight --model-type {mode})")
    for key, have in (("hidden_size", target.hidden_size), ("vocab_size", target.vocab_size),
                      ("model_dtype", target.dtype)):
        if meta.get(key) != have:
            raise HeadMismatch(f"the {mode} head {head_lib} has {key} {meta.get(key)} but the target has {have}: "
                               "it was built for another model")
    return classes[kind](Path(head_dir), Path(head_lib), device)
