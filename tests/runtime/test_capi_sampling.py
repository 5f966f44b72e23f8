"""At T > 0 the C runtime's tokens follow the target's distribution, speculation included: its
generator is not numpy's, so a seed does not give Python's sample; instead the law is tested.
On a repeating prompt the first token is drawn from the prefill's distribution and the second
by a verify step over drafts (rejection sampling against a one-hot draft: an n-gram chain, or an
EAGLE tree whose root has two children, the second tested against the residual the first
leaves), and both must match the Python model's probabilities (chi-square, p = 0.001)."""
from __future__ import annotations

import ctypes as C
from collections import Counter

import numpy as np
import pytest
from capi_ctypes import Capi, Stats, GenerateParams

from speccompile.runtime.model import Model
from speccompile.runtime.sampling import SamplingParams, probs_from_logits
from speccompile.runtime.tokenizer import load_tokenizer

pytestmark = pytest.mark.real_model

T = 1.3
RUNS = 500
CRITICAL = {1: 10.83, 2: 13.82, 3: 16.27, 4: 18.47, 5: 20.52, 6: 22.46, 7: 24.32}  # chi-square, p = 0.001


Params = GenerateParams  # include/speccompile.h's spc_generate_params


def chi2_ok(counts: Counter, probs: np.ndarray) -> tuple[bool, float, int]:
    """Counts against probabilities: categories expected at least 5 times, the rest lumped."""
    n = sum(counts.values())
    order = np.argsort(-probs)
    bins = [int(t) for t in order[:6] if probs[t] * n >= 5]
    observed = [counts.get(t, 0) for t in bins] + [n - sum(counts.get(t, 0) for t in bins)]
    expected = [probs[t] * n for t in bins] + [n * (1 - probs[bins].sum())]
    if expected[-1] < 5:
        observed[-2] += observed.pop()
        expected[-2] += expected.pop()
    stat = sum((o - e) ** 2 / e for o, e in zip(observed, expected))
    df = len(observed) - 1
    return stat < CRITICAL[df], stat, df


@pytest.mark.parametrize("drafts", ["ngram", "eagle-tree"])
def test_sampled_tokens_follow_the_target(capi_build, smollm2_q4, request, drafts):
    model_dir, lib = smollm2_q4
    py = Model(model_dir, lib)
    prompt = load_tokenizer(model_dir).encode(" 1 2 3 1 2 3 1 2 3 1 2 3 1 2", add_special_tokens=False).ids
    sp = SamplingParams(temperature=T)

    def probs(ids: list[int]) -> np.ndarray:
        kv = py.create_kv_cache(256)
        kv.add_sequence(0)
        return probs_from_logits(py.prefill(kv, [0], [ids])[0], sp)

    capi = Capi(capi_build)
    model = capi.model(model_dir, lib)
    head = None
    if drafts == "ngram":
        session = capi.session(model, speculative_mode=1, draft_length=4)
    else:
        head = capi.model(*request.getfixturevalue("smollm2_heads")[0])
        session = capi.session(model, speculative_mode=4, draft_length=2, spec_tree_width=2, draft_model=head)
    arr = (C.c_int32 * len(prompt))(*prompt)
    out = (C.c_int32 * 2)()
    n = C.c_size_t()
    pairs, verify_steps = [], 0
    try:
        for seed in range(RUNS):
            p = Params(2, T, 1.0, 0, seed, 1, None, 0)
            capi.check(capi.lib.spc_generate(session, arr, C.c_size_t(len(prompt)), C.byref(p), None, None, out,
                                             C.c_size_t(2), C.byref(n)))
            pairs.append((out[0], out[1]))
            stats = Stats()
            capi.check(capi.lib.spc_session_stats(session, C.byref(stats)))
            verify_steps += stats.verify_steps
    finally:
        capi.lib.spc_session_free(session)
        if head is not None:
            capi.lib.spc_model_free(head)
        capi.lib.spc_model_free(model)
    assert verify_steps > RUNS // 2  # the second token mostly came from a verify step over drafts
    first = Counter(a for a, _ in pairs)
    ok, stat, df = chi2_ok(first, probs(prompt))
    assert ok, ("first token", stat, df, first.most_common(6))
    top, _ = first.most_common(1)[0]
    second = Counter(b for a, b in pairs if a == top)
    assert sum(second.values()) >= 100
    ok, stat, df = chi2_ok(second, probs(prompt + [top]))
    assert ok, ("second token", stat, df, second.most_common(6))
