"""Paged KV cache bookkeeping on the host; the pages themselves live in one device tensor.

The model's kernels (kernels/attention.py) read and write the tensor; this class decides
which slots each token writes and which rows each token attends, and builds the
per-forward metadata arrays by name (runtime/contract.py's ``FORWARD_META``, which also
fixes the order the entry points take them in). Pages hold the contract's
``KV_PAGE_SIZE`` tokens, the size compiled into the attention kernel. Rolling back a
chain is just shortening a sequence; committing a token tree copies the accepted path's
rows into place.

Recycled sequences (the engine's prefix cache, runtime/engine.py): a finished sequence's
pages may be kept for a later prompt that starts with the same tokens. They count as free
(a scheduler admits against them), and a reservation that lacks pages first asks
``reclaim()`` to free a recycled sequence (the engine's, which frees it here and in its
proposer's caches, least recently recycled first) until it has them or none is left.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from .contract import FORWARD_META, KV_PAGE_SIZE

PAGE = KV_PAGE_SIZE  # the short name this module (and the scheduler) uses


class KVCacheFull(RuntimeError):
    """Not enough free pages for the requested tokens (nothing was changed)."""


@dataclass
class SeqState:
    pages: list[int] = field(default_factory=list)
    length: int = 0  # committed tokens


@dataclass
class ForwardBatch:
    """Metadata of one forward, by name (the keys of ``FORWARD_META``), plus bookkeeping."""

    seq_ids: list[int]
    counts: list[int]
    named: dict[str, np.ndarray]

    @property
    def arrays(self) -> list[np.ndarray]:
        """The metadata in the order the forward entry points take it."""
        return [self.named[name] for name in FORWARD_META]


def split_forwards(counts: list[int], limit: int) -> list[list[tuple[int, int, int]]]:
    """Cut a chain of ``counts[i]`` tokens per sequence into consecutive forwards of at most
    ``limit`` tokens in all: per forward, (sequence index, start, end) of each piece, the
    sequences in order and each sequence's pieces in order."""
    pos = [0] * len(counts)
    forwards = []
    while any(p < c for p, c in zip(pos, counts)):
        budget, pieces = limit, []
        for i, c in enumerate(counts):
            take = min(c - pos[i], budget)
            if take > 0:
                pieces.append((i, pos[i], pos[i] + take))
                pos[i] += take
                budget -= take
        forwards.append(pieces)
    return forwards


