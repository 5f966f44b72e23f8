"""EAGLE-3 heads in torch, named as SafeAILab and SpecForge publish them, and the writer
of that layout: the model and the export of ``train-draft --method eagle3``.

The training loop (speccompile/training/eagle3.py: the training-time test on the head's own
fed-back outputs, checkpoint selection on held-out conversations) trains this model on the
features speccompile/training/answers.py captured while the engine generated, and writes it
with ``export_eagle3``, so a trained head is
read by ``convert_weight --model-type eagle`` exactly as a downloaded one; the round trip
(torch forward == the numpy reference the compiled head is checked against) is tested in
tests/training/test_eagle3.py.

The module mirrors models/eagle3.py: ``fuse`` is fc over the target's low/mid/high layer
outputs [.., 3h]; ``forward`` the one decoder layer, whose attention reads
[input_layernorm(embedding), hidden_norm(hidden)] and whose residual starts from
``hidden`` (the fused feature, or the head's own previous output); ``logits`` its final
norm and lm_head over the draft vocabulary.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from speccompile.training.common import llama_blocks


def build_eagle3_head(layer_cfg, draft_vocab_size: int, torch):
    """The EAGLE-3 head in torch; ``layer_cfg`` gives the decoder layer's sizes (a Llama
    config: hidden_size, intermediate_size, heads, head_dim, rms_norm_eps)."""
    nn = torch.nn
    c = layer_cfg
    h = c.hidden_size
    RMSNorm, Attention, MLP = llama_blocks(torch)

    class MidLayer(nn.Module):
        def __init__(self):
            super().__init__()
            self.self_attn, self.mlp = Attention(c, 2 * h), MLP(h, c.intermediate_size)
            self.input_layernorm, self.hidden_norm, self.post_attention_layernorm = (
                RMSNorm(h, c.rms_norm_eps) for _ in range(3))

        def forward(self, emb, hidden, cos, sin):
            x = torch.cat([self.input_layernorm(emb), self.hidden_norm(hidden)], -1)
            hidden = hidden + self.self_attn(x, cos, sin)
            return hidden + self.mlp(self.post_attention_layernorm(hidden))

    class Eagle3(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(3 * h, h, bias=False)
            self.midlayer = MidLayer()
            self.norm = RMSNorm(h, c.rms_norm_eps)
            self.lm_head = nn.Linear(h, draft_vocab_size, bias=False)

        def fuse(self, features):
            # features: [b, n, 3h] the target's low/mid/high layer outputs -> [b, n, h]
            return self.fc(features)

        def forward(self, emb, hidden, cos, sin):
            # emb: [b, n, h] embeddings of token i+1; hidden: [b, n, h] fused feature (or the
            # head's own output) at i -> the head's output at i [b, n, h], before its norm
            return self.midlayer(emb, hidden, cos, sin)

        def logits(self, out):
            # out: [b, n, h] -> [b, n, draft_vocab]
            return self.lm_head(self.norm(out))

    return Eagle3()


def init_from_target_layer(model, target_dir: Path, layer: int, high: int, torch) -> None:
    """Start a new head as the target's decoder ``layer`` reading the ``high`` feature.

    Why: the head is one decoder layer whose output goes through the target's final norm and
    frozen lm_head, which is what the target's own upper layers feed; from random weights it
    must learn that interface from our ~1.6M answer tokens first. Started so -- fc passing the
    high layer's output through, the attention's hidden half and o_proj the target layer's,
    the embedding half zero, the MLP the target layer's ``intermediate_size`` neurons of
    largest |up row| * |down column|, the norms the layer's -- it begins as (most of) the next
    layer of the target and only has to learn the shift to the token after next. Measured on
    Qwen2.5-Coder-1.5B (layer 25 over layer 24's output; same batches, seed and held-out set,
    depth-1 training): held-out top-1 0.345 / 0.450 after 100 / 200 steps, against 0.275 /
    0.343 from random weights; the random-weight run of 4 TTT steps reached 0.45 at step 600.
    The qkv biases of a Qwen layer have no place in the published (Llama) layer and are dropped."""
    from speccompile.training.common import target_weight

    a, m, mid = model.midlayer.self_attn, model.midlayer.mlp, model.midlayer
    h = model.fc.weight.shape[0]
    p = f"layers.{layer}"
    nq, nk = a.q_proj.weight.shape[0], a.k_proj.weight.shape[0]
    qkv = target_weight(target_dir, f"{p}.self_attn.qkv_proj")  # [nq + 2 nk, h]
    gate_up = target_weight(target_dir, f"{p}.mlp.gate_up_proj")  # [2 I, h]
    down = target_weight(target_dir, f"{p}.mlp.down_proj")  # [h, I]
    inter = gate_up.shape[0] // 2
    n = m.gate_proj.weight.shape[0]
    keep = np.sort(np.argsort(-np.linalg.norm(down, axis=0) * np.linalg.norm(gate_up[inter:], axis=1))[:n])

    def t(x):
        return torch.from_numpy(np.array(x, np.float32))  # a copy: memory maps are read-only

    with torch.no_grad():
        for lin, rows in ((a.q_proj, qkv[:nq]), (a.k_proj, qkv[nq:nq + nk]), (a.v_proj, qkv[nq + nk:])):
            lin.weight[:, :h] = 0.0  # the embedding half: learned
            lin.weight[:, h:] = t(rows)
        a.o_proj.weight[:] = t(target_weight(target_dir, f"{p}.self_attn.o_proj"))
        m.gate_proj.weight[: keep.size] = t(gate_up[:inter][keep])
        m.up_proj.weight[: keep.size] = t(gate_up[inter:][keep])
        m.down_proj.weight[:, : keep.size] = t(down[:, keep])
        m.down_proj.weight[:, keep.size:] = 0.0  # a head wider than the target layer: the rest starts silent
        mid.hidden_norm.weight[:] = t(target_weight(target_dir, f"{p}.input_layernorm"))
        mid.post_attention_layernorm.weight[:] = t(target_weight(target_dir, f"{p}.post_attention_layernorm"))
        model.fc.weight.zero_()
        model.fc.weight[:, high * h:(high + 1) * h] = torch.eye(h)


def export_eagle3(model, layer_cfg, out_dir: Path, torch, vocab: np.ndarray, feature_layers: list[int],
                  ship_lm_head: bool = False) -> None:
    """config.json + model.safetensors in the published EAGLE-3 layout (fp16).

    ``vocab``: the draft vocabulary's target ids, sorted; written as ``d2t`` (target id minus
    draft id) and ``t2d`` (the mask of those ids over the target's vocabulary).
    ``feature_layers``: the target layers whose outputs fc was trained on, written where
    SpecForge writes them (``eagle_config.eagle_aux_hidden_state_layer_ids``). Without
    ``ship_lm_head`` the projection -- the target's own rows, frozen in training -- is left
    out and ``convert_weight --target`` reads it from the target, as for our EAGLE-1 heads."""
    from safetensors.numpy import save_file

    vocab = np.asarray(vocab, np.int64)
    c = layer_cfg
    if vocab.ndim != 1 or np.any(np.diff(vocab) <= 0) or vocab[0] < 0 or vocab[-1] >= c.vocab_size:
        raise ValueError(f"the draft vocabulary must be sorted distinct ids of the target's {c.vocab_size} tokens")
    if model.lm_head.weight.shape[0] != vocab.size:
        raise ValueError(f"the head's lm_head has {model.lm_head.weight.shape[0]} rows for {vocab.size} draft tokens")
    tensors = {k: v.detach().to(torch.float16).numpy() for k, v in model.state_dict().items()
               if ship_lm_head or k != "lm_head.weight"}
    tensors["d2t"] = vocab - np.arange(vocab.size)
    tensors["t2d"] = np.isin(np.arange(c.vocab_size), vocab)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out_dir / "model.safetensors"))
    cfg = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": c.hidden_size,
           "intermediate_size": c.intermediate_size, "num_attention_heads": c.num_attention_heads,
           "num_key_value_heads": c.num_key_value_heads, "num_hidden_layers": 1, "head_dim": c.head_dim,
           "rms_norm_eps": c.rms_norm_eps, "rope_theta": c.rope_theta, "vocab_size": c.vocab_size,
           "max_position_embeddings": c.context_window_size, "hidden_act": "silu", "tie_word_embeddings": False,
           "torch_dtype": "float16", "draft_vocab_size": int(vocab.size),
           "eagle_config": {"eagle_aux_hidden_state_layer_ids": [int(i) for i in feature_layers]}}
    (out_dir / "config.json").write_text(json.dumps(cfg, indent=1))


def load_exported_head(model, head_dir: Path, torch) -> np.ndarray:
    """Load a head written by ``export_eagle3`` into ``model`` (its layers; the projection, the
    target's frozen rows, is not the head's to load); returns its draft vocabulary (target ids,
    sorted). For fine-tuning a shipped head on new answers (``--init <folder>``). A head of
    another shape or target is refused by name."""
    from safetensors.numpy import load_file

    tensors = load_file(str(Path(head_dir) / "model.safetensors"))
    if "d2t" not in tensors:
        raise ValueError(f"{head_dir} has no d2t: not a head train-draft exported")
    vocab = (tensors["d2t"] + np.arange(tensors["d2t"].size)).astype(np.int64)
    state = {k: torch.from_numpy(v.astype(np.float32)) for k, v in tensors.items()
             if k not in ("d2t", "t2d", "lm_head.weight")}
    own = model.state_dict()
    missing = sorted(set(own) - {"lm_head.weight"} - set(state))
    wrong = sorted(k for k in state if k not in own or tuple(own[k].shape) != tuple(state[k].shape))
    if missing or wrong:
        raise ValueError(f"the head in {head_dir} does not fit this target's head layer: missing {missing[:3]}, "
                         f"other shape or unknown {wrong[:3]}")
    model.load_state_dict(state, strict=False)
    return vocab

