"""EAGLE-1 draft head (SafeAILab layout) written with the same blocks as the target.

Why it looks like this: EAGLE drafts at the *feature* level. Its input at position i is
``fc(concat(embed(token[i+1]), f[i]))`` where ``f[i]`` is the target's final-normed last
hidden state at position i (the input is shifted one token left compared with the
target's); then N Llama decoder layers (layer 0 without its input RMSNorm, no final norm)
predict ``f[i+1]``, and the *target's* lm_head turns that into next-token logits. The head
therefore owns no embedding: the runtime calls the target library's ``embed``.

On a CPU the target's lm_head would dominate a draft step (21% of SmolLM2's weights
against 3% for the decoder layer), so a head may instead carry an EAGLE-3 style *reduced
draft vocabulary*: its own ``lm_head.weight`` [draft_vocab, h] and ``d2t`` [draft_vocab]
(draft id j is target token ``j + d2t[j]``, the published layout). Its ``draft_logits``
then scores only those tokens; without them the runtime uses the target's ``get_logits``
(runtime/drafters/eagle.py). Drafts are still verified by the target, so this changes speed, never
the output.

Draft steps on device. A head with a draft vocabulary also exports ``draft_step`` and
``draft_catch_up``: embedding, fc, layers, lm_head and the top-k (kernels/draft_topk.py)
of a whole draft depth in one call, so only the small [n, k] arrays of token ids and
log-probabilities leave the device, and the features stay there for the next depth.

Where the embedding comes from. The head owns none, and copying the target's table into
every head would make a Qwen head 117 MB (q4) or 933 MB (fp32) heavier, for rows the
target already holds in memory. So those entry points take the target's own embedding
tensors as an argument (``target_embed``: its ``embed_tokens`` storage, e.g. the packed
q4 words and scales) and gather with the same tagged kernel the target uses
(``embedding_rows``): no copy, no extra call, and embeddings bit-identical to the
target's. The head is compiled with its target's quantization, which is what fixes the
storage; ``_metadata["target_embed"]`` records the names, shapes and dtypes it expects,
and the runtime hands the target's tensors over only when they match (else it drafts
through the separate calls: ``target.embed``, ``eagle_forward``, ``draft_logits``).

The decoder layers are models/llama.py's own ``DecoderLayer`` with the same paged KV cache,
attention kernels and per-forward token metadata (``FORWARD_META``, runtime/contract.py)
as the target, so the head drafts chains and token trees with the planner the target uses
(runtime/kv_cache.py).

One definition drives conversion (``source_map``), compilation (``get_spec``) and the
library's metadata (``EagleConfig``), as ``hf_source_map`` does for Llama.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import Tensor, op

from speccompile.runtime.contract import EAGLE, FORWARD_META

from speccompile.models.config import ConfigError, LlamaConfig, reduced_vocabulary_size
from speccompile.kernels.draft_topk import draft_top
from speccompile.models.exports import contract_spec, forward_meta_specs
from speccompile.models.llama import DecoderLayer
from speccompile.models.quantization import QLinear, Quantization, embedding_rows, weight_storage

DRAFT_TOP_K = 8  # columns of draft_step's top-k: the widest tree (--spec-tree-width) it serves
TARGET_EMBED = "embed_tokens"  # the target's embedding module (models/llama.py): its tensors' prefix


class HeadLayerConfig:
    """What an EAGLE head's config (EAGLE-1 and EAGLE-3) shares: its decoder layer(s) as a
    Llama config ``layer``, and the names build_metadata and the runtime read, delegated to it;
    plus the check of an embedding a checkpoint may carry."""

    layer: LlamaConfig
    hidden_size = property(lambda self: self.layer.hidden_size)
    vocab_size = property(lambda self: self.layer.vocab_size)
    num_hidden_layers = property(lambda self: self.layer.num_hidden_layers)
    num_key_value_heads = property(lambda self: self.layer.num_key_value_heads)
    head_dim = property(lambda self: self.layer.head_dim)
    context_window_size = property(lambda self: self.layer.context_window_size)
    prefill_chunk_size = property(lambda self: self.layer.prefill_chunk_size)

    @staticmethod
    def check_embedding(who: str, target: LlamaConfig, names: list[str], shape: Callable[[str], tuple[int, ...]]):
        """A head carrying its own embed_tokens (ours use the target's) must match the target's."""
        h = target.hidden_size
        if "embed_tokens.weight" in names and tuple(shape("embed_tokens.weight")) != (target.vocab_size, h):
            raise ConfigError(f"the {who} head's embed_tokens.weight is {list(shape('embed_tokens.weight'))}, the "
                              f"target's vocabulary is [{target.vocab_size}, {h}]: this head belongs to another model")


@dataclass
class EagleConfig(HeadLayerConfig):
    """The head's decoder hyper-parameters (EAGLE's config.json is a Llama config)."""

    layer: LlamaConfig
    draft_vocab_size: int = 0  # 0: draft with the target's lm_head; else own lm_head + d2t
    model_type = "eagle"

    def to_dict(self) -> dict[str, Any]:
        return {"layer": self.layer.to_dict(), "draft_vocab_size": self.draft_vocab_size}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "EagleConfig":
        if "layer" not in data or not set(data) <= {"layer", "draft_vocab_size"}:
            raise ConfigError(f"an EAGLE model config holds 'layer' (and 'draft_vocab_size'), got {sorted(data)}")
        return cls(LlamaConfig.from_dict(data["layer"]), int(data.get("draft_vocab_size", 0)))

    def extra_metadata(self) -> dict[str, Any]:
        return {"head_kind": "eagle", "draft_vocab_size": self.draft_vocab_size}

    @classmethod
    def from_checkpoint(cls, raw: dict[str, Any], target: LlamaConfig, names: list[str],
                        shape: Callable[[str], tuple[int, ...]]) -> "EagleConfig":
        """Read an EAGLE config.json and check, before any long work, that the head was
        trained for this target: its hidden size and vocabulary must be the target's."""
        layer = head_decoder_config(raw, target, "EAGLE", "layers.0.self_attn.q_proj.bias" in names)
        h = target.hidden_size
        if "fc.weight" not in names:
            raise ConfigError("not an EAGLE checkpoint: it has no fc.weight")
        if tuple(shape("fc.weight")) != (h, 2 * h):
            raise ConfigError(f"the EAGLE head's fc.weight is {list(shape('fc.weight'))}, a target with hidden size "
                              f"{h} needs [{h}, {2 * h}]: this head was trained for another model")
        cls.check_embedding("EAGLE", target, names, shape)
        draft_vocab = _draft_vocabulary(raw, target, names, shape)
        layers = {int(n.split(".")[1]) for n in names if n.startswith("layers.") and n.split(".")[1].isdigit()}
        if layers and layers != set(range(layer.num_hidden_layers)):
            raise ConfigError(f"config.json says {layer.num_hidden_layers} layer(s) but the weights hold "
                              f"layers {sorted(layers)}")
        return cls(layer, draft_vocab)


