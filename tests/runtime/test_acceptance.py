"""The shared verification routine: greedy exactness and the rejection sampler's law."""
import numpy as np
import pytest

from speccompile.runtime.sampling import SamplingParams, probs_from_logits
from speccompile.runtime.acceptance import Draft, accept_reference

V = 8


def test_greedy_chain_accepts_matching_prefix_and_adds_bonus():
    logits = np.zeros((4, V))
    for row, tok in enumerate([3, 5, 1, 6]):
        logits[row, tok] = 1.0
    v = accept_reference(logits, Draft([3, 5, 2]), SamplingParams(), np.random.default_rng(0))
    assert v.path == [0, 1] and v.tokens == [3, 5, 1]
    v = accept_reference(logits, Draft([3, 5, 1]), SamplingParams(), np.random.default_rng(0))
    assert v.tokens == [3, 5, 1, 6]
    v = accept_reference(logits, Draft([4]), SamplingParams(), np.random.default_rng(0))
    assert v.path == [] and v.tokens == [3]


def test_greedy_tree_follows_the_matching_branch():
    # nodes: 0:tok2 (root child), 1:tok3 (root child), 2:tok4 child of 1, 3:tok7 child of 1
    d = Draft([2, 3, 4, 7], parents=[-1, -1, 1, 1])
    logits = np.zeros((5, V))
    logits[0, 3] = logits[2, 7] = logits[4, 0] = 1.0  # row j+1 = after node j
    v = accept_reference(logits, d, SamplingParams(), np.random.default_rng(0))
    assert v.path == [1, 3] and v.tokens == [3, 7, 0]
    assert d.verify_parents() == [-1, 0, 0, 2, 2]


def _empirical(n, target_logits, draft_q, sampling, tree=False, seed=0):
    rng = np.random.default_rng(seed)
    counts = np.zeros(V)
    for _ in range(n):
        if tree:  # two sampled siblings from q (multi-draft), deterministic order
            toks = [int(rng.choice(V, p=draft_q[0])), int(rng.choice(V, p=draft_q[0]))]
            d = Draft(toks, parents=[-1, -1], probs=np.stack([draft_q[0], draft_q[0]]))
            logits = np.stack([target_logits[0], target_logits[1], target_logits[1]])
        else:
            tok = int(rng.choice(V, p=draft_q[0]))
            d = Draft([tok], probs=draft_q[:1])
            logits = target_logits
        counts[accept_reference(logits, d, sampling, rng).tokens[0]] += 1
    return counts / n


@pytest.mark.parametrize("tree", [False, True])
@pytest.mark.parametrize("sampling", [SamplingParams(temperature=1.0), SamplingParams(temperature=0.7, top_k=5, top_p=0.9)])
def test_rejection_sampling_matches_target_distribution(tree, sampling):
    rng = np.random.default_rng(42)
    target_logits = rng.standard_normal((2, V)) * 1.5
    p = probs_from_logits(target_logits[0], sampling)
    # a draft far from the target: if it leaked into the output, the error would not shrink
    q = probs_from_logits(-target_logits[:1] * 2, SamplingParams(temperature=1.0))
    # mean total-variation distance over several seeds at n and 16n samples
    tv = [np.mean([0.5 * np.abs(_empirical(n, target_logits, q, sampling, tree, seed) - p).sum() for seed in range(reps)])
          for n, reps in ((1000, 6), (16000, 3))]
    assert tv[1] < 3.0 / np.sqrt(16000)
    assert tv[0] / tv[1] > 2.4  # shrinks like 1/sqrt(n): a factor 4 is expected
    assert 0.5 * np.abs(q[0] - p).sum() > 10 * tv[1]


def test_one_hot_draft_keeps_target_distribution():
    rng = np.random.default_rng(3)
    logits = rng.standard_normal((2, V))
    sampling = SamplingParams(temperature=1.0)
    p = probs_from_logits(logits[0], sampling)
    counts = np.zeros(V)
    n = 30000
    for _ in range(n):
        counts[accept_reference(logits, Draft([2]), sampling, rng).tokens[0]] += 1  # n-gram style draft
    assert 0.5 * np.abs(counts / n - p).sum() < 4.0 / np.sqrt(n)


def test_deterministic_siblings_from_two_sources_keep_target_distribution():
    """A merged draft (runtime/drafters/merged.py): the suffix index's token and a head's other token
    as siblings, both one-hot, tried in turn against the residual: the target's law (trying the
    second sibling against p itself instead would be off by 0.040 in total variation here,
    against the bound of 0.023 at this n)."""
    rng = np.random.default_rng(4)
    logits = rng.standard_normal((4, V))
    sampling = SamplingParams(temperature=0.9)
    p = probs_from_logits(logits[0], sampling)
    d = Draft([2, 5, 1], parents=[-1, -1, 1], source=[0, 1, 0])
    n = 30000
    counts = np.zeros(V)
    for _ in range(n):
        counts[accept_reference(logits, d, sampling, rng).tokens[0]] += 1
    assert 0.5 * np.abs(counts / n - p).sum() < 4.0 / np.sqrt(n)


def test_stream_decoder_reassembles_the_full_text():
    from conftest import make_byte_tokenizer  # byte-level: emoji and accents span several tokens
    from tokenizers import Tokenizer

    from speccompile.runtime.tokenizer import StreamDecoder

    import tempfile, pathlib  # noqa: E401
    path = pathlib.Path(tempfile.mkdtemp()) / "tok.json"
    make_byte_tokenizer(path)
    tok = Tokenizer.from_file(str(path))
    text = "naïve café — 日本語 😀 ok\n  end"
    ids = tok.encode(text).ids
    dec = StreamDecoder(tok)
    deltas = [dec.push([i]) for i in ids]
    assert "".join(deltas) == text == tok.decode(ids)
    assert all("\ufffd" not in d for d in deltas)
