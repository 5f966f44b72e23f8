"""Medusa drafting: K heads on the target's last hidden state, verified as a sparse tree.

Why: from the feature of the last token the target forwarded (position L-1, whose logits
gave the pending token L), head j predicts token L+1+j, all heads in one call. A
candidate is one choice of rank per depth -- (r_1, ..., r_d) takes head j's r_j-th best
token at depth j -- i.e. the Cartesian product of the heads' top-k. Verifying all of it
is far too big, so the tree is the ``max_nodes`` most probable rank paths, where the
probability of a path is the product of the *measured* per-head, per-rank hit rates
(the Medusa paper's construction): every proposal is scored later against the tokens
actually committed, so the tree follows how good the heads are on this workload. With
width 1 it is a chain of each head's top-1. Each node carries its head's softmax probability
as confidence, and the step's plan verifies only the nodes worth their rows (and skips the
heads' forward altogether when no draft is expected to pay). Drafts are deterministic (one-hot q), so
rejection sampling stays exact (runtime/acceptance.py).
"""
from __future__ import annotations

import heapq
import time

import numpy as np

from ..contract import MEDUSA
from .eagle import MAX_TREE_NODES, VocabCoverage, check_draft_vocab, draft_vocab_ids, top_tokens
from ..model import Model
from ..costs import time_min
from ..acceptance import Draft
from .proposers import load_head


class MedusaHeadsModel(Model):
    """A compiled set of Medusa heads and its weights (only ``medusa_heads``)."""

    kind = MEDUSA  # the contract's entry points of Medusa heads

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.vocab_ids = draft_vocab_ids(self)  # heads sharing a reduced vocabulary: row -> target token

    @property
    def num_heads(self) -> int:
        return int(self.meta["medusa_num_heads"])

    def forward(self, feats: np.ndarray) -> np.ndarray:
        """feats [b, hidden] -> logits [K, b, vocab] (or [K, b, draft_vocab], see ``vocab_ids``)."""
        self.check_rows(len(feats), "rows")
        hid = self.uploads.put("feats", np.asarray(feats, self.dtype))
        return self._fn["medusa_heads"](hid, self.params).numpy()


