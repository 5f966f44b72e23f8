"""Build an HF ``tokenizer.json`` from GGUF tokenizer metadata (BPE / gpt2 family).

The pre-tokenizer follows llama.cpp's ``tokenizer.ggml.pre`` name so text splits the
same way as in the original HF tokenizer (tests compare against transformers).
"""
from __future__ import annotations

from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

# Qwen2 / llama-3 style split (GPT-4 regex, digits one at a time).
_QWEN2_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_LLAMA3_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

TOKEN_TYPE_CONTROL = 3
TOKEN_TYPE_USER_DEFINED = 4


class TokenizerBuildError(ValueError):
    pass


def _pre_tokenizer(pre: str | None):
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in (None, "default", "gpt2", "gpt-2"):
        return byte_level
    if pre == "smollm":
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    if pre in ("qwen2", "deepseek-r1-qwen"):
        regex = _QWEN2_REGEX
    elif pre in ("llama3", "llama-bpe", "smaug-bpe"):
        regex = _LLAMA3_REGEX
    else:
        raise TokenizerBuildError(
            f"GGUF pre-tokenizer {pre!r} is not supported; supported: gpt2, smollm, qwen2, llama-bpe. "
            "Convert from the HF folder (with tokenizer.json) instead."
        )
    return pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])


def tokenizer_from_gguf(fields: dict[str, Any]) -> Tokenizer:
    """fields: GGUF field name -> decoded value (tokens, merges, token types, ids)."""
    model = fields.get("tokenizer.ggml.model")
    if model != "gpt2":
        raise TokenizerBuildError(
            f"GGUF tokenizer model {model!r} is not supported (only byte-level BPE 'gpt2'); "
            "use an HF folder with tokenizer.json"
        )
    tokens: list[str] = list(fields["tokenizer.ggml.tokens"])
    merges = [tuple(m.split(" ", 1)) for m in fields.get("tokenizer.ggml.merges", [])]
    types = list(fields.get("tokenizer.ggml.token_type", [1] * len(tokens)))
    vocab = {t: i for i, t in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = _pre_tokenizer(fields.get("tokenizer.ggml.pre"))
    tok.decoder = decoders.ByteLevel()
    specials = [AddedToken(tokens[i], special=True, normalized=False)
                for i, t in enumerate(types) if t == TOKEN_TYPE_CONTROL]
    added = [AddedToken(tokens[i], special=False, normalized=False)
             for i, t in enumerate(types) if t == TOKEN_TYPE_USER_DEFINED]
    tok.add_special_tokens(specials)
    if added:
        tok.add_tokens(added)
    return tok
