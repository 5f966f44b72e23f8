"""runtime/kv_cache.py's PagedKV without a model: the host-side bookkeeping every forward
depends on. The metadata arrays are what the compiled attention kernels read (which slot
each token writes, which rows it attends), so a wrong index here corrupts outputs without
any error; these tests pin them down by hand-computed values."""
from __future__ import annotations

import numpy as np
import pytest

from speccompile.runtime.kv_cache import PAGE, KVCacheFull, PagedKV, split_forwards

POS, SLOTS, PAGE_TABLE, SEQ_ROW, PREFIX, EXTRA, EXTRA_LEN = range(7)  # META_SPEC order


def state(kv: PagedKV) -> tuple:
    """Everything a failed call must leave as it was."""
    return list(kv.free), {s: (list(st.pages), st.length) for s, st in kv.seqs.items()}


def test_sequences_take_pages_in_order_and_give_them_back():
    kv = PagedKV(None, 4)
    kv.add_sequence(0)
    kv.add_sequence(1)
    with pytest.raises(ValueError, match="already exists"):
        kv.add_sequence(0)
    kv.plan_chain([0, 1], [PAGE + 1, 3])
    assert kv.seqs[0].pages == [0, 1] and kv.seqs[1].pages == [2]
    assert kv.num_free_pages() == 1 and kv.length(0) == PAGE + 1
    kv.remove_sequence(0)
    assert kv.num_free_pages() == 3 and 0 not in kv.seqs
    kv.remove_sequence(0)  # twice is harmless (detach may run twice)
    kv.add_sequence(2)
    kv.plan_chain([2], [2 * PAGE])
    assert sorted(kv.seqs[2].pages) == [0, 1]  # the pages sequence 0 gave back
    kv.remove_sequence(1)
    kv.remove_sequence(2)
    assert sorted(kv.free) == [0, 1, 2, 3]


def test_pages_needed_counts_only_new_pages():
    kv = PagedKV(None, 8)
    kv.add_sequence(0)
    assert kv.pages_needed(0, 0) == 0 and kv.pages_needed(0, 1) == 1 and kv.pages_needed(0, PAGE + 1) == 2
    kv.plan_chain([0], [10])
    assert kv.pages_needed(0, PAGE - 10) == 0 and kv.pages_needed(0, PAGE - 9) == 1
    kv.plan_chain([0], [PAGE - 10])  # exactly one full page
    assert kv.pages_needed(0, 0) == 0 and kv.pages_needed(0, 1) == 1


def test_plan_chain_arrays():
    kv = PagedKV(None, 8)
    kv.add_sequence(5)
    kv.add_sequence(9)
    kv.plan_chain([5], [PAGE - 2])  # sequence 5: page 0, 14 tokens
    batch = kv.plan_chain([9, 5], [2, 3])  # 9 starts on page 1; 5 crosses into page 2
    a = batch.arrays
    assert batch.seq_ids == [9, 5] and batch.counts == [2, 3]
    assert a[POS].tolist() == [0, 1, 14, 15, 16]
    assert a[SLOTS].tolist() == [1 * PAGE + 0, 1 * PAGE + 1, 0 * PAGE + 14, 0 * PAGE + 15, 2 * PAGE + 0]
    assert a[PAGE_TABLE].tolist() == [[1, 0], [0, 2]]  # padded to the widest sequence
    assert a[SEQ_ROW].tolist() == [0, 0, 1, 1, 1]
    assert a[PREFIX].tolist() == [1, 2, 15, 16, 17]  # each token attends rows 0..itself
    assert a[EXTRA].shape == (5, 1) and not a[EXTRA].any() and not a[EXTRA_LEN].any()
    assert all(x.dtype == np.int32 for x in a)
    assert kv.length(9) == 2 and kv.length(5) == PAGE + 1


