"""``speccompile gen_config``: write ``speccompile-config.json`` and the tokenizer files.

The config holds everything the runtime needs besides weights and library: the model
config, quantization, context window, special token ids, sampling defaults and the chat
template (rendered later exactly like HF ``apply_chat_template``). A draft head (eagle,
medusa) gets a config without tokenizer or template -- it runs on its target's tokens --
whose sizes and context window come from the target given with ``--target``.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from speccompile.models import get_quantization
from speccompile.runtime.contract import MODEL_CONFIG_FILE
from speccompile.compiler.sources import GGUFSource, HeadSource, SourceError, gguf_field_value

# end-of-turn and end-of-text tokens of ChatML/Qwen, Llama 3 (eot, eom), Llama 2/Mistral, Gemma, Phi
STOP_TOKEN_TEXTS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|eom_id|>", "<|end_of_text|>", "</s>",
                    "<end_of_turn>", "<|end|>")

# Named templates for --conv-template (auto takes the checkpoint's own).
CONV_TEMPLATES = {
    "chatml": (
        "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content']"
        " + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
    ),
    "raw": "{% for message in messages %}{{ message['content'] }}{% endfor %}",
}


def gen_config(src: Path, quantization: str, out_dir: Path, conv_template: str = "auto",
               context_window_size: int | None = None, prefill_chunk_size: int | None = None,
               max_batch_size: int = 8, target: Path | None = None, model_type: str = "auto",
               config_overrides: dict | None = None) -> Path:
    """``config_overrides``: head config fields (Medusa sizes) as ``convert_weight`` got them."""
    quant = get_quantization(quantization)
    from speccompile.compiler.convert_weight import open_any

    source = open_any(Path(src), model_type, target, config_overrides)
    if isinstance(source, HeadSource):
        return _gen_head_config(source, quant.name, Path(out_dir), context_window_size, prefill_chunk_size)
    if conv_template not in ("auto", *CONV_TEMPLATES):
        raise SourceError(f"unknown --conv-template {conv_template!r}; choose auto, {', '.join(CONV_TEMPLATES)}")
    cfg = source.config
    if context_window_size:
        if context_window_size <= 0:
            raise SourceError("--context-window-size must be positive")
        limit = cfg.rope_context_limit()
        if limit and context_window_size > limit:
            raise SourceError(f"--context-window-size {context_window_size} is past this model's LongRoPE short-factor "
                              f"range ({limit} tokens, its original_max_position_embeddings); use at most {limit}")
        cfg.context_window_size = context_window_size
    if prefill_chunk_size:
        cfg.prefill_chunk_size = prefill_chunk_size
    cfg.prefill_chunk_size = min(cfg.prefill_chunk_size, cfg.context_window_size)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)

    if isinstance(source, GGUFSource):
        tok_info = _tokenizer_from_gguf(source, out_dir)
    else:
        tok_info = _tokenizer_from_hf(Path(src), out_dir)
    template = tok_info.pop("chat_template")
    if conv_template != "auto":
        template = CONV_TEMPLATES[conv_template]
    elif template is None:
        raise SourceError(f"{src} has no chat template; pass --conv-template chatml or raw")

    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(out_dir / "tokenizer.json"))
    if tok.get_vocab_size() > cfg.vocab_size:
        raise SourceError(f"tokenizer has {tok.get_vocab_size()} tokens but the model vocab is {cfg.vocab_size}")
    # what the C++ runtime renders conversations from (it has no Jinja): runtime/chat_format.py
    from speccompile.compiler.chat_format import derive_chat_format

    chat_format, chat_format_error = derive_chat_format(template, tok_info.get("bos_token"), tok_info.get("eos_token"))
    stop_ids = list(cfg.eos_token_id)
    generation = Path(src) / "generation_config.json"  # where Gemma and Llama 3 list their end-of-turn ids
    if generation.is_file():
        eos = json.loads(generation.read_text()).get("eos_token_id")
        for tid in [] if eos is None else [eos] if isinstance(eos, int) else eos:
            if isinstance(tid, int) and 0 <= tid < cfg.vocab_size and tid not in stop_ids:
                stop_ids.append(tid)
    for text in STOP_TOKEN_TEXTS:
        tid = tok.token_to_id(text)
        if tid is not None and tid not in stop_ids:
            stop_ids.append(tid)
    conf: dict[str, Any] = {
        "model_type": cfg.model_type,
        "quantization": quant.name,
        "model_config": cfg.to_dict(),
        "vocab_size": cfg.vocab_size,
        "context_window_size": cfg.context_window_size,
        "prefill_chunk_size": cfg.prefill_chunk_size,
        "max_batch_size": max_batch_size,
        "conv_template": conv_template,
        "chat_template": template,
        "chat_format": chat_format,
        **({"chat_format_error": chat_format_error} if chat_format is None else {}),
        "tokenizer_files": ["tokenizer.json"],
        "bos_token_id": cfg.bos_token_id,
        "eos_token_id": cfg.eos_token_id,
        "stop_token_ids": stop_ids,
        "temperature": 0.0,
        "top_p": 1.0,
        "top_k": 0,
        **tok_info,
    }
    path = out_dir / MODEL_CONFIG_FILE
    path.write_text(json.dumps(conf, indent=1))
    return path


def _gen_head_config(source: HeadSource, quant_name: str, out_dir: Path, context_window_size: int | None,
                     prefill_chunk_size: int | None) -> Path:
    cfg = source.config
    layer = getattr(cfg, "layer", cfg)  # EAGLE keeps its window in its decoder config
    if context_window_size:
        if context_window_size <= 0:
            raise SourceError("--context-window-size must be positive")
        layer.context_window_size = context_window_size
    if prefill_chunk_size:
        layer.prefill_chunk_size = prefill_chunk_size
    layer.prefill_chunk_size = min(layer.prefill_chunk_size, layer.context_window_size)
    out_dir.mkdir(parents=True, exist_ok=True)
    conf = {"model_type": cfg.model_type, "quantization": quant_name, "model_config": cfg.to_dict(),
            "vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size,
            "context_window_size": cfg.context_window_size, "prefill_chunk_size": cfg.prefill_chunk_size,
            "target": str(Path(source.target_path).resolve())}
    path = out_dir / MODEL_CONFIG_FILE
    path.write_text(json.dumps(conf, indent=1))
    return path


def _tokenizer_from_gguf(source: GGUFSource, out_dir: Path) -> dict[str, Any]:
    fields = {k: gguf_field_value(f) for k, f in source.fields.items() if k.startswith("tokenizer.")}
    if "tokenizer.ggml.tokens" not in fields:
        raise SourceError(f"{source.path} has no tokenizer in its metadata")
    return tokenizer_from_gguf_fields(fields, out_dir)


def tokenizer_from_gguf_fields(fields: dict[str, Any], out_dir: Path) -> dict[str, Any]:
    """Writes ``out_dir/tokenizer.json`` from a GGUF's ``tokenizer.*`` fields (name -> value);
    returns the chat template and the special tokens the config records."""
    from speccompile.compiler.gguf_tokenizer import tokenizer_from_gguf

    tok = tokenizer_from_gguf(fields)
    tok.save(str(out_dir / "tokenizer.json"))
    tokens = fields["tokenizer.ggml.tokens"]

    def text(key: str) -> str | None:
        i = fields.get(key)
        return tokens[i] if isinstance(i, int) and 0 <= i < len(tokens) else None

    return {"chat_template": fields.get("tokenizer.chat_template"),
            "add_bos_token": bool(fields.get("tokenizer.ggml.add_bos_token", False)),
            "bos_token": text("tokenizer.ggml.bos_token_id"), "eos_token": text("tokenizer.ggml.eos_token_id")}


def _tokenizer_from_hf(folder: Path, out_dir: Path) -> dict[str, Any]:
    tj = folder / "tokenizer.json"
    if not tj.exists():
        raise SourceError(f"{tj} not found: the HF folder needs tokenizer.json (a fast tokenizer)")
    if folder.resolve() != out_dir.resolve():
        shutil.copy(tj, out_dir / "tokenizer.json")
    info: dict[str, Any] = {"chat_template": None, "add_bos_token": False, "bos_token": None, "eos_token": None}
    tc = folder / "tokenizer_config.json"
    if tc.exists():
        data = json.loads(tc.read_text())
        if folder.resolve() != out_dir.resolve():
            shutil.copy(tc, out_dir / "tokenizer_config.json")
        info["chat_template"] = data.get("chat_template")
        info["add_bos_token"] = bool(data.get("add_bos_token", False))
        for key in ("bos_token", "eos_token"):
            val = data.get(key)
            info[key] = val.get("content") if isinstance(val, dict) else val
    jinja = folder / "chat_template.jinja"
    if info["chat_template"] is None and jinja.exists():
        info["chat_template"] = jinja.read_text()
    return info
