"""A check shared by the EAGLE-1 and EAGLE-3 tests: every row a head drafts in a step (a
scratch row of the token tree: its RoPE position, KV slot and the rows it attends) computes
what the same path computes appended as chain rows after the committed ones -- siblings do
not see each other, deeper rows see their ancestors. A wrong scratch row would only lower
acceptance, never change the output, so no lossless test would notice."""
from __future__ import annotations

import numpy as np


def _host(x) -> np.ndarray:
    return np.array(x.numpy() if hasattr(x, "numpy") else x)


def check_draft_rows(eng, prompt: list[int], steps: int, chain_row, exact: bool) -> int:
    """Run ``steps`` engine steps of one sequence, recording the head's calls; for each drafted
    row, append its path (token, the feature it pairs with: the catch-up's output at the root,
    then each parent's output) with ``chain_row(kv, seq_id, token, feature)`` -> that row's
    output, compare with the row's own output (bit for bit if ``exact``), roll back. Returns
    the rows checked."""
    head, kv = eng.proposer.head, eng.proposer.kv
    calls = []  # this step's head calls: (tokens, parent rows in the call before, outputs)
    real_catch_up, real_step = head.catch_up, head.step

    def catch_up(target, kv_, batch, tokens, feats, last, width):
        out = real_catch_up(target, kv_, batch, tokens, feats, last, width)
        calls[:] = [(None, None, _host(out[0]))]
        return out

    def step(target, kv_, batch, tokens, hidden, rows, width):
        out = real_step(target, kv_, batch, tokens, hidden, rows, width)
        calls.append((np.array(tokens), np.array(rows), _host(out[0])))
        return out

    head.catch_up, head.step = catch_up, step
    seq = eng.new_sequence(prompt, 4 * steps + 8, ignore_eos=True)
    eng.attach(seq)
    while seq.prefilling:
        eng.prefill([seq], eng.model.prefill_chunk_size)
    checked = 0
    try:
        for _ in range(steps):
            eng.step([seq])
            committed = kv.length(seq.seq_id)
            for c in range(1, len(calls)):
                for m in range(len(calls[c][0])):
                    path, call, row = [], c, m  # (token, feature), from the root down
                    while call >= 1:
                        parent = int(calls[call][1][row])
                        path.insert(0, (int(calls[call][0][row]), calls[call - 1][2][parent]))
                        call, row = call - 1, parent
                    for token, feature in path:
                        want = chain_row(kv, seq.seq_id, token, feature)
                    kv.popn(seq.seq_id, len(path))
                    assert kv.length(seq.seq_id) == committed
                    got, want = calls[c][2][m], _host(want)[0]
                    if exact:
                        assert np.array_equal(got, want), f"depth {c + 1} row {m}: {np.abs(got - want).max()}"
                    else:
                        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=f"depth {c + 1} row {m}")
                    checked += 1
    finally:
        head.catch_up, head.step = real_catch_up, real_step
        eng.detach(seq)
    return checked
