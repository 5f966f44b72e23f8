"""EAGLE-3 heads end to end: the published checkpoint layout (SafeAILab / SpecForge) ->
convert_weight --model-type eagle (detected as EAGLE-3) -> gen_config -> compile ->
drafting on the target's low/mid/high layer features, lossless.

One head is built (on the shared tiny-qwen2 target, whose greedy output varies where
tiny-llama's repeats one token, and whose two layers give the feature layers [0, 0, 1])
and serves every test here. Its fc mostly passes the last layer's
output on, its final norm is the target's and its lm_head the target's rows of the draft
vocabulary, with random attention and MLP weights added on top: it drafts roughly what
the target predicted one position earlier, so its drafts are partly accepted (full and
partial acceptance, tree branches other than the top-1, the catch-up on accepted tokens).
"""
from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from reference import PROMPTS, attention_mlp, forward as reference_forward, rms_norm
from speccompile.models.config import LlamaConfig, PRESETS, feature_layers, preset
from speccompile.runtime.contract import ENTRY_POINTS, entry_point_names, library_kind

NEW_TOKENS = 24


def make_eagle3_checkpoint(folder: Path, target_w: dict, t: dict, ids: np.ndarray | None, noise: float = 0.3,
                           seed: int = 0, lm_head: bool = True, config: dict | None = None) -> dict:
    """The published EAGLE-3 layout: config.json (a Llama config with draft_vocab_size) and
    model.safetensors holding fc.weight [h, 3h], midlayer.* (q/k/v read 2h), norm.weight,
    lm_head.weight [draft_vocab, h], d2t (int64) and t2d (bool), plus the frozen
    embed_tokens.weight some releases ship. ``ids``: the draft vocabulary (None: the whole
    vocabulary, no d2t/t2d, as SafeAILab saves it then). Returns the tensors by name."""
    from safetensors.numpy import save_file

    rng = np.random.default_rng(seed)
    h, inter, v = t["hidden_size"], t["intermediate_size"], t["vocab_size"]
    nh, nkv = t["num_attention_heads"], t["num_key_value_heads"]
    hd = h // nh
    r = lambda *s: (rng.standard_normal(s) / np.sqrt(s[-1])).astype(np.float32)
    near_one = lambda: (1 + 0.1 * rng.standard_normal(h)).astype(np.float32)
    fc = noise * r(h, 3 * h)
    fc[:, 2 * h:] += np.eye(h, dtype=np.float32)  # mostly the high layer's output, passed on
    p = "midlayer."
    w = {"fc.weight": fc, "norm.weight": target_w["model.norm.weight"], "embed_tokens.weight": r(v, h),
         p + "self_attn.q_proj.weight": r(nh * hd, 2 * h), p + "self_attn.k_proj.weight": r(nkv * hd, 2 * h),
         p + "self_attn.v_proj.weight": r(nkv * hd, 2 * h), p + "self_attn.o_proj.weight": noise * r(h, nh * hd),
         p + "mlp.gate_proj.weight": r(inter, h), p + "mlp.up_proj.weight": r(inter, h),
         p + "mlp.down_proj.weight": noise * r(h, inter), p + "hidden_norm.weight": near_one(),
         p + "input_layernorm.weight": near_one(), p + "post_attention_layernorm.weight": near_one()}
    out_rows = target_w.get("lm_head.weight", target_w["model.embed_tokens.weight"])
    extra = {"draft_vocab_size": v}
    if ids is not None:
        w["d2t"] = np.asarray(ids, np.int64) - np.arange(len(ids))
        w["t2d"] = np.isin(np.arange(v), ids)
        extra["draft_vocab_size"] = len(ids)
    if lm_head:
        w["lm_head.weight"] = np.ascontiguousarray(out_rows if ids is None else out_rows[ids])
    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: np.ascontiguousarray(a) for k, a in w.items()}, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": h,
        "intermediate_size": inter, "num_hidden_layers": 1, "num_attention_heads": nh, "num_key_value_heads": nkv,
        "vocab_size": v, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 2048,
        "hidden_act": "silu", "tie_word_embeddings": False, **extra, **(config or {})}))
    return w