def test_plan_tree_arrays_and_scratch_rows():
    """Node j is written at scratch row L+j, sits at position L+depth-1, and attends the
    committed rows plus its ancestors from the root down, ending with itself."""
    kv = PagedKV(None, 8)
    kv.add_sequence(0)
    kv.plan_chain([0], [PAGE - 1])  # L = 15: the tree crosses a page boundary
    parents = [-1, 0, 0, 1, 3]  # a root token, two children, a grandchild, a great-grandchild
    batch = kv.plan_tree([0], [parents])
    a = batch.arrays
    L = PAGE - 1
    slot = lambda row: kv.seqs[0].pages[row // PAGE] * PAGE + row % PAGE  # noqa: E731
    assert kv.length(0) == L  # a tree never grows the committed length
    assert a[POS].tolist() == [L, L + 1, L + 1, L + 2, L + 3]
    assert a[SLOTS].tolist() == [slot(L + j) for j in range(5)]
    assert a[PREFIX].tolist() == [L] * 5
    chains = [[0], [0, 1], [0, 2], [0, 1, 3], [0, 1, 3, 4]]
    assert a[EXTRA_LEN].tolist() == [len(c) for c in chains]
    for j, chain in enumerate(chains):
        assert a[EXTRA][j, : len(chain)].tolist() == [slot(L + n) for n in chain]
        assert not a[EXTRA][j, len(chain):].any()
    assert len(kv.seqs[0].pages) == 2
    kv.popn(0, 0)  # nothing accepted: the scratch page goes back
    assert len(kv.seqs[0].pages) == 1 and kv.num_free_pages() == 7
    with pytest.raises(ValueError, match="precede"):
        kv.plan_tree([0], [[-1, 2, 0]])


def test_popn_rolls_back_rejected_drafts_and_their_pages():
    kv = PagedKV(None, 4)
    kv.add_sequence(0)
    kv.plan_chain([0], [PAGE - 1])
    kv.plan_chain([0], [5])  # [last] + 4 drafts, crossing into a second page
    assert len(kv.seqs[0].pages) == 2 and kv.num_free_pages() == 2
    kv.popn(0, 4)  # all four drafts rejected
    assert kv.length(0) == PAGE and kv.seqs[0].pages == [0] and kv.num_free_pages() == 3
    batch = kv.plan_chain([0], [1])  # the next token reuses the rows the drafts held
    assert batch.arrays[POS].tolist() == [PAGE] and kv.length(0) == PAGE + 1
    with pytest.raises(ValueError, match="cannot pop"):
        kv.popn(0, PAGE + 2)
    assert kv.length(0) == PAGE + 1


def test_kv_cache_full_changes_nothing():
    kv = PagedKV(None, 3)
    kv.add_sequence(0)
    kv.add_sequence(1)
    kv.plan_chain([0], [PAGE])
    before = state(kv)
    with pytest.raises(KVCacheFull):  # the first sequence alone would fit, the batch does not
        kv.plan_chain([1, 0], [PAGE, 2 * PAGE])
    assert state(kv) == before
    with pytest.raises(KVCacheFull):
        kv.plan_tree([1, 0], [[-1] * PAGE, [-1] * (PAGE + 1)])
    assert state(kv) == before
    kv.plan_chain([1, 0], [PAGE, PAGE])  # exactly what is left
    assert kv.num_free_pages() == 0


@pytest.mark.parametrize("path", [[1, 3, 4], [0, 2, 5], [0, 2], [1], []])
def test_tree_commit_moves_put_the_accepted_path_in_place(path):
    """Apply the returned moves in order to a fake KV tensor (one value per slot): rows
    L.. then hold the accepted nodes' entries, and no move reads a slot an earlier one
    overwrote."""
    kv = PagedKV(None, 4)
    kv.add_sequence(0)
    kv.plan_chain([0], [PAGE - 3])
    L = kv.length(0)
    parents = [-1, -1, 0, 1, 3, 2]  # two branches: 0 -> 2 -> 5 and 1 -> 3 -> 4
    kv.plan_tree([0], [parents])
    tensor = np.full(4 * PAGE, -1)
    for j in range(len(parents)):
        tensor[kv.slot(0, L + j)] = 100 + j  # node j's K/V, written at its scratch row
    committed = [tensor[kv.slot(0, r)] for r in range(L)]
    src, dst = kv.tree_commit_moves(0, path)
    assert len(src) == len(dst) == sum(n != d for d, n in enumerate(path))
    for k, (s, d) in enumerate(zip(src, dst)):
        assert s not in dst[:k]  # never reads a slot an earlier move overwrote
        tensor[d] = tensor[s]
    assert kv.length(0) == L + len(path)
    assert [tensor[kv.slot(0, L + d)] for d in range(len(path))] == [100 + n for n in path]
    assert [tensor[kv.slot(0, r)] for r in range(L)] == committed
    assert len(kv.seqs[0].pages) == -(-(L + len(path)) // PAGE)  # scratch pages past the path freed


def test_split_forwards_cuts_a_chain_into_bounded_forwards():
    # sequences in order, each one's pieces in order, every forward full but the last
    assert split_forwards([5, 2, 6], 4) == [[(0, 0, 4)], [(0, 4, 5), (1, 0, 2), (2, 0, 1)], [(2, 1, 5)],
                                            [(2, 5, 6)]]
    assert split_forwards([3, 1], 4) == [[(0, 0, 3), (1, 0, 1)]]
    assert split_forwards([0, 2], 4) == [[(1, 0, 2)]] and split_forwards([], 4) == []


def test_check_room_is_all_or_nothing():
    kv = PagedKV(None, 2)
    kv.add_sequence(0)
    kv.check_room([0], [2 * PAGE])
    with pytest.raises(KVCacheFull):
        kv.check_room([0], [2 * PAGE + 1])
    assert kv.num_free_pages() == 2 and kv.length(0) == 0


def test_recycled_sequences_count_as_free_and_are_reclaimed_before_a_reservation_fails():
    """The prefix cache's side of PagedKV: a recycled sequence's pages are free to take (the
    scheduler admits against them); a reservation short of pages asks ``reclaim`` first."""
    kv = PagedKV(None, 4)
    for s in (0, 1):
        kv.add_sequence(s)
        kv.plan_chain([s], [PAGE + 1])  # two pages each
    kv.recycle(0)
    assert kv.num_free_pages() == 2 and kv.recycled_pages == 2
    kv.adopt(0)  # taken over by a new request: in use again
    assert kv.num_free_pages() == 0
    kv.recycle(0)
    reclaimed = []

    def reclaim() -> bool:
        if not kv.recycled:
            return False
        sid = next(iter(kv.recycled))
        kv.remove_sequence(sid)
        reclaimed.append(sid)
        return True

    kv.reclaim = reclaim
    kv.add_sequence(2)
    kv.plan_chain([2], [PAGE])  # needs one page: sequence 0 is reclaimed for it
    assert reclaimed == [0] and kv.recycled_pages == 0 and kv.num_free_pages() == 1
    with pytest.raises(KVCacheFull):  # nothing left to reclaim
        kv.plan_chain([1], [3 * PAGE])
