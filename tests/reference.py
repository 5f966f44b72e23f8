"""A plain numpy Llama/Qwen2 forward over HF-named float32 weights: the test oracle."""
from __future__ import annotations

import numpy as np

# prompts the head tests decode (EAGLE-1, EAGLE-3, Medusa): short, varied, one repetitive
PROMPTS = [
    "What is the capital of France?",
    "Write a Python function that returns the n-th Fibonacci number.",
    "Repeat after me: the quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy dog.",
    "List the days of the week.",
    "Summarize: The cat sat on the mat. The mat was red.",
    "Translate 'good morning' into French and Spanish.",
    "Explain what a hash table is in one paragraph.",
    "Count from one to twenty in words.",
]


def rms_norm(x, w, eps):
    return x / np.sqrt((x.astype(np.float64) ** 2).mean(-1, keepdims=True) + eps).astype(np.float32) * w


def rope(x, pos, theta):
    # x: [n, heads, d]; rotate-half convention (HF Llama)
    d = x.shape[-1]
    inv = 1.0 / theta ** (np.arange(0, d, 2, dtype=np.float64) / d)
    ang = pos[:, None].astype(np.float64) * inv[None]
    cos = np.concatenate([np.cos(ang)] * 2, -1)[:, None].astype(np.float32)
    sin = np.concatenate([np.sin(ang)] * 2, -1)[:, None].astype(np.float32)
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * cos + np.concatenate([-x2, x1], -1) * sin


def int8_groups(x: np.ndarray) -> np.ndarray:
    """x rounded to int8 per 32-wide group and back, as the VNNI q4 kernel sees it."""
    g = x.reshape(x.shape[0], -1, 32).astype(np.float32)
    amax = np.abs(g).max(-1, keepdims=True)
    inv = np.where(amax > 0, np.float32(127) / np.where(amax > 0, amax, 1), 0).astype(np.float32)
    t = g * inv
    q = np.sign(t) * np.floor(np.abs(t) + np.float32(0.5))  # llvm.round: half away from zero
    return (q * (amax / np.float32(127))).reshape(x.shape).astype(np.float32)


def attention_mlp(w: dict, p: str, cfg, a: np.ndarray, x: np.ndarray, pos: np.ndarray, act=lambda t: t) -> np.ndarray:
    """The rest of a decoder block after its input norm: causal attention of the normed input
    ``a`` [n, in] (prefix ``p``'s weights, positions ``pos``) added to the residual ``x`` [n, h],
    then the MLP; returns the block's output [n, h]."""
    nh, nkv, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    n = x.shape[0]
    mask = np.triu(np.full((n, n), -np.inf, np.float32), 1)
    q = act(a) @ w[p + "self_attn.q_proj.weight"].T
    k = act(a) @ w[p + "self_attn.k_proj.weight"].T
    v = act(a) @ w[p + "self_attn.v_proj.weight"].T
    if cfg.attention_bias:
        q, k, v = q + w[p + "self_attn.q_proj.bias"], k + w[p + "self_attn.k_proj.bias"], v + w[p + "self_attn.v_proj.bias"]
    q = rope(q.reshape(n, nh, hd), pos, cfg.rope_theta)
    k = rope(k.reshape(n, nkv, hd), pos, cfg.rope_theta)
    v = v.reshape(n, nkv, hd)
    rep = nh // nkv
    k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
    s = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(hd) + mask
    s = np.exp(s - s.max(-1, keepdims=True))
    s /= s.sum(-1, keepdims=True)
    o = np.einsum("hqk,khd->qhd", s, v).reshape(n, nh * hd)
    x = x + act(o) @ w[p + "self_attn.o_proj.weight"].T
    a = rms_norm(x, w[p + "post_attention_layernorm.weight"], cfg.rms_norm_eps)
    g = act(a) @ w[p + "mlp.gate_proj.weight"].T
    u = act(a) @ w[p + "mlp.up_proj.weight"].T
    return x + act((g / (1 + np.exp(-g))) * u) @ w[p + "mlp.down_proj.weight"].T


def forward(w: dict, cfg, ids: list[int], int8_activations: bool = False,
            layer_outputs: list | None = None) -> np.ndarray:
    """Causal forward of one sequence; logits [n, vocab]. ``int8_activations``: the inputs
    of the weight matmuls are int8-rounded per group (the library's q4_activations).
    ``layer_outputs``: a list that receives every decoder layer's output [n, h]."""
    act = int8_groups if int8_activations else (lambda a: a)
    x = w["model.embed_tokens.weight"][ids].astype(np.float32)
    pos = np.arange(len(ids))
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        x = attention_mlp(w, p, cfg, rms_norm(x, w[p + "input_layernorm.weight"], cfg.rms_norm_eps), x, pos, act)
        if layer_outputs is not None:
            layer_outputs.append(x)
    x = rms_norm(x, w["model.norm.weight"], cfg.rms_norm_eps)
    head = w.get("lm_head.weight", w["model.embed_tokens.weight"])
    return act(x) @ head.T
