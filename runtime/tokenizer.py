"""Tokenizer and chat-template rendering for the runtime (no compiler imports).

The chat template is rendered the way HF ``apply_chat_template`` does: jinja2 with
``trim_blocks``/``lstrip_blocks``, a ``raise_exception`` helper and a ``tojson`` filter.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer


class TokenizerError(ValueError):
    pass


def load_tokenizer(model_dir: Path) -> Tokenizer:
    path = Path(model_dir) / "tokenizer.json"
    if not path.exists():
        raise TokenizerError(f"{path} not found: run `speccompile gen_config SRC -o {model_dir}` to write it")
    try:
        return Tokenizer.from_file(str(path))
    except Exception as err:  # noqa: BLE001 - tokenizers raises plain Exceptions
        raise TokenizerError(f"{path} cannot be loaded: {err}") from err


def render_messages(config: dict, messages: list[dict], tools: list[dict] | None = None) -> str:
    """A model's chat template (its ``speccompile-config.json``: ``config``) applied to these
    messages, ready for generation: what the engine tokenizes, and what bench hands to
    llama.cpp so that both decode the same text. ``tools``: OpenAI function definitions."""
    extra = {"tools": [{"type": "function", "function": f} for f in tools]} if tools else {}
    return render_chat(config["chat_template"], messages, add_generation_prompt=True,
                       bos_token=config.get("bos_token") or "", eos_token=config.get("eos_token") or "", **extra)


def render_chat(template: str, messages: list[dict[str, str]], add_generation_prompt: bool = True,
                **special: Any) -> str:
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(msg: str) -> None:
        raise jinja2.exceptions.TemplateError(msg)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = lambda x, indent=None, ensure_ascii=False: json.dumps(
        x, indent=indent, ensure_ascii=ensure_ascii)
    env.globals["raise_exception"] = raise_exception
    return env.from_string(template).render(messages=messages, add_generation_prompt=add_generation_prompt,
                                            **special)


class StreamDecoder:
    """Turns a growing token list into text deltas without splitting UTF-8 characters.

    Only a short window is re-decoded per push (tokens since the last emitted text plus
    a few before it, for context-dependent spacing), so the cost per token stays flat."""

    CONTEXT = 4

    def __init__(self, tokenizer: Tokenizer, skip_special: bool = True):
        self.tok, self.skip, self.ids, self.text = tokenizer, skip_special, [], ""
        self.start = 0  # ids[start:] have not all been turned into text yet

    def push(self, ids: list[int]) -> str:
        self.ids.extend(ids)
        ctx = max(0, self.start - self.CONTEXT)
        prefix = self.tok.decode(self.ids[ctx:self.start], skip_special_tokens=self.skip)
        window = self.tok.decode(self.ids[ctx:], skip_special_tokens=self.skip)
        if window.endswith("\ufffd") or not window.startswith(prefix):
            return ""  # wait for the rest of a multi-byte character
        delta = window[len(prefix):]
        self.text += delta
        self.start = len(self.ids)
        return delta
