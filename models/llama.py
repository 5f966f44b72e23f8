"""Llama / Qwen2 decoder written with ``relax.frontend.nn`` and the paged KV cache.

One definition drives everything: its parameters name the converted tensors, its
``get_spec`` lists every entry point compiled into the library, and the runtime
calls exactly those. Qwen2 is Llama with a bias on the fused QKV projection.
"""
from __future__ import annotations

from typing import Any

from tvm import tirx
from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import Tensor, op

from . import attention as A
from .activation import swiglu
from .sampling_kernels import sampling_probs, verify_sampling
from .verification import greedy_verify
from .config import LlamaConfig
from .quantization import QEmbedding, QLinear, Quantization

# Per-forward token metadata built by the runtime (runtime/kv_cache.py), in this order.
META_SPEC = {
    "positions": (["n"], "int32"),  # RoPE position of each token
    "write_slots": (["n"], "int32"),  # KV slot each token's k/v is written to
    "page_table": (["b", "pages"], "int32"),  # page ids of each sequence in the batch
    "token_seq": (["n"], "int32"),  # page-table row of each token
    "token_prefix": (["n"], "int32"),  # rows 0..prefix-1 of its sequence each token attends
    "extra_slots": (["n", "e"], "int32"),  # further slots it attends (tree ancestors, itself)
    "extra_len": (["n"], "int32"),
}


class Attention(nn.Module):
    def __init__(self, cfg: LlamaConfig, quant: Quantization):
        super().__init__()
        self.cfg = cfg
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        qkv_out = (self.num_heads + 2 * self.num_kv_heads) * self.head_dim
        self.qkv_proj = QLinear(cfg.hidden_size, qkv_out, quant, bias=cfg.attention_bias)
        self.o_proj = QLinear(self.num_heads * self.head_dim, cfg.hidden_size, quant)

    def forward(self, x: Tensor, kv: Tensor, meta: dict[str, Tensor], layer_id: int) -> tuple[Tensor, Tensor]:
        # x: [n, hidden]; kv: [layers, 2, slots, kv_heads, head_dim]
        cfg, dtype = self.cfg, x.dtype
        n = x.shape[0]
        h, hkv, d = self.num_heads, self.num_kv_heads, self.head_dim
        qkv = op.reshape(self.qkv_proj(x), (n, h + 2 * hkv, d))
        q = op.tensor_ir_op(A.rope_q(h, hkv, d, cfg.rope_theta, dtype), "rope_q", [qkv, meta["positions"]],
                            Tensor.placeholder((n, h, d), dtype))
        kv = op.tensor_ir_inplace_op(
            A.append_kv(cfg.num_hidden_layers, h, hkv, d, cfg.rope_theta, dtype), "append_kv",
            [kv, qkv, meta["positions"], meta["write_slots"], tirx.IntImm("int64", layer_id)], inplace_indices=[0],
            out=Tensor.placeholder(kv.shape, dtype))
        out = op.tensor_ir_op(
            A.attention(cfg.num_hidden_layers, h, hkv, d, dtype), "attention",
            [q, kv, meta["page_table"], meta["token_seq"], meta["token_prefix"], meta["extra_slots"],
             meta["extra_len"], tirx.IntImm("int64", layer_id)],
            Tensor.placeholder((n, h, d), dtype))
        return self.o_proj(op.reshape(out, (n, h * d))), kv


class MLP(nn.Module):
    def __init__(self, cfg: LlamaConfig, quant: Quantization):
        super().__init__()
        self.inter = cfg.intermediate_size
        self.gate_up_proj = QLinear(cfg.hidden_size, 2 * cfg.intermediate_size, quant)
        self.down_proj = QLinear(cfg.intermediate_size, cfg.hidden_size, quant)

    def forward(self, x: Tensor) -> Tensor:
        # x: [n, hidden] -> [n, hidden]; gate_up: [n, 2 * inter]
        gu = self.gate_up_proj(x)
        act = op.tensor_ir_op(swiglu(self.inter, gu.dtype), "swiglu", [gu, gu],
                              Tensor.placeholder((gu.shape[0], self.inter), gu.dtype))
        return self.down_proj(act)


class DecoderLayer(nn.Module):
    """One Llama block. ``input_norm=False`` drops the input RMSNorm: an EAGLE head's first
    layer reads the ``fc`` projection directly (models/eagle.py), as SafeAILab trained it."""

    def __init__(self, cfg: LlamaConfig, quant: Quantization, input_norm: bool = True):
        super().__init__()
        dtype = quant.model_dtype
        self.self_attn = Attention(cfg, quant)
        self.mlp = MLP(cfg, quant)
        self.input_layernorm = (nn.RMSNorm(cfg.hidden_size, -1, cfg.rms_norm_eps, bias=False, dtype=dtype)
                                if input_norm else None)
        self.post_attention_layernorm = nn.RMSNorm(cfg.hidden_size, -1, cfg.rms_norm_eps, bias=False, dtype=dtype)

    def forward(self, x: Tensor, kv: Tensor, meta: dict[str, Tensor], layer_id: int) -> tuple[Tensor, Tensor]:
        a, kv = self.self_attn(x if self.input_layernorm is None else self.input_layernorm(x), kv, meta, layer_id)
        x = x + a
        return x + self.mlp(self.post_attention_layernorm(x)), kv


