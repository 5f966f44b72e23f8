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
(``ScratchRows`` never grows the committed length), so after drafting the head's cache is
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
the ``width`` most probable frontier nodes are expanded (one head call per depth for all
sequences), each giving its ``width`` best children, for as long as the step's plan says
the next head call pays. The proposer hands over the ``max_nodes`` most probable
candidates (a parent is never less probable than its child, so it is a tree) and the plan
keeps those worth their verify rows; width 1 is a chain. Draft tokens are deterministic
(one-hot q), which keeps rejection sampling exact for trees too (runtime/acceptance.py).

Why it is built for speed. On a CPU a draft depth must cost a few percent of a target
step, so each depth is one library call for the whole batch (runtime/drafters/eagle_heads.py: the
head's ``draft_step`` embeds, runs its layers, scores and takes the top-k on the device;
the features stay there, only [n, k] ids and log-probabilities come back), and the host
work around it is array arithmetic: the candidates of all sequences live in flat numpy
arrays (``DraftTree``) and the scratch rows' KV metadata is built from per-row arrays
(``ScratchRows``), instead of per-node Python lists and a re-planned tree per depth.
"""
from __future__ import annotations

import time

import numpy as np
from tvm.runtime import tensor as to_device

from ..acceptance import Draft
from ..adaptive import MAX_DEPTH
from ..contract import EAGLE, EAGLE3, KV_PAGE_SIZE
from ..costs import time_min
from .eagle_heads import (Eagle3HeadModel, EagleHeadModel, HostDraftCalls, VocabCoverage,  # noqa: F401
                          check_draft_vocab, draft_vocab_ids, top_tokens)
from ..kv_cache import ForwardBatch, PagedKV, split_forwards
from ..model import Model
from .proposers import load_head

MAX_TREE_NODES = 256


class DraftTree:
    """The candidates of one ``propose`` for every sequence of the batch, in creation order
    (a depth's children after its parents): flat arrays indexed by node, in preallocated
    columns (a draft depth appends by slice assignment, not by concatenating)."""

    INT = ("tok", "par", "seq", "depth", "src", "row")
    # tok: target token id; par: parent node (-1: a child of the last committed token); seq: its
    # sequence's index in the batch; depth: 1 for a child of the last committed token; src: the row
    # of the head call that gave it (its parent's features); row: its scratch row once expanded, or -1
    FLOAT = ("conf", "P")  # the head's probability of the token; path probability (the plan's
    # acceptance of conf times the parent's P)

    def __init__(self, plan, seq_ids: list[int], capacity: int = 64):
        self.plan, self.seq_ids, self.n = plan, seq_ids, 0  # seq_ids: the batch's, for the plan
        self._int = np.zeros((len(self.INT), capacity), np.int64)
        self._float = np.zeros((len(self.FLOAT), capacity))
        self._views()

    def _views(self) -> None:
        for j, name in enumerate(self.INT):
            setattr(self, name, self._int[j, : self.n])
        for j, name in enumerate(self.FLOAT):
            setattr(self, name, self._float[j, : self.n])

    def add(self, parents: np.ndarray, seqs: np.ndarray, ids: np.ndarray, logp: np.ndarray) -> np.ndarray:
        """Row j of a head call ([rows, width] ids and log-probs) gives ``width`` children of
        node parents[j] (-1: the root) of sequence seqs[j]; returns the new nodes' indices."""
        rows, width = ids.shape
        n0, n1 = self.n, self.n + rows * width
        if n1 > self._int.shape[1]:
            grow = max(n1, 2 * self._int.shape[1]) - self._int.shape[1]
            self._int = np.pad(self._int, ((0, 0), (0, grow)))
            self._float = np.pad(self._float, ((0, 0), (0, grow)))
        tok, par, seq, depth, src, row = (c.reshape(rows, width) for c in self._int[:, n0:n1])
        conf, P = (c.reshape(rows, width) for c in self._float[:, n0:n1])
        tok[:] = ids
        par[:] = parents[:, None]
        seq[:] = seqs[:, None]
        src[:] = np.arange(rows)[:, None]
        row[:] = -1
        conf[:] = np.exp(logp)
        known = parents >= 0
        at = np.where(known, parents, 0)
        depth[:] = np.where(known, self._int[3, at] + 1, 1)[:, None]
        up = np.where(known, self._float[1, at], 1.0)
        owner = [self.seq_ids[i] for i in np.repeat(seqs, width).tolist()]
        P[:] = np.asarray([self.plan.p(c, s) for c, s in zip(conf.reshape(-1).tolist(), owner)]).reshape(
            rows, width) * up[:, None]
        self.n = n1
        self._views()
        return np.arange(n0, n1)

    def expand(self, frontier: np.ndarray, width: int) -> np.ndarray:
        """Per sequence the ``width`` most probable of these nodes (ties: created first),
        sequences in batch order."""
        fr = frontier[np.lexsort((frontier, -self.P[frontier], self.seq[frontier]))]
        seq = self.seq[fr]
        rank = np.arange(len(fr)) - np.searchsorted(seq, seq)
        return fr[rank < width]

    def select(self, seq: int, budget: int) -> tuple[np.ndarray, np.ndarray]:
        """The ``budget`` most probable nodes of a sequence (ties: shallower, then created
        first), ordered by depth: (nodes, local parent index or -1). As P never grows down a
        path, every chosen node's parent is chosen too: it is a tree."""
        nodes = np.flatnonzero(self.seq == seq)
        keep = nodes[np.lexsort((nodes, self.depth[nodes], -self.P[nodes]))][:budget]
        keep = keep[np.lexsort((keep, self.depth[keep]))]
        local = np.full(self.n, -1)
        local[keep] = np.arange(len(keep))
        par = self.par[keep]
        parents = np.where(par >= 0, local[np.maximum(par, 0)], -1)
        if ((parents < 0) != (par < 0)).any():
            raise RuntimeError("EAGLE: a draft candidate is more probable than its parent")
        return keep, parents


class ScratchRows:
    """KV metadata of a head's scratch tree rows, planned row by row as the tree grows.

    Row j of sequence s (with L committed rows) sits at row L + j, has RoPE position
    L + depth - 1 and attends rows 0..L-1, then its ancestors' rows from the root down and
    itself -- what ``PagedKV.plan_tree`` gives for the whole tree, but only for the rows
    added by this call, from arrays of the earlier rows' paths (the tree is never
    re-planned)."""

    def __init__(self, kv: PagedKV, ids: list[int], max_depth: int = MAX_DEPTH, capacity: int = 64):
        self.kv, self.ids, self.n = kv, ids, 0
        self.base = np.asarray([kv.length(s) for s in ids], np.int64)  # committed rows
        self.count = np.zeros(len(ids), np.int64)  # scratch rows so far
        self.depth = np.zeros(capacity, np.int64)  # of every scratch row (all sequences, in planning order)
        self.path = np.zeros((capacity, max_depth), np.int32)  # slots of each row's ancestors, root first, then itself

    def plan(self, seqs: np.ndarray, parents: np.ndarray) -> tuple[ForwardBatch, np.ndarray]:
        """New rows of sequences seqs (batch indices, ascending) whose parents are these
        earlier rows (indices this method returned, -1: the root) -> (their forward's
        metadata, their row indices)."""
        n = len(seqs)
        first = np.flatnonzero(np.concatenate([[True], seqs[1:] != seqs[:-1]]))
        grow, counts = seqs[first], np.diff(np.append(first, n))
        local = self.count[seqs] + np.arange(n) - np.repeat(first, counts)
        self.count[grow] += counts
        ids = [self.ids[g] for g in grow.tolist()]
        self.kv.reserve(ids, self.count[grow].tolist())
        rows = self.base[seqs] + local
        slots = np.concatenate([self.kv.slots(s, rows[lo: lo + c]) for s, lo, c in zip(ids, first, counts)])
        known = parents >= 0
        depth = np.where(known, self.depth[np.where(known, parents, 0)] + 1, 1)
        if self.n + n > len(self.depth) or depth.max() > self.path.shape[1]:
            more = max(self.n + n, 2 * len(self.depth)) - len(self.depth)
            self.depth = np.pad(self.depth, (0, more))
            self.path = np.pad(self.path, ((0, more), (0, max(0, int(depth.max()) - self.path.shape[1]))))
        new = np.arange(self.n, self.n + n)
        path = self.path[new]
        path[known] = self.path[parents[known]]
        path[np.arange(n), depth - 1] = slots
        self.path[new], self.depth[new], self.n = path, depth, self.n + n
        named = {"positions": (self.base[seqs] + depth - 1).astype(np.int32), "write_slots": slots.astype(np.int32),
                 "page_table": self.kv.page_table(ids), "token_seq": np.repeat(np.arange(len(grow), dtype=np.int32), counts),
                 "token_prefix": self.base[seqs].astype(np.int32),
                 "extra_slots": np.ascontiguousarray(path[:, : depth.max()]), "extra_len": depth.astype(np.int32)}
        return ForwardBatch(ids, counts.tolist(), named), new


class EagleProposer:
    name = "eagle"
    supports_trees = True
    additional_model, additional_model_form = "its EAGLE head", "HEAD_DIR,HEAD_LIB"
    additional_model_optional = False
    free_drafts = False
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

    def __init__(self, head: HostDraftCalls, target: Model, max_total_tokens: int, tree_width: int = 1,
                 max_nodes: int = 64):
        if tree_width < 1:
            raise ValueError("--spec-tree-width must be >= 1 (1 = chain)")
        if not 1 <= max_nodes <= MAX_TREE_NODES:
            raise ValueError(f"--spec-tree-nodes must be in 1..{MAX_TREE_NODES}")
        check_draft_vocab(head.vocab_ids, target.vocab_size, "EAGLE")
        self.head, self.target = head, target
        self.features = head.features
        self.width, self.max_nodes = tree_width, max_nodes
        # None: each draft depth is one call on the device; else why it takes separate calls
        self.separate_calls = head.bind(target, tree_width)
        self.kv = head.create_kv_cache(max_total_tokens)
        self.pending: dict[int, list[np.ndarray]] = {}  # true features not yet in the head's cache
        # their rows, kept (not summed per step: while a losing head drafts nothing the list grows
        # by one array a step, and a step's cost must not grow with it)
        self.pending_rows: dict[int, int] = {}
        self.coverage = VocabCoverage(head.vocab_ids)
        self.forwards = 0
        self.last_catch_up = 0

    # ------------------------------------------------------------ sequences
    def add_sequence(self, seq_id: int, prompt: list[int], tenant: str | None = None) -> None:
        self.kv.add_sequence(seq_id)
        self.pending[seq_id], self.pending_rows[seq_id] = [], 0
        self.coverage.add(seq_id, prompt)

    def remove_sequence(self, seq_id: int) -> None:
        self.kv.remove_sequence(seq_id)
        self.pending.pop(seq_id, None)
        self.pending_rows.pop(seq_id, None)
        self.coverage.remove(seq_id)

    def on_finish(self, seq_id: int) -> None:
        pass

    def resume(self, seq_id: int, prompt: list[int], keep: int, tenant: str | None = None) -> int:
        """The head's row j is built from the target feature of position j and token j + 1, so
        rows before keep - 1 stay valid; pending features of positions before keep stay too.
        The target must send features again from the first position the head lacks."""
        built = self.kv.length(seq_id)
        if built > keep - 1:
            self.kv.popn(seq_id, built - max(keep - 1, 0))
            self.pending[seq_id] = []
        else:
            pending = self.pending[seq_id]  # positions built.., and keep > built here
            self.pending[seq_id] = [np.concatenate(pending)[: keep - built]] if pending else []
        self.pending_rows[seq_id] = sum(len(p) for p in self.pending[seq_id])
        self.coverage.remove(seq_id)
        self.coverage.add(seq_id, prompt)
        return self.kv.length(seq_id) + self.pending_rows[seq_id]

    def prefill(self, seq_ids: list[int], chunks: list[list[int]], starts: list[int]) -> None:
        pass  # the head works from the features observe_hidden receives

    def observe_hidden(self, seq_id: int, position: int, hidden: np.ndarray) -> None:
        """Target features of the tokens at positions position.. (in order, no gaps)."""
        if seq_id not in self.pending:  # attached while speculation was disabled
            return
        have = self.kv.length(seq_id) + self.pending_rows[seq_id]
        if position != have:
            raise RuntimeError(f"EAGLE: features for position {position} arrived, {have} expected")
        self.pending[seq_id].append(np.asarray(hidden))
        self.pending_rows[seq_id] += len(hidden)

    def on_commit(self, seq_id: int, history: list[int]) -> None:
        pass  # the head's cache already holds only rows built from true features

    def measure(self, rows: list[int]) -> tuple[dict[int, float], float]:
        """One draft depth over r scratch rows (one per scratch sequence), as ``_grow`` runs
        it: the rows' metadata, the head call, the top-width ids and log-probabilities on
        the host, for each r; and what one more true-feature row costs in a catch-up (32 rows
        of one sequence, as after a prompt or a plain stretch, against one row)."""
        scratch = [-1 - i for i in range(max(rows))]
        feats = np.zeros((max(rows), self.head.hidden_size), getattr(self.head, "dtype", "float32"))
        hidden = to_device(feats, self.head.device) if self.head.on_device else feats
        width = self.head.hidden_size * (len(self.target.feature_layers) if self.features == "layers" else 1)
        true = np.zeros((32, width), np.float32)
        for s in scratch:
            self.kv.add_sequence(s)

        def step(r):
            batch, _ = ScratchRows(self.kv, scratch[:r]).plan(np.arange(r), np.full(r, -1))
            self.head.step(self.target, self.kv, batch, np.zeros(r, np.int64), hidden, np.arange(r), self.width)
            for s in scratch[:r]:
                self.kv.popn(s, 0)

        def catch_up(n):
            self.head.catch_up(self.target, self.kv, self.kv.plan_chain(scratch[:1], [n]), np.zeros(n, np.int32),
                               true[:n], np.array([n - 1]), self.width)
            self.kv.popn(scratch[0], n)

        try:
            table = {r: time_min(lambda: step(r)) for r in rows}
            per_row = max(time_min(lambda: catch_up(32)) - time_min(lambda: catch_up(1)), 0.0) / 31
            return table, per_row
        finally:
            for s in scratch:
                self.kv.remove_sequence(s)

    # -------------------------------------------------------------- drafting
    def propose(self, seq_ids, histories, ks, sampling, rngs, plan, node_limit: int | None = None) -> list[Draft]:
        drafts = [Draft() for _ in seq_ids]
        active = [i for i, k in enumerate(ks) if k > 0]
        fed = sum(self.pending_rows[seq_ids[i]] for i in active)
        # the catch-up builds every true row the head lacks (a prompt, a plain stretch): priced
        # per row and charged in part to this step, since it buys drafting for the steps after
        # it too; charged whole as a draft forward of that many rows, a 73-token prompt looked
        # like a target step, never paid, and grew by a row with every plain step after it
        if not active:
            return drafts
        ids = [seq_ids[i] for i in active]
        if not plan.should_draft(len(active), self.coverage.first_tokens(ids, [histories[i] for i in active], plan),
                                 fed - len(active)):
            return drafts
        try:
            t0 = time.perf_counter()
            root = self._catch_up(ids, [histories[i] for i in active])
            tree = self._grow(ids, [ks[i] for i in active], root, plan, t0)
        finally:
            for s in ids:
                self.kv.popn(s, 0)  # free the pages the scratch tree rows took
        budget = min(self.max_nodes, node_limit or self.max_nodes)
        for r, i in enumerate(active):
            nodes, parents = tree.select(r, budget)
            tokens, conf = tree.tok[nodes].tolist(), tree.conf[nodes].tolist()
            drafts[i] = Draft(tokens, conf=conf) if self.width == 1 else Draft(tokens, parents.tolist(), conf=conf)
        return drafts

    def _catch_up(self, ids: list[int], histories: list[list[int]]):
        """Build the head rows of every pending true feature; returns the head's features at
        each sequence's last row and the ``width`` best tokens there (the depth-1 candidates)
        with their log-probabilities."""
        feats = [np.concatenate(self.pending[s]) for s in ids]
        starts = [self.kv.length(s) for s in ids]
        tokens = [h[st + 1: st + 1 + len(f)] for h, st, f in zip(histories, starts, feats)]
        if any(len(t) != len(f) or not len(f) for t, f in zip(tokens, feats)):
            raise RuntimeError("EAGLE: the target features and the history disagree")
        counts = [len(f) for f in feats]
        self.kv.check_room(ids, counts)  # all or nothing: a full cache leaves the pending rows pending
        forwards = split_forwards(counts, min(self.head.max_forward_tokens, self.target.max_forward_tokens))
        if len(forwards) == 1:  # the usual case: one call, its features stay on the device
            batch = self.kv.plan_chain(ids, counts)
            out = self.head.catch_up(self.target, self.kv, batch, np.concatenate(tokens).astype(np.int32),
                                     np.concatenate(feats), np.cumsum(counts) - 1, self.width)
            self.forwards += 1
        else:  # a long prompt's rows over consecutive calls (the same rows, so the same result)
            roots = [None] * len(ids)
            for pieces in forwards:
                sizes = [e - a for _, a, e in pieces]
                batch = self.kv.plan_chain([ids[i] for i, _, _ in pieces], sizes)
                f, top, logp = self.head.catch_up(
                    self.target, self.kv, batch, np.concatenate([tokens[i][a:e] for i, a, e in pieces]).astype(np.int32),
                    np.concatenate([feats[i][a:e] for i, a, e in pieces]), np.cumsum(sizes) - 1, self.width)
                f = f if isinstance(f, np.ndarray) else f.numpy()
                self.forwards += 1
                for j, (i, _, e) in enumerate(pieces):
                    if e == counts[i]:
                        roots[i] = (f[j], top[j], logp[j])
            out = tuple(np.stack(col) for col in zip(*roots))
        self.last_catch_up = max(counts)
        for s in ids:
            self.pending[s], self.pending_rows[s] = [], 0
        return out

    def _grow(self, ids: list[int], depths: list[int], root, plan, t0: float) -> DraftTree:
        """Candidates of every sequence, expanded EAGLE-2 style: per depth the ``width``
        most probable frontier nodes of each sequence still growing, in one head call, while
        the plan says the next call pays."""
        feats, top_ids, top_logp = root  # [b, h] (device or host), [b, width], [b, width]
        tree = DraftTree(plan, ids)
        frontier = tree.add(np.full(len(ids), -1), np.arange(len(ids)), top_ids, top_logp)
        plan.spent(time.perf_counter() - t0)
        plan.drafted(tree.P.tolist())
        rows = ScratchRows(self.kv, ids, max(MAX_DEPTH, max(depths)))
        depths = np.asarray(depths)
        for depth in range(1, int(depths.max())):
            expand = tree.expand(frontier[depths[tree.seq[frontier]] > depth], self.width)
            nodes = [(P, plan.p(c, ids[i])) for P, c, i in
                     zip(tree.P[expand].tolist(), tree.conf[expand].tolist(), tree.seq[expand].tolist())]
            if not plan.should_draft(len(nodes), nodes):
                break
            t0 = time.perf_counter()
            par = tree.par[expand]
            batch, tree.row[expand] = rows.plan(tree.seq[expand], np.where(par >= 0, tree.row[np.maximum(par, 0)], -1))
            feats, top_ids, top_logp = self.head.step(self.target, self.kv, batch, tree.tok[expand], feats,
                                                      tree.src[expand], self.width)
            self.forwards += 1
            frontier = tree.add(expand, tree.seq[expand], top_ids, top_logp)
            plan.spent(time.perf_counter() - t0)
            plan.drafted(tree.P[frontier].tolist())
        return tree


def head_kv_tokens(max_total_tokens: int, max_num_sequence: int, width: int, max_depth: int) -> int:
    """KV capacity of a head: the committed rows plus each sequence's scratch tree rows."""
    return max_total_tokens + max_num_sequence * (width * max_depth + 2 * KV_PAGE_SIZE)
