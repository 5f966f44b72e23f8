"""Every speculative mode on every supported family: greedy output identical to plain, batch 1
and 4, with EAGLE-1, EAGLE-3 and Medusa heads compiled against each family's target, and
the prefix cache across sliding windows. Also the families on the CPU OpenCL and Vulkan
devices (PoCL, lavapipe) when present.

The targets are tests/compiler/test_families.py's random transformers models; the heads are
the noisy "repeat" heads of test_eagle_medusa.py and test_eagle3.py, so drafts are partly
accepted (rejections and acceptances both happen); a self draft accepts all. Gemma 3 keeps
its 262k vocabulary: verification and the draft top-k run over rows that wide, and its
EAGLE-3 head has a 272-token draft vocabulary mapped through d2t.
"""
from __future__ import annotations

import numpy as np
import pytest

from conftest import fixed_costs
from test_eagle_medusa import build_head, make_eagle_checkpoint, make_medusa_checkpoint
from test_eagle3 import make_eagle3_checkpoint
from test_families import FAMILIES, TINY, build_family

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.tiny, pytest.mark.hf]

NEW_TOKENS = 20
PROMPTS = ["Name the planets in order.", "Repeat after me: the cat sat on the mat, the cat sat on the mat.",
           "Write a haiku about rain.", "Count: one two three four five six"]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("family-spec")


@pytest.fixture(scope="module", autouse=True)
def synthetic_costs():
    """Engines here take a fixed cost profile instead of timing forwards at load (the draft
    length is fixed, so what the forwards cost decides nothing; the cost model and its
    measurement are tested in test_adaptive.py and test_speculative.py)."""
    with fixed_costs():
        yield


def _target_dict(name: str) -> dict:
    t = {**TINY, **FAMILIES[name][2]}
    return {k: t[k] for k in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
                              "vocab_size")}


def _heads(fam, root) -> dict:
    """EAGLE-1, EAGLE-3 and Medusa heads in their published layouts, converted against the
    family's checkpoint and compiled."""
    t = _target_dict(fam.name)
    w = {k: v.detach().float().numpy() for k, v in fam.hf_model.state_dict().items()}
    emb = w["model.embed_tokens.weight"]
    base = root / fam.name
    make_eagle_checkpoint(base / "eagle-hf", t, layers=1, repeat=0.5)
    make_medusa_checkpoint(base / "medusa-hf", t["hidden_size"], t["vocab_size"], heads=2, lm_head=emb, noise=0.2)
    ids = np.arange(272) if t["vocab_size"] > 4096 else None  # Gemma's 262k: a reduced draft vocabulary
    make_eagle3_checkpoint(base / "eagle3-hf", w, t, ids)
    return {kind: build_head(kind, base / f"{kind}-hf", fam.hf_dir, "q0f32", base / kind)
            for kind in ("eagle", "eagle3", "medusa")}


@pytest.mark.parametrize("name", list(FAMILIES))
def test_every_mode_is_lossless(root, name):
    from speccompile.runtime.engine import Engine

    fam = build_family(name, root)
    heads = _heads(fam, root)
    plain = Engine(fam.model_dir, fam.lib)
    prompts = [plain.encode_prompt(p) for p in PROMPTS]
    expected = [plain.generate(ids, NEW_TOKENS, ignore_eos=True).token_ids for ids in prompts]
    modes = [("ngram", {}), ("suffix", {}), ("suffix", {"spec_tree_width": 3}),
             ("small_draft", {"additional_models": [(str(fam.model_dir), str(fam.lib))]}),
             ("eagle", {"additional_models": [heads["eagle"]]}),
             ("eagle", {"additional_models": [heads["eagle"]], "spec_tree_width": 3}),
             ("eagle", {"additional_models": [heads["eagle3"]]}),
             ("medusa", {"additional_models": [heads["medusa"]], "spec_tree_width": 2}),
             ("suffix", {"additional_models": [heads["eagle3"]]})]
    accepted = rejected = 0
    for mode, kw in modes:
        eng = Engine(fam.model_dir, fam.lib, speculative_mode=mode, **kw)
        eng.set_draft_length(3)
        for i, ids in enumerate(prompts):
            res = eng.generate(ids, NEW_TOKENS, ignore_eos=True)
            assert res.token_ids == expected[i], (name, mode, kw, i)
            accepted += res.stats.spec.accepted_tokens
            rejected += res.stats.spec.draft_tokens - res.stats.spec.accepted_tokens
        batch = eng.generate_batch(prompts, NEW_TOKENS, ignore_eos=True)
        assert [r.token_ids for r in batch] == expected, (name, mode, kw, "batch 4")
    assert accepted > 0 and rejected > 0, (accepted, rejected)


