"""Model configuration: one dataclass for the decoder families (Llama 2/3, Mistral and
Ministral, Qwen2, Qwen3, Gemma 3, Phi-3/Phi-4-mini).

They are one pre-norm decoder with a handful of switches -- q/k norms, RoPE variants and
partial rotary, sliding-window layers, GeGLU, Gemma's extra norms and embedding scale,
fused checkpoint projections -- so one dataclass and one nn.Module (models/llama.py) serve
them all; each family is a reading rule in :func:`LlamaConfig.from_hf_dict` and a source
map. It is read from an HF ``config.json`` or from GGUF metadata, and it is the single
source of truth for shapes used by conversion, compilation and the runtime.
Unknown HF keys are kept aside in ``extra`` so nothing is silently dropped.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from speccompile.models.rope import Rope, RopeError, make_rope, rope_context_limit

SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "llama",
    "MinistralForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Gemma3ForCausalLM": "gemma3",
    "Phi3ForCausalLM": "phi3",
}
SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3", "gemma3", "phi3")
# HF model_type values read as one of ours (Mistral and Ministral are Llama with sliding windows)
HF_MODEL_TYPES = {"llama": "llama", "mistral": "llama", "ministral": "llama", "qwen2": "qwen2", "qwen3": "qwen3",
                  "gemma3_text": "gemma3", "gemma3": "gemma3", "phi3": "phi3"}
ACTIVATIONS = ("silu", "gelu_pytorch_tanh")
GGUF_ARCHITECTURES = ("llama", "qwen2", "qwen3", "gemma3")


class ConfigError(ValueError):
    """A model config that cannot be used; the message says what to fix."""


@dataclass
class LlamaConfig:
    """Hyper-parameters of a Llama-family decoder (Qwen2 = Llama + QKV bias)."""

    model_type: str
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    head_dim: int = 0
    max_position_embeddings: int = 2048
    context_window_size: int = 0
    prefill_chunk_size: int = 0
    bos_token_id: int | None = None
    eos_token_id: list[int] = field(default_factory=list)
    # family switches (defaults: Llama)
    qk_norm: bool = False  # RMSNorm over each head's q and k before RoPE (Qwen3, Gemma 3)
    rope_parameters: dict[str, dict[str, Any]] = field(default_factory=dict)  # per layer type: HF rope params
    partial_rotary_factor: float = 1.0  # the share of each head's dims that rotate (Phi)
    sliding_window: int = 0  # keys a sliding layer's token sees, itself included (0: none)
    layer_types: list[str] = field(default_factory=list)  # "full_attention" / "sliding_attention" per layer
    hidden_act: str = "silu"  # the gated MLP's activation: silu (SwiGLU) or gelu_pytorch_tanh (GeGLU)
    sandwich_norms: bool = False  # Gemma: norms after attention and after the MLP too
    embed_scale: bool = False  # Gemma: embeddings times sqrt(hidden_size)
    query_pre_attn_scalar: float = 0.0  # attention scale 1/sqrt(this) instead of 1/sqrt(head_dim) (Gemma)
    final_logit_softcapping: float = 0.0  # logits = c * tanh(logits / c) (0: none)
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.model_type not in SUPPORTED_MODEL_TYPES:
            raise ConfigError(
                f"unsupported model_type {self.model_type!r}; supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
            )
        if self.head_dim == 0:
            if self.hidden_size % self.num_attention_heads:
                raise ConfigError("hidden_size must be divisible by num_attention_heads")
            self.head_dim = self.hidden_size // self.num_attention_heads
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError("num_attention_heads must be a multiple of num_key_value_heads")
        if self.context_window_size <= 0:
            self.context_window_size = self.max_position_embeddings
        if self.prefill_chunk_size <= 0:
            self.prefill_chunk_size = min(self.context_window_size, 2048)
        if isinstance(self.eos_token_id, int):
            self.eos_token_id = [self.eos_token_id]
        if self.hidden_act not in ACTIVATIONS:
            raise ConfigError(f"hidden_act {self.hidden_act!r} is not supported; supported: {', '.join(ACTIVATIONS)}")
        if self.layer_types and len(self.layer_types) != self.num_hidden_layers:
            raise ConfigError(f"layer_types lists {len(self.layer_types)} layers, the model has {self.num_hidden_layers}")
        bad = sorted(set(self.layer_types) - {"full_attention", "sliding_attention"})
        if bad:
            raise ConfigError(f"layer type(s) {bad} are not supported; supported: full_attention, sliding_attention")
        if "sliding_attention" in self.layer_types and self.sliding_window <= 0:
            raise ConfigError("sliding_attention layers need a positive sliding_window")
        try:  # every layer's rope is checked now, not at compile time
            for i in range(self.num_hidden_layers):
                self.rope(i)
        except RopeError as err:
            raise ConfigError(str(err)) from err
        limit = self.rope_context_limit()
        if limit and self.context_window_size > limit:  # past it LongRoPE switches factors for the whole sequence
            self.context_window_size = limit
            self.prefill_chunk_size = min(self.prefill_chunk_size, limit)

    # ------------------------------------------------------------ per layer
    def layer_type(self, layer: int) -> str:
        if self.layer_types:
            return self.layer_types[layer]
        return "sliding_attention" if self.sliding_window > 0 else "full_attention"

    def window(self, layer: int) -> int:
        """The keys a token of this layer attends, itself included (0: all before it)."""
        return self.sliding_window if self.layer_type(layer) == "sliding_attention" else 0

    def rope(self, layer: int) -> Rope:
        params = self.rope_parameters.get(self.layer_type(layer)) or self.rope_parameters.get("full_attention")
        return make_rope(params, self.rope_theta, self.head_dim, self.partial_rotary_factor,
                         self.max_position_embeddings)

    def rope_context_limit(self) -> int:
        """The longest context this model's RoPE is exact for here (0: its own window)."""
        return max((rope_context_limit(p) for p in self.rope_parameters.values()), default=0)

    @property
    def attention_scale(self) -> float:
        return (self.query_pre_attn_scalar or self.head_dim) ** -0.5

    # ------------------------------------------------------------------ readers
    @classmethod
    def from_hf_dict(cls, cfg: dict[str, Any]) -> "LlamaConfig":
        """Build from an HF config dict, naming any missing required field. The family's
        switches are set from its model_type (transformers' meaning of each field)."""
        hf_type = cfg.get("model_type")
        archs = cfg.get("architectures") or []
        model_type = HF_MODEL_TYPES.get(hf_type) if hf_type is not None else \
            next((SUPPORTED_ARCHITECTURES[a] for a in archs if a in SUPPORTED_ARCHITECTURES), None)
        if model_type not in SUPPORTED_MODEL_TYPES:
            known = sorted(set(SUPPORTED_ARCHITECTURES))
            raise ConfigError(
                f"unsupported architecture (model_type={hf_type!r}, architectures={archs}); "
                f"supported: {', '.join(known)} (model_type {', '.join(sorted(HF_MODEL_TYPES))})")
        required = ["hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size"]
        missing = [k for k in required if k not in cfg]
        if missing:
            raise ConfigError(f"config.json is missing required field(s): {', '.join(missing)}")
        for key in required:
            if not isinstance(cfg[key], int) or cfg[key] <= 0:
                raise ConfigError(f"config.json field {key!r} must be a positive integer, got {cfg[key]!r}")
        if cfg.get("attn_logit_softcapping"):
            raise ConfigError(f"attn_logit_softcapping {cfg['attn_logit_softcapping']} (Gemma 2) is not supported")
        known = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in cfg.items() if k in known and k not in ("extra", "model_type", "rope_parameters")}
        for key in ("num_key_value_heads", "head_dim", "sliding_window", "layer_types", "final_logit_softcapping",
                    "query_pre_attn_scalar", "partial_rotary_factor", "hidden_act"):
            if kwargs.get(key) is None:
                kwargs.pop(key, None)
        kwargs.setdefault("num_key_value_heads", cfg["num_attention_heads"])
        kwargs["rope_parameters"] = _rope_parameters(cfg, model_type)
        kwargs["rope_theta"] = float(kwargs["rope_parameters"]["full_attention"]["rope_theta"])
        if model_type == "qwen2":
            kwargs["attention_bias"] = True
        if model_type in ("qwen2", "qwen3") and not cfg.get("use_sliding_window", False):
            kwargs.pop("sliding_window", None)  # Qwen configs carry a window they do not use
            kwargs.pop("layer_types", None)
        if model_type in ("qwen3", "gemma3"):
            kwargs["qk_norm"] = True
        if model_type == "gemma3":
            kwargs.update(sandwich_norms=True, embed_scale=True, hidden_act=cfg.get("hidden_activation")
                          or cfg.get("hidden_act") or "gelu_pytorch_tanh", tie_word_embeddings=cfg.get(
                              "tie_word_embeddings", True), query_pre_attn_scalar=float(cfg.get("query_pre_attn_scalar", 256)))
            if "layer_types" not in kwargs:  # transformers' default pattern: every sixth layer global
                pattern = int(cfg.get("sliding_window_pattern", 6))
                kwargs["layer_types"] = ["sliding_attention" if (i + 1) % pattern else "full_attention"
                                         for i in range(cfg["num_hidden_layers"])]
            kwargs.setdefault("sliding_window", 4096)
            kwargs.setdefault("rms_norm_eps", 1e-6)
        if kwargs.get("layer_types") and "sliding_attention" not in kwargs["layer_types"]:
            kwargs.pop("sliding_window", None)
        if kwargs.get("sliding_window") and kwargs["sliding_window"] >= cfg.get("max_position_embeddings", 2048):
            kwargs.pop("sliding_window", None)  # a window past the context is no window (Phi-4-mini)
            kwargs.pop("layer_types", None)
        if kwargs.get("sliding_window") is None:
            kwargs["layer_types"] = []
        eos = cfg.get("eos_token_id")
        kwargs["eos_token_id"] = [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))
        extra = {k: v for k, v in cfg.items() if k not in known}
        return cls(model_type=model_type, extra=extra, **kwargs)

    @classmethod
    def from_hf_folder(cls, folder: Path) -> "LlamaConfig":
        path = Path(folder) / "config.json"
        if not path.exists():
            raise ConfigError(f"{path} not found: an HF model folder needs config.json")
        try:
            cfg = json.loads(path.read_text())
        except json.JSONDecodeError as err:
            raise ConfigError(f"{path} is not valid JSON: {err}") from err
        return cls.from_hf_dict(cfg)

    @classmethod
    def from_gguf_fields(cls, fields: dict[str, Any]) -> "LlamaConfig":
        """Build from GGUF metadata (already decoded to Python values), read as the HF config
        llama.cpp converted it from, so each family's rules are :meth:`from_hf_dict`'s. What
        llama.cpp leaves implicit is its own convention: Gemma 3's local RoPE theta (10,000),
        its every-sixth-layer global pattern, and its query scale (head_dim, or hidden/heads
        for the 62-layer 27B). Llama 3's RoPE factors come as a tensor (GGUFSource)."""
        arch = fields.get("general.architecture")
        if arch not in GGUF_ARCHITECTURES:
            raise ConfigError(f"unsupported GGUF architecture {arch!r}; supported: {', '.join(GGUF_ARCHITECTURES)} "
                              "(other families: convert their HF safetensors folder)")

        def get(key: str, default: Any = None) -> Any:
            full = f"{arch}.{key}"
            if full not in fields and default is None:
                raise ConfigError(f"GGUF metadata is missing {full!r}")
            return fields.get(full, default)

        vocab = fields.get(f"{arch}.vocab_size") or len(fields.get("tokenizer.ggml.tokens", []))
        if not vocab:
            raise ConfigError("GGUF metadata has neither vocab_size nor tokenizer tokens")
        n_head, hidden, layers = int(get("attention.head_count")), int(get("embedding_length")), int(get("block_count"))
        hf: dict[str, Any] = {
            "model_type": "gemma3_text" if arch == "gemma3" else arch, "hidden_size": hidden,
            "intermediate_size": int(get("feed_forward_length")), "num_hidden_layers": layers,
            "num_attention_heads": n_head, "num_key_value_heads": int(get("attention.head_count_kv", n_head)),
            "vocab_size": int(vocab), "rms_norm_eps": float(get("attention.layer_norm_rms_epsilon", 1e-6)),
            "rope_theta": float(get("rope.freq_base", 1e6 if arch == "gemma3" else 10000.0)),
            "max_position_embeddings": int(get("context_length", 2048)),
            "bos_token_id": fields.get("tokenizer.ggml.bos_token_id"),
            "eos_token_id": [int(fields["tokenizer.ggml.eos_token_id"])] if "tokenizer.ggml.eos_token_id" in fields else [],
            "tie_word_embeddings": False,  # decided by the converter from the presence of output.weight
        }
        if f"{arch}.attention.key_length" in fields:
            hf["head_dim"] = int(get("attention.key_length"))
        scaling = get("rope.scaling.type", "none")
        if scaling not in ("none", "linear", "yarn"):
            raise ConfigError(f"GGUF rope scaling {scaling!r} is not supported; supported: none, linear, yarn")
        if scaling != "none":
            hf["rope_scaling"] = {"rope_type": scaling, "factor": float(get("rope.scaling.factor")),
                                  "original_max_position_embeddings": int(get("rope.scaling.original_context_length",
                                                                              hf["max_position_embeddings"]))}
        if arch == "gemma3":
            head_dim = hf.get("head_dim", hidden // n_head)
            hf.update(sliding_window=int(get("attention.sliding_window")), rope_local_base_freq=10000.0,
                      query_pre_attn_scalar=hidden // n_head if layers == 62 else head_dim)
        return cls.from_hf_dict(hf)

    # ----------------------------------------------------------------- writers
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def extra_metadata(self) -> dict[str, Any]:
        """What a target library records beyond the common keys: the decoder layers whose
        outputs ``forward_tokens_features`` exports for EAGLE-3 heads, and that the library
        exports ``feature_buffer`` (runtime/contract.py)."""
        return {"feature_layers": feature_layers(self.num_hidden_layers), "feature_buffer": True}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "LlamaConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ConfigError(f"unknown model config field(s): {', '.join(sorted(unknown))}")
        return cls(**data)


def _rope_parameters(cfg: dict[str, Any], model_type: str) -> dict[str, dict[str, Any]]:
    """The rope parameters of each layer type, with their theta, from either transformers 5's
    ``rope_parameters`` (flat, or per layer type) or the older ``rope_theta`` /
    ``rope_scaling`` / ``rope_local_base_freq`` keys."""
    given = cfg.get("rope_parameters") or {}
    per_type = given if isinstance(given.get("full_attention"), dict) else {"full_attention": dict(given)}
    full = dict(per_type.get("full_attention") or {})
    for key, value in (cfg.get("rope_scaling") or {}).items():
        full.setdefault(key, value)
    default_theta = 1_000_000.0 if model_type == "gemma3" else 10000.0
    full.setdefault("rope_theta", float(cfg.get("rope_theta") or default_theta))
    out = {"full_attention": full}
    if model_type == "gemma3" or "sliding_attention" in per_type:
        local = dict(per_type.get("sliding_attention") or {"rope_type": "default"})
        local.setdefault("rope_theta", float(cfg.get("rope_local_base_freq") or 10000.0))
        out["sliding_attention"] = local
    for params in out.values():
        if "type" in params and "rope_type" not in params:
            params["rope_type"] = params.pop("type")
        if model_type == "phi3" and "original_max_position_embeddings" in cfg:
            params.setdefault("original_max_position_embeddings", cfg["original_max_position_embeddings"])
        if params.get("rope_type") in ("llama3",) and "original_max_position_embeddings" not in params:
            raise ConfigError("rope_type llama3 needs original_max_position_embeddings")
    return out


def hf_source_map(cfg: LlamaConfig) -> dict[str, list[str]]:
    """Our logical weight name -> the HF tensors concatenated (axis 0) to form it.

    A logical name is a parameter name without its storage suffix: ``X.weight`` of a
    plain layer, or the ``X.q_weight``/``X.q_scale`` pair of a quantized one, both come
    from the float tensor listed for ``X.weight``. It lives here, not in models/llama.py,
    because converting a checkpoint needs it and must work without TVM's compiler.
    Phi checkpoints hold q/k/v and gate/up fused already (in our order); Gemma's norm
    weights are stored less one (:func:`hf_weight_offset`).
    """
    m: dict[str, list[str]] = {"embed_tokens.weight": ["model.embed_tokens.weight"], "norm.weight": ["model.norm.weight"]}
    if not cfg.tie_word_embeddings:
        m["lm_head.weight"] = ["lm_head.weight"]
    fused = cfg.model_type == "phi3"
    norms = (["input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm"]
             if cfg.sandwich_norms else ["input_layernorm", "post_attention_layernorm"])
    for i in range(cfg.num_hidden_layers):
        hf, ours = f"model.layers.{i}", f"layers.{i}"
        m[f"{ours}.self_attn.qkv_proj.weight"] = ([f"{hf}.self_attn.qkv_proj.weight"] if fused else
                                                  [f"{hf}.self_attn.{p}_proj.weight" for p in "qkv"])
        if cfg.attention_bias:
            m[f"{ours}.self_attn.qkv_proj.bias"] = [f"{hf}.self_attn.{p}_proj.bias" for p in "qkv"]
        if cfg.qk_norm:
            m[f"{ours}.self_attn.q_norm.weight"] = [f"{hf}.self_attn.q_norm.weight"]
            m[f"{ours}.self_attn.k_norm.weight"] = [f"{hf}.self_attn.k_norm.weight"]
        m[f"{ours}.self_attn.o_proj.weight"] = [f"{hf}.self_attn.o_proj.weight"]
        m[f"{ours}.mlp.gate_up_proj.weight"] = ([f"{hf}.mlp.gate_up_proj.weight"] if fused else
                                                [f"{hf}.mlp.gate_proj.weight", f"{hf}.mlp.up_proj.weight"])
        m[f"{ours}.mlp.down_proj.weight"] = [f"{hf}.mlp.down_proj.weight"]
        for norm in norms:
            m[f"{ours}.{norm}.weight"] = [f"{hf}.{norm}.weight"]
    return m


def hf_weight_offset(cfg: LlamaConfig, logical: str) -> float:
    """What to add to an HF tensor on conversion: Gemma's RMSNorms scale by ``1 + weight``
    (computed in float32, as here once at conversion), every other family's by ``weight``."""
    return 1.0 if cfg.model_type == "gemma3" and logical.endswith("norm.weight") else 0.0


# Tiny presets: tests build real models from these with random weights.
PRESETS: dict[str, dict[str, Any]] = {
    "tiny-llama": dict(
        model_type="llama", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, vocab_size=272, max_position_embeddings=512,
        tie_word_embeddings=True, prefill_chunk_size=128,
    ),
    "tiny-qwen2": dict(
        model_type="qwen2", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, vocab_size=272, max_position_embeddings=512,
        tie_word_embeddings=False, attention_bias=True, prefill_chunk_size=128,
    ),
}


def preset(name: str, **overrides: Any) -> LlamaConfig:
    if name not in PRESETS:
        raise ConfigError(f"unknown preset {name!r}; known: {', '.join(PRESETS)}")
    return LlamaConfig(**{**PRESETS[name], **overrides})


def feature_layers(num_layers: int) -> list[int]:
    """The decoder layers (0-based) whose outputs -- the residual stream before the next
    layer's input norm -- an EAGLE-3 head reads, low, mid and high.

    Why these: they are what SafeAILab's EAGLE-3 and SpecForge train on by default (the
    inputs of layers 2, L//2 and L-3, i.e. the outputs of layers 1, L//2-1 and L-4;
    SpecForge's ``aux_hidden_state_layer_ids``), so published heads fit our targets.
    Below 5 layers that rule leaves the model or runs backwards; such targets (test
    models) take the first, the middle and the last layer."""
    if num_layers >= 5:
        return [1, num_layers // 2 - 1, num_layers - 4]
    return [0, (num_layers - 1) // 2, num_layers - 1]


def reduced_vocabulary_size(raw: dict[str, Any], target: "LlamaConfig", shape: Callable[[str], tuple[int, ...]],
                            who: str) -> int:
    """Check a draft head's EAGLE-3 style reduced vocabulary (``lm_head.weight`` [draft_vocab, h]
    and ``d2t`` [draft_vocab]) against its target and config.json; returns draft_vocab. Shared
    by EAGLE heads and Medusa heads that share one projection."""
    lm, d2t = tuple(shape("lm_head.weight")), tuple(shape("d2t"))
    if len(lm) != 2 or lm[1] != target.hidden_size or not 0 < lm[0] <= target.vocab_size:
        raise ConfigError(f"{who} lm_head.weight is {list(lm)}; with this target it must be "
                          f"[draft_vocab <= {target.vocab_size}, {target.hidden_size}]")
    if d2t != (lm[0],):
        raise ConfigError(f"{who} d2t is {list(d2t)}, its lm_head has {lm[0]} rows")
    if raw.get("draft_vocab_size", lm[0]) != lm[0]:
        raise ConfigError(f"config.json says draft_vocab_size {raw['draft_vocab_size']}, lm_head.weight has {lm[0]}")
    return int(lm[0])
