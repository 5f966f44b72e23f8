"""The compiled EAGLE heads (EAGLE-1 and EAGLE-3) as the proposer drives them: one draft
depth per call, ``catch_up`` on the target's features then ``step`` on the head's own.

Why two paths. A head library built now exports ``draft_step`` / ``draft_catch_up``
(models/eagle.py, eagle3.py): embedding, layer(s), norm, lm_head and a top-k over the draft
vocabulary in one call for the whole batch, fed the target's own embedding tensors (so the
target is not called per depth), returning the rows' features -- left on the device for
the next depth -- and only [n, k] token ids and log-probabilities to the host. That is
the path whenever it applies (``bind``). The separate calls stay for what it cannot serve:
a full-vocabulary EAGLE-1 head (its logits are the target's ``get_logits``), a library
built before the draft entry points, a tree wider than the compiled top-k, or a target
that stores its embedding otherwise than the head was compiled for (another quantization).
Both paths give the same drafts: the same kernels compute the rows, and ``top_tokens``
orders exactly as the device top-k (kernels/draft_topk.py) -- by logit, ties to the
lower draft id.
"""
from __future__ import annotations

import numpy as np

from ..contract import EAGLE, EAGLE3
from ..kv_cache import ForwardBatch
from ..model import Model
from .proposers import HeadMismatch


