"""Model architectures (compiler side: imports the TVM compiler).

Targets are Llama-family decoders; ``eagle`` (EAGLE-1), ``eagle3`` and ``medusa`` are draft
heads that run on a target's hidden states. Every model type has one config class, one nn.Module and one
source map, dispatched here so conversion, compilation and metadata share them.
"""
from __future__ import annotations

import importlib
from typing import Any

from speccompile.models.config import ConfigError, LlamaConfig, preset
from speccompile.models.quant_codec import QUANTIZATIONS, Quantization, get_quantization

__all__ = ["ConfigError", "LlamaConfig", "preset", "QUANTIZATIONS", "Quantization", "get_quantization",
           "MODELS", "HEAD_TYPES", "build_model", "config_from_dict", "source_map"]

# model_type -> (module, its nn.Module class, its source-map function as "module.function",
# its config class). The target families share one decoder (models/llama.py, switched by
# the config); ``eagle``, ``eagle3`` and ``medusa`` are
# draft heads (``convert_weight --model-type eagle`` picks eagle3 for an EAGLE-3 checkpoint).
# Named, not imported: converting a target never loads the head modules, nor TVM's compiler
# (the Llama source map and the quantization codec import no TVM; `convert_weight
# --layout-from` converts where only TVM's runtime is installed).
MODELS = {
    "llama": ("llama", "LlamaForCausalLM", "config.hf_source_map", None),
    "qwen2": ("llama", "LlamaForCausalLM", "config.hf_source_map", None),
    "qwen3": ("llama", "LlamaForCausalLM", "config.hf_source_map", None),
    "gemma3": ("llama", "LlamaForCausalLM", "config.hf_source_map", None),
    "phi3": ("llama", "LlamaForCausalLM", "config.hf_source_map", None),
    "eagle": ("eagle", "EagleHead", "eagle.source_map", "EagleConfig"),
    "eagle3": ("eagle3", "Eagle3Head", "eagle3.source_map", "Eagle3Config"),
    "medusa": ("medusa", "MedusaHeads", "medusa.source_map", "MedusaConfig"),
}
HEAD_TYPES = tuple(t for t, entry in MODELS.items() if entry[3] is not None)


def _member(model_type: str, index: int):
    if model_type not in MODELS:
        raise ConfigError(f"unknown model type {model_type!r}; choose one of {', '.join(MODELS)}")
    module = importlib.import_module(f"{__package__}.{MODELS[model_type][0]}")
    return getattr(module, MODELS[model_type][index])


def head_config_class(model_type: str):
    if model_type not in HEAD_TYPES:
        raise ConfigError(f"{model_type!r} is not a draft head type; choose one of {', '.join(HEAD_TYPES)}")
    return _member(model_type, 3)


def config_from_dict(model_type: str, data: dict[str, Any]):
    """The config object of a ``speccompile-config.json``'s ``model_config``."""
    if model_type in HEAD_TYPES:
        return head_config_class(model_type).from_dict(data)
    return LlamaConfig.from_dict(data)


def build_model(cfg, quant: Quantization, target=None):
    """Instantiate the nn.Module for a config."""
    return _member(cfg.model_type, 1)(cfg, quant, target)


def source_map(cfg) -> dict[str, list[str]]:
    """Logical parameter name -> checkpoint tensors concatenated on axis 0 to form it."""
    if cfg.model_type not in MODELS:
        raise ConfigError(f"unknown model type {cfg.model_type!r}; choose one of {', '.join(MODELS)}")
    module, name = MODELS[cfg.model_type][2].rsplit(".", 1)
    return getattr(importlib.import_module(f"{__package__}.{module}"), name)(cfg)
