"""GGUF files of the newer families, written here from tests/compiler/test_families.py's random
transformers models in llama.cpp's conventions, converted, and compared with transformers:

- Llama 3: q/k rows permuted as llama.cpp's converter permutes them, and the RoPE bands as its
  ``rope_freqs`` tensor (per-pair divisors) instead of ``rope_scaling``;
- Qwen3: ``attn_q_norm`` / ``attn_k_norm`` and ``attention.key_length``;
- Gemma 3: norms stored as ``1 + w``, llama.cpp's four norm names, the sliding window in the
  metadata (the local theta, the layer pattern and the query scale are llama.cpp's defaults).

Where transformers itself loads the file (its own GGUF reader), it gives the logits of the
original model: the files follow the conventions transformers reads too, not only ours.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from test_families import PROMPT, Family, make_hf_model

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")
gguf = pytest.importorskip("gguf")
pytestmark = [pytest.mark.tiny, pytest.mark.hf]


def _llama3_rope_freqs(params: dict, head_dim: int) -> np.ndarray:
    """llama.cpp's rope_freqs for Llama 3's bands: 1 (short wavelengths), factor (long), or the
    smooth divisor between."""
    base = 1.0 / (params["rope_theta"] ** (np.arange(0, head_dim, 2) / head_dim))
    old, low, high, factor = (params["original_max_position_embeddings"], params["low_freq_factor"],
                              params["high_freq_factor"], params["factor"])
    out = []
    for f in base:
        wavelen = 2 * math.pi / f
        if wavelen < old / high:
            out.append(1.0)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.asarray(out, np.float32)


def write_gguf(fam, path: Path) -> None:
    from speccompile.compiler.sources import _GGUF_GEMMA_NAMES, _GGUF_LAYER_NAMES

    cfg = fam.hf_model.config
    arch = {"llama": "llama", "qwen3": "qwen3", "gemma3_text": "gemma3"}[cfg.model_type]
    table = {v: k for k, v in (_GGUF_GEMMA_NAMES if arch == "gemma3" else _GGUF_LAYER_NAMES).items()}
    w = gguf.GGUFWriter(str(path), arch)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    w.add_uint32(f"{arch}.context_length", cfg.max_position_embeddings)
    w.add_uint32(f"{arch}.embedding_length", cfg.hidden_size)
    w.add_uint32(f"{arch}.block_count", cfg.num_hidden_layers)
    w.add_uint32(f"{arch}.feed_forward_length", cfg.intermediate_size)
    w.add_uint32(f"{arch}.attention.head_count", cfg.num_attention_heads)
    w.add_uint32(f"{arch}.attention.head_count_kv", cfg.num_key_value_heads)
    w.add_uint32(f"{arch}.attention.key_length", head_dim)
    w.add_uint32(f"{arch}.vocab_size", cfg.vocab_size)
    w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", cfg.rms_norm_eps)
    rope = cfg.rope_parameters.get("full_attention", cfg.rope_parameters)
    w.add_float32(f"{arch}.rope.freq_base", rope["rope_theta"])
    if arch == "gemma3":
        w.add_uint32(f"{arch}.attention.sliding_window", cfg.sliding_window)
    tok = json.loads((fam.hf_dir / "tokenizer.json").read_text())
    vocab = sorted(tok["model"]["vocab"].items(), key=lambda kv: kv[1]) + [
        (t["content"], t["id"]) for t in tok["added_tokens"]]
    w.add_string("tokenizer.ggml.model", "gpt2")
    w.add_array("tokenizer.ggml.tokens", [t for t, _ in vocab])
    w.add_array("tokenizer.ggml.token_type", [1] * (len(vocab) - len(tok["added_tokens"])) + [3] * len(tok["added_tokens"]))
    w.add_array("tokenizer.ggml.merges", [])
    w.add_uint32("tokenizer.ggml.bos_token_id", 256)
    w.add_uint32("tokenizer.ggml.eos_token_id", 257)
    w.add_string("tokenizer.chat_template", json.loads((fam.hf_dir / "tokenizer_config.json").read_text())["chat_template"])
    if rope.get("rope_type") == "llama3":
        w.add_tensor("rope_freqs.weight", _llama3_rope_freqs(rope, head_dim))
    for name, t in fam.hf_model.state_dict().items():
        a = t.detach().float().numpy().copy()
        if arch == "gemma3" and name.endswith("norm.weight"):
            a = a + np.float32(1)
        if arch == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):  # llama.cpp's permute
            heads = cfg.num_attention_heads if "q_proj" in name else cfg.num_key_value_heads
            a = a.reshape(heads, 2, a.shape[0] // heads // 2, *a.shape[1:]).swapaxes(1, 2).reshape(a.shape)
        if name == "model.embed_tokens.weight":
            out = "token_embd.weight"
        elif name == "model.norm.weight":
            out = "output_norm.weight"
        elif name == "lm_head.weight":
            if cfg.tie_word_embeddings:
                continue
            out = "output.weight"
        else:
            _, _, i, *rest = name.split(".")
            out = f"blk.{i}.{table['.'.join(rest[:-1])]}.{rest[-1]}"
        w.add_tensor(out, np.ascontiguousarray(a))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.mark.parametrize("name", ["llama3", "qwen3", "gemma3"])
def test_gguf_of_each_family_gives_transformers_logits(name, tmp_path_factory):
    from speccompile.compiler.compile import compile_model
    from speccompile.compiler.convert_weight import convert_weight
    from speccompile.compiler.gen_config import gen_config
    from speccompile.runtime.model import Model

    root = tmp_path_factory.mktemp(f"gguf-{name}")
    overrides = {}
    if name == "gemma3":  # llama.cpp's layer pattern (every sixth layer global) is implied: six layers;
        # the query scale is head_dim, as llama.cpp assumes below 27B -- and 256, transformers' default
        overrides = dict(num_hidden_layers=6, layer_types=None, vocab_size=512, head_dim=256, query_pre_attn_scalar=256)
    fam = Family(name, make_hf_model(name, root / "hf", **overrides), root / "hf", None, None)
    path = root / f"{name}.gguf"
    write_gguf(fam, path)
    out = root / "from-gguf"
    convert_weight(path, "q0f32", out, progress=False)
    gen_config(path, "q0f32", out)
    lib = root / "from-gguf.so"
    compile_model(out / "speccompile-config.json", "llvm", lib, verbose=False)
    model = Model(out, lib)
    kv = model.create_kv_cache(256)
    kv.add_sequence(0)
    ours = model.forward(kv, [0], [PROMPT])
    ref = fam.hf_logits(PROMPT)
    assert np.abs(ours - ref).max() < 1e-4, float(np.abs(ours - ref).max())
    if name == "gemma3":  # transformers' own GGUF reader agrees on the file's conventions
        theirs = transformers.AutoModelForCausalLM.from_pretrained(str(root), gguf_file=path.name,
                                                                   dtype=torch.float32).eval()
        with torch.no_grad():
            logits = theirs(torch.tensor([PROMPT])).logits[0].numpy()
        assert np.abs(logits - ref).max() < 1e-4
