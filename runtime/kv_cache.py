"""Thin wrapper over TVM's paged KV cache builtins (sequence ids, forward, rollback)."""
from __future__ import annotations

import tvm
import tvm_ffi

_F = {}


def _f(name: str):
    if name not in _F:
        _F[name] = tvm.get_global_func(name)
    return _F[name]


class KVCache:
    PAGE_SIZE = 16  # the KV kernels assume 16-token pages

    def __init__(self, handle, max_batch_size: int, max_total_seq_len: int, prefill_chunk_size: int):
        self.handle = handle
        self.max_batch_size = max_batch_size
        self.max_total_seq_len = max_total_seq_len
        self.prefill_chunk_size = prefill_chunk_size
        self.seqs: set[int] = set()

    def add_sequence(self, seq_id: int) -> None:
        _f("vm.builtin.kv_state_add_sequence")(self.handle, seq_id)
        self.seqs.add(seq_id)

    def remove_sequence(self, seq_id: int) -> None:
        if seq_id in self.seqs:
            _f("vm.builtin.kv_state_remove_sequence")(self.handle, seq_id)
            self.seqs.discard(seq_id)

    def fork_sequence(self, parent: int, child: int, fork_pos: int = -1) -> None:
        _f("vm.builtin.kv_state_fork_sequence")(self.handle, parent, child, fork_pos)
        self.seqs.add(child)

    def clear(self) -> None:
        _f("vm.builtin.kv_state_clear")(self.handle)
        self.seqs.clear()

    def begin_forward(self, seq_ids: list[int], lengths: list[int], tree_parents: list[int] | None = None) -> None:
        """tree_parents: per-token local parent index (-1 = root), all sequences concatenated."""
        args = [self.handle, tvm_ffi.Shape(seq_ids), tvm_ffi.Shape(lengths)]
        if tree_parents is not None:
            args.append(tvm_ffi.Shape(tree_parents))
        _f("vm.builtin.kv_state_begin_forward")(*args)

    def end_forward(self) -> None:
        _f("vm.builtin.kv_state_end_forward")(self.handle)

    def popn(self, seq_id: int, n: int) -> None:
        if n > 0:
            _f("vm.builtin.kv_state_popn")(self.handle, seq_id, n)

    def commit_tree(self, seq_ids: list[int], leaf_indices: list[int]) -> None:
        _f("vm.builtin.attention_kv_cache_commit_accepted_token_tree_nodes")(
            self.handle, tvm_ffi.Shape(seq_ids), tvm_ffi.Shape(leaf_indices))

    def num_available_pages(self) -> int:
        return int(_f("vm.builtin.attention_kv_cache_get_num_available_pages")(self.handle))

    def total_pages(self) -> int:
        return -(-self.max_total_seq_len // self.PAGE_SIZE)

    def seq_length(self, seq_id: int) -> int:
        return int(_f("vm.builtin.attention_kv_cache_get_sequence_length")(self.handle, seq_id))