class MedusaProposer:
    name = "medusa"
    supports_trees = True
    additional_model, additional_model_form = "its Medusa heads", "HEAD_DIR,HEAD_LIB"
    additional_model_optional = False
    free_drafts = False
    features = "hidden"  # the final-normed hidden state of the last committed token

    @classmethod
    def check(cls, config, model_dir) -> None:
        pass  # the heads are checked against the target from their library's metadata, at build

    @classmethod
    def build(cls, config, target: Model, kv_tokens: int, max_num_sequence: int, device: str) -> "MedusaProposer":
        head_dir, head_lib = config.additional_models[0]
        heads = load_head({MEDUSA: MedusaHeadsModel}, cls.name, head_dir, head_lib, target, device)
        return cls(heads, config.spec_tree_width, config.spec_tree_nodes, target=target)

    def __init__(self, heads: MedusaHeadsModel, tree_width: int = 1, max_nodes: int = 64,
                 prior_hits: float = 2.0, target: Model | None = None):
        if tree_width < 1:
            raise ValueError("--spec-tree-width must be >= 1 (1 = chain)")
        if not 1 <= max_nodes <= MAX_TREE_NODES:
            raise ValueError(f"--spec-tree-nodes must be in 1..{MAX_TREE_NODES}")
        if target is not None:
            check_draft_vocab(heads.vocab_ids, target.vocab_size, "Medusa")
        self.heads, self.width, self.max_nodes = heads, tree_width, max_nodes
        k = heads.num_heads
        # hits[j, r]: proposals whose head-j rank-r token was the committed one; tries[j]: scored
        # proposals. A prior that decays with depth and rank seeds the tree before any data.
        self.tries = np.full(k, prior_hits * 4)
        self.hits = np.asarray([[prior_hits * 4 * 0.5 ** (j + 1) / (r + 1) ** 2 for r in range(tree_width)]
                                for j in range(k)])
        self.last: dict[int, tuple[int, np.ndarray]] = {}  # seq -> (position, its target feature)
        self.proposed: dict[int, list[tuple[int, list[list[int]]]]] = {}  # seq -> (first position, top lists)
        self.coverage = VocabCoverage(heads.vocab_ids)
        self.forwards = 0
        self.last_catch_up = 0
        self._tree_cache: tuple | None = None

    # ------------------------------------------------------------ sequences
    def add_sequence(self, seq_id: int, prompt: list[int], tenant: str | None = None) -> None:
        self.proposed[seq_id] = []
        self.coverage.add(seq_id, prompt)

    def remove_sequence(self, seq_id: int) -> None:
        self.last.pop(seq_id, None)
        self.proposed.pop(seq_id, None)
        self.coverage.remove(seq_id)

    def on_finish(self, seq_id: int) -> None:
        pass

    def resume(self, seq_id: int, prompt: list[int], keep: int, tenant: str | None = None) -> int:
        """The heads read the last committed token's feature, which the prefill of the prompt's
        tail sends again; earlier proposals are the old request's."""
        self.remove_sequence(seq_id)
        self.add_sequence(seq_id, prompt, tenant)
        return keep

    def prefill(self, seq_ids: list[int], chunks: list[list[int]], starts: list[int]) -> None:
        pass  # the head works from the features observe_hidden receives

    def observe_hidden(self, seq_id: int, position: int, hidden: np.ndarray) -> None:
        if seq_id in self.proposed and len(hidden):
            self.last[seq_id] = (position + len(hidden) - 1, np.asarray(hidden[-1]))

    def on_commit(self, seq_id: int, history: list[int]) -> None:
        """Score earlier proposals against the tokens now committed."""
        keep = []
        for first, tops in self.proposed.get(seq_id, []):
            done = True
            for j, top in enumerate(tops):
                if top is None:
                    continue
                pos = first + j
                if pos >= len(history):
                    done = False
                    continue
                self.tries[j] += 1
                if history[pos] in top:
                    self.hits[j, top.index(history[pos])] += 1
                tops[j] = None
            if not done:
                keep.append((first, tops))
        self.proposed[seq_id] = keep

    # -------------------------------------------------------------- drafting
    def accuracy(self) -> np.ndarray:
        """Estimated P(head j's rank-r token is the committed one) [K, width]."""
        return self.hits / self.tries[:, None]

    def tree(self, depth: int, budget: int) -> list[tuple[int, ...]]:
        """The ``budget`` most probable rank paths up to ``depth``, parents before children."""
        acc = self.accuracy()
        key = (depth, budget, np.round(acc, 3).tobytes())
        if self._tree_cache is not None and self._tree_cache[0] == key:
            return self._tree_cache[1]
        heap = [(-acc[0, r], (r,)) for r in range(self.width)]
        heapq.heapify(heap)
        paths: list[tuple[int, ...]] = []
        while heap and len(paths) < budget:
            neg, path = heapq.heappop(heap)
            paths.append(path)
            if len(path) < depth:
                for r in range(self.width):
                    heapq.heappush(heap, (neg * acc[len(path), r], path + (r,)))
        paths.sort(key=lambda p: (len(p), p))
        self._tree_cache = (key, paths)
        return paths

    def measure(self, rows: list[int]) -> tuple[dict[int, float], float]:
        """All K heads over r features, plus each head's top-width search, for each r."""
        feats = np.zeros((max(rows), self.heads.hidden_size), np.float32)

        def step(r):
            logits = self.heads.forward(feats[:r])
            for j in range(self.heads.num_heads):
                for row in range(r):
                    top_tokens(logits[j, row], self.width)

        return {r: time_min(lambda: step(r)) for r in rows}, 0.0

    def propose(self, seq_ids, histories, ks, sampling, rngs, plan, node_limit: int | None = None) -> list[Draft]:
        drafts = [Draft() for _ in seq_ids]
        active = [i for i, k in enumerate(ks) if k > 0 and seq_ids[i] in self.last]
        if not active or not plan.should_draft(
                len(active), self.coverage.first_tokens([seq_ids[i] for i in active], [histories[i] for i in active], plan)):
            return drafts
        for i in active:
            pos, _ = self.last[seq_ids[i]]
            if pos != len(histories[i]) - 2:
                raise RuntimeError(f"Medusa: the last feature is at position {pos}, {len(histories[i]) - 2} expected")
        t0 = time.perf_counter()
        logits = self.heads.forward(np.stack([self.last[seq_ids[i]][1] for i in active]))  # [K, a, vocab]
        self.forwards += 1
        budget = min(self.max_nodes, node_limit or self.max_nodes)
        for row, i in enumerate(active):
            depth = min(ks[i], self.heads.num_heads)
            tops, confs = [], []
            for j in range(depth):
                top, logp = top_tokens(logits[j, row], self.width)  # the head's softmax probability: confidence
                if self.heads.vocab_ids is not None:
                    top = self.heads.vocab_ids[top]
                tops.append(top.tolist())
                confs.append(np.exp(logp).tolist())
            paths = self.tree(depth, budget)
            index = {p: n for n, p in enumerate(paths)}
            tokens = [tops[len(p) - 1][p[-1]] for p in paths]
            conf = [confs[len(p) - 1][p[-1]] for p in paths]
            if self.width == 1:
                drafts[i] = Draft(tokens, conf=conf)
            else:
                drafts[i] = Draft(tokens, [index[p[:-1]] if len(p) > 1 else -1 for p in paths], conf=conf)
            # head j proposed tokens for position len(history) + j
            self.proposed[seq_ids[i]].append((len(histories[i]), [list(t) for t in tops]))
        plan.spent(time.perf_counter() - t0)
        return drafts