def target_embed_storage(vocab: int, hidden: int, quant: Quantization) -> list[dict[str, Any]]:
    """The target's embedding tensors a head's draft entry points take, as
    ``_metadata["target_embed"]`` records them (a target of this quantization stores these)."""
    return [{"name": f"{TARGET_EMBED}.{name}", "shape": list(shape), "dtype": dtype}
            for name, shape, dtype in weight_storage(vocab, hidden, quant)]


def draft_step_metadata(vocab: int, hidden: int, draft_vocab: int, quant: Quantization) -> dict[str, Any]:
    """``draft_top_k`` (0: no draft entry points) and ``target_embed`` of a head."""
    return {"draft_top_k": min(DRAFT_TOP_K, draft_vocab),
            "target_embed": target_embed_storage(vocab, hidden, quant) if draft_vocab else []}


def target_embed_specs(meta: dict[str, Any]) -> list[nn.spec.Tensor]:
    return [nn.spec.Tensor(e["shape"], e["dtype"]) for e in meta["target_embed"]]


def head_decoder_config(raw: dict[str, Any], target: LlamaConfig, who: str, attention_bias: bool,
                        **fixed: Any) -> LlamaConfig:
    """The decoder hyper-parameters of an EAGLE head's config.json (a Llama config whatever
    it calls itself), checked against its target: hidden size and vocabulary must be the
    target's (else it was trained for another model); the context window is the target's.
    ``fixed``: config fields the head's layout decides whatever its file says."""
    raw = dict(raw)
    raw.setdefault("architectures", ["LlamaForCausalLM"])
    if raw.get("model_type") not in ("llama", "qwen2", "mistral"):
        raw["model_type"] = "llama"
    for key in ("hidden_size", "vocab_size"):
        if key in raw and raw[key] != getattr(target, key):
            raise ConfigError(f"the {who} head has {key} {raw[key]} but the target has {getattr(target, key)}: "
                              "this head was trained for another model")
    raw.setdefault("hidden_size", target.hidden_size)
    raw.setdefault("vocab_size", target.vocab_size)
    raw.update(fixed)
    layer = LlamaConfig.from_hf_dict(raw)
    layer.attention_bias = attention_bias
    layer.tie_word_embeddings = False
    layer.context_window_size = target.context_window_size
    layer.prefill_chunk_size = target.prefill_chunk_size
    return layer


