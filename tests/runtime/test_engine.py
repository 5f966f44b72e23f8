"""Engine.step on a fake model: the step's bookkeeping, apart from any compiled kernel.

The fake target is a deterministic language model whose next token depends on the last
three tokens *as stored in its KV cache slots*: a step that rolls back the wrong number
of rows, or emits a token it did not commit, changes every later token. Its acceptance
calls are the numpy reference (runtime/acceptance.py), so what is tested here is the
engine's own work: proposing, one forward, acceptance, commit or rollback, emission, and
the one record that metrics and policy read. Real-model checks of the same invariants
live in test_speculative.py and test_eagle_medusa.py.
"""
from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from conftest import make_byte_tokenizer
from speccompile.runtime import engine as engine_module
from speccompile.runtime.acceptance import Draft, accept_reference
from speccompile.runtime.kv_cache import PAGE, KVCacheFull, PagedKV
from speccompile.runtime.sampling import SamplingParams

VOCAB, EOS = 258, 257


def next_token(a: int, b: int, c: int, position: int) -> int:
    """The token after a, b, c (c at ``position``): mostly counting up, which an n-gram
    proposer finds, with jumps that depend on the context and on the position, which it
    cannot foresee."""
    if position % 7 == 0:
        return (a * 5 + position) % 200
    return (c * 3 + a) % 200 if (a + b + c) % 5 == 0 else (c + 1) % 200


