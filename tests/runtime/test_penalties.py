"""Penalties, logit biases and min-p (runtime/penalties.py): each verify row adjusted as of its
own prefix, so greedy speculation equals plain greedy decoding with every control, and
sampling keeps the adjusted target's law; a -100 bias bans a token; bad values are refused."""
from __future__ import annotations

import json

import numpy as np
import pytest

from speccompile.runtime.acceptance import Draft
from speccompile.runtime.engine import Engine
from speccompile.runtime.penalties import node_paths, penalize
from speccompile.runtime.sampling import SamplingParams
from speccompile.runtime.sequence import GenerationError

CONTROLS = [{"frequency_penalty": 1.5}, {"presence_penalty": 2.0}, {"repetition_penalty": 1.8},
            {"logit_bias": {"97": 8.0, "198": -100}}, {"frequency_penalty": -1.0, "logit_bias": "198:-100,99:3"},
            {"repetition_penalty": 0.7, "presence_penalty": 2.0, "logit_bias": {"198": -5}}]
PROMPTS = ["abcabcabcabc", "hello hello hello", "xyz", "the cat and the cat and the"]


class _Seq:  # what penalize reads of a Sequence
    def __init__(self, prompt, output, sp):
        self.history = list(prompt) + list(output)
        self.sampling = sp
        self.result = type("R", (), {"prompt_token_ids": list(prompt)})()


def _reference(row, prompt, prefix_out, sp):
    """The formulas, written out per token."""
    row = row.copy()
    for t in set(prompt) | set(prefix_out):
        if sp.repetition_penalty != 1.0:
            row[t] = row[t] / np.float32(sp.repetition_penalty) if row[t] > 0 else row[t] * np.float32(sp.repetition_penalty)
    for t in set(prefix_out):
        c = prefix_out.count(t)
        row[t] -= np.float32(sp.frequency_penalty) * np.float32(c) + np.float32(sp.presence_penalty) * np.float32(c > 0)
    for t, b in sp.logit_bias:
        row[t] += np.float32(b)
    return row


def test_node_paths_of_a_tree():
    d = Draft([5, 6, 7, 8], parents=[-1, 0, 0, 2])
    assert node_paths(d, 5) == [[], [5], [5, 6], [5, 7], [5, 7, 8]]
    assert node_paths(Draft([1, 2]), 3) == [[], [1], [1, 2]]
    assert node_paths(d, 2) == [[], [5]]


@pytest.mark.parametrize("controls", CONTROLS)
def test_rows_are_penalised_as_of_their_own_prefix(controls):
    rng = np.random.default_rng(0)
    sp = SamplingParams(**controls)
    prompt, output = [1, 2, 97, 97], [3, 99, 3]
    draft = Draft([97, 3, 98, 99], parents=[-1, 0, 0, 1])
    rows = rng.standard_normal((5, 260)).astype(np.float32) * 4
    got = rows.copy()
    paths = node_paths(draft, 5)
    penalize(got, _Seq(prompt, output, sp), paths)
    for r, path in enumerate(paths):
        want = _reference(rows[r], prompt, output + path, sp)
        np.testing.assert_allclose(got[r], want, rtol=0, atol=1e-5)


@pytest.fixture(scope="module")
def tiny(build_tiny):
    built = build_tiny("tiny-llama", "q0f32")
    return built.model_dir, built.lib


@pytest.fixture(scope="module")
def engines(tiny):
    model_dir, lib = tiny
    return {"plain": Engine(model_dir, lib, max_num_sequence=4),
            "ngram": Engine(model_dir, lib, speculative_mode="ngram", spec_draft_length=4, max_num_sequence=4),
            "suffix": Engine(model_dir, lib, speculative_mode="suffix", spec_tree_width=2, max_num_sequence=4),
            "small_draft": Engine(model_dir, lib, speculative_mode="small_draft", additional_models=[(model_dir, lib)],
                                  spec_draft_length=3, max_num_sequence=4)}


@pytest.mark.parametrize("controls", CONTROLS)
def test_greedy_speculation_equals_plain_with_each_control(engines, controls):
    """Batch 1 and 4, chains (n-gram, a draft model) and trees (the suffix index at width 2)."""
    sp = SamplingParams(**controls)
    plain = engines["plain"]
    ids = [plain.encode_prompt(p) for p in PROMPTS]
    want = [plain.generate(i, 24, sampling=sp).token_ids for i in ids]
    free = [plain.generate(i, 24).token_ids for i in ids]
    assert want != free  # the control changes the output
    drafted = 0
    for mode in ("ngram", "suffix", "small_draft"):
        eng = engines[mode]
        batch = eng.generate_batch(ids, 24, [sp] * len(ids))
        assert [r.token_ids for r in batch] == want, mode
        one = eng.generate(ids[0], 24, sampling=sp)
        assert one.token_ids == want[0], mode
        drafted += one.stats.spec.draft_tokens + sum(r.stats.spec.draft_tokens for r in batch)
    assert drafted > 0


