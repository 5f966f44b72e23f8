"""The library's TensorIR sampling kernels (sampling_probs, accept_sampled) against the
numpy reference on the same random numbers, and the law of the kernel rejection sampler; each
for the CPU library and the OpenCL one (the GPU versions of both kernels)."""
import re

import numpy as np
import pytest

from conftest import opencl_missing

from speccompile.runtime.model import Model, to_device
from speccompile.runtime.sampling import SamplingParams, probs_from_logits
from speccompile.runtime.acceptance import Draft, accept_reference


@pytest.fixture(scope="module", params=["llvm", "opencl"])
def model(build_tiny, request):
    """The tiny model's CPU library, and its OpenCL library on the CPU OpenCL device: the GPU
    versions of both kernels (a block per row, a block per sequence) against the same references."""
    if request.param == "opencl" and opencl_missing() is not None:
        pytest.skip(f"OpenCL unavailable: {opencl_missing()}")
    built = build_tiny("tiny-llama", "q0f32", request.param)
    return Model(built.model_dir, built.lib)


def _random_params(rng) -> SamplingParams:
    return SamplingParams(temperature=float(rng.uniform(0.3, 2.0)),
                          top_k=int(rng.choice([0, 1, 2, 5, 40, 271, 272, 1000])),
                          top_p=float(rng.choice([1.0, rng.uniform(0.05, 1.0)])))


def _probs(model, logits: np.ndarray, params: list[SamplingParams]) -> np.ndarray:
    dev = model.sampling_probs(to_device(logits.astype(np.float32), model.device), [s.temperature for s in params],
                               [s.top_k for s in params], [s.top_p for s in params])
    return dev.numpy()


def test_sampling_probs_matches_numpy(model):
    rng = np.random.default_rng(0)
    n, vocab = 96, model.vocab_size
    logits = (rng.standard_normal((n, vocab)) * rng.uniform(0.5, 4.0, (n, 1))).astype(np.float32)
    params = [_random_params(rng) for _ in range(n)]
    got = _probs(model, logits, params)
    kept = 0
    for row, s in enumerate(params):
        ref = probs_from_logits(logits[row], s)
        np.testing.assert_allclose(got[row], ref, rtol=1e-5, atol=1e-6)
        assert np.array_equal(got[row] > 0, ref > 0)  # the same support: top-k and top-p cut alike
        kept += int((ref > 0).sum())
    assert 0 < kept < n * vocab  # the cuts did remove tokens


def test_sampling_probs_temperature_zero_is_argmax(model):
    logits = np.zeros((2, model.vocab_size), np.float32)
    logits[0, [7, 30]] = 2.0  # tie: the first index, like np.argmax
    logits[1, 100] = -1.0
    logits[1] -= 5.0
    got = _probs(model, logits, [SamplingParams(), SamplingParams()])
    assert got[0, 7] == 1.0 and got[0].sum() == 1.0
    assert got[1, 0] == 1.0 and got[1].sum() == 1.0


def _random_tree(rng, size):
    return [-1] + [int(rng.integers(0, j)) if rng.random() < 0.5 else j - 1 for j in range(1, size)]


