"""Llama / Qwen2 decoder written with ``relax.frontend.nn`` and the paged KV cache.

One definition drives everything: its parameters name the converted tensors, its
``get_spec`` lists every entry point compiled into the library, and the runtime
calls exactly those. Qwen2 is Llama with a bias on the fused QKV projection.
"""
from __future__ import annotations

from typing import Any

from tvm import relax as rx
from tvm import tirx
from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import Tensor, op
from tvm.relax.frontend.nn.llm.kv_cache import PagedKVCache, RopeMode, TIRPagedKVCache
from tvm.target import Target

from .config import LlamaConfig
from .quantization import QEmbedding, QLinear, Quantization


class Attention(nn.Module):
    def __init__(self, cfg: LlamaConfig, quant: Quantization):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        qkv_out = (self.num_heads + 2 * self.num_kv_heads) * self.head_dim
        self.qkv_proj = QLinear(cfg.hidden_size, qkv_out, quant, bias=cfg.attention_bias)
        self.o_proj = QLinear(self.num_heads * self.head_dim, cfg.hidden_size, quant)

    def forward(self, x: Tensor, kv: PagedKVCache, layer_id: int) -> Tensor:
        b, s, _ = x.shape
        qkv = op.reshape(self.qkv_proj(x), (b, s, self.num_heads + 2 * self.num_kv_heads, self.head_dim))
        out = kv.attention_with_fused_qkv(layer_id, qkv, self.num_heads, sm_scale=self.head_dim**-0.5)
        return self.o_proj(op.reshape(out, (b, s, self.num_heads * self.head_dim)))


class MLP(nn.Module):
    def __init__(self, cfg: LlamaConfig, quant: Quantization):
        super().__init__()
        self.inter = cfg.intermediate_size
        self.gate_up_proj = QLinear(cfg.hidden_size, 2 * cfg.intermediate_size, quant)
        self.down_proj = QLinear(cfg.intermediate_size, cfg.hidden_size, quant)

    def forward(self, x: Tensor) -> Tensor:
        gate, up = op.split(self.gate_up_proj(x), 2, axis=-1)
        return self.down_proj(op.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: LlamaConfig, quant: Quantization):
        super().__init__()
        dtype = quant.model_dtype
        self.self_attn = Attention(cfg, quant)
        self.mlp = MLP(cfg, quant)
        self.input_layernorm = nn.RMSNorm(cfg.hidden_size, -1, cfg.rms_norm_eps, bias=False, dtype=dtype)
        self.post_attention_layernorm = nn.RMSNorm(cfg.hidden_size, -1, cfg.rms_norm_eps, bias=False, dtype=dtype)

    def forward(self, x: Tensor, kv: PagedKVCache, layer_id: int) -> Tensor:
        x = x + self.self_attn(self.input_layernorm(x), kv, layer_id)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaForCausalLM(nn.Module):
    """The target (or small draft) model. Entry points are listed in :meth:`get_spec`."""

    def __init__(self, cfg: LlamaConfig, quant: Quantization, target: Target | None = None):
        super().__init__()
        self.cfg, self.quant = cfg, quant
        self.dtype = quant.model_dtype
        self.target = target
        self.embed_tokens = QEmbedding(cfg.vocab_size, cfg.hidden_size, quant)
        self.layers = nn.ModuleList([DecoderLayer(cfg, quant) for _ in range(cfg.num_hidden_layers)])
        self.norm = nn.RMSNorm(cfg.hidden_size, -1, cfg.rms_norm_eps, bias=False, dtype=self.dtype)
        self.lm_head = None if cfg.tie_word_embeddings else QLinear(cfg.hidden_size, cfg.vocab_size, quant)

    # ----------------------------------------------------------- building blocks
    def _body(self, x: Tensor, kv: PagedKVCache) -> Tensor:
        for i, layer in enumerate(self.layers):
            x = layer(x, kv, i)
        return self.norm(x)

    def _logits(self, h: Tensor) -> Tensor:
        logits = self.embed_tokens.lm_head_forward(h) if self.lm_head is None else self.lm_head(h)
        return logits if logits.dtype == "float32" else logits.astype("float32")

    # -------------------------------------------------------------- entry points
    def embed(self, input_ids: Tensor) -> Tensor:
        # input_ids: [n] int32 -> [n, h]
        return self.embed_tokens(input_ids)

    def prefill_to_last_hidden_states(self, input_embeds: Tensor, kv: PagedKVCache) -> Tensor:
        # input_embeds: [1, n, h] (sequences packed back to back) -> [1, n, h]
        return self._body(input_embeds, kv)

    def prefill(self, input_embeds: Tensor, logit_positions: Tensor, kv: PagedKVCache) -> Tensor:
        # input_embeds: [1, n, h]; logit_positions: [b] int32 -> logits [1, b, vocab]
        h = self._body(input_embeds, kv)
        h = op.take(op.reshape(h, [-1, self.cfg.hidden_size]), logit_positions, axis=0)
        return op.reshape(self._logits(h), [1, -1, self.cfg.vocab_size])

    def decode_to_last_hidden_states(self, input_embeds: Tensor, kv: PagedKVCache) -> Tensor:
        # input_embeds: [b, 1, h] -> [b, 1, h]
        return self._body(input_embeds, kv)

    def decode(self, input_embeds: Tensor, kv: PagedKVCache) -> Tensor:
        # input_embeds: [b, 1, h] -> logits [b, 1, vocab]
        return self._logits(self._body(input_embeds, kv))

    def verify_to_last_hidden_states(self, input_embeds: Tensor, kv: PagedKVCache) -> Tensor:
        # input_embeds: [1, n, h], n = sum of per-sequence draft sizes -> [1, n, h]
        return self._body(input_embeds, kv)

    def verify(self, input_embeds: Tensor, kv: PagedKVCache) -> Tensor:
        # Several tokens per sequence (chain or token tree; the tree's parent pointers
        # are given to the KV cache's begin_forward). input_embeds: [1, n, h] -> [1, n, vocab]
        return self._logits(self._body(input_embeds, kv))

    def get_logits(self, hidden_states: Tensor) -> Tensor:
        # hidden_states: [n, h] (after the final norm) -> [n, vocab]
        return self._logits(hidden_states)

    def create_paged_kv_cache(
        self, max_batch_size: tirx.Var, max_total_seq_len: tirx.Var, prefill_chunk_size: tirx.Var,
        page_size: tirx.Var, support_sliding_window: tirx.Var,
    ) -> PagedKVCache:
        cfg = self.cfg
        cache = TIRPagedKVCache(
            attn_kind="mha", max_batch_size=max_batch_size, max_total_seq_len=max_total_seq_len,
            prefill_chunk_size=prefill_chunk_size, page_size=page_size,
            support_sliding_window=support_sliding_window,
            layer_partition=rx.ShapeExpr([0, cfg.num_hidden_layers]),
            num_hidden_layers=cfg.num_hidden_layers, num_attention_heads=cfg.num_attention_heads,
            num_key_value_heads=cfg.num_key_value_heads, qk_head_dim=cfg.head_dim, v_head_dim=cfg.head_dim,
            mla_original_qk_head_dim=0, mla_original_v_head_dim=0,
            rope_mode=RopeMode.NORMAL, rope_scale=1, rope_theta=cfg.rope_theta, rope_scaling={},
            rope_ext_factors=rx.prim_value(0), rotary_dim=cfg.head_dim, enable_disaggregation=False,
            dtype=self.dtype, target=self.target,
        )
        return cache

    def get_spec(self) -> dict[str, Any]:
        h, dt = self.cfg.hidden_size, self.dtype
        kv = nn.spec.Object(object_type=PagedKVCache)
        packed = {"param_mode": "packed", "effect_mode": "none"}
        return {
            "embed": {"input_ids": nn.spec.Tensor(["n"], "int32"), "$": packed},
            "prefill_to_last_hidden_states": {"input_embeds": nn.spec.Tensor([1, "n", h], dt), "kv": kv, "$": packed},
            "prefill": {"input_embeds": nn.spec.Tensor([1, "n", h], dt),
                        "logit_positions": nn.spec.Tensor(["b"], "int32"), "kv": kv, "$": packed},
            "decode_to_last_hidden_states": {"input_embeds": nn.spec.Tensor(["b", 1, h], dt), "kv": kv, "$": packed},
            "decode": {"input_embeds": nn.spec.Tensor(["b", 1, h], dt), "kv": kv, "$": packed},
            "verify_to_last_hidden_states": {"input_embeds": nn.spec.Tensor([1, "n", h], dt), "kv": kv, "$": packed},
            "verify": {"input_embeds": nn.spec.Tensor([1, "n", h], dt), "kv": kv, "$": packed},
            "get_logits": {"hidden_states": nn.spec.Tensor(["n", h], dt), "$": packed},
            "create_paged_kv_cache": {
                "max_batch_size": int, "max_total_seq_len": int, "prefill_chunk_size": int,
                "page_size": int, "support_sliding_window": int,
                "$": {"param_mode": "none", "effect_mode": "none"},
            },
        }