def test_a_minus_100_bias_bans_a_token(engines):
    plain = engines["plain"]
    ids = plain.encode_prompt(PROMPTS[0])
    out = plain.generate(ids, 32).token_ids
    banned = max(set(out), key=out.count)
    sp = SamplingParams(logit_bias={str(banned): -100})
    for mode in ("plain", "ngram", "small_draft"):
        assert banned not in engines[mode].generate(ids, 32, sampling=sp).token_ids
        for seed in range(4):
            hot = SamplingParams(temperature=1.0, seed=seed, logit_bias={str(banned): -100})
            assert banned not in engines[mode].generate(ids, 32, sampling=hot).token_ids


def test_penalised_sampling_keeps_the_target_distribution(tiny):
    """At T > 0 a draft model that knows nothing of the penalty proposes (itself, unpenalised),
    and rejection sampling corrects it to the penalised target: the law of the second and
    third tokens is the same with and without speculation (chi-square), and differs from
    the law without the penalty (the test can see a difference)."""
    model_dir, lib = tiny
    batch, n = 30, 240
    plain = Engine(model_dir, lib, max_num_sequence=batch)
    spec = Engine(model_dir, lib, speculative_mode="small_draft", additional_models=[(model_dir, lib)],
                  spec_draft_length=3, max_num_sequence=batch)
    ids = plain.encode_prompt("aaaa")

    def law(eng, **controls):
        seen = []
        for first in range(0, n, batch):
            runs = eng.generate_batch([ids] * batch, 3, [SamplingParams(temperature=1.0, top_k=3, seed=s, **controls)
                                                         for s in range(first, first + batch)])
            seen += [tuple(r.token_ids[1:3]) for r in runs]
        return seen

    pen = {"frequency_penalty": 2.0, "presence_penalty": 1.0}
    a, b, free = law(plain, **pen), law(spec, **pen), law(plain)
    cats = sorted(set(a) | set(b) | set(free), key=lambda c: -(a.count(c) + b.count(c)))[:8]

    def counts(seen):
        c = np.array([seen.count(k) for k in cats] + [len([s for s in seen if s not in cats])], float)
        return c

    ca, cb, cf = counts(a), counts(b), counts(free)
    expected = (ca + cb) / 2
    keep = expected > 0
    chi2 = (((ca - expected) ** 2 + (cb - expected) ** 2)[keep] / expected[keep]).sum()
    print("penalised plain", ca, "spec", cb, "free", cf, "chi2", chi2)
    assert chi2 < 27.9, (ca, cb)  # p = 0.001 with up to 8 degrees of freedom
    e2 = (ca + cf) / 2
    k2 = e2 > 0
    assert (((ca - e2) ** 2 + (cf - e2) ** 2)[k2] / e2[k2]).sum() > 27.9  # the penalty changed the law


def test_bad_values_are_refused(engines):
    with pytest.raises(ValueError, match="frequency_penalty is out of range"):
        SamplingParams(frequency_penalty=3)
    with pytest.raises(ValueError, match="logit_bias key 'x' is not a token id"):
        SamplingParams(logit_bias={"x": 1})
    with pytest.raises(ValueError, match="write TOKEN_ID:BIAS"):
        SamplingParams(logit_bias="12")
    plain = engines["plain"]
    with pytest.raises(GenerationError, match="logit_bias names token 100000"):
        plain.generate(plain.encode_prompt("a"), 4, sampling=SamplingParams(logit_bias={"100000": 1}))


LOOP_FORMAT = {"type": "json_schema", "json_schema": {"name": "s", "schema": {
    "type": "object", "properties": {"title": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}}},
    "required": ["title", "tags"]}}}


@pytest.mark.parametrize("prompt", ["Give a title and tags for a blog post about Python scripting.",
                                    "Title and tags for a shell script tutorial, as JSON."])
def test_a_frequency_penalty_ends_a_small_models_loop(smollm2_q4, prompt):
    """SmolLM2 under a JSON schema repeats a tag ("Python Scripting", "Python Scripting", ...)
    until max_tokens; a frequency penalty of 1 lets it close the object, with and without
    speculation alike."""
    model_dir, lib = smollm2_q4
    plain, spec = Engine(model_dir, lib), Engine(model_dir, lib, speculative_mode="suffix")
    ids = plain.encode_prompt(prompt)
    looped = plain.generate(ids, 120, response_format=LOOP_FORMAT)
    assert looped.finish_reason == "length"
    sp = SamplingParams(frequency_penalty=1.0)
    fixed = plain.generate(ids, 120, sampling=sp, response_format=LOOP_FORMAT)
    assert fixed.finish_reason == "stop" and isinstance(json.loads(fixed.text)["tags"], list)
    spec.set_draft_length(3)  # drafting whatever load the cost measurement saw (an adaptive k may not draft)
    again = spec.generate(ids, 120, sampling=sp, response_format=LOOP_FORMAT)
    assert again.token_ids == fixed.token_ids and again.stats.spec.draft_tokens > 0