class PagedKV:
    def __init__(self, tensor, num_pages: int):
        self.tensor = tensor  # device tensor [layers, 2, num_pages * PAGE, kv_heads, head_dim]
        self.num_pages = num_pages
        self.free: list[int] = list(range(num_pages - 1, -1, -1))
        self.seqs: dict[int, SeqState] = {}
        self.recycled: set[int] = set()  # finished sequences kept (the engine's prefix cache orders them)
        self.recycled_pages = 0  # the pages they hold: an int, so that other threads read it safely (metrics)
        self.reclaim: Callable[[], bool] | None = None  # frees one recycled sequence; False if none is left

    # ------------------------------------------------------------- sequences
    def add_sequence(self, seq_id: int) -> None:
        if seq_id in self.seqs:
            raise ValueError(f"sequence {seq_id} already exists")
        self.seqs[seq_id] = SeqState()

    def remove_sequence(self, seq_id: int) -> None:
        if seq_id in self.recycled:
            self.adopt(seq_id)
        st = self.seqs.pop(seq_id, None)
        if st is not None:
            self.free.extend(reversed(st.pages))

    def recycle(self, seq_id: int) -> None:
        """A finished sequence's pages are kept, and counted as free, until reclaimed."""
        self.recycled.add(seq_id)
        self.recycled_pages += len(self.seqs[seq_id].pages)

    def adopt(self, seq_id: int) -> None:
        """A recycled sequence is in use again: its pages are no longer free to take."""
        self.recycled.remove(seq_id)
        self.recycled_pages -= len(self.seqs[seq_id].pages)

    def length(self, seq_id: int) -> int:
        return self.seqs[seq_id].length

    def num_free_pages(self) -> int:
        """Pages a reservation can get: the free ones and those recycled sequences hold."""
        return len(self.free) + self.recycled_pages

    def pages_needed(self, seq_id: int, extra_tokens: int) -> int:
        st = self.seqs[seq_id]
        return max(0, -(-(st.length + extra_tokens) // PAGE) - len(st.pages))

    def check_room(self, seq_ids: list[int], counts: list[int]) -> None:
        """Raise KVCacheFull unless these sequences can grow by these many tokens (done
        before a long chain is appended over several forwards, so a full cache still
        changes nothing but the recycled sequences it reclaimed)."""
        need = sum(self.pages_needed(s, c) for s, c in zip(seq_ids, counts))
        while need > len(self.free) and self.reclaim is not None and self.reclaim():
            pass
        if need > len(self.free):
            raise KVCacheFull(f"KV cache needs {need} more pages, {len(self.free)} free")

    def _reserve(self, seq_ids: list[int], counts: list[int]) -> None:
        self.check_room(seq_ids, counts)
        for s, c in zip(seq_ids, counts):
            st = self.seqs[s]
            for _ in range(self.pages_needed(s, c)):
                st.pages.append(self.free.pop())

    def reserve(self, seq_ids: list[int], counts: list[int]) -> None:
        """Pages for counts[i] rows past each sequence's committed length, e.g. the scratch rows
        of a token tree planned row by row (runtime/drafters/eagle.py); nothing changes if they do not fit."""
        self._reserve(seq_ids, counts)

    def fork(self, src_id: int, dst_id: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Give the empty sequence ``dst_id`` pages for ``n`` rows holding what the first ``n``
        rows of ``src_id`` hold: returns the (src, dst) slots to copy (runtime/shared_prefill.py).
        Raises KVCacheFull (nothing changed) when the pages are not there."""
        if self.seqs[dst_id].length or self.seqs[src_id].length < n:
            raise ValueError(f"cannot fork {n} rows of sequence {src_id} into sequence {dst_id}")
        self._reserve([dst_id], [n])
        self.seqs[dst_id].length = n
        rows = np.arange(n)
        return self.slots(src_id, rows), self.slots(dst_id, rows)

    def slot(self, seq_id: int, row: int) -> int:
        st = self.seqs[seq_id]
        return st.pages[row // PAGE] * PAGE + row % PAGE

    def slots(self, seq_id: int, rows: np.ndarray) -> np.ndarray:
        """:meth:`slot` of many rows (reserved ones) at once."""
        pages = np.asarray(self.seqs[seq_id].pages, np.int64)
        return pages[rows // PAGE] * PAGE + rows % PAGE

    def page_table(self, seq_ids: list[int]) -> np.ndarray:
        """The page ids of each sequence, one row per sequence [b, pages] (FORWARD_META's page_table)."""
        return self._page_table(seq_ids)

    def _trim(self, seq_id: int) -> None:
        st = self.seqs[seq_id]
        keep = -(-st.length // PAGE)
        while len(st.pages) > keep:
            self.free.append(st.pages.pop())

    # --------------------------------------------------------------- forwards
    def plan_chain(self, seq_ids: list[int], token_counts: list[int]) -> ForwardBatch:
        """Append token_counts[i] tokens to each sequence; token j of a sequence with
        committed length L sits at row L+j and attends rows 0..L+j."""
        self._reserve(seq_ids, token_counts)
        pos, slots, seq_row, prefix = [], [], [], []
        for b, (s, k) in enumerate(zip(seq_ids, token_counts)):
            st = self.seqs[s]
            for j in range(k):
                r = st.length + j
                pos.append(r)
                slots.append(self.slot(s, r))
                seq_row.append(b)
                prefix.append(r + 1)
            st.length += k
        n = len(pos)
        return ForwardBatch(list(seq_ids), list(token_counts), self._named(
            seq_ids, positions=pos, write_slots=slots, token_seq=seq_row, token_prefix=prefix,
            extra_slots=np.zeros((n, 1), np.int32), extra_len=np.zeros(n, np.int32)))

    def plan_tree(self, seq_ids: list[int], parents: list[list[int]]) -> ForwardBatch:
        """Verify one token tree per sequence (parents[i][j] = local parent, -1 = root).

        Node j is written at scratch row L+j, has RoPE position L+depth(j), and attends
        rows 0..L-1 and then its ancestors from the root down, ending with itself -- the
        order its row would have in a plain decode once the path is committed."""
        counts = [len(p) for p in parents]
        self._reserve(seq_ids, counts)
        pos, slots, seq_row, prefix, extras = [], [], [], [], []
        for b, (s, par) in enumerate(zip(seq_ids, parents)):
            st = self.seqs[s]
            for j, p in enumerate(par):
                if p >= j:
                    raise ValueError("token tree parents must precede their children")
            for j in range(len(par)):
                chain = [j]
                while par[chain[-1]] >= 0:
                    chain.append(par[chain[-1]])
                chain.reverse()
                pos.append(st.length + len(chain) - 1)
                slots.append(self.slot(s, st.length + j))
                seq_row.append(b)
                prefix.append(st.length)
                extras.append([self.slot(s, st.length + a) for a in chain])
        n = len(pos)
        width = max(len(e) for e in extras)
        extra = np.zeros((n, width), np.int32)
        extra_len = np.zeros(n, np.int32)
        for i, e in enumerate(extras):
            extra[i, : len(e)] = e
            extra_len[i] = len(e)
        return ForwardBatch(list(seq_ids), counts, self._named(
            seq_ids, positions=pos, write_slots=slots, token_seq=seq_row, token_prefix=prefix,
            extra_slots=extra, extra_len=extra_len))

    def _named(self, seq_ids: list[int], **per_token) -> dict[str, np.ndarray]:
        """The forward's metadata by name: the per-token arrays plus the batch's page table."""
        return {"page_table": self._page_table(seq_ids), **{k: np.asarray(v, np.int32) for k, v in per_token.items()}}

    def _page_table(self, seq_ids: list[int]) -> np.ndarray:
        width = max(1, max(len(self.seqs[s].pages) for s in seq_ids))
        pt = np.zeros((len(seq_ids), width), np.int32)
        for b, s in enumerate(seq_ids):
            pages = self.seqs[s].pages
            pt[b, : len(pages)] = pages
        return pt

    # ------------------------------------------------------------ roll back
    def popn(self, seq_id: int, n: int) -> None:
        """Drop the last n tokens of a sequence (rejected drafts of a chain)."""
        st = self.seqs[seq_id]
        if n > st.length:
            raise ValueError(f"cannot pop {n} tokens from a sequence of {st.length}")
        st.length -= n
        self._trim(seq_id)

    def tree_commit_moves(self, seq_id: int, path: list[int]) -> tuple[list[int], list[int]]:
        """Accept tree nodes `path` (root first): the (src, dst) slot moves that put node
        path[d] at row L+d; then the sequence grows by len(path). Moves go in increasing
        depth, which never overwrites a later source (path[d] >= d)."""
        st = self.seqs[seq_id]
        src, dst = [], []
        for d, node in enumerate(path):
            if node != d:
                src.append(self.slot(seq_id, st.length + node))
                dst.append(self.slot(seq_id, st.length + d))
        st.length += len(path)
        self._trim(seq_id)
        return src, dst