class HostDraftCalls:
    """A draft depth through separate calls, with the top-k on the host. Built on the
    head's ``forward``, ``forward_target``, ``logits`` and ``vocab_ids`` (the compiled heads
    below, or a test's fake head)."""

    on_device = False  # catch_up/step run the fused entry points; features stay on the device

    def bind(self, target, width: int) -> str | None:
        """Prepare the draft path for this target and tree width; returns why the fused
        entry points do not serve (None when they do)."""
        return "the head drafts through separate calls"

    def catch_up(self, target, kv, batch: ForwardBatch, tokens: np.ndarray, feats: np.ndarray, last: np.ndarray,
                 width: int):
        """Head rows built from the target's features feats [n, f] (host) paired with tokens
        [n] -> (the head's features at rows ``last`` [s, h], the ``width`` best target token
        ids [s, width] there, their log-probabilities [s, width])."""
        out = self.forward_target(target, kv, batch, tokens, feats).numpy()[last]
        return (out, *self.top(target, out, width))

    def step(self, target, kv, batch: ForwardBatch, tokens: np.ndarray, hidden, rows: np.ndarray, width: int):
        """One draft depth: rows of tokens [n] whose parent features are hidden[rows] (hidden:
        what the last catch_up/step returned) -> (features [n, h], ids [n, width], log-probs [n, width])."""
        out = self.forward(target, kv, batch, tokens, np.asarray(hidden)[rows]).numpy()
        return (out, *self.top(target, out, width))

    def top(self, target, feats: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
        """The ``width`` best target tokens of each row's draft logits [n, width], log-probs [n, width]."""
        logits = self.logits(target, feats)
        width = min(width, logits.shape[1])
        ids, logp = np.empty((len(logits), width), np.int64), np.empty((len(logits), width))
        for j, row in enumerate(logits):
            ids[j], logp[j] = top_tokens(row, width)
        return (ids if self.vocab_ids is None else self.vocab_ids[ids]), logp


class EagleHeadModel(HostDraftCalls, Model):
    """A compiled EAGLE head and its weights: ``eagle_forward``, and with a reduced draft
    vocabulary (``vocab_ids`` maps its rows to target tokens) ``draft_logits`` and the draft
    entry points (``top_k`` > 0 columns)."""

    kind = EAGLE  # the contract's entry points of an EAGLE head (draft_logits with a reduced vocabulary)
    features = "hidden"  # what its rows are built from: the target's final-normed hidden states

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.vocab_ids = draft_vocab_ids(self)
        has = "draft_step" in self._fn and self.meta.get("target_embed")
        self.top_k = int(self.meta.get("draft_top_k") or 0) if has else 0
        self.target_embed: list | None = None  # the target's embedding tensors, once bound

    def check_target(self, target: Model) -> None:
        """Refuse a target this head cannot read. An EAGLE-1 head reads the final hidden states,
        which every target library exports, and the loader checked the sizes: nothing to refuse."""

    def bind(self, target: Model, width: int) -> str | None:
        """Draft through ``draft_step``/``draft_catch_up`` with the target's embedding tensors
        if the head has them, its top-k covers ``width`` and the target stores the tensors
        the head was compiled for (same names, shapes and dtypes, same device kind: the CPU
        kernels then read the same tiled layout); else returns why not."""
        self.on_device, self.target_embed = False, None
        if not self.top_k:
            return "the head has no draft_step (a full-vocabulary head, or built before draft steps on device)"
        if width > self.top_k:
            return f"--spec-tree-width {width} is wider than the head's compiled top-{self.top_k}"
        if target.meta.get("target") != self.meta.get("target"):
            return f"the head was compiled for {self.meta.get('target')}, the target for {target.meta.get('target')}"
        index = {p["name"]: (i, p) for i, p in enumerate(target.meta["params"])}
        tensors = []
        for want in self.meta["target_embed"]:
            i, have = index.get(want["name"], (None, None))
            if have is None or list(have["shape"]) != list(want["shape"]) or have["dtype"] != want["dtype"]:
                return (f"the head reads the target's {want['name']} {want['shape']} {want['dtype']}, which this "
                        f"target ({target.meta.get('quantization')}) does not store: compile the head with the "
                        "target's quantization")
            tensors.append(target.params[i])
        self.target_embed, self.on_device = tensors, True
        return None

    def catch_up(self, target, kv, batch, tokens, feats, last, width):
        self.check_rows(len(tokens))  # the buffers are planned for at most prefill_chunk_size rows
        if not self.on_device:
            return super().catch_up(target, kv, batch, tokens, feats, last, width)
        target.check_token_ids(tokens)  # committed tokens; the embedding gather does not bounds-check
        ids, feats, last, *meta = self.stage("catch_up", [np.asarray(tokens, np.int32), np.asarray(feats, self.dtype),
                                                          np.asarray(last, np.int32), *batch.arrays])
        out = self._fn["draft_catch_up"](ids, feats, last, self.target_embed, kv.tensor, *meta, self.params)
        return self._result(out, width)

    def step(self, target, kv, batch, tokens, hidden, rows, width):
        self.check_rows(len(tokens))
        if not self.on_device:
            return super().step(target, kv, batch, tokens, hidden, rows, width)
        # tokens: drafts of this head, mapped to target ids through d2t (checked at load); hidden: the
        # features the last call left on the device (or host ones, staged with the rest)
        host = [np.asarray(hidden, self.dtype)] if isinstance(hidden, np.ndarray) else []
        ids, rows, *meta = self.stage("step", [np.asarray(tokens, np.int32), np.asarray(rows, np.int32),
                                               *batch.arrays, *host])
        hidden = meta.pop() if host else hidden
        out = self._fn["draft_step"](ids, hidden, rows, self.target_embed, kv.tensor, *meta, self.params)
        return self._result(out, width)

    @staticmethod
    def _result(out, width: int):
        # (features [n, h] left on the device, ids [n, width], log-probs [n, width] on the host)
        return out[0], out[1].numpy()[:, :width].astype(np.int64), out[2].numpy()[:, :width].astype(np.float64)

    # ------------------------------------------------ the separate calls
    def logits(self, target: Model, feats) -> np.ndarray:
        """Draft logits of predicted features: over the reduced vocabulary (rows of
        ``vocab_ids``) when the head has one, else the target's full lm_head."""
        if self.vocab_ids is None:
            return target.get_logits(feats).numpy()
        if isinstance(feats, np.ndarray):
            feats = self.uploads.put("logits.feats", np.asarray(feats, self.dtype))
        self.check_rows(int(feats.shape[0]), "rows")
        return self._fn["draft_logits"](feats, self.params).numpy()

    def forward(self, target: Model, kv, batch: ForwardBatch, tokens: np.ndarray, feats):
        """Predicted features [n, hidden] (device) of the pairs (feats[j], tokens[j]); feats
        on the host or the device."""
        self.check_rows(len(tokens))
        emb = target.embed(tokens)  # the target's embedding: the head owns none
        hid = self.uploads.put("forward.feats", np.asarray(feats, self.dtype)) if isinstance(feats, np.ndarray) else feats
        meta = [self.uploads.put(f"forward.{i}", a) for i, a in enumerate(batch.arrays)]
        return self._fn["eagle_forward"](emb, hid, kv.tensor, *meta, self.params)

    def forward_target(self, target: Model, kv, batch: ForwardBatch, tokens: np.ndarray, feats: np.ndarray):
        """As :meth:`forward`, for rows built from the target's own features (the catch-up)."""
        return self.forward(target, kv, batch, tokens, feats)


class Eagle3HeadModel(EagleHeadModel):
    """A compiled EAGLE-3 head: ``fuse_features`` (fc over the target's three layer outputs),
    ``eagle_forward`` (its decoder layer, output before its final norm), ``draft_logits``
    (its final norm and lm_head over its draft vocabulary: ``vocab_ids`` is never None, as an
    EAGLE-3 head always carries d2t, so :meth:`logits` never uses the target's lm_head), and
    the draft entry points, whose catch-up applies fc itself."""

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
        fused = self._fn["fuse_features"](self.uploads.put("fuse.feats", np.asarray(feats, self.dtype)), self.params)
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


COVERAGE_DECAY = 0.9  # per committed token: a sequence's coverage is mostly its last ten or so tokens


class VocabCoverage:
    """How often each sequence's recent tokens lay in a head's reduced draft vocabulary.

    A head can only be right on tokens its vocabulary holds, and its confidence is over that
    vocabulary alone. On a translation into French or German 41-45% of Qwen2.5-Coder-1.5B's
    answer tokens are among the 16k of its EAGLE-3 head (code 98-100%, summaries and RAG
    84-91%). The head was then asked in up to a third of the steps, confidently, and never
    accepted. The first-token acceptance a plan weighs before any draft forward is scaled by
    this rate, which the committed tokens give for free, before a catch-up or a head call is
    paid for."""

    def __init__(self, vocab_ids: np.ndarray | None):
        self.mask = None  # token id -> in the draft vocabulary (ids past its end are not)
        if vocab_ids is not None:
            ids = np.asarray(vocab_ids, np.int64)
            self.mask = np.zeros(int(ids.max()) + 2, bool)
            self.mask[ids] = True
        self.rate: dict[int, float] = {}
        self.seen: dict[int, int] = {}  # tokens of the sequence's history already counted

    def add(self, seq_id: int, prompt: list[int]) -> None:
        self.rate[seq_id], self.seen[seq_id] = 1.0, len(prompt)  # the answer's tokens count, not the prompt's

    def remove(self, seq_id: int) -> None:
        self.rate.pop(seq_id, None)
        self.seen.pop(seq_id, None)

    def update(self, seq_id: int, history: list[int]) -> float:
        """The sequence's coverage after counting its tokens committed since the last call."""
        rate, start = self.rate.get(seq_id, 1.0), self.seen.get(seq_id, len(history))
        if self.mask is not None:
            new = np.minimum(np.asarray(history[start:], np.int64), self.mask.size - 1)  # the last entry is False
            for hit in self.mask[new].tolist():
                rate = COVERAGE_DECAY * rate + (1.0 - COVERAGE_DECAY) * hit
        self.rate[seq_id], self.seen[seq_id] = rate, len(history)
        return rate

    def first_tokens(self, seq_ids: list[int], histories: list[list[int]], plan) -> list[tuple[float, float]]:
        """The expansions a plan's first ``should_draft`` weighs: (1, each sequence's first-token
        estimate times its coverage); a head over the full vocabulary leaves the estimate as it is."""
        rates = [self.update(s, h) for s, h in zip(seq_ids, histories)]
        if self.mask is None:
            rates = [1.0] * len(seq_ids)
        return [(1.0, plan.first(s) * r) for s, r in zip(seq_ids, rates)]


def top_tokens(row: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``width`` most likely tokens of one logits row (ties: lower id first, the order of
    the heads' device top-k) and their log-probabilities."""
    row = np.asarray(row, np.float64)
    if width == 1:
        idx = np.asarray([int(np.argmax(row))])
    else:  # the width-th largest value; of the tokens tied with it, the lowest ids get in
        width = min(width, row.size)
        kth = -np.partition(-row, width - 1)[width - 1]
        above = np.flatnonzero(row > kth)
        part = np.concatenate([above, np.flatnonzero(row == kth)[: width - above.size]])
        idx = part[np.lexsort((part, -row[part]))]
    m = row.max()
    lse = m + np.log(np.exp(row - m).sum())
    return idx, row[idx] - lse
