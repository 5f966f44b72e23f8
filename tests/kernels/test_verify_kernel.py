"""The library's TensorIR greedy verification kernel against the numpy reference."""
import numpy as np

from speccompile.runtime.model import Model, to_device
from speccompile.runtime.sampling import SamplingParams
from speccompile.runtime.acceptance import Draft, accept_reference


def _random_tree(rng, size):
    return [-1] + [int(rng.integers(0, j)) if rng.random() < 0.5 else j - 1 for j in range(1, size)]


def test_greedy_kernel_matches_numpy_on_chains_and_trees(build_tiny):
    built = build_tiny("tiny-llama", "q0f32")
    model = Model(built.model_dir, built.lib)
    vocab = model.vocab_size
    rng = np.random.default_rng(0)
    for trial in range(40):
        b = int(rng.integers(1, 5))
        drafts, token_lists, parents, blocks = [], [], [], []
        for _ in range(b):
            k = int(rng.integers(0, 7))
            par = _random_tree(rng, k) if (k and trial % 2) else list(range(-1, k - 1))
            logits = rng.standard_normal((k + 1, vocab)).astype(np.float32)
            toks = [int(t) for t in rng.integers(0, vocab, size=k)]
            # make some drafts match the target's argmax so paths get long
            for j in range(k):
                if rng.random() < 0.7:
                    toks[j] = int(np.argmax(logits[par[j] + 1]))
            d = Draft(toks, parents=par if trial % 2 else None)
            drafts.append(d)
            token_lists.append([1] + toks)
            parents.append(d.verify_parents())
            blocks.append(logits)
        dev = to_device(np.concatenate(blocks), model.device)
        got = model.accept_greedy(dev, token_lists, parents)
        for d, logits, (path, bonus) in zip(drafts, blocks, got):
            ref = accept_reference(logits, d, SamplingParams(), np.random.default_rng(0))
            assert path == ref.path and [d.tokens[j] for j in path] + [bonus] == ref.tokens


def test_greedy_kernel_breaks_ties_like_numpy(build_tiny):
    built = build_tiny("tiny-llama", "q0f32")
    model = Model(built.model_dir, built.lib)
    logits = np.zeros((2, model.vocab_size), np.float32)
    logits[0, [5, 9]] = 3.0  # tie: numpy argmax takes the first
    logits[1, 2] = 1.0
    got = model.accept_greedy(to_device(logits, model.device), [[1, 5]], [[-1, 0]])
    assert got == [([0], 2)]
