"""EAGLE drafting: a feature-level head on the target's hidden states (EAGLE-1 and EAGLE-3
heads, EAGLE-2 dynamic trees).

Why the bookkeeping looks like this. Head row i holds the pair (target feature f_i,
token i+1) -- the input is shifted one token left of the target's -- and predicts
f_{i+1}, which the *target's* lm_head (``get_logits``) turns into logits for token i+2.
The engine hands over the true features of every token the target forwarded
(``observe_hidden``): the prompt at prefill, then after each verify the last committed
token plus the accepted drafts. At the next ``propose`` the head first catches up on the
rows it could not build before (pairs whose token was only just committed), in one
chain forward; the output at the last row gives the depth-1 candidates. Draft rows built
from the head's *own* predicted features are scratch rows of a token tree
(``plan_tree`` never grows the committed length), so after drafting the head's cache is
exactly the rows built from true features -- rolling back costs nothing and the next
catch-up rebuilds the accepted tokens from the target's real hidden states.

EAGLE-3 heads (``Eagle3HeadModel``, chosen by the head library's ``model_type``: users
still type ``--speculative-mode eagle``) differ in what a row is built from. Rows of the
catch-up are built from the target's low/mid/high layer outputs (the engine hands those
over instead of the final hidden states: ``features = "layers"``), fused by the head's
``fc``; rows at later depths from the head's own output at the parent row, without fc;
the logits come from the head's own norm and lm_head. The bookkeeping is the same.

Trees (EAGLE-2): every candidate has a path probability P, the product of the calibrated
acceptances of its and its ancestors' draft probabilities (runtime/adaptive.py); per depth
the ``width`` most probable frontier nodes are expanded (one head forward per depth for all
sequences), each giving its ``width`` best children, for as long as the step's plan says
the next head forward pays. The proposer hands over the ``max_nodes`` most probable
candidates (a parent is never less probable than its child, so it is a tree) and the plan
keeps those worth their verify rows; width 1 is a chain. Draft tokens are deterministic
(one-hot q), which keeps rejection sampling exact for trees too (runtime/acceptance.py).
"""
from __future__ import annotations

import time

import numpy as np
from tvm.runtime import tensor as to_device

from .contract import EAGLE, EAGLE3, FORWARD_META, KV_PAGE_SIZE
from .kv_cache import ForwardBatch, split_forwards
from .model import Model
from .costs import time_min
from .acceptance import Draft
from .adaptive import MAX_DEPTH
from .proposers import HeadMismatch, load_head

MAX_TREE_NODES = 256


class EagleHeadModel(Model):
    """A compiled EAGLE head and its weights: ``eagle_forward``, and ``draft_logits`` when the
    head has a reduced draft vocabulary (``vocab_ids`` maps its rows to target tokens)."""

    kind = EAGLE  # the contract's entry points of an EAGLE head (draft_logits with a reduced vocabulary)
    features = "hidden"  # what its rows are built from: the target's final-normed hidden states

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.vocab_ids = draft_vocab_ids(self)

    def check_target(self, target: Model) -> None:
        """Refuse a target this head cannot read. An EAGLE-1 head reads the final hidden states,
        which every target library exports, and the loader checked the sizes: nothing to refuse."""

    def logits(self, target: Model, feats) -> np.ndarray:
        """Draft logits of predicted features: over the reduced vocabulary (rows of
        ``vocab_ids``) when the head has one, else the target's full lm_head."""
        if self.vocab_ids is None:
            return target.get_logits(feats).numpy()
        if isinstance(feats, np.ndarray):
            feats = to_device(np.ascontiguousarray(feats, self.dtype), self.device)
        self.check_rows(int(feats.shape[0]), "rows")
        return self._fn["draft_logits"](feats, self.params).numpy()

    def forward(self, target: Model, kv, batch: ForwardBatch, tokens: np.ndarray, feats):
        """Predicted features [n, hidden] (device) of the pairs (feats[j], tokens[j]); feats
        on the host or the device."""
        self.check_rows(len(tokens))
        emb = target.embed(tokens)  # the target's embedding: the head owns none
        hid = to_device(np.ascontiguousarray(feats, self.dtype), self.device) if isinstance(feats, np.ndarray) else feats
        meta = [to_device(a, self.device) for a in batch.arrays]
        return self._fn["eagle_forward"](emb, hid, kv.tensor, *meta, self.params)

    def forward_target(self, target: Model, kv, batch: ForwardBatch, tokens: np.ndarray, feats: np.ndarray):
        """As :meth:`forward`, for rows built from the target's own features (the catch-up)."""
        return self.forward(target, kv, batch, tokens, feats)