class LlamaForCausalLM(nn.Module):
    """The target (or small draft) model. Entry points are listed in :meth:`get_spec`."""

    def __init__(self, cfg: LlamaConfig, quant: Quantization, target=None):
        super().__init__()
        self.cfg, self.quant = cfg, quant
        self.dtype = quant.model_dtype
        self.embed_tokens = QEmbedding(cfg.vocab_size, cfg.hidden_size, quant)
        self.layers = nn.ModuleList([DecoderLayer(cfg, quant) for _ in range(cfg.num_hidden_layers)])
        self.norm = nn.RMSNorm(cfg.hidden_size, -1, cfg.rms_norm_eps, bias=False, dtype=self.dtype)
        self.lm_head = None if cfg.tie_word_embeddings else QLinear(cfg.hidden_size, cfg.vocab_size, quant)

    def kv_cache_shape(self, num_slots) -> list:
        """[layers, 2 (k/v), slots, kv_heads, head_dim]; slots = pages * 16."""
        c = self.cfg
        return [c.num_hidden_layers, 2, num_slots, c.num_key_value_heads, c.head_dim]

    # ----------------------------------------------------------- building blocks
    def _body(self, x: Tensor, kv: Tensor, meta: dict[str, Tensor]) -> Tensor:
        # x: [n, hidden] -> final-normed hidden states [n, hidden]
        for i, layer in enumerate(self.layers):
            x, kv = layer(x, kv, meta, i)
        return self.norm(x)

    def _logits(self, h: Tensor) -> Tensor:
        logits = self.embed_tokens.lm_head_forward(h) if self.lm_head is None else self.lm_head(h)
        return logits if logits.dtype == "float32" else logits.astype("float32")

    # -------------------------------------------------------------- entry points
    # Every forward takes the token metadata of META_SPEC: the same kernels serve prefill,
    # decode and (tree) verify, which is what keeps them bit-identical per token.
    def embed(self, input_ids: Tensor) -> Tensor:
        # input_ids: [n] int32 -> [n, hidden]
        return self.embed_tokens(input_ids)

    def prefill_to_last_hidden_states(self, input_embeds: Tensor, kv: Tensor, positions, write_slots, page_table, token_seq, token_prefix, extra_slots, extra_len) -> Tensor:
        # input_embeds: [n, hidden] (sequences back to back) -> [n, hidden]
        return self._body(input_embeds, kv, self._meta(positions, write_slots, page_table, token_seq, token_prefix, extra_slots, extra_len))

    def prefill(self, input_embeds: Tensor, logit_positions: Tensor, kv: Tensor, positions, write_slots, page_table, token_seq, token_prefix, extra_slots, extra_len) -> Tensor:
        # input_embeds: [n, hidden]; logit_positions: [nl] int32 -> logits [nl, vocab]
        h = self._body(input_embeds, kv, self._meta(positions, write_slots, page_table, token_seq, token_prefix, extra_slots, extra_len))
        return self._logits(op.take(h, logit_positions, axis=0))

    def decode_to_last_hidden_states(self, input_embeds: Tensor, kv: Tensor, positions, write_slots, page_table, token_seq, token_prefix, extra_slots, extra_len) -> Tensor:
        # input_embeds: [b, hidden], one token per sequence -> [b, hidden]
        return self._body(input_embeds, kv, self._meta(positions, write_slots, page_table, token_seq, token_prefix, extra_slots, extra_len))

    def decode(self, input_embeds: Tensor, kv: Tensor, positions, write_slots, page_table, token_seq, token_prefix, extra_slots, extra_len) -> Tensor:
        # input_embeds: [b, hidden] -> logits [b, vocab]
        return self._logits(self._body(input_embeds, kv, self._meta(positions, write_slots, page_table, token_seq, token_prefix, extra_slots, extra_len)))

    def verify_to_last_hidden_states(self, input_embeds: Tensor, kv: Tensor, positions, write_slots, page_table, token_seq, token_prefix, extra_slots, extra_len) -> Tensor:
        # input_embeds: [n, hidden], several tokens per sequence (chain or token tree) -> [n, hidden]
        return self._body(input_embeds, kv, self._meta(positions, write_slots, page_table, token_seq, token_prefix, extra_slots, extra_len))

    def verify(self, input_embeds: Tensor, kv: Tensor, positions, write_slots, page_table, token_seq, token_prefix, extra_slots, extra_len) -> Tensor:
        # input_embeds: [n, hidden] -> logits at every position [n, vocab]
        return self._logits(self._body(input_embeds, kv, self._meta(positions, write_slots, page_table, token_seq, token_prefix, extra_slots, extra_len)))

    def get_logits(self, hidden_states: Tensor) -> Tensor:
        # hidden_states: [n, hidden] (after the final norm) -> [n, vocab]
        return self._logits(hidden_states)

    def copy_kv_slots(self, kv: Tensor, src: Tensor, dst: Tensor) -> Tensor:
        # kv[:, :, dst[i]] = kv[:, :, src[i]]; commits the accepted path of a token tree
        c = self.cfg
        return op.tensor_ir_inplace_op(A.copy_slots(c.num_hidden_layers, c.num_key_value_heads, c.head_dim, self.dtype),
                                       "copy_kv_slots", [kv, src, dst], inplace_indices=[0],
                                       out=Tensor.placeholder(kv.shape, self.dtype))

    def verify_greedy(self, logits: Tensor, tokens: Tensor, parents: Tensor, seq_indptr: Tensor) -> Tensor:
        # logits: [n, vocab]; tokens, parents: [n]; seq_indptr: [b + 1] -> [b + 1, n + 2]
        n, b1 = logits.shape[0], seq_indptr.shape[0]
        return op.tensor_ir_op(greedy_verify(self.cfg.vocab_size), "greedy_verify",
                               [logits, tokens, parents, seq_indptr], Tensor.placeholder((b1, n + 2), "int32"))

    def sampling_probs(self, logits: Tensor, temperature: Tensor, top_k: Tensor, top_p: Tensor) -> Tensor:
        # logits: [n, vocab]; temperature, top_p: [n] f32; top_k: [n] i32 -> probs [n, vocab]
        return op.tensor_ir_op(sampling_probs(self.cfg.vocab_size), "sampling_probs",
                               [logits, temperature, top_k, top_p], Tensor.placeholder(logits.shape, "float32"))

    def verify_sampling(self, p: Tensor, q: Tensor, one_hot: Tensor, tokens: Tensor, parents: Tensor,
                        seq_indptr: Tensor, uniforms: Tensor) -> Tensor:
        # p: [n, vocab]; q: [nq, vocab] (nq = n, or 1 if all one-hot); one_hot, tokens, parents: [n];
        # seq_indptr: [b + 1]; uniforms: [n + b] -> [b + 1, n + 2]
        n, b1 = p.shape[0], seq_indptr.shape[0]
        return op.tensor_ir_op(verify_sampling(self.cfg.vocab_size), "verify_sampling",
                               [p, q, one_hot, tokens, parents, seq_indptr, uniforms],
                               Tensor.placeholder((b1, n + 2), "int32"))

    @staticmethod
    def _meta(*values: Tensor) -> dict[str, Tensor]:
        return dict(zip(META_SPEC, values))

    def get_spec(self) -> dict[str, Any]:
        h, dt = self.cfg.hidden_size, self.dtype
        kv = nn.spec.Tensor(self.kv_cache_shape("slots"), dt)
        meta = {k: nn.spec.Tensor(shape, dtype) for k, (shape, dtype) in META_SPEC.items()}
        packed = {"param_mode": "packed", "effect_mode": "none"}
        fwd = lambda extra=None: {"input_embeds": nn.spec.Tensor(["n", h], dt), **(extra or {}), "kv": kv, **meta, "$": packed}
        return {
            "embed": {"input_ids": nn.spec.Tensor(["n"], "int32"), "$": packed},
            "prefill_to_last_hidden_states": fwd(),
            "prefill": fwd({"logit_positions": nn.spec.Tensor(["nl"], "int32")}),
            "decode_to_last_hidden_states": fwd(),
            "decode": fwd(),
            "verify_to_last_hidden_states": fwd(),
            "verify": fwd(),
            "get_logits": {"hidden_states": nn.spec.Tensor(["n", h], dt), "$": packed},
            "verify_greedy": {"logits": nn.spec.Tensor(["n", self.cfg.vocab_size], "float32"),
                              "tokens": nn.spec.Tensor(["n"], "int32"), "parents": nn.spec.Tensor(["n"], "int32"),
                              "seq_indptr": nn.spec.Tensor(["b1"], "int32"),
                              "$": {"param_mode": "none", "effect_mode": "none"}},
            "sampling_probs": {"logits": nn.spec.Tensor(["n", self.cfg.vocab_size], "float32"),
                               "temperature": nn.spec.Tensor(["n"], "float32"), "top_k": nn.spec.Tensor(["n"], "int32"),
                               "top_p": nn.spec.Tensor(["n"], "float32"),
                               "$": {"param_mode": "none", "effect_mode": "none"}},
            "verify_sampling": {"p": nn.spec.Tensor(["n", self.cfg.vocab_size], "float32"),
                                "q": nn.spec.Tensor(["nq", self.cfg.vocab_size], "float32"),
                                "one_hot": nn.spec.Tensor(["n"], "int32"), "tokens": nn.spec.Tensor(["n"], "int32"),
                                "parents": nn.spec.Tensor(["n"], "int32"), "seq_indptr": nn.spec.Tensor(["b1"], "int32"),
                                "uniforms": nn.spec.Tensor(["nu"], "float32"),
                                "$": {"param_mode": "none", "effect_mode": "none"}},
            "copy_kv_slots": {"kv": kv, "src": nn.spec.Tensor(["c"], "int32"), "dst": nn.spec.Tensor(["c"], "int32"),
                              "$": {"param_mode": "none", "effect_mode": "none"}},
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
