"""Model architectures (compiler side: imports the TVM compiler)."""
from .config import ConfigError, LlamaConfig, preset
from .quantization import QUANTIZATIONS, Quantization, get_quantization

__all__ = ["ConfigError", "LlamaConfig", "preset", "QUANTIZATIONS", "Quantization", "get_quantization",
           "MODELS", "build_model"]

MODELS = {"llama": "LlamaForCausalLM", "qwen2": "LlamaForCausalLM"}


def build_model(cfg: LlamaConfig, quant: Quantization, target=None):
    """Instantiate the nn.Module for a config (Qwen2 is Llama with QKV bias)."""
    from .llama import LlamaForCausalLM

    return LlamaForCausalLM(cfg, quant, target)