def _draft_vocabulary(raw: dict[str, Any], target: LlamaConfig, names: list[str],
                      shape: Callable[[str], tuple[int, ...]]) -> int:
    """The size of an EAGLE-3 style reduced draft vocabulary (0 when the head has none)."""
    has = [n for n in ("lm_head.weight", "d2t") if n in names]
    if not has:
        return 0
    if len(has) == 1:
        raise ConfigError(f"the EAGLE head has {has[0]} without {({'lm_head.weight', 'd2t'} - set(has)).pop()}: a "
                          "reduced draft vocabulary needs both (lm_head.weight [draft_vocab, hidden], d2t [draft_vocab])")
    return reduced_vocabulary_size(raw, target, shape, "the EAGLE head's")


class DraftHead(nn.Module):
    """What every EAGLE head module shares: its KV cache's shape and the draft-step facts
    baked into ``_metadata`` (both read from ``self.cfg`` / ``self.quant``)."""

    def kv_cache_shape(self, num_slots) -> list:
        c = self.cfg
        return [c.num_hidden_layers, 2, num_slots, c.num_key_value_heads, c.head_dim]

    def extra_metadata(self) -> dict[str, Any]:
        c = self.cfg
        return {**c.extra_metadata(), **draft_step_metadata(c.vocab_size, c.hidden_size, c.draft_vocab_size, self.quant)}


