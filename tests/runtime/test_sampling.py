"""runtime/sampling.py: top-p is the smallest prefix of the descending order (ties by index)
that holds top_p. The nucleus is found from a partition of the likeliest tokens, not a sort of
the whole vocabulary; these tests hold it to the definition -- a full stable sort -- bit for bit,
on ties, on flat distributions whose nucleus outgrows the first candidates, and at top_k."""
from __future__ import annotations

import numpy as np
import pytest

from speccompile.runtime.sampling import SamplingParams, _nucleus, probs_from_logits, sample


def _reference(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """The definition, by a full stable sort of every row."""
    z = logits.astype(np.float64) / params.temperature
    if params.top_k and params.top_k < z.shape[-1]:
        kth = np.partition(z, -params.top_k, axis=-1)[..., -params.top_k][..., None]
        z = np.where(z < kth, -np.inf, z)
    z = z - z.max(axis=-1, keepdims=True)
    p = np.exp(z)
    p /= p.sum(axis=-1, keepdims=True)
    if params.top_p < 1.0:
        order = np.argsort(-p, axis=-1, kind="stable")
        sorted_p = np.take_along_axis(p, order, axis=-1)
        keep_sorted = (np.cumsum(sorted_p, axis=-1) - sorted_p) < params.top_p
        keep = np.zeros_like(keep_sorted)
        np.put_along_axis(keep, order, keep_sorted, axis=-1)
        p = np.where(keep, p, 0.0)
        p /= p.sum(axis=-1, keepdims=True)
    return p


@pytest.mark.parametrize("vocab", [5, 300, 151936])
def test_top_p_equals_a_full_stable_sort_bit_for_bit(vocab):
    rng = np.random.default_rng(vocab)
    for trial in range(40 if vocab < 10**5 else 12):
        x = (rng.standard_normal((2, vocab)) * rng.choice([0.05, 1.0, 4.0, 20.0])).astype(np.float32)
        if trial % 3 == 0:
            x = np.round(x)  # ties everywhere, across the boundary of the first candidates too
        if trial % 10 == 0:
            x[:] = 0.0  # one tie of the whole vocabulary: the nucleus is most of it
        for top_p in (0.01, 0.5, 0.9, 0.95, 0.9999):
            params = SamplingParams(float(rng.choice([0.5, 1.0, 2.0])), top_p, int(rng.choice([0, 3, 100])))
            assert np.array_equal(probs_from_logits(x, params), _reference(x, params)), (trial, top_p)


def test_the_nucleus_widens_until_it_holds_top_p():
    p = np.full(1000, 1e-3)  # flat: 950 tokens are needed, far past the first 64 candidates
    assert len(_nucleus(p, 0.95)) == 950
    assert list(_nucleus(p, 0.95)[:3]) == [0, 1, 2]  # ties in index order
    q = np.zeros(1000)
    q[[7, 3]] = [0.6, 0.4]
    assert list(_nucleus(q, 0.5)) == [7] and list(_nucleus(q, 0.7)) == [7, 3]
    # the tokens without mass sort last, after all of it: they join only when it is short of
    # top_p (rounding, in a normalised row), and then all of them, as a full sort has it
    r = np.zeros(1000)
    r[[7, 3]] = [0.3, 0.3]
    assert sorted(_nucleus(r, 0.5)) == [3, 7] and sorted(_nucleus(r, 0.7)) == list(range(1000))


def test_a_seeded_sample_is_the_references_draw():
    rng_logits = np.random.default_rng(3)
    x = (rng_logits.standard_normal(151936) * 2).astype(np.float32)
    x[rng_logits.integers(0, 151936, 30)] += 10
    params = SamplingParams(0.8, 0.9)
    a, b = np.random.default_rng(5), np.random.default_rng(5)
    ref = _reference(x, params)
    assert [sample(x, params, a) for _ in range(20)] == [int(b.choice(ref.shape[-1], p=ref)) for _ in range(20)]
