"""Rendering a conversation from a declarative chat format, without Jinja.

``speccompile gen_config`` records under ``chat_format`` in speccompile-config.json what the
model's Jinja chat template emits, cut into fixed pieces (speccompile/compiler/chat_format.py
derives them and checks them against Jinja). Apps that embed the C++ runtime have no Jinja
engine: runtime/capi/src/chat_format.cc renders the same pieces the same way as this file, the
reference. The keys (all strings unless said):

- ``version``: 1.
- ``prefix``: text before everything (Llama 3's ``<|begin_of_text|>``).
- ``default_system``: the whole text the template emits in place of a system message when the
  conversation does not start with one ("" when it emits none).
- ``roles``: role -> ``{"begin", "end", "content"?}``: one message renders as begin + content +
  end. ``content`` says what the template does to the message's text: ``"raw"`` (the default),
  ``"trim"`` (Jinja's ``| trim``: Python ``str.strip()``) or ``"json"`` (``| tojson``: a quoted
  JSON string, as Llama 3.1 renders tool results). ``roles["system"]`` is a first message only.
- ``later_system``: optional, the same shape: a system message after the first. Absent where the
  template cannot place one there (it raises, or moves it elsewhere).
- ``tool_group``: optional ``{"begin", "end"}`` around each run of consecutive tool messages
  (Qwen2.5 puts one user turn around them).
- ``generation_prompt``: after the last message when a reply is to be generated.
- ``closing``: after the last message otherwise (Phi-3 appends its eos token; mostly "").

An empty conversation is refused: templates disagree about it and no app needs it.
"""
from __future__ import annotations

import json

FORMAT_VERSION = 1
CONTENT_MODES = ("raw", "trim", "json")


class ChatFormatError(ValueError):
    """A conversation the chat format cannot render as the model's template would."""


def render_content(mode: str, text: str) -> str:
    """The message text as the template emits it (see ``roles`` in the module docstring)."""
    if mode == "trim":
        return text.strip()  # Jinja's trim filter is str.strip(): Unicode whitespace
    if mode == "json":
        return json.dumps(text, ensure_ascii=False)  # runtime/tokenizer.py's tojson filter
    if mode == "raw":
        return text
    raise ChatFormatError(f"chat format content mode {mode!r} is not one of {', '.join(CONTENT_MODES)}")


def _checked(messages: list[dict]) -> list[tuple[str, str]]:
    """(role, content) pairs, or ChatFormatError naming the first message that cannot render."""
    if not messages:
        raise ChatFormatError("the conversation has no messages")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ChatFormatError(f"message {i} is not an object with a string 'role'")
        if m.get("tool_calls") is not None:
            raise ChatFormatError(f"message {i} has tool_calls, which the chat format cannot render "
                                  "(pass raw text, or use the Python runtime's Jinja template)")
        if not isinstance(m.get("content"), str):
            raise ChatFormatError(f"message {i} ({m['role']}) has content of type "
                                  f"{type(m.get('content')).__name__}: the chat format renders only text")
        out.append((m["role"], m["content"]))
    return out


def render_with_format(fmt: dict, messages: list[dict], add_generation_prompt: bool = True) -> str:
    """The conversation as the model's chat template renders it, from its ``chat_format``.

    A pure concatenation, so the C++ runtime does exactly the same (chat_format.cc)."""
    if fmt.get("version") != FORMAT_VERSION:
        raise ChatFormatError(f"chat format version {fmt.get('version')!r} is not {FORMAT_VERSION}: "
                              "rerun `speccompile gen_config`")
    msgs = _checked(messages)
    roles, group = fmt["roles"], fmt.get("tool_group")
    parts = [fmt["prefix"]]
    if msgs[0][0] != "system":
        parts.append(fmt["default_system"])
    for i, (role, content) in enumerate(msgs):
        if role == "system" and i > 0:
            piece = fmt.get("later_system")
            if piece is None:
                raise ChatFormatError(f"message {i} is a system message, which this model's template "
                                      "accepts only as the first message")
        elif role in roles:
            piece = roles[role]
        else:
            raise ChatFormatError(f"message {i} has role {role!r}, which this model's template does not "
                                  f"render (it renders {', '.join(sorted(roles))})")
        in_group = group is not None and role == "tool"
        if in_group and (i == 0 or msgs[i - 1][0] != "tool"):
            parts.append(group["begin"])
        parts += [piece["begin"], render_content(piece.get("content", "raw"), content), piece["end"]]
        if in_group and (i + 1 == len(msgs) or msgs[i + 1][0] != "tool"):
            parts.append(group["end"])
    parts.append(fmt["generation_prompt"] if add_generation_prompt else fmt.get("closing", ""))
    return "".join(parts)
