"""Tiny random-weight models through the whole pipeline, against a numpy reference."""
import numpy as np
import pytest

from reference import forward
from speccompile.models.config import preset
from speccompile.models.quantization import dequantize_q4, quantize_q4
from speccompile.runtime.model import Model

IDS = [5, 17, 99, 3, 250, 42, 7, 7, 7, 120, 33, 64, 1, 2, 200, 150, 80, 81, 82, 90, 11]


def reference_weights(built):
    w = dict(built.weights)
    if built.quant.startswith("q4"):
        for k, a in w.items():
            if a.ndim == 2:
                w[k] = dequantize_q4(*quantize_q4(a, "float32"))
    return w


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen2"])
@pytest.mark.parametrize("quant", ["q0f32", "q4f32_1"])
def test_logits_match_numpy_reference(build_tiny, name, quant):
    built = build_tiny(name, quant)
    model = Model(built.model_dir, built.lib)
    kv = model.create_kv_cache(256)
    kv.add_sequence(0)
    ours = model.forward(kv, [0], [IDS])
    ref = forward(reference_weights(built), preset(name), IDS, model.meta["q4_activations"] == "int8")
    scale = np.abs(ref).max()
    assert np.abs(ours - ref).max() < 1e-4 * max(1.0, scale)


@pytest.mark.parametrize("quant", ["q0f32", "q4f32_1"])
def test_batch_invariance_is_bit_exact(build_tiny, quant):
    built = build_tiny("tiny-llama", quant)
    check_batch_invariance(Model(built.model_dir, built.lib))


def check_batch_invariance(model, prompt: list[int] = IDS[:13]) -> None:
    """A token's logits are identical decoded alone, verified among others, in a batch, in a tree
    (tests/runtime/test_opencl.py runs it on the OpenCL device too, with a long prompt as well)."""
    kv = model.create_kv_cache(3 * len(prompt) + 64)
    cont = IDS[13:]
    # plain: prefill then one decode per token
    kv.add_sequence(0)
    model.prefill(kv, [0], [prompt])
    alone = np.stack([model.decode(kv, [0], [t])[0] for t in cont])
    # chain verify of all continuation tokens at once, batched with another sequence
    kv.add_sequence(1)
    kv.add_sequence(2)
    model.prefill(kv, [1, 2], [prompt, [9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 11, 12, 13, 14, 15, 16, 17, 18]])
    logits = model.forward(kv, [2, 1], [[30, 31, 32], cont])
    assert np.array_equal(logits[3:], alone)
    # decode batch of two
    kv.popn(1, len(cont))
    batch = model.decode(kv, [2, 1], [40, cont[0]])
    assert np.array_equal(batch[1], alone[0])
    # token tree: root cont[1] with two children, the first of which is cont[2]
    tree = model.forward(kv, [1], [[cont[1], 77, cont[2]]], tree_parents=[[-1, 0, 0]])
    assert np.array_equal(tree[0], alone[1]) and np.array_equal(tree[2], alone[2])
    model.commit_tree(kv, 1, [0, 2])
    assert kv.length(1) == len(prompt) + 3
    after = model.decode(kv, [1], [cont[3]])
    assert np.array_equal(after[0], alone[3])


def check_padded_pages(model) -> None:
    """Page tables padded to a fixed width (what CUDA graphs use: runtime/model.py) give the same
    bits: prefill, decode, chain and tree forwards, with and without the padding."""
    kv = model.create_kv_cache(512)
    runs = []
    for width in (None, 40):
        model.page_width = width
        kv.add_sequence(0)
        out = [model.prefill(kv, [0], [IDS[:13]])]
        out += [model.decode(kv, [0], [t]) for t in IDS[13:]]
        out.append(model.forward(kv, [0], [IDS[:4]]))
        out.append(model.forward(kv, [0], [IDS[4:7]], tree_parents=[[-1, 0, 0]]))
        kv.remove_sequence(0)
        runs.append(np.concatenate(out))
    assert np.array_equal(runs[0], runs[1])
    check_batch_invariance(model)  # still padded
    model.page_width = None


def test_padded_page_tables_give_the_same_bits(build_tiny):
    built = build_tiny("tiny-llama", "q4f32_1")
    check_padded_pages(Model(built.model_dir, built.lib))


def test_rollback_across_page_boundaries(build_tiny):
    built = build_tiny("tiny-llama", "q0f32")
    model = Model(built.model_dir, built.lib)
    kv = model.create_kv_cache(256)
    kv.add_sequence(0)
    model.prefill(kv, [0], [IDS[:14]])
    first = model.forward(kv, [0], [IDS[14:21]])  # rows 14..20 cross the 16-row page
    kv.popn(0, 7)
    assert kv.length(0) == 14 and len(kv.seqs[0].pages) == 1
    again = model.forward(kv, [0], [IDS[14:21]])
    assert np.array_equal(first, again)


def test_kv_cache_full_is_reported_and_nothing_changes(build_tiny):
    from speccompile.runtime.kv_cache import KVCacheFull

    built = build_tiny("tiny-llama", "q0f32")
    model = Model(built.model_dir, built.lib)
    kv = model.create_kv_cache(32)
    kv.add_sequence(0)
    model.prefill(kv, [0], [IDS])
    with pytest.raises(KVCacheFull):
        model.forward(kv, [0], [IDS])
    assert kv.length(0) == len(IDS) and kv.num_free_pages() == 0


def test_kv_rows_after_rejection_equal_a_sequence_that_never_saw_them(build_tiny):
    built = build_tiny("tiny-qwen2", "q4f32_1")
    model = Model(built.model_dir, built.lib)
    kv = model.create_kv_cache(256)
    kv.add_sequence(0)
    kv.add_sequence(1)
    model.prefill(kv, [0], [IDS[:10]])
    model.forward(kv, [0], [[IDS[10], 200, 201, 202, 203]])  # last + 4 drafts, all rejected
    kv.popn(0, 4)
    model.decode(kv, [0], [IDS[11]])
    model.prefill(kv, [1], [IDS[:12]])  # never saw the drafts
    tensor = kv.tensor.numpy()
    rows0 = [kv.slot(0, r) for r in range(12)]
    rows1 = [kv.slot(1, r) for r in range(12)]
    assert np.array_equal(tensor[:, :, rows0], tensor[:, :, rows1])


@pytest.mark.parametrize("quant", ["q0f16", "q4f16_1"])
def test_fp16_formats_run_and_stay_close(build_tiny, quant):
    """fp16 builds (meant for GPUs) also compile and run on the CPU, near the reference."""
    built = build_tiny("tiny-qwen2", quant)
    model = Model(built.model_dir, built.lib)
    kv = model.create_kv_cache(256)
    kv.add_sequence(0)
    ours = model.forward(kv, [0], [IDS])
    ref = forward(reference_weights(built), preset("tiny-qwen2"), IDS)
    assert np.abs(ours - ref).max() < 0.05 * np.abs(ref).max()