def hf_source_map(cfg: LlamaConfig) -> dict[str, list[str]]:
    """Our logical weight name -> the HF tensors concatenated (axis 0) to form it.

    A logical name is a parameter name without its storage suffix: ``X.weight`` of a
    plain layer, or the ``X.q_weight``/``X.q_scale`` pair of a quantized one, both come
    from the float tensor listed for ``X.weight``.
    """
    m: dict[str, list[str]] = {"embed_tokens.weight": ["model.embed_tokens.weight"], "norm.weight": ["model.norm.weight"]}
    if not cfg.tie_word_embeddings:
        m["lm_head.weight"] = ["lm_head.weight"]
    for i in range(cfg.num_hidden_layers):
        hf, ours = f"model.layers.{i}", f"layers.{i}"
        m[f"{ours}.self_attn.qkv_proj.weight"] = [f"{hf}.self_attn.{p}_proj.weight" for p in "qkv"]
        if cfg.attention_bias:
            m[f"{ours}.self_attn.qkv_proj.bias"] = [f"{hf}.self_attn.{p}_proj.bias" for p in "qkv"]
        m[f"{ours}.self_attn.o_proj.weight"] = [f"{hf}.self_attn.o_proj.weight"]
        m[f"{ours}.mlp.gate_up_proj.weight"] = [f"{hf}.mlp.gate_proj.weight", f"{hf}.mlp.up_proj.weight"]
        m[f"{ours}.mlp.down_proj.weight"] = [f"{hf}.mlp.down_proj.weight"]
        m[f"{ours}.input_layernorm.weight"] = [f"{hf}.input_layernorm.weight"]
        m[f"{ours}.post_attention_layernorm.weight"] = [f"{hf}.post_attention_layernorm.weight"]
    return m