@pytest.mark.parametrize("name", ["mistral", "gemma3"])
def test_prefix_cache_across_a_sliding_window(root, name):
    """A next turn takes the kept sequence (its rows past the window included) and decodes
    what a fresh engine decodes from the whole prompt."""
    from speccompile.runtime.engine import Engine

    fam = build_family(name, root)
    eng = Engine(fam.model_dir, fam.lib, speculative_mode="suffix")
    ids = eng.encode_prompt(PROMPTS[1])
    first = eng.generate(ids, NEW_TOKENS, ignore_eos=True)
    turn = ids + first.token_ids + eng.encode_prompt(PROMPTS[3])
    second = eng.generate(turn, NEW_TOKENS, ignore_eos=True)
    assert second.stats.cached_prompt_tokens >= len(ids)
    fresh = Engine(fam.model_dir, fam.lib).generate(turn, NEW_TOKENS, ignore_eos=True)
    assert second.token_ids == fresh.token_ids


@pytest.mark.parametrize("name, device", [("qwen3", "opencl"), ("phi3", "opencl"), ("gemma3", "vulkan")])
def test_families_on_cpu_gpu_devices(root, name, device):
    """The GPU code path (q/k norms before the fused RoPE kernel, the windowed GPU attention,
    partial rotary, Gemma's unfused norms): logits as the CPU build's, and greedy speculation
    identical to plain on the device. (Each family's kernels are the same TensorIR on both
    devices; OpenCL and Vulkan each get a family whose code path the others lack.)"""
    from conftest import opencl_missing, vulkan_missing
    from speccompile.runtime.engine import Engine
    from speccompile.runtime.model import Model

    missing = (opencl_missing if device == "opencl" else vulkan_missing)()
    if missing:
        pytest.skip(f"{device} unavailable: {missing}")
    cpu, dev = build_family(name, root), build_family(name, root, device=device)
    ids = [int(t) for t in np.random.default_rng(2).integers(0, 256, 40)]
    logits = []
    for fam in (cpu, dev):
        model = Model(fam.model_dir, fam.lib)
        kv = model.create_kv_cache(128)
        kv.add_sequence(0)
        logits.append(model.forward(kv, [0], [ids]))
    assert np.abs(logits[0] - logits[1]).max() < 1e-4
    plain = Engine(dev.model_dir, dev.lib).generate(ids[:12], 16, ignore_eos=True).token_ids
    spec = Engine(dev.model_dir, dev.lib, speculative_mode="suffix")
    spec.set_draft_length(3)
    assert spec.generate(ids[:12], 16, ignore_eos=True).token_ids == plain


def test_sampling_over_gemmas_vocabulary(root):
    """Sampling (T > 0, top-p) with speculation over 262,144-wide rows: reproducible by seed,
    every token inside the vocabulary, and rejection sampling against a self draft accepting
    what the target itself would sample (the self draft's q is the target's p)."""
    from speccompile.runtime.engine import Engine
    from speccompile.runtime.sampling import SamplingParams

    fam = build_family("gemma3", root)
    eng = Engine(fam.model_dir, fam.lib, speculative_mode="small_draft",
                 additional_models=[(str(fam.model_dir), str(fam.lib))])
    ids = eng.encode_prompt(PROMPTS[0])
    sp = SamplingParams(temperature=0.9, top_p=0.95, seed=3)
    runs = []
    for _ in range(2):
        eng.set_draft_length(3)
        runs.append(eng.generate(ids, 16, sp, ignore_eos=True))
    assert runs[0].token_ids == runs[1].token_ids and len(runs[0].token_ids) == 16
    assert max(runs[0].token_ids) < 262144
    spec = runs[0].stats.spec
    assert spec.draft_tokens > 0 and spec.accepted_tokens == spec.draft_tokens
