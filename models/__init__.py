"""Model architectures (compiler side: imports the TVM compiler).

Targets are Llama-family decoders; ``eagle`` and ``medusa`` are draft heads that run on a
target's hidden states. Every model type has one config class, one nn.Module and one
source map, dispatched here so conversion, compilation and metadata share them.
"""
from __future__ import annotations

from typing import Any

from .config import ConfigError, LlamaConfig, preset
from .quantization import QUANTIZATIONS, Quantization, get_quantization

__all__ = ["ConfigError", "LlamaConfig", "preset", "QUANTIZATIONS", "Quantization", "get_quantization",
           "MODELS", "HEAD_TYPES", "build_model", "config_from_dict", "source_map"]

MODELS = {"llama": "LlamaForCausalLM", "qwen2": "LlamaForCausalLM", "eagle": "EagleHead", "medusa": "MedusaHeads"}
HEAD_TYPES = ("eagle", "medusa")


def head_config_class(model_type: str):
    if model_type == "eagle":
        from .eagle import EagleConfig

        return EagleConfig
    if model_type == "medusa":
        from .medusa import MedusaConfig

        return MedusaConfig
    raise ConfigError(f"{model_type!r} is not a draft head type; choose one of {', '.join(HEAD_TYPES)}")


def config_from_dict(model_type: str, data: dict[str, Any]):
    """The config object of a ``speccompile-config.json``'s ``model_config``."""
    if model_type in HEAD_TYPES:
        return head_config_class(model_type).from_dict(data)
    return LlamaConfig.from_dict(data)


def build_model(cfg, quant: Quantization, target=None):
    """Instantiate the nn.Module for a config (Qwen2 is Llama with QKV bias)."""
    if cfg.model_type == "eagle":
        from .eagle import EagleHead

        return EagleHead(cfg, quant, target)
    if cfg.model_type == "medusa":
        from .medusa import MedusaHeads

        return MedusaHeads(cfg, quant, target)
    from .llama import LlamaForCausalLM

    return LlamaForCausalLM(cfg, quant, target)


def source_map(cfg) -> dict[str, list[str]]:
    """Logical parameter name -> checkpoint tensors concatenated on axis 0 to form it."""
    if cfg.model_type == "eagle":
        from .eagle import source_map as eagle_map

        return eagle_map(cfg)
    if cfg.model_type == "medusa":
        from .medusa import source_map as medusa_map

        return medusa_map(cfg)
    from .llama import hf_source_map

    return hf_source_map(cfg)
