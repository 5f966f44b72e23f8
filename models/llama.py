"""The decoder of every supported family, written with ``relax.frontend.nn`` and the paged KV cache.

One definition drives everything: its parameters name the converted tensors, its
``get_spec`` exports the entry points runtime/contract.py lists (checking each method's
arguments against that table), and the runtime calls exactly those. The families differ by
the config's switches (models/config.py): Qwen2 adds a bias on the fused QKV projection,
Qwen3 and Gemma 3 normalise each head's q and k, Gemma 3 adds norms after attention and
the MLP, GeGLU, an embedding scale and sliding-window layers with their own RoPE, Phi
rotates part of each head, Llama 3 and Phi scale RoPE's frequencies (models/rope.py).
"""
from __future__ import annotations

from typing import Any

import numpy as np
from tvm import tirx
from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import Tensor, op

from speccompile.runtime.contract import FORWARD_META, TARGET

from speccompile.kernels import attention as A
from speccompile.kernels.activation import swiglu
from speccompile.kernels.attention import building_for_cpu
from speccompile.kernels.attention_gpu import SPLITS, attention_gpu, attention_merge_gpu, qkv_rope_append_gpu
from speccompile.kernels.norm_gpu import add_rms_norm_gpu
from speccompile.models.config import LlamaConfig, hf_source_map  # noqa: F401 - re-exported (lives with the config: no TVM)
from speccompile.models.exports import contract_spec, forward_meta_specs
from speccompile.models.quantization import QEmbedding, QLinear, Quantization
from speccompile.kernels.sampling import accept_sampled as accept_sampled_kernel, sampling_probs as sampling_probs_kernel
from speccompile.kernels.verification import accept_greedy as accept_greedy_kernel


