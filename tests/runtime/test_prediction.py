"""Predicted Outputs (runtime/prediction.py): the client's prediction is one more source of the
suffix index. The output is the same with and without it, with a right, an edited and an
unrelated prediction; a right one is drafted from (far more accepted drafts), the index
re-aligns after an edit, and usage counts the prediction's tokens as OpenAI does."""
from __future__ import annotations

import pytest

from speccompile.runtime.engine import Engine
from speccompile.runtime.metrics import prediction_usage
from speccompile.runtime.sequence import GenerationError

PROMPT = "Write a short story about a robot who learns to paint."
N = 96


@pytest.fixture(scope="module")
def engines(smollm2_q4):
    model_dir, lib = smollm2_q4
    return Engine(model_dir, lib), Engine(model_dir, lib, speculative_mode="suffix", spec_draft_length=8)


@pytest.fixture(scope="module")
def answer(engines):
    plain, _ = engines
    ids = plain.encode_prompt(PROMPT)
    return ids, plain.generate(ids, N).token_ids


def test_usage_counts_the_prediction_as_openai_does():
    assert prediction_usage([1, 2, 3, 4], [1, 2, 9, 4, 5]) == {"accepted_prediction_tokens": 3,
                                                                "rejected_prediction_tokens": 1}
    assert prediction_usage([7, 8], [1, 2]) == {"accepted_prediction_tokens": 0, "rejected_prediction_tokens": 2}


def test_the_index_follows_the_prediction_and_realigns_after_an_edit():
    from speccompile.runtime.drafters.suffix import SuffixProposer

    prediction = list(range(100, 160))  # the file as the client has it

    def draft(history, predicted=True):  # a fresh request with this history so far
        prop = SuffixProposer()
        prop.add_sequence(0, [1, 2, 3])  # the prompt
        if predicted:
            prop.predict(0, prediction)
        return prop.propose([0], [history], [8], [None], [None], None)[0].tokens

    assert draft([1, 2, 3, 100, 101, 102]) == prediction[3:11]  # follows it
    assert draft([1, 2, 3, 100, 101]) == []  # not on a two-token match (PREDICTION_MIN_MATCH)
    edited = [1, 2, 3] + prediction[:20] + [7, 8, 9]  # the answer departs from it (the edit) ...
    assert draft(edited) == []
    assert draft(edited + prediction[23:26]) == prediction[26:34]  # ... and, a few tokens on, re-aligns
    prop = SuffixProposer()
    prop.add_sequence(0, [1, 2, 3])
    prop.predict(0, prediction)
    prop.remove_sequence(0)
    prop.add_sequence(0, [1, 2, 3])
    assert prop.propose([0], [[1, 2, 3, 100, 101, 102]], [8], [None], [None], None)[0].tokens == []
    # a prediction belongs to its request


def test_a_prediction_changes_the_speed_never_the_output(engines, answer):
    _, spec = engines
    ids, want = answer
    cut = len(want) // 2
    edited = want[:cut - 6] + spec.tokenizer.encode(" (an edit) ", add_special_tokens=False).ids + want[cut:]
    runs = {"none": spec.generate(ids, N)}
    for name, pred in (("right", want), ("edited", edited),
                       ("unrelated", spec.tokenizer.encode("The quick brown fox. " * 20, add_special_tokens=False).ids)):
        runs[name] = spec.generate(ids, N, prediction=pred)
    for name, r in runs.items():
        assert r.token_ids == want, name
    accepted = {name: r.stats.spec.accepted_tokens for name, r in runs.items()}
    print(accepted)
    assert accepted["right"] >= len(want) * 0.8 > accepted["none"]  # drafted from the prediction
    assert accepted["edited"] >= len(want) * 0.7
    details = runs["right"].to_dict()["completion_tokens_details"]
    assert details == {"accepted_prediction_tokens": len(want), "rejected_prediction_tokens": 0}
    assert runs["unrelated"].to_dict()["completion_tokens_details"]["accepted_prediction_tokens"] < 10
    assert "completion_tokens_details" not in runs["none"].to_dict()


def test_bad_predictions_are_refused(engines, smollm2_q4):
    plain, spec = engines
    ids = plain.encode_prompt("hi")
    with pytest.raises(GenerationError, match="the prediction has .* tokens but the context window is"):
        spec.generate(ids, 4, prediction=[5] * spec.context_window)
    with pytest.raises(GenerationError, match="a prediction drafts through the suffix index: run with "
                                              "--speculative-mode suffix"):
        plain.generate(ids, 4, prediction=[5, 6])
    with pytest.raises(GenerationError, match="token id"):
        spec.generate(ids, 4, prediction=[10 ** 7])
