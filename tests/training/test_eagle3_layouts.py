"""The published EAGLE-3 layouts other trainers write, each on random weights of its exact
names and config, converted by ``--model-type eagle`` (auto-detected), compiled, and checked
against a numpy forward of that layout:

- vLLM's ``speculators`` format: ``layers.0.*``, the Llama config nested in
  ``transformer_layer_config``, aux layers as vLLM's ids at the top, ``norm_before_residual``
  (the residual starts from the normed feature);
- SpecForge with ``fc_norm``: an RMSNorm on each of the three features before ``fc``;
- the same as SGLang's loader names it: ``model.``-prefixed, ``aux_norm_low/mid/high``;
- AngelSlim's: ``Eagle3LlamaForCausalLM`` with ``target_model_type``, SafeAILab's names.

SafeAILab's own layout is tests/training/test_eagle3.py's.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from reference import PROMPTS, attention_mlp, rms_norm
from reference import forward as reference_forward
from speccompile.models.config import PRESETS, feature_layers, preset
from test_eagle3 import build_head, head_config, make_eagle3_checkpoint

pytestmark = pytest.mark.tiny

LAYOUTS = ("speculators", "specforge-fc-norm", "sglang-names", "angelslim")


def write_layout(folder: Path, layout: str, base: dict, config: dict) -> dict:
    """Rewrite a SafeAILab-layout head (tensors ``base``, ``config``) in another trainer's
    layout; returns the tensors by their SafeAILab names (the reference reads those)."""
    from safetensors.numpy import save_file

    rng = np.random.default_rng(7)
    w = dict(base)
    h = config["hidden_size"]
    if layout in ("specforge-fc-norm", "sglang-names"):
        for i in range(3):
            w[f"fc_norm.{i}.weight"] = (1 + 0.2 * rng.standard_normal(h)).astype(np.float32)
    names = dict.fromkeys(w)
    cfg = dict(config)
    if layout == "speculators":
        names = {n: n.replace("midlayer.", "layers.0.") for n in w}
        cfg = {"architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3",
               "transformer_layer_config": {k: v for k, v in config.items() if k != "draft_vocab_size"},
               "draft_vocab_size": config["draft_vocab_size"], "norm_before_residual": True,
               "eagle_aux_hidden_state_layer_ids": [i + 1 for i in feature_layers(2)],
               "speculators_config": {"algorithm": "eagle3", "verifier": {"name_or_path": "target"}}}
    elif layout == "specforge-fc-norm":
        names = {n: n for n in w}
        cfg.update(fc_norm=True, norm_output=True)
    elif layout == "sglang-names":
        low_mid_high = {f"fc_norm.{i}.": f"aux_norm_{p}." for i, p in enumerate(("low", "mid", "high"))}
        names = {}
        for n in w:
            out = n
            for a, b in low_mid_high.items():
                out = out.replace(a, b)
            names[n] = out if n in ("d2t", "t2d", "lm_head.weight") else "model." + out.replace("midlayer.", "layers.0.")
    elif layout == "angelslim":
        names = {n: n for n in w}
        cfg.update(architectures=["Eagle3LlamaForCausalLM"], target_model_type="qwen2")
    folder.mkdir(parents=True, exist_ok=True)
    save_file({names[n]: np.ascontiguousarray(a) for n, a in w.items()}, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(cfg))
    return w


def layout_reference(w: dict, layout: str, emb: np.ndarray, hidden: np.ndarray, fused: int):
    """The head over one sequence (rows at positions 0..n-1): the first ``fused`` rows' hidden
    are target features [.., 3h] through (per-feature norms and) fc, the rest the head's own
    outputs; returns (outputs before the final norm, logits)."""
    cfg = head_config()
    eps, p, h = cfg.rms_norm_eps, "midlayer.", cfg.hidden_size
    feats = hidden[:fused]
    if "fc_norm.0.weight" in w:
        feats = np.concatenate([rms_norm(feats[:, i * h:(i + 1) * h], w[f"fc_norm.{i}.weight"], eps)
                                for i in range(3)], -1)
    g = np.concatenate([feats @ w["fc.weight"].T, hidden[fused:, :h]])
    normed = rms_norm(g, w[p + "hidden_norm.weight"], eps)
    a = np.concatenate([rms_norm(emb, w[p + "input_layernorm.weight"], eps), normed], -1)
    out = attention_mlp(w, p, cfg, a, normed if layout == "speculators" else g, np.arange(len(g)))
    return out, rms_norm(out, w["norm.weight"], eps) @ w["lm_head.weight"].T


@pytest.fixture(scope="module")
def target(build_tiny):
    from speccompile.runtime.engine import Engine

    built = build_tiny("tiny-qwen2", "q0f32")
    eng = Engine(built.model_dir, built.lib)
    prompts = [eng.encode_prompt(p) for p in PROMPTS[:3]]
    return built, prompts, [eng.generate(ids, 16, ignore_eos=True).token_ids for ids in prompts]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_layout_converts_and_matches_its_reference(target, layout, tmp_path):
    from speccompile.compiler.sources import detect_head
    from speccompile.runtime.drafters.eagle import Eagle3HeadModel
    from speccompile.runtime.engine import Engine
    from speccompile.runtime.model import Model

    built, prompts, expected = target
    t = PRESETS["tiny-qwen2"]
    ids = np.arange(0, t["vocab_size"], 2)
    base = make_eagle3_checkpoint(tmp_path / "base", built.weights, t, ids)
    config = json.loads((tmp_path / "base" / "config.json").read_text())
    w = write_layout(tmp_path / "hf", layout, base, config)
    assert detect_head(tmp_path / "hf") == "eagle3"
    head_paths = build_head(tmp_path / "hf", built.hf_dir, tmp_path / "head")
    meta = json.loads((tmp_path / "head" / "speccompile-config.json").read_text())["model_config"]
    assert meta["fc_norm"] == ("fc_norm.0.weight" in w) and meta["norm_before_residual"] == (layout == "speculators")

    target_model, head = Model(built.model_dir, built.lib), Eagle3HeadModel(*head_paths)
    tokens = [5, 17, 200, 33, 9, 101]
    outs: list = []
    reference_forward(built.weights, preset("tiny-qwen2"), tokens, layer_outputs=outs)
    feats = np.concatenate([outs[i] for i in feature_layers(2)], -1)[:-1]
    kv = head.create_kv_cache(64)
    kv.add_sequence(0)
    out = head.forward_target(target_model, kv, kv.plan_chain([0], [len(feats)]), np.asarray(tokens[1:], np.int32),
                              feats).numpy()
    fed = head.forward(target_model, kv, kv.plan_chain([0], [1]), np.asarray([77], np.int32), out[-1:]).numpy()
    emb = built.weights["model.embed_tokens.weight"]
    hidden = np.concatenate([feats, np.pad(out[-1:], ((0, 0), (0, feats.shape[1] - out.shape[1])))])
    ref_out, ref_logits = layout_reference(w, layout, emb[tokens[1:] + [77]], hidden, len(feats))
    np.testing.assert_allclose(np.concatenate([out, fed]), ref_out, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(head.logits(target_model, np.concatenate([out, fed])), ref_logits, rtol=1e-4,
                               atol=1e-4)
    eng = Engine(built.model_dir, built.lib, speculative_mode="eagle", additional_models=[head_paths])
    eng.set_draft_length(3)
    assert [eng.generate(p, 16, ignore_eos=True).token_ids for p in prompts] == expected


def test_aux_layers_the_target_does_not_export_are_refused(target, tmp_path):
    from speccompile.compiler.sources import SourceError

    built, *_ = target
    t = PRESETS["tiny-qwen2"]
    base = make_eagle3_checkpoint(tmp_path / "base", built.weights, t, None)
    config = json.loads((tmp_path / "base" / "config.json").read_text())
    write_layout(tmp_path / "hf", "speculators", base, config)
    cfg = json.loads((tmp_path / "hf" / "config.json").read_text())
    cfg["eagle_aux_hidden_state_layer_ids"] = [2, 2, 2]
    (tmp_path / "hf" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(SourceError, match=r"reads the outputs of target layers \[1, 1, 1\]"):
        build_head(tmp_path / "hf", built.hf_dir, tmp_path / "head")
