"""The library's TensorIR greedy verification kernel against the numpy reference."""
import numpy as np
import pytest

from conftest import opencl_missing

from speccompile.runtime.model import Model, to_device
from speccompile.runtime.sampling import SamplingParams
from speccompile.runtime.acceptance import Draft, accept_reference

_OPENCL_MISSING = opencl_missing()


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


@pytest.mark.skipif(_OPENCL_MISSING is not None, reason=f"OpenCL unavailable: {_OPENCL_MISSING}")
@pytest.mark.parametrize("vocab", [151936, 1000])
def test_opencl_gpu_greedy_kernel_argmax_over_vocabulary_slices_is_numpys_first_maximum(vocab, tmp_path):
    """The GPU kernel splits each row's argmax over 32 blocks (kernels/verification.py): on
    the CPU OpenCL device its bonus token must be numpy's first maximum -- ties inside one
    slice and across slices, the maximum at the first and the last index, NaN ignored, a row
    of -inf giving 0 -- for Qwen's vocabulary (19 logits per thread) and a small one (most
    slices empty)."""
    import tvm

    from speccompile.kernels.verification import accept_greedy_gpu

    rng = np.random.default_rng(vocab)
    rows = rng.standard_normal((10, vocab)).astype(np.float32)
    rows[0, [7, vocab - 3]] = 9.0  # tie across slices: the first wins
    rows[1, [vocab // 2, vocab // 2 + 1]] = 9.0  # tie inside a slice
    rows[2, 0] = 9.0
    rows[3, vocab - 1] = 9.0
    rows[4, :] = -np.inf
    rows[5, [3, vocab // 3]] = [np.nan, 9.0]
    rows[6, :] = 1.5  # all equal: index 0
    want = [int(np.nanargmax(np.where(np.isnan(r), -np.inf, r))) for r in rows]
    mod = tvm.IRModule({"acc": accept_greedy_gpu(vocab).with_attr("global_symbol", "acc")})
    lib = tmp_path / "acc.so"
    tvm.compile(mod, target=tvm.target.Target({"kind": "opencl", "host": {"kind": "llvm"}})).export_library(str(lib))
    fn, dev = tvm.runtime.load_module(str(lib))["acc"], tvm.device("opencl", 0)
    n = len(rows)
    t = lambda a: tvm.runtime.tensor(np.ascontiguousarray(a), dev)
    out = tvm.runtime.empty((n + 1, n + 2), "int32", dev)  # one sequence per row, no drafts
    fn(t(rows), t(np.zeros(n, np.int32)), t(np.full(n, -1, np.int32)), t(np.arange(n + 1, dtype=np.int32)), out)
    got = out.numpy()[:n]
    assert (got[:, 0] == 0).all()
    assert got[:, 1].tolist() == want