class Attention(nn.Module):
    """``in_features``: the width the q/k/v projections read (an EAGLE-3 head's attention reads
    [embedding, feature], twice the hidden size: models/eagle3.py)."""

    def __init__(self, cfg: LlamaConfig, quant: Quantization, in_features: int | None = None):
        super().__init__()
        self.cfg = cfg
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        qkv_out = (self.num_heads + 2 * self.num_kv_heads) * self.head_dim
        self.qkv_proj = QLinear(in_features or cfg.hidden_size, qkv_out, quant, bias=cfg.attention_bias)
        self.o_proj = QLinear(self.num_heads * self.head_dim, cfg.hidden_size, quant)
        dtype = quant.model_dtype
        self.q_norm = nn.RMSNorm(cfg.head_dim, -1, cfg.rms_norm_eps, bias=False, dtype=dtype) if cfg.qk_norm else None
        self.k_norm = nn.RMSNorm(cfg.head_dim, -1, cfg.rms_norm_eps, bias=False, dtype=dtype) if cfg.qk_norm else None

    def _norm_qk(self, qkv: Tensor) -> Tensor:
        # qkv: [n, h + 2 hkv, d] -> the same with each q and k head RMS-normed (Qwen3, Gemma 3)
        h, hkv = self.num_heads, self.num_kv_heads
        q, k, v = op.split(qkv, [h, h + hkv], axis=1)
        return op.concat([self.q_norm(q), self.k_norm(k), v], dim=1)

    def forward(self, x: Tensor, kv: Tensor, meta: dict[str, Tensor], layer_id: int) -> tuple[Tensor, Tensor]:
        # x: [n, hidden]; kv: [layers, 2, slots, kv_heads, head_dim]
        cfg, dtype = self.cfg, x.dtype
        n = x.shape[0]
        h, hkv, d = self.num_heads, self.num_kv_heads, self.head_dim
        rope = cfg.rope(layer_id)
        if not building_for_cpu():  # one kernel for bias, RoPE and the KV append (launches bound GPU steps)
            if self.q_norm is None:
                qkv = op.reshape(self.qkv_proj.project(x), (n, h + 2 * hkv, d))
                bias = [] if self.qkv_proj.bias is None else [self.qkv_proj.bias]
            else:  # the norms read q and k after the bias
                qkv, bias = self._norm_qk(op.reshape(self.qkv_proj(x), (n, h + 2 * hkv, d))), []
            kv, q = op.tensor_ir_inplace_op(
                qkv_rope_append_gpu(cfg.num_hidden_layers, h, hkv, d, rope, dtype, bool(bias)),
                "qkv_rope_append", [kv, qkv, *bias, meta["positions"], meta["write_slots"],
                                    tirx.IntImm("int64", layer_id)], inplace_indices=[0, -1],
                out=[Tensor.placeholder(kv.shape, dtype), Tensor.placeholder((n, h, d), dtype)])
            return self._attend(q, kv, meta, layer_id)
        qkv = op.reshape(self.qkv_proj(x), (n, h + 2 * hkv, d))
        if self.q_norm is not None:
            qkv = self._norm_qk(qkv)
        q = op.tensor_ir_op(A.rope_q(h, hkv, d, rope, dtype), "rope_q", [qkv, meta["positions"]],
                            Tensor.placeholder((n, h, d), dtype))
        kv = op.tensor_ir_inplace_op(
            A.append_kv(cfg.num_hidden_layers, h, hkv, d, rope, dtype), "append_kv",
            [kv, qkv, meta["positions"], meta["write_slots"], tirx.IntImm("int64", layer_id)], inplace_indices=[0],
            out=Tensor.placeholder(kv.shape, dtype))
        return self._attend(q, kv, meta, layer_id)

    def _attend(self, q: Tensor, kv: Tensor, meta: dict[str, Tensor], layer_id: int) -> tuple[Tensor, Tensor]:
        # q: [n, heads, head_dim] (rotated; this token's K/V already in kv) -> (o_proj output [n, hidden], kv)
        cfg, dtype, n = self.cfg, q.dtype, q.shape[0]
        h, hkv, d = self.num_heads, self.num_kv_heads, self.head_dim
        args = [q, kv, meta["page_table"], meta["token_seq"], meta["token_prefix"], meta["extra_slots"],
                meta["extra_len"], tirx.IntImm("int64", layer_id)]
        scale, window = cfg.attention_scale, cfg.window(layer_id)
        if building_for_cpu():
            out = op.tensor_ir_op(A.attention(cfg.num_hidden_layers, h, hkv, d, dtype, scale, window), "attention",
                                  args, Tensor.placeholder((n, h, d), dtype))
        else:  # a long context's rows in chunks side by side, then their states merged (kernels/attention_gpu.py)
            out, part = op.tensor_ir_op(
                attention_gpu(cfg.num_hidden_layers, h, hkv, d, dtype, "tiled", scale, window), "attention", args,
                [Tensor.placeholder((n, h, d), dtype), Tensor.placeholder((n, h, SPLITS, d + 2), "float32")])
            out = op.tensor_ir_inplace_op(attention_merge_gpu(h, d, dtype, window), "attention_merge",
                                          [out, part, meta["token_prefix"], meta["extra_len"]], inplace_indices=[0],
                                          out=Tensor.placeholder((n, h, d), dtype))
        return self.o_proj(op.reshape(out, (n, h * d))), kv


class MLP(nn.Module):
    def __init__(self, cfg: LlamaConfig, quant: Quantization):
        super().__init__()
        self.inter, self.act = cfg.intermediate_size, cfg.hidden_act
        self.gate_up_proj = QLinear(cfg.hidden_size, 2 * cfg.intermediate_size, quant)
        self.down_proj = QLinear(cfg.intermediate_size, cfg.hidden_size, quant)

    def forward(self, x: Tensor) -> Tensor:
        # x: [n, hidden] -> [n, hidden]; gate_up: [n, 2 * inter]
        gu = self.gate_up_proj(x)
        act = op.tensor_ir_op(swiglu(self.inter, gu.dtype, self.act), "swiglu", [gu, gu],
                              Tensor.placeholder((gu.shape[0], self.inter), gu.dtype))
        return self.down_proj(act)