@pytest.mark.parametrize("tree", [False, True])
def test_accept_sampled_matches_numpy_on_same_uniforms(model, tree):
    rng = np.random.default_rng(1 + tree)
    vocab = model.vocab_size
    accepted = rejected_all = 0
    for trial in range(30):
        b = int(rng.integers(1, 6))
        cases = []
        for _ in range(b):
            k = int(rng.integers(0, 8))
            par = _random_tree(rng, k) if (k and tree) else list(range(-1, k - 1))
            s = _random_params(rng)
            target = (rng.standard_normal((k + 1, vocab)) * 2).astype(np.float32)
            # node j (row j + 1) was drafted from a distribution near the target's at its parent
            draft_logits = target[[0] + [x + 1 for x in par]] + rng.standard_normal((k + 1, vocab)).astype(np.float32) * 0.5
            one_hot = bool(rng.random() < 0.4)
            cases.append((k, par, s, target, draft_logits, one_hot))
        targets = np.concatenate([c[3] for c in cases])
        drafts_l = np.concatenate([c[4] for c in cases])
        row_params = [c[2] for c in cases for _ in range(c[0] + 1)]
        p = _probs(model, targets, row_params)
        q = _probs(model, drafts_l, row_params)  # row r: the draft distribution its node was drawn from
        token_lists, parents, flags, uniforms, drafts, offset = [], [], [], [], [], 0
        for k, par, s, target, _, one_hot in cases:
            toks = []
            for j in range(k):
                src = p[offset + par[j] + 1] if one_hot else q[offset + j + 1]
                toks.append(int(rng.choice(vocab, p=src / src.sum())) if rng.random() < 0.9 else int(rng.integers(vocab)))
            probs = None if one_hot else q[offset + 1: offset + 1 + k]
            d = Draft(toks, parents=par if tree else None, probs=probs)
            drafts.append(d)
            token_lists.append([1] + toks)
            parents.append(d.verify_parents())
            flags.append(one_hot)
            uniforms.append(rng.random(k + 1, dtype=np.float32))
            offset += k + 1
        got = model.accept_sampled(to_device(p, model.device), q, flags, token_lists, parents, uniforms)
        for (k, _, s, target, _, _), d, u, (path, token) in zip(cases, drafts, uniforms, got):
            ref = accept_reference(target, d, s, np.random.default_rng(), uniforms=u)
            assert path == ref.path and [d.tokens[j] for j in path] + [token] == ref.tokens
            accepted += len(path)
            rejected_all += int(k > 0 and not path)
    print(accepted, rejected_all)
    assert accepted > 50 and rejected_all > 5  # both outcomes were exercised


def test_accept_sampled_without_q_and_with_greedy_rows(model):
    """q=None (all drafts one-hot) and temperature-0 rows: the greedy law through the sampler."""
    rng = np.random.default_rng(5)
    vocab = model.vocab_size
    logits = rng.standard_normal((4, vocab)).astype(np.float32)
    best = logits.argmax(axis=1)
    p = model.sampling_probs(to_device(logits, model.device), [0.0] * 4, [0] * 4, [1.0] * 4)
    tokens = [[1, int(best[0]), int(best[1]), (int(best[2]) + 1) % vocab]]
    got = model.accept_sampled(p, None, None, tokens, [[-1, 0, 1, 2]], [rng.random(4)])
    assert got == [([0, 1], int(best[2]))]


def _first_tokens(model, p_row, q_row, n, rng, one_hot):
    """First emitted token of n sequences verifying two sibling drafts: drawn from q_row, or
    (one_hot) the two fixed n-gram-style proposals where q_row is largest."""
    vocab = p_row.shape[0]
    counts = np.zeros(vocab)
    step = model.max_forward_tokens // 3  # sequences per call: 3 rows each, within the planned bound
    for start in range(0, n, step):
        b = min(step, n - start)
        if one_hot:
            toks = np.broadcast_to(np.argsort(-q_row)[:2], (b, 2))
        else:
            toks = rng.choice(vocab, size=(b, 2), p=q_row / q_row.sum())
        p = to_device(np.broadcast_to(p_row, (3 * b, vocab)).astype(np.float32), model.device)
        q = None if one_hot else np.broadcast_to(q_row, (3 * b, vocab)).astype(np.float32)
        out = model.accept_sampled(p, q, [one_hot] * b, [[1, int(x), int(y)] for x, y in toks], [[-1, 0, 0]] * b,
                                    list(rng.random((b, 3), dtype=np.float32)))
        for (x, y), (path, token) in zip(toks, out):
            counts[int((x, y)[path[0]]) if path else token] += 1
    return counts / n


@pytest.mark.parametrize("one_hot", [False, True])
@pytest.mark.parametrize("sampling", [SamplingParams(temperature=1.0),
                                      SamplingParams(temperature=0.7, top_k=5, top_p=0.9)])