class Eagle3HeadModel(EagleHeadModel):
    """A compiled EAGLE-3 head: ``fuse_features`` (fc over the target's three layer outputs),
    ``eagle_forward`` (its decoder layer, output before its final norm) and ``draft_logits``
    (its final norm and lm_head over its draft vocabulary: ``vocab_ids`` is never None, as an
    EAGLE-3 head always carries d2t, so :meth:`logits` never uses the target's lm_head)."""

    kind = EAGLE3
    features = "layers"  # the target's low/mid/high layer outputs [n, 3 * hidden]

    def check_target(self, target: Model) -> None:
        """The target library must export the outputs of the very layers the head was trained on."""
        want, have = self.meta["feature_layers"], target.feature_layers
        if have is None:
            raise HeadMismatch(f"the EAGLE-3 head {self.lib_path} reads the target's layer features, which "
                               f"{target.lib_path} does not export (it was built before EAGLE-3 support): rebuild it "
                               "with `speccompile compile`")
        if list(have) != list(want):
            raise HeadMismatch(f"the EAGLE-3 head {self.lib_path} was trained on the outputs of target layers {want}, "
                               f"{target.lib_path} exports layers {have}: it was built for another model")

    def forward_target(self, target: Model, kv, batch: ForwardBatch, tokens: np.ndarray, feats: np.ndarray):
        """Rows built from the target's layer features feats [n, 3 * hidden]: fc fuses them first."""
        self.check_rows(len(feats))
        fused = self._fn["fuse_features"](to_device(np.ascontiguousarray(feats, self.dtype), self.device), self.params)
        return self.forward(target, kv, batch, tokens, fused)


def draft_vocab_ids(head: Model) -> np.ndarray | None:
    """A head's reduced draft vocabulary as target token ids (row j -> ``j + d2t[j]``), or
    None when it drafts over the full vocabulary."""
    if not int(head.meta.get("draft_vocab_size", 0)):
        return None
    names = [p["name"] for p in head.meta["params"]]
    d2t = head.params[names.index("d2t")].numpy().astype(np.int64)
    return np.arange(d2t.size) + d2t


def check_draft_vocab(ids: np.ndarray | None, vocab_size: int, kind: str) -> None:
    """A draft vocabulary must map onto distinct tokens of the target (at conversion and load)."""
    if ids is not None and (ids.min() < 0 or ids.max() >= vocab_size or np.unique(ids).size != ids.size):
        raise ValueError(f"the {kind} head's d2t maps its draft vocabulary outside the target's vocabulary "
                         f"(size {vocab_size}) or twice onto one token: it was trained for another model")