def eagle3_reference(w: dict, t: LlamaConfig, emb: np.ndarray, hidden: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The EAGLE-3 head over one sequence of n rows at positions 0..n-1 (numpy, from the
    published names): row i reads the embedding of token i+1 and ``hidden[i]`` (fc of the
    target's features, or the head's own output); returns (outputs before the final norm
    [n, h], logits over the draft vocabulary [n, draft_vocab])."""
    p, eps = "midlayer.", t.rms_norm_eps
    a = np.concatenate([rms_norm(emb, w[p + "input_layernorm.weight"], eps),
                        rms_norm(hidden, w[p + "hidden_norm.weight"], eps)], -1)
    out = attention_mlp(w, p, t, a, hidden, np.arange(len(hidden)))
    return out, rms_norm(out, w["norm.weight"], eps) @ w["lm_head.weight"].T


def head_config() -> LlamaConfig:
    """The head's decoder layer: the target's sizes, one layer, no attention bias (the
    published EAGLE-3 layer has none, on Qwen2 targets too)."""
    return preset("tiny-qwen2", num_hidden_layers=1, attention_bias=False)


def build_head(ckpt: Path, target_src: Path, out: Path, model_type: str = "eagle") -> tuple[str, str]:
    from speccompile.compiler.compile import compile_model
    from speccompile.compiler.convert_weight import convert_weight
    from speccompile.compiler.gen_config import gen_config

    convert_weight(ckpt, "q0f32", out, model_type, progress=False, target=target_src)
    gen_config(ckpt, "q0f32", out, target=target_src, model_type=model_type)
    lib = out.with_suffix(".so")
    meta = compile_model(out / "speccompile-config.json", "llvm", lib, verbose=False)
    assert meta["model_type"] == "eagle3" and meta["feature_layers"] == [0, 0, 1]
    assert meta["entry_points"] == {n: list(ENTRY_POINTS["eagle3"][n]) for n in entry_point_names("eagle3", meta)}
    return str(out), str(lib)


@pytest.fixture(scope="module")
def e3(build_tiny, tmp_path_factory):
    from speccompile.runtime.engine import Engine

    built = build_tiny("tiny-qwen2", "q0f32")
    root = tmp_path_factory.mktemp("eagle3")
    eng = Engine(built.model_dir, built.lib)
    prompts = [eng.encode_prompt(p) for p in PROMPTS]
    expected = [eng.generate(ids, NEW_TOKENS, ignore_eos=True).token_ids for ids in prompts]
    t = PRESETS["tiny-qwen2"]
    # the draft vocabulary: a quarter of the target's plus every token the target emits here
    ids = np.array(sorted({tok for e in expected for tok in e} | set(range(0, t["vocab_size"], 4))))
    w = make_eagle3_checkpoint(root / "hf", built.weights, t, ids)
    head = build_head(root / "hf", built.hf_dir, root / "head")
    return built, head, w, ids, prompts, expected, root


# ------------------------------------------------------------------ conversion
def test_published_layout_is_detected_and_converted(e3, tmp_path):
    """--model-type eagle (and auto) read the EAGLE-3 layout: q/k/v and gate/up fused, d2t as
    int32, t2d and the shipped embedding left out; without lm_head.weight the draft
    vocabulary's rows are read from the target."""
    from speccompile.runtime.tensor_cache import load_params
    from speccompile.compiler.sources import HeadSource, detect_head

    built, head, w, ids, *_ = e3
    assert detect_head(e3[-1] / "hf") == "eagle3"
    params = load_params(Path(head[0]), ["fc.weight", "midlayer.self_attn.qkv_proj.weight", "d2t", "lm_head.weight",
                                         "midlayer.mlp.gate_up_proj.weight", "midlayer.hidden_norm.weight"])
    p = "midlayer."
    np.testing.assert_array_equal(params["fc.weight"], w["fc.weight"])
    np.testing.assert_array_equal(params[p + "self_attn.qkv_proj.weight"],
                                  np.concatenate([w[p + f"self_attn.{x}_proj.weight"] for x in "qkv"]))
    np.testing.assert_array_equal(params[p + "mlp.gate_up_proj.weight"],
                                  np.concatenate([w[p + "mlp.gate_proj.weight"], w[p + "mlp.up_proj.weight"]]))
    np.testing.assert_array_equal(params[p + "hidden_norm.weight"], w[p + "hidden_norm.weight"])
    assert params["d2t"].dtype == np.int32 and (np.arange(len(ids)) + params["d2t"]).tolist() == ids.tolist()
    np.testing.assert_array_equal(params["lm_head.weight"], w["lm_head.weight"])
    cfg = json.loads((Path(head[0]) / "speccompile-config.json").read_text())
    assert cfg["model_type"] == "eagle3" and cfg["model_config"]["draft_vocab_size"] == len(ids)

    t = PRESETS["tiny-qwen2"]
    make_eagle3_checkpoint(tmp_path / "rows", built.weights, t, ids, lm_head=False)  # rows from the target
    src = HeadSource("eagle3", tmp_path / "rows", built.hf_dir)
    np.testing.assert_array_equal(src.get("lm_head.weight"), built.weights["lm_head.weight"][ids])
    make_eagle3_checkpoint(tmp_path / "full", built.weights, t, None)  # the whole vocabulary: no d2t, no t2d
    src = HeadSource("eagle3", tmp_path / "full", built.hf_dir)
    assert src.config.draft_vocab_size == t["vocab_size"] and not src.get("d2t").any()


def test_conversion_refuses_heads_that_do_not_fit(e3, tmp_path):
    """Each refusal comes before any tensor is converted and says what does not fit."""
    from speccompile.compiler.convert_weight import convert_weight
    from speccompile.compiler.sources import SourceError

    built, *_ = e3
    t = PRESETS["tiny-qwen2"]
    ids = np.arange(0, t["vocab_size"], 2)
    cases = {
        "layers": ({"eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 1, 1]}},
                   r"outputs of target layers \[0, 1, 1\], but target libraries export layers \[0, 0, 1\]"),
        "fc_norm": ({"fc_norm": True}, "fc_norm"),
        "target_width": ({"target_hidden_size": 128}, "trained for a target of hidden size 128"),
        "vocab": ({"draft_vocab_size": 7}, f"draft_vocab_size 7, the weights hold {len(ids)}"),
    }
    for name, (config, words) in cases.items():
        make_eagle3_checkpoint(tmp_path / name, built.weights, t, ids, config=config)
        with pytest.raises(SourceError, match=words):
            convert_weight(tmp_path / name, "q0f32", tmp_path / f"out-{name}", "eagle", progress=False,
                           target=built.hf_dir)
        assert not (tmp_path / f"out-{name}").exists()
    from safetensors.numpy import load_file, save_file

    make_eagle3_checkpoint(tmp_path / "t2d", built.weights, t, ids)
    tensors = load_file(str(tmp_path / "t2d" / "model.safetensors"))
    tensors["t2d"] = np.roll(tensors["t2d"], 1)  # marks other tokens than d2t maps to
    save_file(tensors, str(tmp_path / "t2d" / "model.safetensors"))
    with pytest.raises(SourceError, match="the checkpoint's two maps disagree"):
        convert_weight(tmp_path / "t2d", "q0f32", tmp_path / "out-t2d", "eagle", progress=False, target=built.hf_dir)
    tensors["fc.weight"] = tensors["fc.weight"][:, : 2 * t["hidden_size"]]  # an EAGLE-1-wide fc
    tensors["t2d"] = np.roll(tensors["t2d"], -1)
    save_file(tensors, str(tmp_path / "t2d" / "model.safetensors"))
    with pytest.raises(SourceError, match=r"fc.weight is \[64, 128\], a target with hidden size 64 needs \[64, 192\]"):
        convert_weight(tmp_path / "t2d", "q0f32", tmp_path / "out-fc", "eagle", progress=False, target=built.hf_dir)


# ------------------------------------------------------------- the forwards
def test_target_exports_layer_features_with_the_same_logits(e3):
    """forward_tokens_features: the outputs of feature_layers (numpy reference), and hidden
    states whose get_logits are bit-identical to forward_tokens' logits, chain and tree."""
    from speccompile.runtime.model import Model

    built, *_ = e3
    model = Model(built.model_dir, built.lib)
    cfg = preset("tiny-qwen2")
    assert model.feature_layers == feature_layers(cfg.num_hidden_layers) == [0, 0, 1]
    ids = [5, 17, 200, 33, 9, 101, 64]
    outs: list = []
    reference_forward(built.weights, cfg, ids, layer_outputs=outs)
    kv = model.create_kv_cache(64)
    kv.add_sequence(0)
    hidden, feats = model.forward(kv, [0], [ids], outputs=("hidden", "features"))
    np.testing.assert_allclose(feats.numpy(), np.concatenate([outs[i] for i in model.feature_layers], -1),
                               rtol=1e-4, atol=1e-4)
    logits = model.get_logits(hidden).numpy()
    kv.popn(0, len(ids))
    assert np.array_equal(logits, model.forward(kv, [0], [ids]))
    kv.popn(0, len(ids) - 3)  # a token tree after a 3-token prefix (scratch rows: planned twice alike)
    tree, parents = [ids[3:]], [[-1, 0, 0, 1]]
    hidden, feats = model.forward(kv, [0], tree, parents, outputs=("hidden", "features"))
    assert feats.numpy().shape == (4, 3 * cfg.hidden_size)
    assert np.array_equal(model.get_logits(hidden).numpy(), model.forward(kv, [0], tree, parents))


def test_head_matches_the_reference_forward(e3):
    """The compiled head against numpy: catch-up rows built from fc of the target's
    features, then a row fed the head's own output (no fc), as drafting does."""
    from speccompile.runtime.drafters.eagle import Eagle3HeadModel
    from speccompile.runtime.model import Model

    built, head_paths, w, ids, *_ = e3
    target, head = Model(built.model_dir, built.lib), Eagle3HeadModel(*head_paths)
    assert head.features == "layers" and head.vocab_ids.tolist() == ids.tolist()
    tcfg, hcfg = preset("tiny-qwen2"), head_config()
    tokens = [5, 17, 200, 33, 9, 101]
    outs: list = []
    reference_forward(built.weights, tcfg, tokens, layer_outputs=outs)
    feats = np.concatenate([outs[i] for i in feature_layers(2)], -1)[:-1]  # rows 0..n-2: (f_i, token i+1)
    kv = head.create_kv_cache(64)
    kv.add_sequence(0)
    out = head.forward_target(target, kv, kv.plan_chain([0], [len(feats)]), np.asarray(tokens[1:], np.int32),
                              feats).numpy()
    fed = head.forward(target, kv, kv.plan_chain([0], [1]), np.asarray([77], np.int32), out[-1:]).numpy()
    emb = built.weights["model.embed_tokens.weight"]
    hidden = np.concatenate([feats @ w["fc.weight"].T, out[-1:]])
    ref_out, ref_logits = eagle3_reference(w, hcfg, emb[tokens[1:] + [77]], hidden)
    np.testing.assert_allclose(np.concatenate([out, fed]), ref_out, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(head.logits(target, np.concatenate([out, fed])), ref_logits, rtol=1e-4, atol=1e-4)


def test_draft_entry_points_match_the_reference(e3):
    """draft_catch_up (fc, layer, norm, lm_head, top-k at chosen rows) and draft_step (rows fed
    the head's own outputs, gathered on device by hidden_rows) against the numpy EAGLE-3
    forward: outputs, and the top-k target ids and log-softmax over the draft vocabulary,
    ordered as top_tokens orders the head's own logits."""
    from speccompile.runtime.drafters.eagle import Eagle3HeadModel, HostDraftCalls, ScratchRows, top_tokens
    from speccompile.runtime.model import Model

    built, head_paths, w, ids, *_ = e3
    target, head = Model(built.model_dir, built.lib), Eagle3HeadModel(*head_paths)
    assert head.bind(target, 3) is None and head.on_device and head.top_k == head.meta["draft_top_k"] == 8
    tcfg, hcfg = preset("tiny-qwen2"), head_config()
    emb, fc = built.weights["model.embed_tokens.weight"], w["fc.weight"]
    tokens = [5, 17, 200, 33, 9, 101]
    outs: list = []
    reference_forward(built.weights, tcfg, tokens, layer_outputs=outs)
    feats = np.concatenate([outs[i] for i in feature_layers(2)], -1)[:-1]  # rows 0..n-2: (f_i, token i+1)
    kv = head.create_kv_cache(64)
    kv.add_sequence(0)
    n, last = len(feats), np.array([2, len(feats) - 1])
    out, top, logp = head.catch_up(target, kv, kv.plan_chain([0], [n]), np.asarray(tokens[1:], np.int32), feats,
                                   last, 8)
    ref_out, ref_logits = eagle3_reference(w, hcfg, emb[tokens[1:]], feats @ fc.T)

    def check(got_out, got_ids, got_logp, want_out, want_logits):
        np.testing.assert_allclose(got_out, want_out, rtol=1e-4, atol=1e-4)
        logits = head.logits(target, got_out)  # the head's own logits: top-k order exactly as top_tokens
        for row, got_i, got_lp, want in zip(logits, got_ids, got_logp, want_logits):
            order, lp = top_tokens(row, 8)
            assert got_i.tolist() == ids[order].tolist()
            np.testing.assert_allclose(got_lp, lp, rtol=1e-5, atol=1e-5)
            ref_lp = want - want.max() - np.log(np.exp(want - want.max()).sum())
            np.testing.assert_allclose(got_lp, ref_lp[order], rtol=1e-4, atol=1e-4)

    check(out.numpy(), top, logp, ref_out[last], ref_logits[last])
    # depth 1 of a tree: three rows at position n, parents = rows 1, 1, 0 of the catch-up's output
    rows = ScratchRows(kv, [0])
    batch, _ = rows.plan(np.zeros(3, np.int64), np.full(3, -1))
    drafts, parents = np.array([77, 78, 79]), np.array([1, 1, 0])
    out2, top2, logp2 = head.step(target, kv, batch, drafts, out, parents, 8)
    fed = [eagle3_reference(w, hcfg, emb[tokens[1:] + [int(t)]], np.concatenate([feats @ fc.T, ref_out[last[p]][None]]))
           for t, p in zip(drafts, parents)]
    check(out2.numpy(), top2, logp2, np.stack([o[-1] for o, _ in fed]), np.stack([lg[-1] for _, lg in fed]))
    # the separate calls (the path of heads without draft_step) draft the very same tokens
    again, _ = rows.plan(np.zeros(3, np.int64), np.full(3, -1))
    out3, top3, logp3 = HostDraftCalls.step(head, target, kv, again, drafts, out.numpy(), parents, 8)
    assert top3.tolist() == top2.tolist()
    np.testing.assert_allclose(logp3, logp2, rtol=1e-5, atol=1e-5)


def test_device_top_k_orders_as_top_tokens():
    """The draft top-k kernels alone, over several chunks of a row: ids mapped through d2t,
    ties (inside a chunk, across chunk borders, at the k-th place) to the lower draft id,
    log-probabilities as top_tokens' float64 log-softmax."""
    import tvm
    from tvm.relax.frontend import nn
    from tvm.runtime.vm import VirtualMachine

    from speccompile.kernels.draft_topk import CHUNK, draft_top
    from speccompile.runtime.drafters.eagle import top_tokens

    vocab, k = 2 * CHUNK + 100, 8

    class Top(nn.Module):
        def top(self, logits, d2t):
            return draft_top(logits, d2t, k)

    target = tvm.target.Target({"kind": "llvm"})
    with target:
        mod, _ = Top().export_tvm({"top": {"logits": nn.spec.Tensor(["n", vocab], "float32"),
                                           "d2t": nn.spec.Tensor([vocab], "int32"),
                                           "$": {"param_mode": "none", "effect_mode": "none"}}})
    vm = VirtualMachine(tvm.compile(mod, target=target), tvm.cpu())
    rng = np.random.default_rng(0)
    d2t = (np.sort(rng.choice(3 * vocab, vocab, replace=False)) - np.arange(vocab)).astype(np.int32)
    logits = np.round(rng.standard_normal((48, vocab)) * 2, 1).astype(np.float32)  # many ties
    logits[1, [CHUNK - 1, CHUNK, 7, 2 * CHUNK + 50]] = 9.0  # tied maxima across chunks
    logits[2, :] = 0.0  # a flat row: the k lowest ids
    logits[3, [3, CHUNK + 3]] = 20.0
    logits[3, 2 * CHUNK + 99] = -100.0
    logits[4, ::7] = 5.0  # the k-th place tied many times over
    for rows in (5, 48):  # few rows run on the calling thread, many in parallel: the same results
        got_ids, got_logp = (a.numpy() for a in vm["top"](tvm.runtime.tensor(logits[:rows]), tvm.runtime.tensor(d2t)))
        for row, gi, gl in zip(logits, got_ids, got_logp):
            order, lp = top_tokens(row, k)
            assert gi.tolist() == (order + d2t[order]).tolist()
            np.testing.assert_allclose(gl, lp, rtol=1e-5, atol=1e-5)
        assert got_ids[2].tolist() == (np.arange(k) + d2t[:k]).tolist()


def test_draft_steps_need_the_targets_embedding_storage(e3):
    """A head drafts on device only with a target storing the embedding it was compiled
    for and trees within its top-k; otherwise it says why and takes the separate calls."""
    from speccompile.runtime.drafters.eagle import Eagle3HeadModel
    from speccompile.runtime.model import Model

    built, head_paths, *_ = e3
    target, head = Model(built.model_dir, built.lib), Eagle3HeadModel(*head_paths)
    assert "wider than the head's compiled top-8" in head.bind(target, 9) and not head.on_device
    params = [dict(p, dtype="float16") if p["name"] == "embed_tokens.weight" else p for p in target.meta["params"]]
    target.meta = {**target.meta, "params": params, "quantization": "q0f16"}
    assert "embed_tokens.weight [272, 64] float32, which this target (q0f16) does not store" in head.bind(target, 1)
    assert head.target_embed is None and not head.on_device


# ------------------------------------------------------------------ drafting
def test_lossless_chain_and_tree_at_batch_1_and_4(e3):
    """Greedy output identical to plain decoding with chains (width 1) and EAGLE-2 trees
    (width 3) 3 deep, batch 1 and 4; drafts partly accepted, trees beyond the top-1."""
    from speccompile.runtime.engine import Engine

    built, head, w, ids, prompts, expected, _ = e3
    stats = []
    for width in (1, 3):
        eng = Engine(built.model_dir, built.lib, speculative_mode="eagle", additional_models=[head],
                     spec_tree_width=width, spec_tree_nodes=16 if width > 1 else 64)
        assert eng.proposer.features == "layers" and eng.proposer.separate_calls is None  # drafts on device
        eng.set_draft_length(3)
        for i, p in enumerate(prompts):
            res = eng.generate(p, NEW_TOKENS, ignore_eos=True)
            assert res.token_ids == expected[i], f"width={width} prompt {i}"
            stats.append((width, res.stats.spec))
        for start in range(0, len(prompts), 4):
            results = eng.generate_batch(prompts[start:start + 4], NEW_TOKENS, ignore_eos=True)
            assert [r.token_ids for r in results] == expected[start:start + 4], f"width={width} batch at {start}"
            stats += [(width, r.stats.spec) for r in results]
    for width in (1, 3):
        seen = [s for w_, s in stats if w_ == width]
        accepted, drafted = sum(s.accepted_tokens for s in seen), sum(s.draft_tokens for s in seen)
        assert 0 < accepted < drafted, f"width {width}: {accepted} of {drafted} drafts accepted"
    mean_len = {wd: sum(s.emitted_in_verify for v, s in stats if v == wd) / sum(s.verify_steps for v, s in stats if v == wd)
                for wd in (1, 3)}
    assert mean_len[3] > mean_len[1], mean_len  # other branches than the top-1 get accepted


@pytest.mark.parametrize("mode, width", [("eagle", 1), ("eagle", 3), ("suffix", 2)])
def test_c_runtime_drafts_what_python_drafts(e3, capi_build, mode, width):
    """The C runtime (runtime/capi/src/drafters/eagle.cc) with the EAGLE-3 head: catch-up from
    the target's layer features through fc, trees from the head's own outputs, alone and merged
    with the suffix index, at a fixed k -- Python's tokens and every draft and acceptance count."""
    from capi_ctypes import run_example

    from speccompile.runtime.engine import Engine

    built, head, _, _, prompts, expected, _ = e3
    for i in (0, 3):
        py = Engine(built.model_dir, built.lib, speculative_mode=mode, additional_models=[head], spec_draft_length=3,
                    spec_tree_width=width).generate(prompts[i], NEW_TOKENS, ignore_eos=True).to_dict()
        proc = run_example(capi_build / "spc_generate", built.model_dir, built.lib, "--prompt-ids",
                           ",".join(map(str, prompts[i])), "--max-tokens", str(NEW_TOKENS), "--ignore-eos", "--json",
                           "--speculative-mode", mode, "--additional-models", ",".join(head),
                           "--spec-draft-length", "3", "--spec-tree-width", str(width))
        assert proc.returncode == 0, proc.stderr
        c = json.loads(proc.stdout)
        assert c["token_ids"] == py["token_ids"] == expected[i]
        counts = ("draft_tokens", "accepted_tokens", "verify_steps", "plain_steps")
        assert [c["stats"][n] for n in counts] == [py["stats"][n] for n in counts]
        assert c["stats"]["accepted_tokens"] > 0


@pytest.mark.parametrize("width", [1, 2])
def test_draft_tree_rows_compute_what_their_paths_compute_as_chains(e3, width):
    """Every row an EAGLE-3 head drafts in a step -- fed its parent's own output, without fc --
    equals its path appended as chain rows through eagle_forward (tests/draft_rows.py); the
    fused draft_step and the separate call round differently, so to 1e-4."""
    from draft_rows import check_draft_rows
    from speccompile.runtime.engine import Engine

    built, head, _, _, prompts, _, _ = e3
    eng = Engine(built.model_dir, built.lib, speculative_mode="eagle", additional_models=[head], spec_draft_length=3,
                 spec_tree_width=width, spec_tree_nodes=16)

    def chain_row(kv, sid, token, feature):
        return eng.proposer.head.forward(eng.model, kv, kv.plan_chain([sid], [1]), np.array([token], np.int32),
                                         feature[None].astype(np.float32))

    assert check_draft_rows(eng, prompts[0], 4, chain_row, exact=False) >= 4 * 2 * width


def test_sampling_keeps_the_target_distribution(e3):
    """At T > 0 the first two tokens of many seeded generations (the second one verified
    against EAGLE-3 drafts by rejection sampling) follow the target's exact joint law."""
    from speccompile.runtime.engine import Engine
    from speccompile.runtime.sampling import SamplingParams, probs_from_logits

    built, head, w, ids, prompts, expected, _ = e3
    sp = dict(temperature=1.5, top_k=4)
    eng = Engine(built.model_dir, built.lib, speculative_mode="eagle", additional_models=[head],
                 max_num_sequence=16)
    # short, so that 100 batches of 16 run in ~3 s; the target repeats itself after it, so
    # the head's drafts are accepted now and then
    prompt = eng.encode_prompt("<|im_start|>assistant\n", raw=True)
    # the exact law of (t1, t2) under the target alone
    model = eng.model
    kv = model.create_kv_cache(256)
    kv.add_sequence(0)
    p1 = probs_from_logits(model.prefill(kv, [0], [prompt])[0], SamplingParams(**sp))
    exact = {}
    for t1 in np.flatnonzero(p1):
        p2 = probs_from_logits(model.forward(kv, [0], [[int(t1)]])[0], SamplingParams(**sp))
        kv.popn(0, 1)
        exact.update({(int(t1), int(t2)): p1[t1] * p2[t2] for t2 in np.flatnonzero(p2)})
    counts: dict = {}
    n, accepted = 1600, 0
    eng.set_draft_length(3)
    for start in range(0, n, 16):
        results = eng.generate_batch([prompt] * 16, 2, [SamplingParams(**sp, seed=start + i) for i in range(16)],
                                     ignore_eos=True)
        for r in results:
            counts[tuple(r.token_ids)] = counts.get(tuple(r.token_ids), 0) + 1
            accepted += r.stats.spec.accepted_tokens
    assert set(counts) <= set(exact)
    tv = 0.5 * sum(abs(counts.get(key, 0) / n - q) for key, q in exact.items())
    sd = 0.5 * sum(np.sqrt(q * (1 - q) / n) for q in exact.values())  # E[tv] is about 0.8 of this
    assert tv < 2 * sd, (tv, sd)
    assert 0 < accepted < n  # drafts were verified, some accepted, some rejected
    # a sampler that let the (deterministic) draft through would miss by at least this much
    leak = sum(p1[t1] * (1 - max(q for (a, _), q in exact.items() if a == t1) / p1[t1]) for t1 in np.flatnonzero(p1))
    assert leak > 4 * sd, (leak, sd)


def test_runtime_refuses_a_target_without_layer_features(e3, monkeypatch):
    """A target library built before EAGLE-3 support (no feature_layers) still loads for
    every other mode, and an EAGLE-3 head on it is refused by name before drafting."""
    import speccompile.runtime.model as model_mod
    from speccompile.runtime.engine import Engine, GenerationError

    built, head, *_ = e3
    real = model_mod.read_metadata

    def older(path):
        lib, meta = real(path)
        if library_kind(meta) != "target":
            return lib, meta
        meta = {**meta, "entry_points": {k: v for k, v in meta["entry_points"].items()
                                         if k != "forward_tokens_features"}}
        meta.pop("feature_layers")
        return lib, meta

    monkeypatch.setattr(model_mod, "read_metadata", older)
    assert model_mod.Model(built.model_dir, built.lib).feature_layers is None  # loads as before
    with pytest.raises(GenerationError, match="does not export .* rebuild it with `speccompile compile`"):
        Engine(built.model_dir, built.lib, speculative_mode="eagle", additional_models=[head])


# ------------------------------------------------------------ writing heads
def test_torch_head_written_in_the_published_layout_round_trips(e3, tmp_path):
    """train-draft's EAGLE-3 model and writer (speccompile/training/eagle3_torch.py): what it writes
    converts as a published head, and its torch forward is the numpy reference's (which the
    compiled head matches, test_head_matches_the_reference_forward)."""
    torch = pytest.importorskip("torch")
    from speccompile.compiler.convert_weight import open_any
    from speccompile.training.eagle3_torch import build_eagle3_head, export_eagle3
    from speccompile.training.common import rope_tables

    built, _, _, ids, *_ = e3
    hcfg = head_config()
    torch.manual_seed(0)
    model = build_eagle3_head(hcfg, len(ids), torch)
    rows = built.weights["lm_head.weight"][ids]  # the target's lm_head rows, frozen
    with torch.no_grad():
        model.lm_head.weight.copy_(torch.from_numpy(rows))
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.add_(0.1 * torch.randn_like(p))
    export_eagle3(model, hcfg, tmp_path / "out", torch, ids, feature_layers(2))
    src = open_any(tmp_path / "out", "eagle", built.hf_dir)
    assert src.config.model_type == "eagle3" and src.config.draft_vocab_size == len(ids)
    assert src.config.feature_layers == [0, 0, 1] and "lm_head.weight" not in src.files.names()
    w = {name: src.get(name) for name in src.names()}  # published names, as conversion reads them
    with torch.no_grad():
        for name, p in model.state_dict().items():  # written in fp16, but lm_head: the target's own rows
            want = rows if name == "lm_head.weight" else p.to(torch.float16).float().numpy()
            assert np.array_equal(w[name], want), name
            p.copy_(torch.from_numpy(w[name]))
        rng = np.random.default_rng(1)
        n, h = 6, hcfg.hidden_size
        emb = built.weights["model.embed_tokens.weight"][rng.integers(0, hcfg.vocab_size, n)]
        feats = rng.standard_normal((n, 3 * h)).astype(np.float32)
        cos, sin = rope_tables(n, hcfg.head_dim, hcfg.rope_theta, torch)
        fused = model.fuse(torch.from_numpy(feats)[None])
        out = model(torch.from_numpy(emb)[None], fused, cos, sin)
        ref_out, ref_logits = eagle3_reference(w, hcfg, emb, feats @ w["fc.weight"].T)
        np.testing.assert_allclose(out[0].numpy(), ref_out, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(model.logits(out)[0].numpy(), ref_logits, rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="sorted distinct ids"):
        export_eagle3(model, hcfg, tmp_path / "bad", torch, ids[::-1], feature_layers(2))
    # and read back for fine-tuning (--init <folder>): every layer as written, the vocabulary as given
    from speccompile.training.eagle3_torch import load_exported_head

    again = build_eagle3_head(hcfg, len(ids), torch)
    assert list(load_exported_head(again, tmp_path / "out", torch)) == sorted(ids)
    for name, p in again.state_dict().items():
        if name != "lm_head.weight":
            assert np.array_equal(p.numpy(), w[name]), name
    smaller = copy.deepcopy(hcfg)
    smaller.intermediate_size = hcfg.intermediate_size // 2
    with pytest.raises(ValueError, match="does not fit"):
        load_exported_head(build_eagle3_head(smaller, len(ids), torch), tmp_path / "out", torch)


def test_answers_with_features_then_training_resume(e3, tmp_path):
    """train-answers: greedy answers with the target's layer features captured while the
    engine generates -- the same tokens as plain generation, the same features as one
    forward over the finished conversation -- in shards a rerun resumes (a torn index line
    and an unnamed shard are redone, nothing twice); train-draft --method eagle3 trains on
    them, resumes from its state and exports a head conversion reads."""
    pytest.importorskip("torch")
    from speccompile.compiler.convert_weight import open_any
    from speccompile.runtime.engine import Engine
    from speccompile.training.answers import conversations, read_shards, run_train_answers
    from speccompile.training.eagle3 import Settings, train_eagle3

    built, *_ = e3
    (tmp_path / "prompts").mkdir()
    for split, texts in (("train", ["Tell me a story.", "Write a poem.", "Hello there.", "Sort a list."]),
                         ("held_out", ["What is two plus two?", "Name a color."])):
        rows = [{"id": f"{split[0]}{i}", "prompt": t} for i, t in enumerate(texts)]
        (tmp_path / "prompts" / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    run = lambda: run_train_answers(built.model_dir, built.lib, tmp_path, None, held_out=2, mt_bench=False,  # noqa
                                    max_tokens=12, batch=3, shard_tokens=40, progress=False)
    run()
    train_dir = tmp_path / "answers" / "train"
    shards = read_shards(train_dir)
    assert len(shards) >= 2
    eng = Engine(built.model_dir, built.lib)
    convs = [c for s in shards for c in conversations(s)]
    assert sorted(c[0] for c in convs) == ["t0", "t1", "t2", "t3"]
    for pid, toks, plen, feats in convs:
        assert eng.generate(list(map(int, toks[:plen])), 12).token_ids == list(map(int, toks[plen:]))
        eng.kv.add_sequence(99)
        h, f = eng.model.forward(eng.kv, [99], [list(map(int, toks[:-1]))], outputs=("hidden", "features"))
        eng.kv.remove_sequence(99)
        assert np.array_equal(feats, f.numpy().astype(np.float16))
        hidden = [c[3] for s in shards for c in conversations(s, hidden=True) if c[0] == pid][0]
        assert np.array_equal(hidden, h.numpy().astype(np.float16))
    # an interrupted run: the last shard's index line torn, a half-written shard left behind
    index = (train_dir / "index.jsonl").read_text().splitlines()
    (train_dir / "index.jsonl").write_text("\n".join(index[:-1]) + "\n" + index[-1][:10])
    (train_dir / "shard_00099.npz.tmp").write_bytes(b"partial")
    run()
    again = [c[0] for s in read_shards(train_dir) for c in conversations(s)]
    assert sorted(again) == ["t0", "t1", "t2", "t3"] and not list(train_dir.glob("*.tmp"))

    settings = Settings(intermediate_size=32, draft_vocab=64, ttt_steps=2, epochs=1, batch_rows=32, eval_every=2,
                        eval_share=1.0, warmup=1)
    first = train_eagle3(built.model_dir, tmp_path, tmp_path / "head", settings, progress=False)
    assert first["epochs"] == 1 and first["best"]["top1"]
    second = train_eagle3(built.model_dir, tmp_path, tmp_path / "head", Settings(**{**settings.__dict__, "epochs": 2}),
                          progress=False)
    assert second["steps"] == 2 * first["steps"] and second["epochs"] == 2  # continued, not restarted
    curve = [json.loads(x) for x in (tmp_path / "eagle3" / "curve.jsonl").read_text().splitlines()]
    assert curve[0]["step"] == 0 and curve[-1]["step"] == second["steps"]
    # more held-out answers arrive between runs: the best checkpoint is scored again on the new set
    # before any comparison (scores on different sets do not compare)
    with open(tmp_path / "prompts" / "held_out.jsonl", "a") as f:
        f.write(json.dumps({"id": "h2", "prompt": "Spell the word cat."}) + "\n")
    run_train_answers(built.model_dir, built.lib, tmp_path, None, held_out=3, mt_bench=False, max_tokens=12, batch=3,
                      shard_tokens=40, progress=False)
    third = train_eagle3(built.model_dir, tmp_path, tmp_path / "head", Settings(**{**settings.__dict__, "epochs": 3}),
                         progress=False)
    curve = [json.loads(x) for x in (tmp_path / "eagle3" / "curve.jsonl").read_text().splitlines()]
    assert third["held_out_conversations"] == 3 and curve[-1]["held_out"] != curve[0]["held_out"]
    assert third["best"]["held_out"] == curve[-1]["held_out"]  # every later comparison on the new set
    src = open_any(tmp_path / "head", "eagle", built.hf_dir)
    assert src.config.model_type == "eagle3" and src.config.draft_vocab_size <= 64
    # soft labels read the shards' final hidden states (another epoch on the same run)
    fourth = train_eagle3(built.model_dir, tmp_path, tmp_path / "head",
                          Settings(**{**settings.__dict__, "epochs": 4, "soft_labels": True}), progress=False)
    assert fourth["steps"] > third["steps"] and fourth["settings"]["soft_labels"]
    # --export-only: the best checkpoint so far, the run's folder untouched (safe beside a running training)
    before = {f.name: f.read_bytes() for f in (tmp_path / "eagle3").iterdir()}
    exported = train_eagle3(built.model_dir, tmp_path, tmp_path / "head2", settings, progress=False, export_only=True)
    assert {f.name: f.read_bytes() for f in (tmp_path / "eagle3").iterdir()} == before
    assert exported["best"] == fourth["best"]
    assert (tmp_path / "head2" / "model.safetensors").read_bytes() == (tmp_path / "head" / "model.safetensors").read_bytes()
    # a smaller draft vocabulary on a resumed run: the layers carry over (the projection is frozen),
    # the best checkpoint is scored again under it, and the export drafts over the new one
    fifth = train_eagle3(built.model_dir, tmp_path, tmp_path / "head",
                         Settings(**{**settings.__dict__, "epochs": 5, "draft_vocab": 32}), progress=False)
    curve = [json.loads(x) for x in (tmp_path / "eagle3" / "curve.jsonl").read_text().splitlines()]
    assert fifth["steps"] > fourth["steps"] and curve[-1]["draft_vocab"] == 32
    assert fifth["best"]["held_out"] == curve[-1]["held_out"] != fourth["best"]["held_out"]
    assert open_any(tmp_path / "head", "eagle", built.hf_dir).config.draft_vocab_size == 32
    # a new run that starts as the exported head (--init <its folder>, a fine-tune on today's answers):
    # its shape and draft vocabulary are the head's, and its first held-out point scores as the head did
    ft = tmp_path / "ft"
    for d in ("answers", "prompts"):
        shutil.copytree(tmp_path / d, ft / d)
    tuned = train_eagle3(built.model_dir, ft, tmp_path / "head_ft", Settings(**{
        **settings.__dict__, "intermediate_size": 8, "draft_vocab": None, "init": str(tmp_path / "head")}),
        progress=False)
    start = json.loads((ft / "eagle3" / "curve.jsonl").read_text().splitlines()[0])
    assert start["step"] == 0 and start["draft_vocab"] == 32 and tuned["settings"]["intermediate_size"] == 32
    assert start["top1"] == fifth["best"]["top1"]  # scored as the head was (its weights: the round-trip test)
    assert tuned["steps"] >= 1 and (tmp_path / "head_ft" / "model.safetensors").exists()
    with pytest.raises(ValueError, match="exported head's folder"):
        train_eagle3(built.model_dir, ft, tmp_path / "x", Settings(init=str(tmp_path / "nowhere")), progress=False)
    # Medusa trains on the same answers (their final hidden states), with a reduced vocabulary
    from speccompile.training.eagle import run_train_draft

    rep = run_train_draft("medusa", built.model_dir, None, tmp_path / "medusa", steps=3, train_batch=2, draft_vocab=64,
                          progress=False, work_dir=tmp_path, medusa_num_heads=2)
    assert rep["steps"] == 3 and rep["draft_vocab"] <= 64 and rep["held_out"] is not None
    assert (tmp_path / "medusa" / "model.safetensors").exists()


def test_adaptive_head_drafts_after_a_long_prompt(e3):
    """The head's catch-up over a prompt's rows is priced per row and amortized, not as a
    draft forward of that many rows: with Qwen-like costs (a draft row 5% of a step, extra
    verified rows nearly free), a fresh adaptive engine drafts from the first decode steps
    after a 200-token prompt (priced whole, such a catch-up looked like a target step and
    grew by a row with every plain step: the head never drafted), and stays lossless."""
    from speccompile.runtime.costs import CostModel, CostTable
    from speccompile.runtime.engine import Engine

    built, head, _, _, _, _, _ = e3
    eng = Engine(built.model_dir, built.lib, speculative_mode="eagle", additional_models=[head])
    plain = Engine(built.model_dir, built.lib)
    prompt = eng.encode_prompt(" ".join(PROMPTS[:4]))
    assert len(prompt) > 150
    ms = {1: 10, 2: 10.3, 4: 10.6, 8: 11.5, 16: 13, 32: 16}
    eng.cost = CostModel(CostTable({r: v * 1e-3 for r, v in ms.items()}), CostTable({1: 5e-4, 8: 1e-3}), 2e-5)
    eng.set_draft_length(0)
    res = eng.generate(prompt, 8, ignore_eos=True)
    assert res.stats.spec.draft_steps > 0 and res.stats.spec.verify_steps > 0
    assert res.token_ids == plain.generate(prompt, 8, ignore_eos=True).token_ids
