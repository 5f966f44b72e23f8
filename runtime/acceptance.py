"""The acceptance rule every draft goes through (chain or token tree): the numpy reference
of the library's kernels (``Model.accept_greedy``, ``Model.accept_sampled``).

A draft for one sequence is a list of nodes: token, parent (-1 = the last committed
token), and optionally the draft's distribution q at that node. Row 0 of the target
logits is the target's prediction after the last committed token, row j+1 the
prediction after draft node j (the order ``[last] + drafts`` is verified in).

- Greedy (temperature 0): from the root, follow the child whose token equals the
  target's argmax; stop when none does. The bonus token is the argmax where we stop.
  The output is then exactly what plain greedy decoding produces.
- Sampling: at each node, try its children in order and accept child x with probability
  min(1, p(x)/q(x)); after a rejection p becomes norm(max(p - q, 0)) before the next
  sibling (recursive rejection sampling, the standard multi-draft rule). The bonus is
  drawn from the final p. A deterministic draft (n-gram, greedy draft model) has a
  one-hot q. Either way the emitted tokens follow the target's distribution exactly.
  ``probs_from_logits`` applies temperature/top-k/top-p identically to target and draft.

The random numbers may also be given (``uniforms``), one per draft node for its accept
test and one for the bonus, which is drawn by inverse CDF exactly as ``Generator.choice``
does with one uniform. The law is the same; this is how the library's TensorIR kernel
(kernels/sampling.py) and this reference are compared on the same draws.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .sampling import SamplingParams, probs_from_logits


@dataclass
class Draft:
    tokens: list[int] = field(default_factory=list)  # [k]
    parents: list[int] | None = None  # [k] local parent index, -1 = root; None = chain
    probs: np.ndarray | None = None  # [k, vocab] draft distribution at each node; None = one-hot
    conf: list[float] | None = None  # [k] the proposer's confidence in each node (runtime/adaptive.py)
    source: list[int] | None = None  # [k] which source drafted each node (adaptive.SOURCES); None = all 0

    def __len__(self) -> int:
        return len(self.tokens)

    def parent_list(self) -> list[int]:
        return self.parents if self.parents is not None else list(range(-1, len(self.tokens) - 1))

    def depths(self) -> list[int]:
        """Each node's depth, 1 for a child of the last committed token."""
        depth: list[int] = []
        for p in self.parent_list():
            depth.append(1 if p < 0 else depth[p] + 1)
        return depth

    def subset(self, nodes: list[int]) -> "Draft":
        """The draft restricted to ``nodes`` (a parent-closed set, ascending), renumbered in
        order (of a chain, a prefix: it stays a chain)."""
        if len(nodes) == len(self):
            return self
        local = {n: i for i, n in enumerate(nodes)}
        parents = self.parent_list()
        return Draft([self.tokens[n] for n in nodes],
                     None if self.parents is None else [local[parents[n]] if parents[n] >= 0 else -1 for n in nodes],
                     None if self.probs is None else self.probs[nodes],
                     None if self.conf is None else [self.conf[n] for n in nodes],
                     None if self.source is None else [self.source[n] for n in nodes])

    def verify_parents(self) -> list[int]:
        """Parents for the verify forward of [last] + nodes (node j -> row j + 1)."""
        return [-1] + [p + 1 for p in self.parent_list()]


def verified_as_tree(drafts: list[Draft]) -> bool:
    """Whether a step verifies these drafts as token trees (scratch rows, then a tree commit)
    rather than as chains (appended rows, rolled back). The forward and the commit must agree:
    an empty draft is a chain whatever its parent list, since no tree row is written for it."""
    return any(d.parents is not None and len(d) for d in drafts)


@dataclass
class Verdict:
    path: list[int]  # accepted draft nodes, root first
    tokens: list[int]  # emitted tokens: accepted drafts then the bonus token


def accept_reference(logits: np.ndarray, draft: Draft, sampling: SamplingParams, rng: np.random.Generator,
           uniforms: np.ndarray | None = None) -> Verdict:
    """logits: [k + 1, vocab] target logits for [last] + draft nodes.

    uniforms: [k + 1] in [0, 1) replacing ``rng`` when given: uniforms[j] for the accept
    test of draft node j, uniforms[k] for the bonus token."""
    parents = draft.parent_list()
    children: dict[int, list[int]] = {}
    for j, p in enumerate(parents):
        children.setdefault(p, []).append(j)
    path: list[int] = []
    node = -1
    if sampling.greedy:
        while True:
            best = int(np.argmax(logits[node + 1]))
            nxt = next((c for c in children.get(node, []) if draft.tokens[c] == best), None)
            if nxt is None:
                return Verdict(path, [draft.tokens[j] for j in path] + [best])
            path.append(nxt)
            node = nxt
    while True:
        p = probs_from_logits(logits[node + 1], sampling)
        accepted = None
        for c in children.get(node, []):
            x = draft.tokens[c]
            q = _draft_probs(draft, c, p.shape[-1])
            if q[x] > 0 and _uniform(rng, uniforms, c) < min(1.0, p[x] / q[x]):
                accepted = c
                break
            p = np.maximum(p - q, 0.0)
            total = p.sum()
            if total <= 0:  # p == q on the support: any residual is empty, fall back to p's mass elsewhere
                p = probs_from_logits(logits[node + 1], sampling)
                break
            p = p / total
        if accepted is None:
            if uniforms is None:
                bonus = int(rng.choice(p.shape[-1], p=p))
            else:  # Generator.choice's own rule: the first index whose normalized CDF exceeds u
                cdf = np.cumsum(p)
                bonus = int(np.searchsorted(cdf / cdf[-1], float(uniforms[len(draft)]), side="right"))
            return Verdict(path, [draft.tokens[j] for j in path] + [bonus])
        path.append(accepted)
        node = accepted


def _uniform(rng: np.random.Generator, uniforms: np.ndarray | None, index: int) -> float:
    return rng.random() if uniforms is None else float(uniforms[index])


def _draft_probs(draft: Draft, node: int, vocab: int) -> np.ndarray:
    if draft.probs is not None:
        return draft.probs[node].astype(np.float64)
    q = np.zeros(vocab)
    q[draft.tokens[node]] = 1.0
    return q