class FakeModel:
    """The calls the engine and the cost profile make of a Model, on host arrays."""

    cpu_kernels = False  # no TVM kernels: no thread pool to size

    def __init__(self, model_dir, lib_path, device="auto", cuda_graph=True):
        self.meta = {"model_type": "llama"}
        self.vocab_size, self.prefill_chunk_size = VOCAB, 64
        self.full = 0  # forwards refused for want of KV pages

    def create_kv_cache(self, max_total_tokens):
        pages = -(-max_total_tokens // PAGE)
        return PagedKV(np.zeros(pages * PAGE, np.int64), pages)  # one stored token id per slot

    def check_token_ids(self, ids):
        if np.asarray(ids).size and (np.min(ids) < 0 or np.max(ids) >= VOCAB):
            raise ValueError("token id out of range")

    def _logits(self, kv, sid, upto):
        """Logits after the row ``upto`` of sequence sid, reading its stored tokens."""
        rows = [kv.tensor[kv.slot(sid, r)] for r in range(max(0, upto - 2), upto + 1)]
        rows = [0] * (3 - len(rows)) + rows
        out = np.full(VOCAB, -5.0, np.float32)
        out[next_token(*rows, upto)] = 5.0
        return out

    def _chain(self, kv, seq_ids, token_lists):
        starts = [kv.length(s) for s in seq_ids]
        try:
            kv.plan_chain(seq_ids, [len(t) for t in token_lists])
        except KVCacheFull:
            self.full += 1
            raise
        out = []
        for sid, start, toks in zip(seq_ids, starts, token_lists):
            for i, tok in enumerate(toks):
                kv.tensor[kv.slot(sid, start + i)] = tok
            out += [self._logits(kv, sid, start + i) for i in range(len(toks))]
        return np.stack(out)

    def prefill(self, kv, seq_ids, token_lists):
        rows = self._chain(kv, seq_ids, token_lists)
        return rows[np.cumsum([len(t) for t in token_lists]) - 1]

    def decode(self, kv, seq_ids, tokens, on_device=False):
        return self._chain(kv, seq_ids, [[t] for t in tokens])

    def forward(self, kv, seq_ids, token_lists, tree_parents=None, outputs="logits", on_device=False):
        if tree_parents is None:
            return self._chain(kv, seq_ids, token_lists)
        starts = [kv.length(s) for s in seq_ids]
        try:
            kv.plan_tree(seq_ids, tree_parents)  # node j at scratch row L + j
        except KVCacheFull:
            self.full += 1
            raise
        out = []
        for sid, start, toks, par in zip(seq_ids, starts, token_lists, tree_parents):
            for j, tok in enumerate(toks):
                kv.tensor[kv.slot(sid, start + j)] = tok
            for j in range(len(toks)):  # a node reads the committed rows, then its ancestors and itself
                chain = [j]
                while par[chain[-1]] >= 0:
                    chain.append(par[chain[-1]])
                stored = [kv.tensor[kv.slot(sid, r)] for r in range(max(0, start - 2), start)]
                context = ([0, 0, 0] + stored + [toks[a] for a in reversed(chain)])[-3:]
                row = np.full(VOCAB, -5.0, np.float32)
                row[next_token(*context, start + len(chain) - 1)] = 5.0
                out.append(row)
        return np.stack(out)

    def commit_tree(self, kv, seq_id, path):
        src, dst = kv.tree_commit_moves(seq_id, path)
        kv.tensor[dst] = kv.tensor[src]

    def accept_greedy(self, logits, token_lists, parents):
        out, row = [], 0
        for toks, par in zip(token_lists, parents):
            n = len(toks)
            d = Draft(list(toks[1:]), [p - 1 for p in par[1:]] if any(p != i for i, p in enumerate(par)) else None)
            v = accept_reference(logits[row: row + n], d, SamplingParams(), np.random.default_rng(0))
            out.append((v.path, v.tokens[-1]))
            row += n
        return out


@pytest.fixture
def model_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECCOMPILE_CACHE", str(tmp_path / "cache"))  # cost profiles of the fake stay here
    monkeypatch.setattr(engine_module, "Model", FakeModel)
    make_byte_tokenizer(tmp_path / "tokenizer.json")
    (tmp_path / "speccompile-config.json").write_text(json.dumps({
        "model_type": "llama", "vocab_size": VOCAB, "context_window_size": 512, "prefill_chunk_size": 64,
        "stop_token_ids": [EOS], "chat_template": "{{ messages[0]['content'] }}"}))
    (tmp_path / "lib.so").write_bytes(b"fake")
    return tmp_path


def reference(prompt: list[int], n: int) -> list[int]:
    """What greedy decoding of the fake model gives, computed directly (stops at EOS)."""
    out = list(prompt)
    for _ in range(n):
        out.append(next_token(*([0, 0, 0] + out)[-3:], len(out) - 1))
        if out[-1] == EOS:
            break
    return out[len(prompt):]


PROMPTS = [[5, 6, 7, 8, 9, 10], [40, 41, 3, 44, 45, 46, 47], [120, 121, 122]]


@pytest.mark.parametrize("k", [0, 1, 3, 6])
@pytest.mark.parametrize("batch", [1, 3])
def test_ngram_steps_emit_what_the_model_alone_emits(model_dir, k, batch):
    eng = engine_module.Engine(model_dir, model_dir / "lib.so", speculative_mode="ngram", spec_draft_length=k)
    outs = eng.generate_batch(PROMPTS[:batch], max_tokens=40, ignore_eos=True)
    for prompt, res in zip(PROMPTS, outs):
        assert res.token_ids == reference(prompt, 40)
    spec = eng.totals.spec
    if k:  # a fixed draft length drafts wherever the history has a match; long drafts also miss
        assert spec.verify_steps > 0 and spec.accepted_tokens > 0
        assert spec.accepted_tokens < spec.draft_tokens or k == 1
    assert eng.totals.decode_tokens == sum(len(r.token_ids) for r in outs) - batch  # the first comes from prefill


@pytest.mark.parametrize("k", [0, 3])
@pytest.mark.parametrize("batch", [1, 3])
def test_suffix_trees_and_empty_trees_commit_exactly_what_was_verified(model_dir, monkeypatch, k, batch):
    """Token trees from the suffix index, some of them empty trees (a plan that keeps no node
    of a tree): the cache holds exactly the committed tokens after every step, and the output
    is the model's own. (An empty tree was once forwarded as a decode and committed as a
    tree: the cache grew by two rows.)"""
    from speccompile.runtime.drafters.suffix import SuffixProposer

    real, calls = SuffixProposer.propose, [0]

    def propose(self, *args, **kwargs):
        calls[0] += 1
        drafts = real(self, *args, **kwargs)
        return [Draft([], []) if (calls[0] + i) % 3 == 0 else d for i, d in enumerate(drafts)]

    monkeypatch.setattr(SuffixProposer, "propose", propose)
    eng = engine_module.Engine(model_dir, model_dir / "lib.so", speculative_mode="suffix", spec_tree_width=3,
                               spec_draft_length=k)
    seqs = [eng.new_sequence(p, 40, ignore_eos=True) for p in PROMPTS[:batch]]
    for s in seqs:
        eng.attach(s)
    eng.prefill(seqs, 64)
    drafted = trees = 0
    while not all(s.done for s in seqs):
        active = [s for s in seqs if not s.done]
        step = eng.step(active)
        drafted += sum(len(d) for d in step.drafts)
        trees += sum(d.parents is not None and len(d) > 0 for d in step.drafts)
        for s in active:
            if not s.done:
                assert eng.kv.length(s.seq_id) == len(s.history) - 1
    for s in seqs:
        assert s.result.token_ids == reference(s.result.prompt_token_ids, 40)
    assert drafted > 0 or k == 0  # a fixed depth drafts wherever the text repeats
    assert trees > 0 or batch == 1 or k == 0  # (one sequence's text has one continuation each time)


def test_the_step_record_is_what_the_metrics_and_the_kv_cache_saw(model_dir):
    eng = engine_module.Engine(model_dir, model_dir / "lib.so", speculative_mode="ngram", spec_draft_length=4)
    seqs = [eng.new_sequence(p, 30, ignore_eos=True) for p in PROMPTS]
    for s in seqs:
        eng.attach(s)
    eng.prefill(seqs, 64)
    drafted = 0
    while not all(s.done for s in seqs):
        active = [s for s in seqs if not s.done]
        before = [len(s.result.token_ids) for s in active]
        step = eng.step(active)
        assert step.batch == len(active) and step.rows == sum(len(d) + 1 for d in step.drafts)
        for s, d, v, n, b in zip(active, step.drafts, step.verdicts, step.emitted, before):
            assert len(v.tokens) == len(v.path) + 1 and len(v.path) <= len(d)
            assert len(s.result.token_ids) - b == n <= len(v.tokens)
            if not s.done:  # (a finished sequence may hold accepted tokens it did not emit, until detached)
                assert eng.kv.length(s.seq_id) == len(s.history) - 1  # the committed tokens, less the last
        drafted += step.drafted
    assert drafted and eng.totals.spec.draft_steps == 0  # n-gram lookups are not draft forwards
    per_seq = [s.result.stats.spec for s in seqs]
    assert eng.totals.spec.accepted_tokens == sum(m.accepted_tokens for m in per_seq)
    assert eng.totals.spec.draft_tokens == sum(m.draft_tokens for m in per_seq)
    for s in seqs:
        assert s.result.token_ids == reference(s.result.prompt_token_ids, 30)
        eng.detach(s)
    assert eng.kv.num_free_pages() == eng.kv.num_pages


def test_drafts_that_do_not_fit_the_cache_are_dropped_not_the_step(model_dir):
    # 3 pages of 16 rows: the prompt and output fit, but not output + 6 drafts near the end
    eng = engine_module.Engine(model_dir, model_dir / "lib.so", speculative_mode="ngram", spec_draft_length=6,
                               max_total_seq_length=3 * PAGE, max_num_sequence=1)
    prompt = [5, 6, 7, 8, 9, 10]
    res = eng.generate(prompt, max_tokens=3 * PAGE - len(prompt) - 1, ignore_eos=True)
    assert res.token_ids == reference(prompt, len(res.token_ids)) and res.finish_reason == "length"
    assert eng.model.full > 0  # some step's drafts did not fit, and that step decoded plainly
    prompt = list(range(5, 5 + PAGE))  # fills its page: the next token needs a new one
    seq = eng.new_sequence(prompt, 5)
    eng.attach(seq)
    eng.prefill([seq], 64)
    eng.kv.free.clear()  # no page left at all: even plain decoding cannot run, and says so
    with pytest.raises(KVCacheFull):
        eng.step([seq])


def test_eos_inside_an_accepted_draft_ends_the_sequence_there(model_dir, monkeypatch):
    prompt = [31, 32, 33, 34, 31, 32]  # the n-gram proposer drafts 33, 34, 31, ...; the model says 33, 34, EOS
    real = next_token
    monkeypatch.setattr(sys.modules[__name__], "next_token",
                        lambda a, b, c, pos: EOS if c == 34 and pos > 6 else real(a, b, c, pos))
    eng = engine_module.Engine(model_dir, model_dir / "lib.so", speculative_mode="ngram", spec_draft_length=6)
    res = eng.generate(prompt, max_tokens=40)
    assert reference(prompt, 40)[-1] == EOS
    assert res.token_ids == reference(prompt, 40)[:-1] and res.finish_reason == "stop"
    assert eng.totals.spec.accepted_tokens > 0  # the stop came inside an accepted draft