def test_kernel_rejection_sampling_matches_target_distribution(model, sampling, one_hot):
    rng = np.random.default_rng(42)
    vocab = model.vocab_size
    logits = np.full((2, vocab), -1e4, np.float32)  # eight live tokens: a small effective vocabulary
    logits[:, :8] = rng.standard_normal((2, 8)) * 1.5
    draft_logits = logits.copy()
    draft_logits[:, :8] *= -2
    p_row = _probs(model, logits, [sampling, sampling])[0]  # through the kernel, as the engine will
    q_row = _probs(model, draft_logits, [SamplingParams(temperature=1.0)] * 2)[0]
    p = probs_from_logits(logits[0].astype(np.float64), sampling)
    np.testing.assert_allclose(p_row, p, atol=1e-6)
    tv = [np.mean([0.5 * np.abs(_first_tokens(model, p_row, q_row, n, rng, one_hot) - p).sum() for _ in range(reps)])
          for n, reps in ((1000, 6), (16000, 3))]
    assert tv[1] < 3.0 / np.sqrt(16000)
    assert tv[0] / tv[1] > 2.4  # shrinks like 1/sqrt(n): a factor 4 is expected
    draft = q_row if not one_hot else np.eye(vocab)[np.argmax(q_row)]  # what is proposed first
    assert 0.5 * np.abs(draft - p).sum() > 10 * tv[1]  # the draft does not leak


def test_gpu_versions_are_in_an_opencl_library(build_tiny, tmp_path):
    """GPU builds carry the block-per-row sampling_probs and the block-per-sequence sampler."""
    from speccompile.compiler.compile import compile_model

    built = build_tiny("tiny-llama", "q0f32")
    lib, src = tmp_path / "m-opencl.so", tmp_path / "m.cl"
    compile_model(built.model_dir / "speccompile-config.json", "opencl", lib, verbose=False, dump_source=src)
    text = src.read_text()
    body = re.search(r"__kernel void sampling_probs\w*\([^)]*\) \{(.*?)\n\}", text, re.S)
    assert body and "__local float val_ptr[256];" in body.group(1)  # a thread block per row
    walk = re.search(r"__kernel void accept_sampled\w*\([^)]*\) \{(.*?)\n\}", text, re.S)
    assert walk and "__local int st_ptr[6];" in walk.group(1)  # a thread block per sequence


@pytest.mark.skipif(opencl_missing() is not None, reason=f"OpenCL unavailable: {opencl_missing()}")
@pytest.mark.parametrize("vocab", [1000, 49152, 151936])
def test_opencl_gpu_sampling_probs_matches_numpy(vocab, tmp_path):
    """sampling_probs_gpu (a block per row; each pass's loads issued a chunk at a time) on the
    CPU OpenCL device against the numpy reference: temperature, top-k, top-p and temperature 0
    per row, a vocabulary that is not a multiple of the chunk (1000), SmolLM2's and Qwen's
    (rows whose keys near the maximum fit the threads' lists, and rows too flat for them)."""
    import tvm

    from speccompile.kernels.sampling import sampling_probs_gpu

    rng = np.random.default_rng(vocab)
    n = 12
    logits = (rng.standard_normal((n, vocab)) * rng.uniform(0.5, 4.0, (n, 1))).astype(np.float32)
    params = [_random_params(rng) for _ in range(n - 2)] + [SamplingParams(), SamplingParams(temperature=0.7,
                                                                                             top_p=0.9)]
    logits[-2, [5, vocab - 1]] = 50.0  # temperature 0 with a tie: the first index
    mod = tvm.IRModule({"probs": sampling_probs_gpu(vocab).with_attr("global_symbol", "probs")})
    lib = tmp_path / "probs.so"
    tvm.compile(mod, target=tvm.target.Target({"kind": "opencl", "host": {"kind": "llvm"}})).export_library(str(lib))
    fn, dev = tvm.runtime.load_module(str(lib))["probs"], tvm.device("opencl", 0)
    t = lambda a: tvm.runtime.tensor(np.ascontiguousarray(a), dev)
    out = tvm.runtime.empty((n, vocab), "float32", dev)
    fn(t(logits), t(np.array([s.temperature for s in params], np.float32)),
       t(np.array([s.top_k for s in params], np.int32)), t(np.array([s.top_p for s in params], np.float32)), out)
    got = out.numpy()
    for row, s in enumerate(params[:-2] + params[-1:]):
        row = row if row < n - 2 else n - 1
        ref = probs_from_logits(logits[row], s)
        np.testing.assert_allclose(got[row], ref, rtol=1e-5, atol=1e-6)
        assert np.array_equal(got[row] > 0, ref > 0), row  # the same support: top-k and top-p cut alike
    assert got[-2, 5] == 1.0 and got[-2].sum() == 1.0  # temperature 0: the first argmax, one-hot