def top_tokens(row: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``width`` most likely tokens of one logits row (ties: lower id first) and their
    log-probabilities."""
    row = np.asarray(row, np.float64)
    if width == 1:
        idx = np.asarray([int(np.argmax(row))])
    else:
        part = np.argpartition(-row, min(width, row.size) - 1)[:width]
        idx = np.asarray(sorted(part.tolist(), key=lambda t: (-row[t], t)))
    m = row.max()
    lse = m + np.log(np.exp(row - m).sum())
    return idx, row[idx] - lse


class EagleProposer:
    name = "eagle"
    supports_trees = True
    additional_model, additional_model_form = "its EAGLE head", "HEAD_DIR,HEAD_LIB"
    features = "hidden"  # an EAGLE-3 head's proposer reads "layers" (set from the head in __init__)

    @classmethod
    def check(cls, config, model_dir) -> None:
        pass  # the head is checked against the target from its library's metadata, at build

    @classmethod
    def build(cls, config, target: Model, kv_tokens: int, max_num_sequence: int, device: str) -> "EagleProposer":
        head_dir, head_lib = config.additional_models[0]
        head = load_head({EAGLE: EagleHeadModel, EAGLE3: Eagle3HeadModel}, cls.name, head_dir, head_lib, target,
                         device)
        head.check_target(target)
        depth = max(config.spec_draft_length, MAX_DEPTH)
        return cls(head, target, head_kv_tokens(kv_tokens, max_num_sequence, config.spec_tree_width, depth),
                   config.spec_tree_width, config.spec_tree_nodes)

    def __init__(self, head: EagleHeadModel, target: Model, max_total_tokens: int, tree_width: int = 1,
                 max_nodes: int = 64):
        if tree_width < 1:
            raise ValueError("--spec-tree-width must be >= 1 (1 = chain)")
        if not 1 <= max_nodes <= MAX_TREE_NODES:
            raise ValueError(f"--spec-tree-nodes must be in 1..{MAX_TREE_NODES}")
        check_draft_vocab(head.vocab_ids, target.vocab_size, "EAGLE")
        self.head, self.target = head, target
        self.features = head.features
        self.width, self.max_nodes = tree_width, max_nodes
        self.kv = head.create_kv_cache(max_total_tokens)
        self.pending: dict[int, list[np.ndarray]] = {}  # true features not yet in the head's cache
        self.forwards = 0
        self.last_catch_up = 0

    # ------------------------------------------------------------ sequences
    def add_sequence(self, seq_id: int, prompt: list[int]) -> None:
        self.kv.add_sequence(seq_id)
        self.pending[seq_id] = []

    def remove_sequence(self, seq_id: int) -> None:
        self.kv.remove_sequence(seq_id)
        self.pending.pop(seq_id, None)

    def prefill(self, seq_ids: list[int], chunks: list[list[int]], starts: list[int]) -> None:
        pass  # the head works from the features observe_hidden receives

    def observe_hidden(self, seq_id: int, position: int, hidden: np.ndarray) -> None:
        """Target features of the tokens at positions position.. (in order, no gaps)."""
        if seq_id not in self.pending:  # attached while speculation was disabled
            return
        have = self.kv.length(seq_id) + sum(len(p) for p in self.pending[seq_id])
        if position != have:
            raise RuntimeError(f"EAGLE: features for position {position} arrived, {have} expected")
        self.pending[seq_id].append(np.asarray(hidden))

    def on_commit(self, seq_id: int, history: list[int]) -> None:
        pass  # the head's cache already holds only rows built from true features

    def measure(self, rows: list[int]) -> tuple[dict[int, float], float]:
        """A head forward over r scratch rows (one per scratch sequence) plus its draft
        logits and the top-width search, for each r."""
        scratch = [-1 - i for i in range(max(rows))]
        feats = np.zeros((max(rows), self.head.hidden_size), np.float32)
        for s in scratch:
            self.kv.add_sequence(s)

        def step(r):
            batch = self.kv.plan_tree(scratch[:r], [[-1]] * r)
            out = self.head.forward(self.target, self.kv, batch, np.zeros(r, np.int32), feats[:r]).numpy()
            for row in self.head.logits(self.target, out):
                self._top(row)
            for s in scratch[:r]:
                self.kv.popn(s, 0)

        try:
            return {r: time_min(lambda: step(r)) for r in rows}, 0.0
        finally:
            for s in scratch:
                self.kv.remove_sequence(s)

    # -------------------------------------------------------------- drafting
    def propose(self, seq_ids, histories, ks, sampling, rngs, plan, node_limit: int | None = None) -> list[Draft]:
        drafts = [Draft() for _ in seq_ids]
        active = [i for i, k in enumerate(ks) if k > 0]
        fed = sum(sum(len(f) for f in self.pending[seq_ids[i]]) for i in active)
        if not active or not plan.should_draft(fed, [(1.0, None)] * len(active)):
            return drafts
        ids = [seq_ids[i] for i in active]
        try:
            t0 = time.perf_counter()
            root_feat, root_logits = self._catch_up(ids, [histories[i] for i in active])
            trees = self._grow(ids, [ks[i] for i in active], root_feat, root_logits, plan, t0)
        finally:
            for s in ids:
                self.kv.popn(s, 0)  # free the pages the scratch tree rows took
        budget = min(self.max_nodes, node_limit or self.max_nodes)
        for i, tree in zip(active, trees):
            drafts[i] = self._select(tree, budget)
        return drafts

    def _catch_up(self, ids: list[int], histories: list[list[int]]):
        """Build the head rows of every pending true feature; returns the predicted feature
        and the logits at each sequence's last row (the depth-1 candidates).

        One chain forward, or consecutive ones when the pending rows exceed what one call of
        the head (or the target's embedding) takes -- a whole long prompt's features arrive
        before the first propose -- with the same rows, so the same result."""
        feats = [np.concatenate(self.pending[s]) for s in ids]
        starts = [self.kv.length(s) for s in ids]
        tokens = [h[st + 1: st + 1 + len(f)] for h, st, f in zip(histories, starts, feats)]
        if any(len(t) != len(f) or not len(f) for t, f in zip(tokens, feats)):
            raise RuntimeError("EAGLE: the target features and the history disagree")
        counts = [len(f) for f in feats]
        self.kv.check_room(ids, counts)  # all or nothing: a full cache leaves the pending rows pending
        root = [None] * len(ids)
        for pieces in split_forwards(counts, min(self.head.max_forward_tokens, self.target.max_forward_tokens)):
            batch = self.kv.plan_chain([ids[i] for i, _, _ in pieces], [e - a for _, a, e in pieces])
            out = self.head.forward_target(
                self.target, self.kv, batch, np.concatenate([tokens[i][a:e] for i, a, e in pieces]).astype(np.int32),
                np.concatenate([feats[i][a:e] for i, a, e in pieces])).numpy()
            self.forwards += 1
            ends = np.cumsum([e - a for _, a, e in pieces])
            for (i, _, e), end in zip(pieces, ends):
                if e == counts[i]:
                    root[i] = out[end - 1]
        self.last_catch_up = max(counts)
        for s in ids:
            self.pending[s] = []
        root = np.stack(root)
        return root, self.head.logits(self.target, root)

    def _grow(self, ids: list[int], depths: list[int], root_feat: np.ndarray, root_logits: np.ndarray,
              plan, t0: float) -> list[dict]:
        """Candidates (token, parent, depth, P, confidence) per sequence, expanded EAGLE-2
        style: per depth the ``width`` most probable frontier nodes, while the plan says
        the next head forward pays."""
        trees = []
        for r in range(len(ids)):
            trees.append({"tok": [], "par": [], "depth": [], "P": [], "conf": [], "row": [], "head_par": [],
                          "feat": [], "frontier": []})
            self._add_children(trees[-1], -1, root_logits[r], plan)
        plan.spent(time.perf_counter() - t0)
        plan.drafted([p for t in trees for p in t["P"]])
        for depth in range(1, max(depths)):
            grow = [r for r in range(len(ids)) if depth < depths[r]]
            for r in grow:
                t = trees[r]
                t["expand"] = sorted(t["frontier"], key=lambda n: (-t["P"][n], n))[: self.width]
            nodes = [(trees[r]["P"][n], plan.p(trees[r]["conf"][n])) for r in grow for n in trees[r]["expand"]]
            if not plan.should_draft(len(nodes), nodes):
                break
            t0 = time.perf_counter()
            firsts, tokens, feats = [], [], []
            for r in grow:
                t = trees[r]
                firsts.append(len(t["head_par"]))
                for n in t["expand"]:
                    p = t["par"][n]
                    t["row"][n] = len(t["head_par"])
                    t["head_par"].append(-1 if p < 0 else t["row"][p])
                    tokens.append(t["tok"][n])
                    feats.append(root_feat[r] if p < 0 else t["feat"][t["row"][p]])
            batch = self._plan_new_rows([ids[r] for r in grow], [trees[r]["head_par"] for r in grow], firsts)
            out = self.head.forward(self.target, self.kv, batch, np.asarray(tokens, np.int32), np.stack(feats)).numpy()
            self.forwards += 1
            logits = self.head.logits(self.target, out)
            row, new = 0, []
            for r in grow:
                t = trees[r]
                t["frontier"] = []
                for n in t["expand"]:
                    t["feat"].append(out[row])
                    new.extend(self._add_children(t, n, logits[row], plan))
                    row += 1
            plan.spent(time.perf_counter() - t0)
            plan.drafted(new)
        return trees

    def _add_children(self, t: dict, parent: int, logits: np.ndarray, plan) -> list[float]:
        """The ``width`` best tokens of a logits row as children of ``parent``; their P."""
        toks, logp = self._top(logits)
        out = []
        for tok, lp in zip(toks.tolist(), logp.tolist()):
            conf = float(np.exp(lp))
            prob = plan.p(conf) * (1.0 if parent < 0 else t["P"][parent])
            t["frontier"].append(len(t["tok"]))
            t["tok"].append(tok)
            t["par"].append(parent)
            t["depth"].append(1 if parent < 0 else t["depth"][parent] + 1)
            t["P"].append(prob)
            t["conf"].append(conf)
            t["row"].append(-1)
            out.append(prob)
        return out

    def _top(self, row: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The ``width`` best target tokens of one draft logits row, with log-probabilities."""
        toks, logp = top_tokens(row, self.width)
        return (toks if self.head.vocab_ids is None else self.head.vocab_ids[toks]), logp

    def _plan_new_rows(self, ids: list[int], head_parents: list[list[int]], firsts: list[int]) -> ForwardBatch:
        """Tree metadata for the rows added this forward (earlier rows are already written)."""
        full = self.kv.plan_tree(ids, head_parents)
        offsets = np.concatenate([[0], np.cumsum([len(p) for p in head_parents])])
        sel = np.concatenate([np.arange(offsets[b] + f, offsets[b + 1]) for b, f in enumerate(firsts)])
        # per-token arrays (shape ("n", ...)) keep the new rows; the page table is per sequence
        named = {k: a[sel] if FORWARD_META[k][0][0] == "n" else a for k, a in full.named.items()}
        return ForwardBatch(list(ids), [len(p) - f for p, f in zip(head_parents, firsts)], named)

    def _select(self, tree: dict, budget: int) -> Draft:
        """The ``budget`` most probable candidates, parents first (a child's P never exceeds
        its parent's, so this is a tree)."""
        order = sorted(range(len(tree["tok"])), key=lambda n: (-tree["P"][n], tree["depth"][n], n))
        chosen: set[int] = set()
        for n in order:
            if len(chosen) >= budget:
                break
            if tree["par"][n] < 0 or tree["par"][n] in chosen:
                chosen.add(n)
        nodes = sorted(chosen, key=lambda n: (tree["depth"][n], n))
        local = {n: j for j, n in enumerate(nodes)}
        tokens = [tree["tok"][n] for n in nodes]
        conf = [tree["conf"][n] for n in nodes]
        if self.width == 1:
            return Draft(tokens, conf=conf)
        return Draft(tokens, [local[tree["par"][n]] if tree["par"][n] >= 0 else -1 for n in nodes], conf=conf)


def head_kv_tokens(max_total_tokens: int, max_num_sequence: int, width: int, max_depth: int) -> int:
    """KV capacity of a head: the committed rows plus each sequence's scratch tree rows."""
    return max_total_tokens + max_num_sequence * (width * max_depth + 2 * KV_PAGE_SIZE)