class DecoderLayer(nn.Module):
    """One pre-norm block. ``input_norm=False`` drops the input RMSNorm: an EAGLE head's first
    layer reads the ``fc`` projection directly (models/eagle.py), as SafeAILab trained it.
    With ``sandwich_norms`` (Gemma) the names are transformers': ``post_attention_layernorm``
    normalises the attention's output, ``pre_/post_feedforward_layernorm`` the MLP's input and
    output; otherwise ``post_attention_layernorm`` is the MLP's input norm, as in Llama."""

    def __init__(self, cfg: LlamaConfig, quant: Quantization, input_norm: bool = True):
        super().__init__()
        dtype = quant.model_dtype
        norm = lambda: nn.RMSNorm(cfg.hidden_size, -1, cfg.rms_norm_eps, bias=False, dtype=dtype)  # noqa: E731
        self.self_attn = Attention(cfg, quant)
        self.mlp = MLP(cfg, quant)
        self.input_layernorm = norm() if input_norm else None
        self.post_attention_layernorm = norm()
        self.sandwich = cfg.sandwich_norms
        if self.sandwich:
            self.pre_feedforward_layernorm, self.post_feedforward_layernorm = norm(), norm()

    def forward(self, x: Tensor, kv: Tensor, meta: dict[str, Tensor], layer_id: int) -> tuple[Tensor, Tensor]:
        a, kv = self.self_attn(x if self.input_layernorm is None else self.input_layernorm(x), kv, meta, layer_id)
        if self.sandwich:
            x = x + self.post_attention_layernorm(a)
            return x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x))), kv
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
        """[layers, 2 (k/v), slots, kv_heads, head_dim]; slots = pages * KV_PAGE_SIZE."""
        c = self.cfg
        return [c.num_hidden_layers, 2, num_slots, c.num_key_value_heads, c.head_dim]

    # ----------------------------------------------------------- building blocks
    def _body(self, x: Tensor, kv: Tensor, meta: dict[str, Tensor], capture: list[int] | None = None):
        # x: [n, hidden] -> final-normed hidden states [n, hidden]; with ``capture``, also the
        # outputs of those layers concatenated [n, len(capture) * hidden] (EAGLE-3 features)
        if not building_for_cpu() and not self.cfg.sandwich_norms:
            return self._body_gpu(x, kv, meta, capture)
        taken = {}
        for i, layer in enumerate(self.layers):
            x, kv = layer(x, kv, meta, i)
            if capture and i in capture:
                taken[i] = x
        if capture is None:
            return self.norm(x)
        return self.norm(x), op.concat([taken[i] for i in capture], dim=-1)

    def _body_gpu(self, x: Tensor, kv: Tensor, meta: dict[str, Tensor], capture: list[int] | None):
        """The same layers, each residual add fused with the RMSNorm that reads its sum
        (kernels/norm_gpu.py): on GPUs a step is bound by kernel launches."""
        taken = {}
        h = self.layers[0].input_layernorm(x)
        for i, layer in enumerate(self.layers):
            a, kv = layer.self_attn(h, kv, meta, i)
            x, h2 = self._add_norm(x, a, layer.post_attention_layernorm)
            following = self.layers[i + 1].input_layernorm if i + 1 < len(self.layers) else self.norm
            x, h = self._add_norm(x, layer.mlp(h2), following)
            if capture and i in capture:
                taken[i] = x
        return h if capture is None else (h, op.concat([taken[i] for i in capture], dim=-1))

    def _add_norm(self, x: Tensor, a: Tensor, norm: nn.RMSNorm) -> tuple[Tensor, Tensor]:
        # x, a: [n, hidden] -> (x + a, norm(x + a)), one kernel
        out = [Tensor.placeholder(x.shape, x.dtype), Tensor.placeholder(x.shape, x.dtype)]
        return op.tensor_ir_op(add_rms_norm_gpu(self.cfg.hidden_size, norm.epsilon, x.dtype), "add_rms_norm",
                               [x, a, norm.weight], out)

    def _logits(self, h: Tensor) -> Tensor:
        logits = self.embed_tokens.lm_head_forward(h) if self.lm_head is None else self.lm_head(h)
        logits = logits if logits.dtype == "float32" else logits.astype("float32")
        cap = self.cfg.final_logit_softcapping
        return logits if not cap else op.tanh(logits / cap) * cap

    # -------------------------------------------------------------- entry points
    # Their names and argument orders are runtime/contract.py's ENTRY_POINTS (get_spec
    # checks). Every forward takes the token metadata of FORWARD_META: the same kernels
    # serve prefill, decode and (tree) verify, which is what keeps them bit-identical per token.
    def embed(self, input_ids: Tensor) -> Tensor:
        # input_ids: [n] int32 -> [n, hidden]
        x = self.embed_tokens(input_ids)
        if self.cfg.embed_scale:  # Gemma: sqrt(hidden) rounded to the model's dtype, as transformers does
            x = x * float(np.asarray(self.cfg.hidden_size ** 0.5, self.dtype))
        return x

    def prefill(self, input_embeds: Tensor, logit_positions: Tensor, kv: Tensor, positions, write_slots, page_table, token_seq, token_prefix, extra_slots, extra_len) -> Tensor:
        # input_embeds: [n, hidden] (sequences back to back); logit_positions: [nl] int32 -> logits [nl, vocab]
        h = self._body(input_embeds, kv, self._meta(positions, write_slots, page_table, token_seq, token_prefix, extra_slots, extra_len))
        return self._logits(op.take(h, logit_positions, axis=0))

    def decode(self, input_embeds: Tensor, kv: Tensor, positions, write_slots, page_table, token_seq, token_prefix, extra_slots, extra_len) -> Tensor:
        # input_embeds: [b, hidden], one token per sequence -> logits [b, vocab]
        return self._logits(self._body(input_embeds, kv, self._meta(positions, write_slots, page_table, token_seq, token_prefix, extra_slots, extra_len)))

    def forward_tokens_hidden(self, input_embeds: Tensor, kv: Tensor, positions, write_slots, page_table, token_seq, token_prefix, extra_slots, extra_len) -> Tensor:
        # input_embeds: [n, hidden], several tokens per sequence (chain or token tree) -> [n, hidden]
        return self._body(input_embeds, kv, self._meta(positions, write_slots, page_table, token_seq, token_prefix, extra_slots, extra_len))

    def forward_tokens_features(self, input_embeds: Tensor, kv: Tensor, positions, write_slots, page_table, token_seq, token_prefix, extra_slots, extra_len) -> tuple[Tensor, Tensor]:
        # input_embeds: [n, hidden] -> (final-normed hidden states [n, hidden], the outputs of the
        # feature_layers concatenated low/mid/high [n, 3 * hidden]); the same layer and norm
        # kernels as forward_tokens_hidden, so get_logits of the first gives the same logits
        meta = self._meta(positions, write_slots, page_table, token_seq, token_prefix, extra_slots, extra_len)
        return self._body(input_embeds, kv, meta, capture=self.cfg.extra_metadata()["feature_layers"])

    def forward_tokens(self, input_embeds: Tensor, kv: Tensor, positions, write_slots, page_table, token_seq, token_prefix, extra_slots, extra_len) -> Tensor:
        # input_embeds: [n, hidden] -> logits at every position [n, vocab]
        return self._logits(self._body(input_embeds, kv, self._meta(positions, write_slots, page_table, token_seq, token_prefix, extra_slots, extra_len)))

    def feature_buffer(self, hidden_states: Tensor) -> Tensor:
        # hidden_states: [n, hidden] -> [n, 3 * hidden] (the rows repeated): nothing reads the
        # values; a CUDA graph of forward_tokens_features keeps its features' block through this
        # call's output, whose planned size is theirs (runtime/cuda_graph.py)
        return op.concat([hidden_states] * len(self.cfg.extra_metadata()["feature_layers"]), dim=-1)

    def get_logits(self, hidden_states: Tensor) -> Tensor:
        # hidden_states: [n, hidden] (after the final norm) -> [n, vocab]
        return self._logits(hidden_states)

    def copy_kv_slots(self, kv: Tensor, src: Tensor, dst: Tensor) -> Tensor:
        # kv[:, :, dst[i]] = kv[:, :, src[i]]; commits the accepted path of a token tree
        c = self.cfg
        return op.tensor_ir_inplace_op(A.copy_slots(c.num_hidden_layers, c.num_key_value_heads, c.head_dim, self.dtype),
                                       "copy_kv_slots", [kv, src, dst], inplace_indices=[0],
                                       out=Tensor.placeholder(kv.shape, self.dtype))

    def accept_greedy(self, logits: Tensor, tokens: Tensor, parents: Tensor, seq_indptr: Tensor) -> Tensor:
        # logits: [n, vocab]; tokens, parents: [n]; seq_indptr: [b + 1] -> [b + 1, n + 2]
        n, b1 = logits.shape[0], seq_indptr.shape[0]
        return op.tensor_ir_op(accept_greedy_kernel(self.cfg.vocab_size), "accept_greedy",
                               [logits, tokens, parents, seq_indptr], Tensor.placeholder((b1, n + 2), "int32"))

    def sampling_probs(self, logits: Tensor, temperature: Tensor, top_k: Tensor, top_p: Tensor) -> Tensor:
        # logits: [n, vocab]; temperature, top_p: [n] f32; top_k: [n] i32 -> probs [n, vocab]
        return op.tensor_ir_op(sampling_probs_kernel(self.cfg.vocab_size), "sampling_probs",
                               [logits, temperature, top_k, top_p], Tensor.placeholder(logits.shape, "float32"))

    def accept_sampled(self, p: Tensor, q: Tensor, one_hot: Tensor, tokens: Tensor, parents: Tensor,
                       seq_indptr: Tensor, uniforms: Tensor) -> Tensor:
        # p: [n, vocab]; q: [nq, vocab] (nq = n, or 1 if all one-hot); one_hot, tokens, parents: [n];
        # seq_indptr: [b + 1]; uniforms: [n + b] -> [b + 1, n + 2]
        n, b1 = p.shape[0], seq_indptr.shape[0]
        return op.tensor_ir_op(accept_sampled_kernel(self.cfg.vocab_size), "accept_sampled",
                               [p, q, one_hot, tokens, parents, seq_indptr, uniforms],
                               Tensor.placeholder((b1, n + 2), "int32"))

    @staticmethod
    def _meta(*values: Tensor) -> dict[str, Tensor]:
        # the forwards' metadata arguments, which get_spec checked are FORWARD_META's names in order
        return dict(zip(FORWARD_META, values))

    def get_spec(self) -> dict[str, Any]:
        h, dt, v = self.cfg.hidden_size, self.dtype, self.cfg.vocab_size
        i32 = lambda *shape: nn.spec.Tensor(list(shape), "int32")
        f32 = lambda *shape: nn.spec.Tensor(list(shape), "float32")
        tensors = {
            "input_ids": i32("n"), "input_embeds": nn.spec.Tensor(["n", h], dt), "logit_positions": i32("nl"),
            "kv": nn.spec.Tensor(self.kv_cache_shape("slots"), dt), **forward_meta_specs(),
            "hidden_states": nn.spec.Tensor(["n", h], dt), "src": i32("c"), "dst": i32("c"),
            "logits": f32("n", v), "tokens": i32("n"), "parents": i32("n"), "seq_indptr": i32("b1"),
            "temperature": f32("n"), "top_k": i32("n"), "top_p": f32("n"),
            "p": f32("n", v), "q": f32("nq", v), "one_hot": i32("n"), "uniforms": f32("nu"),
        }
        return contract_spec(self, TARGET, tensors, self.cfg.extra_metadata())  # with forward_tokens_features