class EagleHead(DraftHead):
    """fc over concat(token embedding, target feature) then N decoder layers."""

    def __init__(self, cfg: EagleConfig, quant: Quantization, target=None):
        super().__init__()
        self.cfg, self.quant, self.dtype = cfg, quant, quant.model_dtype
        h = cfg.hidden_size
        self.fc = QLinear(2 * h, h, quant, bias=True)
        self.layers = nn.ModuleList([DecoderLayer(cfg.layer, quant, input_norm=i > 0)
                                     for i in range(cfg.num_hidden_layers)])
        if cfg.draft_vocab_size:
            self.lm_head = QLinear(h, cfg.draft_vocab_size, quant)
            self.d2t = nn.Parameter((cfg.draft_vocab_size,), "int32")  # read by the runtime at load

    def _forward(self, emb: Tensor, hidden: Tensor, kv: Tensor, meta: dict[str, Tensor]) -> Tensor:
        # emb, hidden: [n, h] -> predicted features [n, h]
        x = self.fc(op.concat([emb, hidden], dim=-1))
        for i, layer in enumerate(self.layers):
            x, kv = layer(x, kv, meta, i)
        return x

    def eagle_forward(self, input_embeds: Tensor, hidden: Tensor, kv: Tensor, positions, write_slots, page_table,
                      token_seq, token_prefix, extra_slots, extra_len) -> Tensor:
        # input_embeds: [n, h] embeddings of token i+1; hidden: [n, h] features f_i -> predicted f_{i+1} [n, h]
        # the metadata arguments are FORWARD_META's names in order (get_spec checks)
        meta = dict(zip(FORWARD_META, (positions, write_slots, page_table, token_seq, token_prefix, extra_slots,
                                       extra_len)))
        return self._forward(input_embeds, hidden, kv, meta)

    def draft_logits(self, hidden: Tensor) -> Tensor:
        # hidden: [n, h] predicted features -> [n, draft_vocab] logits over the reduced vocabulary
        logits = self.lm_head(hidden)
        return logits if logits.dtype == "float32" else logits.astype("float32")

    def draft_step(self, input_ids: Tensor, hidden: Tensor, hidden_rows: Tensor, target_embed, kv: Tensor, positions,
                   write_slots, page_table, token_seq, token_prefix, extra_slots, extra_len):
        # input_ids: [n] draft tokens; hidden: [m, h] features, row hidden_rows[j] ([n]) the parent of row j;
        # target_embed: the target's embedding tensors -> (features [n, h], target ids [n, k], log-probs [n, k])
        meta = dict(zip(FORWARD_META, (positions, write_slots, page_table, token_seq, token_prefix, extra_slots,
                                       extra_len)))
        emb = embedding_rows(list(target_embed), input_ids, self.quant)
        out = self._forward(emb, op.take(hidden, hidden_rows, axis=0), kv, meta)
        return (out, *draft_top(self.draft_logits(out), self.d2t, self.extra_metadata()["draft_top_k"]))

    def draft_catch_up(self, input_ids: Tensor, hidden: Tensor, score_rows: Tensor, target_embed, kv: Tensor,
                       positions, write_slots, page_table, token_seq, token_prefix, extra_slots, extra_len):
        # input_ids: [n]; hidden: [n, h] the target's features; score_rows: [s] rows whose top-k is
        # wanted -> (features [s, h], target ids [s, k], log-probs [s, k])
        meta = dict(zip(FORWARD_META, (positions, write_slots, page_table, token_seq, token_prefix, extra_slots,
                                       extra_len)))
        emb = embedding_rows(list(target_embed), input_ids, self.quant)
        out = op.take(self._forward(emb, hidden, kv, meta), score_rows, axis=0)
        return (out, *draft_top(self.draft_logits(out), self.d2t, self.extra_metadata()["draft_top_k"]))

    def get_spec(self) -> dict[str, Any]:
        h, dt, meta = self.cfg.hidden_size, self.dtype, self.extra_metadata()
        i32 = lambda *shape: nn.spec.Tensor(list(shape), "int32")
        tensors = {"input_embeds": nn.spec.Tensor(["n", h], dt), "hidden": nn.spec.Tensor(["n", h], dt),
                   "kv": nn.spec.Tensor(self.kv_cache_shape("slots"), dt), **forward_meta_specs(),
                   "input_ids": i32("n"), "hidden_rows": i32("n"), "score_rows": i32("s"),
                   "target_embed": target_embed_specs(meta)}
        tensors["draft_step.hidden"] = nn.spec.Tensor(["m", h], dt)  # parents: m rows of the last step
        # draft_logits and the draft steps only with a reduced draft vocabulary (its own lm_head):
        # the metadata says which
        return contract_spec(self, EAGLE, tensors, meta)


def source_map(cfg: EagleConfig) -> dict[str, list[str]]:
    """Our logical weight name -> the official EAGLE tensors concatenated (axis 0) to form it."""
    m: dict[str, list[str]] = {"fc.weight": ["fc.weight"], "fc.bias": ["fc.bias"]}
    for i in range(cfg.num_hidden_layers):
        p = f"layers.{i}"
        m[f"{p}.self_attn.qkv_proj.weight"] = [f"{p}.self_attn.{x}_proj.weight" for x in "qkv"]
        if cfg.layer.attention_bias:
            m[f"{p}.self_attn.qkv_proj.bias"] = [f"{p}.self_attn.{x}_proj.bias" for x in "qkv"]
        m[f"{p}.self_attn.o_proj.weight"] = [f"{p}.self_attn.o_proj.weight"]
        m[f"{p}.mlp.gate_up_proj.weight"] = [f"{p}.mlp.gate_proj.weight", f"{p}.mlp.up_proj.weight"]
        m[f"{p}.mlp.down_proj.weight"] = [f"{p}.mlp.down_proj.weight"]
        if i > 0:
            m[f"{p}.input_layernorm.weight"] = [f"{p}.input_layernorm.weight"]
        m[f"{p}.post_attention_layernorm.weight"] = [f"{p}.post_attention_layernorm.weight"]
    if cfg.draft_vocab_size:
        m["lm_head.weight"] = ["lm_head.weight"]
        m["d2t"] = ["d2t"]
    return m
