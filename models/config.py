"""Model configuration: one dataclass for the Llama family (Llama, Qwen2).

It is read from an HF ``config.json`` or from GGUF metadata, and it is the single
source of truth for shapes used by conversion, compilation and the runtime.
Unknown HF keys are kept aside in ``extra`` so nothing is silently dropped.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "MistralForCausalLM": "llama",
}
SUPPORTED_MODEL_TYPES = ("llama", "qwen2")


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

    # ------------------------------------------------------------------ readers
    @classmethod
    def from_hf_dict(cls, cfg: dict[str, Any]) -> "LlamaConfig":
        """Build from an HF config dict, naming any missing required field."""
        model_type = cfg.get("model_type")
        if model_type is None:
            archs = cfg.get("architectures") or []
            model_type = next((SUPPORTED_ARCHITECTURES[a] for a in archs if a in SUPPORTED_ARCHITECTURES), None)
        if model_type == "mistral":
            model_type = "llama"
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ConfigError(
                f"unsupported architecture (model_type={cfg.get('model_type')!r}, "
                f"architectures={cfg.get('architectures')}); supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
            )
        required = ["hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size"]
        missing = [k for k in required if k not in cfg]
        if missing:
            raise ConfigError(f"config.json is missing required field(s): {', '.join(missing)}")
        for key in required:
            if not isinstance(cfg[key], int) or cfg[key] <= 0:
                raise ConfigError(f"config.json field {key!r} must be a positive integer, got {cfg[key]!r}")
        # transformers 5 writes RoPE settings as rope_parameters {rope_type, rope_theta}, not top-level keys
        rope_params = cfg.get("rope_parameters") or {}
        for rope_scaling in (cfg.get("rope_scaling"), rope_params):
            if rope_scaling not in (None, {}) and rope_scaling.get("rope_type", rope_scaling.get("type")) not in (None, "default"):
                raise ConfigError(f"rope_scaling {rope_scaling!r} is not supported yet (only plain RoPE)")
        known = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in cfg.items() if k in known and k not in ("extra", "model_type")}
        if "rope_theta" not in kwargs and "rope_theta" in rope_params:
            kwargs["rope_theta"] = float(rope_params["rope_theta"])
        kwargs.setdefault("num_key_value_heads", cfg["num_attention_heads"])
        if kwargs.get("num_key_value_heads") is None:
            kwargs["num_key_value_heads"] = cfg["num_attention_heads"]
        if kwargs.get("head_dim") is None:
            kwargs.pop("head_dim", None)
        if model_type == "qwen2":
            kwargs["attention_bias"] = True
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
        """Build from GGUF metadata (already decoded to Python values)."""
        arch = fields.get("general.architecture")
        if arch not in SUPPORTED_MODEL_TYPES:
            raise ConfigError(f"unsupported GGUF architecture {arch!r}; supported: {', '.join(SUPPORTED_MODEL_TYPES)}")

        def get(key: str, default: Any = None) -> Any:
            full = f"{arch}.{key}"
            if full not in fields and default is None:
                raise ConfigError(f"GGUF metadata is missing {full!r}")
            return fields.get(full, default)

        vocab = fields.get(f"{arch}.vocab_size") or len(fields.get("tokenizer.ggml.tokens", []))
        if not vocab:
            raise ConfigError("GGUF metadata has neither vocab_size nor tokenizer tokens")
        n_head = int(get("attention.head_count"))
        return cls(
            model_type=arch,
            hidden_size=int(get("embedding_length")),
            intermediate_size=int(get("feed_forward_length")),
            num_hidden_layers=int(get("block_count")),
            num_attention_heads=n_head,
            num_key_value_heads=int(get("attention.head_count_kv", n_head)),
            vocab_size=int(vocab),
            rms_norm_eps=float(get("attention.layer_norm_rms_epsilon", 1e-6)),
            rope_theta=float(get("rope.freq_base", 10000.0)),
            attention_bias=arch == "qwen2",
            max_position_embeddings=int(get("context_length", 2048)),
            bos_token_id=fields.get("tokenizer.ggml.bos_token_id"),
            eos_token_id=[int(fields["tokenizer.ggml.eos_token_id"])] if "tokenizer.ggml.eos_token_id" in fields else [],
            # tie is decided by the converter from the presence of output.weight
            tie_word_embeddings=False,
        )

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


def hf_source_map(cfg: LlamaConfig) -> dict[str, list[str]]:
    """Our logical weight name -> the HF tensors concatenated (axis 0) to form it.

    A logical name is a parameter name without its storage suffix: ``X.weight`` of a
    plain layer, or the ``X.q_weight``/``X.q_scale`` pair of a quantized one, both come
    from the float tensor listed for ``X.weight``. It lives here, not in models/llama.py,
    because converting a checkpoint needs it and must work without TVM's compiler.
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
