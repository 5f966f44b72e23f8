"""EAGLE-3 draft head (SafeAILab / SpecForge layout) written with the target's blocks.

Why it looks like this. EAGLE-3 reads more of the target than its last feature: the
outputs of a low, a middle and a high decoder layer (``feature_layers``, models/config.py),
concatenated [n, 3h] and fused by ``fc`` (3h -> h). Its one decoder layer (``midlayer``)
differs from a Llama block only at its input: the attention reads
``concat(input_layernorm(embed(token i+1)), hidden_norm(g_i))`` -- 2h wide, so q/k/v take
2h -- and the residual stream starts from ``g_i``, the fused target feature. Its output
goes through its own ``norm`` and ``lm_head`` over a draft vocabulary (``d2t``: draft id
j is target token ``j + d2t[j]``).

At the next depth there is no target feature yet, so the head is fed its *own* output
(before ``norm``) in place of the fused feature, without ``fc``: that is how EAGLE-3 is
trained (training-time test) and drafts (SafeAILab's ``topK_genrate``). So the library
exports ``fuse_features`` (fc alone) beside ``eagle_forward`` (the layer alone) and
``draft_logits`` (norm + lm_head), and the runtime (runtime/drafters/eagle.py) calls fc only on
rows built from target features.

The layer uses models/llama.py's attention with the same paged KV cache, kernels and
per-forward metadata as the target, so it drafts chains and token trees like EAGLE-1.
The head owns no embedding: the target library's ``embed`` serves (published heads ship
a frozen copy of the target's, which conversion ignores).

Draft steps on device: ``draft_catch_up`` (fc, layer, norm, lm_head and top-k at each
sequence's last row, from target features) and ``draft_step`` (the same from the head's
own outputs, gathered on device) make a draft depth one call, reading the target's
embedding tensors passed in (why, in models/eagle.py's doc).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import Tensor, op

from speccompile.runtime.contract import EAGLE3, FORWARD_META

from speccompile.models.config import ConfigError, LlamaConfig, feature_layers
from speccompile.kernels.draft_topk import draft_top
from speccompile.models.eagle import DraftHead, HeadLayerConfig, head_decoder_config, target_embed_specs
from speccompile.models.exports import contract_spec, forward_meta_specs
from speccompile.models.llama import MLP, Attention
from speccompile.models.quantization import QLinear, Quantization, embedding_rows


@dataclass
class Eagle3Config(HeadLayerConfig):
    """The midlayer's hyper-parameters (a Llama config with one layer), the draft
    vocabulary, and the target layers the head was trained on."""

    layer: LlamaConfig
    draft_vocab_size: int  # rows of lm_head (the full vocabulary when the checkpoint has no d2t)
    feature_layers: list[int] = field(default_factory=list)  # outputs of these target layers feed fc
    fc_bias: bool = False  # SafeAILab's and SpecForge's fc have none; accepted if a checkpoint has one
    fc_norm: bool = False  # SpecForge/SGLang: an RMSNorm on each of the three features before fc
    norm_before_residual: bool = False  # speculators/vLLM: the residual starts from the normed feature
    model_type = "eagle3"

    KEYS = ("layer", "draft_vocab_size", "feature_layers", "fc_bias")
    OPTIONAL = ("fc_norm", "norm_before_residual")  # (configs converted before these existed lack them)

    def to_dict(self) -> dict[str, Any]:
        return {"layer": self.layer.to_dict(), "draft_vocab_size": self.draft_vocab_size,
                "feature_layers": list(self.feature_layers), "fc_bias": self.fc_bias, "fc_norm": self.fc_norm,
                "norm_before_residual": self.norm_before_residual}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Eagle3Config":
        if not set(cls.KEYS) <= set(data) <= set(cls.KEYS + cls.OPTIONAL):
            raise ConfigError(f"an EAGLE-3 model config holds {', '.join(cls.KEYS + cls.OPTIONAL)}; got {sorted(data)}")
        return cls(LlamaConfig.from_dict(data["layer"]), int(data["draft_vocab_size"]),
                   [int(i) for i in data["feature_layers"]], bool(data["fc_bias"]), bool(data.get("fc_norm", False)),
                   bool(data.get("norm_before_residual", False)))

    def extra_metadata(self) -> dict[str, Any]:
        return {"head_kind": "eagle3", "draft_vocab_size": self.draft_vocab_size,
                "feature_layers": list(self.feature_layers)}

    @classmethod
    def from_checkpoint(cls, raw: dict[str, Any], target: LlamaConfig, names: list[str],
                        shape: Callable[[str], tuple[int, ...]]) -> "Eagle3Config":
        """Read an EAGLE-3 config.json and check, before any long work, that the head fits
        this target: hidden size, vocabulary, fc's width, the draft vocabulary's shapes,
        and the target layers it reads being the ones our target libraries export."""
        if "fc.weight" not in names or "midlayer.self_attn.q_proj.weight" not in names:
            raise ConfigError("not an EAGLE-3 checkpoint: it needs fc.weight and midlayer.* tensors")
        raw = published_config(raw)
        h = target.hidden_size
        th = raw.get("target_hidden_size")
        if th is not None and th != h:
            raise ConfigError(f"the EAGLE-3 head was trained for a target of hidden size {th}, this target has {h}: "
                              "this head was trained for another model")
        if th is not None and raw.get("hidden_size", th) != th:
            raise ConfigError(f"the EAGLE-3 head is {raw['hidden_size']} wide for a target of {th}: only heads as "
                              "wide as their target are supported (they share its embedding)")
        fc_norm = [f"fc_norm.{i}.weight" for i in range(3)]
        if (raw.get("fc_norm") or any(n.startswith("fc_norm.") for n in names)) and not set(fc_norm) <= set(names):
            raise ConfigError(f"the EAGLE-3 head normalizes its features before fc but lacks {', '.join(fc_norm)}")
        if raw.get("norm_before_fc"):
            raise ConfigError("the EAGLE-3 head normalizes the concatenated features before fc (norm_before_fc): "
                              "not supported")
        if raw.get("norm_output") is not None and "speculators_model_type" not in raw and not raw["norm_output"]:
            raise ConfigError("the EAGLE-3 head's logits skip its final norm (norm_output: false): not supported")
        if raw.get("hidden_act", "silu") != "silu":
            raise ConfigError(f"the EAGLE-3 head's hidden_act is {raw['hidden_act']!r}; only silu is supported")
        layer = head_decoder_config(raw, target, "EAGLE-3", "midlayer.self_attn.q_proj.bias" in names,
                                    num_hidden_layers=1)
        if tuple(shape("fc.weight")) != (h, 3 * h):
            raise ConfigError(f"the EAGLE-3 head's fc.weight is {list(shape('fc.weight'))}, a target with hidden "
                              f"size {h} needs [{h}, {3 * h}]: this head was trained for another model")
        cls.check_embedding("EAGLE-3", target, names, shape)
        layers = _trained_layers(raw, target)
        return cls(layer, _draft_vocabulary(raw, target, names, shape), layers, "fc.bias" in names,
                   set(fc_norm) <= set(names), bool(raw.get("norm_before_residual", False)))


def published_config(raw: dict[str, Any]) -> dict[str, Any]:
    """An EAGLE-3 config.json in one form, whichever trainer wrote it: SafeAILab's,
    SpecForge's and AngelSlim's are a Llama config with ``draft_vocab_size`` (aux layers, when
    given, in ``eagle_config``, as layer outputs); vLLM's ``speculators`` format nests the
    Llama config in ``transformer_layer_config``, puts the aux layers at the top as vLLM's
    ids (one past the layer whose output they name) and defaults ``norm_before_residual``
    to true."""
    if "transformer_layer_config" not in raw:
        return raw
    out = {**raw["transformer_layer_config"], **{k: v for k, v in raw.items() if k != "transformer_layer_config"}}
    out["architectures"] = ["LlamaForCausalLM"]
    out["model_type"] = "llama"
    out.setdefault("norm_before_residual", True)
    ids = raw.get("eagle_aux_hidden_state_layer_ids")
    if ids is not None:
        out["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": [int(i) - 1 for i in ids]}
    return out


def _trained_layers(raw: dict[str, Any], target: LlamaConfig) -> list[int]:
    """The target layers whose outputs the head was trained on; they must be the ones our
    target libraries export (``feature_layers``), which is the published default."""
    ours = feature_layers(target.num_hidden_layers)
    given = (raw.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    if given is not None and [int(i) for i in given] != ours:
        raise ConfigError(f"the EAGLE-3 head reads the outputs of target layers {list(given)}, but target "
                          f"libraries export layers {ours} of a {target.num_hidden_layers}-layer model "
                          "(the EAGLE-3 default): this head cannot be fed")
    return ours


def _draft_vocabulary(raw: dict[str, Any], target: LlamaConfig, names: list[str],
                      shape: Callable[[str], tuple[int, ...]]) -> int:
    """Rows of the head's lm_head: ``d2t``'s length, or the target's vocabulary when the
    checkpoint maps nothing (SafeAILab drops d2t/t2d when both vocabularies are equal).
    A missing ``lm_head.weight`` is read from the target's rows at conversion
    (speccompile/compiler/sources.py), as for EAGLE-1 heads."""
    v, h = target.vocab_size, target.hidden_size
    rows = shape("d2t")[0] if "d2t" in names else v
    if "d2t" in names and len(shape("d2t")) != 1:
        raise ConfigError(f"the EAGLE-3 head's d2t is {list(shape('d2t'))}, a vector was expected")
    if not 0 < rows <= v:
        raise ConfigError(f"the EAGLE-3 head's d2t has {rows} entries; with this target it needs 1..{v}")
    if "lm_head.weight" in names and tuple(shape("lm_head.weight")) != (rows, h):
        raise ConfigError(f"the EAGLE-3 head's lm_head.weight is {list(shape('lm_head.weight'))}; with "
                          f"{'its d2t' if 'd2t' in names else 'no d2t'} and this target it must be [{rows}, {h}]")
    if "t2d" in names and tuple(shape("t2d")) != (v,):
        raise ConfigError(f"the EAGLE-3 head's t2d is {list(shape('t2d'))}, the target's vocabulary has {v} tokens")
    if raw.get("draft_vocab_size", rows) != rows:
        raise ConfigError(f"config.json says draft_vocab_size {raw['draft_vocab_size']}, the weights hold {rows}")
    return int(rows)


class Eagle3Layer(nn.Module):
    """The midlayer: a Llama block whose attention reads [normed embedding, normed feature]."""

    def __init__(self, cfg: LlamaConfig, quant: Quantization, norm_before_residual: bool = False):
        super().__init__()
        self.norm_before_residual = norm_before_residual
        dtype, h = quant.model_dtype, cfg.hidden_size
        self.self_attn = Attention(cfg, quant, in_features=2 * h)
        self.mlp = MLP(cfg, quant)
        self.input_layernorm = nn.RMSNorm(h, -1, cfg.rms_norm_eps, bias=False, dtype=dtype)
        self.hidden_norm = nn.RMSNorm(h, -1, cfg.rms_norm_eps, bias=False, dtype=dtype)
        self.post_attention_layernorm = nn.RMSNorm(h, -1, cfg.rms_norm_eps, bias=False, dtype=dtype)

    def forward(self, emb: Tensor, hidden: Tensor, kv: Tensor, meta: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        # emb, hidden: [n, h] -> [n, h]; the residual stream starts from hidden (or, with
        # norm_before_residual, its normed form), not from the concat
        normed = self.hidden_norm(hidden)
        x = op.concat([self.input_layernorm(emb), normed], dim=-1)  # [n, 2h]
        a, kv = self.self_attn(x, kv, meta, 0)
        hidden = (normed if self.norm_before_residual else hidden) + a
        return hidden + self.mlp(self.post_attention_layernorm(hidden)), kv


class Eagle3Head(DraftHead):
    """fc over the target's three layer features, one midlayer, its own norm and lm_head."""

    def __init__(self, cfg: Eagle3Config, quant: Quantization, target=None):
        super().__init__()
        self.cfg, self.quant, self.dtype = cfg, quant, quant.model_dtype
        h = cfg.hidden_size
        self.fc = QLinear(3 * h, h, quant, bias=cfg.fc_bias)
        if cfg.fc_norm:
            self.fc_norm = nn.ModuleList([nn.RMSNorm(h, -1, cfg.layer.rms_norm_eps, bias=False, dtype=self.dtype)
                                          for _ in range(3)])
        self.midlayer = Eagle3Layer(cfg.layer, quant, cfg.norm_before_residual)
        self.norm = nn.RMSNorm(h, -1, cfg.layer.rms_norm_eps, bias=False, dtype=self.dtype)
        self.lm_head = QLinear(h, cfg.draft_vocab_size, quant)
        self.d2t = nn.Parameter((cfg.draft_vocab_size,), "int32")  # read by the runtime at load

    def fuse_features(self, features: Tensor) -> Tensor:
        # features: [n, 3h] target layer outputs, low/mid/high -> [n, h] (each normed first with fc_norm)
        if self.cfg.fc_norm:
            parts = op.split(features, 3, axis=-1)
            features = op.concat([norm(part) for norm, part in zip(self.fc_norm, parts)], dim=-1)
        return self.fc(features)

    def eagle_forward(self, input_embeds: Tensor, hidden: Tensor, kv: Tensor, positions, write_slots, page_table,
                      token_seq, token_prefix, extra_slots, extra_len) -> Tensor:
        # input_embeds: [n, h] embeddings of token i+1; hidden: [n, h] fused target feature (or
        # the head's own output) at i -> the head's output at i [n, h], before its final norm
        meta = dict(zip(FORWARD_META, (positions, write_slots, page_table, token_seq, token_prefix, extra_slots,
                                       extra_len)))
        out, _ = self.midlayer(input_embeds, hidden, kv, meta)
        return out

    def draft_logits(self, hidden: Tensor) -> Tensor:
        # hidden: [n, h] head outputs -> [n, draft_vocab] logits over the draft vocabulary
        logits = self.lm_head(self.norm(hidden))
        return logits if logits.dtype == "float32" else logits.astype("float32")

    def _top(self, out: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        # out: [n, h] -> (out, target ids [n, k], log-probabilities [n, k]) over the draft vocabulary
        return (out, *draft_top(self.draft_logits(out), self.d2t, self.extra_metadata()["draft_top_k"]))

    def draft_step(self, input_ids: Tensor, hidden: Tensor, hidden_rows: Tensor, target_embed, kv: Tensor, positions,
                   write_slots, page_table, token_seq, token_prefix, extra_slots, extra_len):
        # input_ids: [n] draft tokens; hidden: [m, h] the head's outputs of the last step, row
        # hidden_rows[j] ([n]) the parent of row j; target_embed: the target's embedding tensors
        # -> (outputs before the final norm [n, h], target ids [n, k], log-probabilities [n, k])
        meta = dict(zip(FORWARD_META, (positions, write_slots, page_table, token_seq, token_prefix, extra_slots,
                                       extra_len)))
        emb = embedding_rows(list(target_embed), input_ids, self.quant)
        out, _ = self.midlayer(emb, op.take(hidden, hidden_rows, axis=0), kv, meta)
        return self._top(out)

    def draft_catch_up(self, input_ids: Tensor, features: Tensor, score_rows: Tensor, target_embed, kv: Tensor,
                       positions, write_slots, page_table, token_seq, token_prefix, extra_slots, extra_len):
        # input_ids: [n]; features: [n, 3h] the target's layer outputs; score_rows: [s] rows whose
        # top-k is wanted -> (outputs [s, h], target ids [s, k], log-probabilities [s, k])
        meta = dict(zip(FORWARD_META, (positions, write_slots, page_table, token_seq, token_prefix, extra_slots,
                                       extra_len)))
        emb = embedding_rows(list(target_embed), input_ids, self.quant)
        out, _ = self.midlayer(emb, self.fuse_features(features), kv, meta)
        return self._top(op.take(out, score_rows, axis=0))

    def get_spec(self) -> dict[str, Any]:
        h, dt, meta = self.cfg.hidden_size, self.dtype, self.extra_metadata()
        i32 = lambda *shape: nn.spec.Tensor(list(shape), "int32")
        tensors = {"features": nn.spec.Tensor(["n", 3 * h], dt), "input_embeds": nn.spec.Tensor(["n", h], dt),
                   "hidden": nn.spec.Tensor(["n", h], dt), "kv": nn.spec.Tensor(self.kv_cache_shape("slots"), dt),
                   **forward_meta_specs(), "input_ids": i32("n"), "hidden_rows": i32("n"), "score_rows": i32("s"),
                   "target_embed": target_embed_specs(meta),
                   "draft_step.hidden": nn.spec.Tensor(["m", h], dt)}  # parents: m rows of the last step
        return contract_spec(self, EAGLE3, tensors, meta)


def source_map(cfg: Eagle3Config) -> dict[str, list[str]]:
    """Our logical weight name -> the published EAGLE-3 tensors concatenated (axis 0) to form it."""
    p = "midlayer"
    m: dict[str, list[str]] = {"fc.weight": ["fc.weight"], "norm.weight": ["norm.weight"],
                               "lm_head.weight": ["lm_head.weight"], "d2t": ["d2t"],
                               f"{p}.self_attn.qkv_proj.weight": [f"{p}.self_attn.{x}_proj.weight" for x in "qkv"],
                               f"{p}.self_attn.o_proj.weight": [f"{p}.self_attn.o_proj.weight"],
                               f"{p}.mlp.gate_up_proj.weight": [f"{p}.mlp.gate_proj.weight", f"{p}.mlp.up_proj.weight"],
                               f"{p}.mlp.down_proj.weight": [f"{p}.mlp.down_proj.weight"]}
    for norm in ("input_layernorm", "hidden_norm", "post_attention_layernorm"):
        m[f"{p}.{norm}.weight"] = [f"{p}.{norm}.weight"]
    if cfg.fc_bias:
        m["fc.bias"] = ["fc.bias"]
    if cfg.fc_norm:
        for i in range(3):
            m[f"fc_norm.{i}.weight"] = [f"fc_norm.{i}.weight"]
    if cfg.layer.attention_bias:
        m[f"{p}.self_attn.qkv_proj.bias"] = [f"{p}.self_attn.{x}_proj.bias" for x in "qkv"]
    return m