def test_cpu_sampling_probs_at_qwens_vocabulary_matches_numpy(tmp_path):
    """The CPU kernel at 151,936 logits, where its shortcuts matter: top-k by radix selection,
    and top-p's bisection over the keys above a histogram's proposal (a peaked row: a few
    dozen candidates) or, when they would be too many (a near-flat row) or the proposal fails
    its check (top-p 0.9999), over the whole row. Support and values as numpy's (but for float32
    sums against float64 ones at the near-flat row's cut)."""
    import tvm

    from speccompile.kernels.sampling import CANDIDATES, sampling_probs

    vocab = 151936
    rng = np.random.default_rng(3)
    peaked = (rng.standard_normal(vocab) * 2.5).astype(np.float32)
    peaked[:50] += 12
    flat = (rng.standard_normal(vocab) * 0.05).astype(np.float32)
    sharp = rng.standard_normal(vocab).astype(np.float32)
    sharp[:10] += 25  # top-p 0.9999 cuts among these (float32 sums of a heavy tail would differ from numpy's)
    rows = [(peaked, SamplingParams(temperature=0.7, top_k=20, top_p=0.8)),
            (peaked, SamplingParams(temperature=0.7, top_p=0.9)),
            (peaked, SamplingParams(temperature=1.0, top_k=5000, top_p=0.95)),
            (peaked, SamplingParams(temperature=1.3, top_k=40)),
            (sharp, SamplingParams(temperature=1.0, top_p=0.9999)),
            (flat, SamplingParams(temperature=1.0, top_p=0.9)),
            (flat, SamplingParams(temperature=0.5, top_k=7, top_p=0.5))]
    logits = np.stack([r for r, _ in rows])
    fn = tvm.compile(tvm.IRModule({"probs": sampling_probs(vocab).with_attr("global_symbol", "probs")}),
                     target=tvm.target.Target({"kind": "llvm"}))["probs"]
    dev = tvm.cpu()
    t = lambda a: tvm.runtime.tensor(np.ascontiguousarray(a), dev)
    out = tvm.runtime.empty(logits.shape, "float32", dev)
    fn(t(logits), t(np.array([s.temperature for _, s in rows], np.float32)),
       t(np.array([s.top_k for _, s in rows], np.int32)), t(np.array([s.top_p for _, s in rows], np.float32)), out)
    got = out.numpy()
    kept = []
    for i, (row, s) in enumerate(rows):
        ref = probs_from_logits(row, s)
        kept.append(int((ref > 0).sum()))
        if row is flat and not s.top_k:  # a cut through ~137k float32 terms: a token either side of numpy's
            assert np.sum((got[i] > 0) != (ref > 0)) <= 2, s
            np.testing.assert_allclose(got[i], ref, rtol=1e-4, atol=1e-5, err_msg=str(s))
            continue
        np.testing.assert_allclose(got[i], ref, rtol=1e-5, atol=1e-7, err_msg=str(s))
        assert np.array_equal(got[i] > 0, ref > 0), s
    assert kept[0] <= 20 and kept[1] < CANDIDATES < kept[5]  # both bisections ran
