"""Tool calls (OpenAI ``tools`` / ``tool_choice``) in the Hermes format Qwen2.5 and most
open chat models are trained on: the model answers ``<tool_call>\\n{"name": ..., "arguments":
{...}}\\n</tool_call>`` blocks, which become OpenAI ``tool_calls``.

- The tools are rendered by the model's chat template where it has a tools section (its
  ``tools`` variable, as HF ``apply_chat_template(tools=...)`` passes it). Where it has none,
  the same instructions go into the system message (``fallback_system``): a model not
  trained on tools may still follow them, and ``required`` / a named function force it.
- ``tool_choice``: ``none`` renders no tools (the model answers in text); ``auto`` lets the
  model choose and parses what it wrote; ``required`` and ``{"type": "function", "function":
  {"name": ...}}`` constrain the answer with a grammar (runtime/grammar.py) to one or more
  (``required``) or exactly one (named) call whose arguments match the function's
  ``parameters`` schema -- inside verification, so speculation stays lossless.
"""
from __future__ import annotations

import json
import re
import uuid

from .grammar import GrammarError

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(re.escape(OPEN) + r"\s*(.*?)\s*" + re.escape(CLOSE), re.S)


def check_tools(tools: list | None, tool_choice) -> list[dict]:
    """The function definitions, validated; raises GrammarError naming the bad field."""
    functions = []
    for i, tool in enumerate(tools or []):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(fn, dict):
            raise GrammarError("each tool must be {\"type\": \"function\", \"function\": {\"name\", \"parameters\"}}",
                               f"tools.{i}")
        if not isinstance(fn.get("name"), str) or not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", fn["name"]):
            raise GrammarError("a function name is 1-64 letters, digits, '_', '.' or '-'", f"tools.{i}.function.name")
        params = fn.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(params, dict):
            raise GrammarError("'parameters' must be a JSON schema object", f"tools.{i}.function.parameters")
        functions.append({**fn, "parameters": params})
    names = [f["name"] for f in functions]
    if len(set(names)) != len(names):
        raise GrammarError("function names must be unique", "tools")
    name = chosen_name(tool_choice)
    if tool_choice not in (None, "none", "auto", "required") and name is None:
        raise GrammarError("tool_choice is 'none', 'auto', 'required' or {\"type\": \"function\", "
                           "\"function\": {\"name\": ...}}", "tool_choice")
    if (name is not None or tool_choice == "required") and not functions:
        raise GrammarError("tool_choice asks for a call but no tools are given", "tool_choice")
    if name is not None and name not in names:
        raise GrammarError(f"tool_choice names '{name}', which is not among the tools ({', '.join(names)})",
                           "tool_choice")
    return functions


def chosen_name(tool_choice) -> str | None:
    if isinstance(tool_choice, dict) and tool_choice.get("type") == "function":
        fn = tool_choice.get("function")
        return fn.get("name") if isinstance(fn, dict) else None
    return None


def fallback_system(functions: list[dict]) -> str:
    """The tool instructions for a chat template without a tools section."""
    listed = "\n".join(json.dumps({"type": "function", "function": f}) for f in functions)
    return ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
            f"You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{listed}\n</tools>\n\n"
            "For each function call, return a json object with function name and arguments within "
            f"{OPEN}{CLOSE} XML tags:\n{OPEN}\n{{\"name\": <function-name>, \"arguments\": <args-json-object>}}\n{CLOSE}")


def template_messages(messages: list[dict], functions: list[dict], template_has_tools: bool) -> list[dict]:
    """Messages for the chat template: OpenAI tool calls with their arguments as objects (what
    templates print with ``tojson``), and for a template without tools the instructions
    prepended to the system message."""
    out = []
    for m in messages:
        m = dict(m)
        if m.get("tool_calls"):
            m["tool_calls"] = [{**c, "function": {**c["function"], "arguments": _arguments(c["function"])}}
                               for c in m["tool_calls"]]
            if not template_has_tools:  # the template prints content only: show the calls as text
                calls = "\n".join(f"{OPEN}\n{json.dumps(c['function'])}\n{CLOSE}" for c in m.pop("tool_calls"))
                m["content"] = ((m.get("content") or "") + "\n" + calls).strip()
        if m.get("content") is None:
            m["content"] = ""
        if m["role"] == "tool" and not template_has_tools:
            m = {"role": "user", "content": f"<tool_response>\n{m['content']}\n</tool_response>"}
        out.append(m)
    if functions and not template_has_tools:
        system = fallback_system(functions)
        if out and out[0]["role"] == "system":
            out[0] = {**out[0], "content": out[0]["content"] + "\n\n" + system}
        else:
            out.insert(0, {"role": "system", "content": system})
    return out


def _arguments(fn: dict):
    args = fn.get("arguments", {})
    if isinstance(args, str):
        try:
            return json.loads(args)
        except ValueError:
            return args
    return args


def call_grammar(functions: list[dict], tool_choice, tag_token) -> str | None:
    """The llguidance Lark grammar a forcing ``tool_choice`` puts on the answer, or None.
    ``tag_token(text)``: the token id of a tag that is one special token of the tokenizer
    (written ``<[id]>`` in the grammar: its bytes do not count as text there), else None."""
    name = chosen_name(tool_choice)
    if tool_choice != "required" and name is None:
        return None
    chosen = [f for f in functions if name is None or f["name"] == name]
    call = {"anyOf": [{"type": "object", "additionalProperties": False, "required": ["name", "arguments"],
                       "properties": {"name": {"const": f["name"]}, "arguments": f["parameters"]}} for f in chosen]}

    def tag(text: str) -> str:
        tid = tag_token(text)
        return f"<[{tid}]>" if tid is not None else json.dumps(text)

    repeat = "+" if name is None else ""
    return (f"start: call{repeat}\n"
            f"call: {tag(OPEN)} \"\\n\" %json {json.dumps(call)} \"\\n\" {tag(CLOSE)} \"\\n\"?\n")


def parse_calls(text: str, functions: list[dict]) -> tuple[str | None, list[dict]]:
    """(the text outside tool-call blocks, or None when empty; OpenAI ``tool_calls``) of an
    answer. A block that is not a JSON call of a known function stays in the text."""
    names = {f["name"] for f in functions}
    calls, kept, at = [], [], 0
    for m in _BLOCK.finditer(text):
        try:
            obj = json.loads(m.group(1))
        except ValueError:
            continue
        if not isinstance(obj, dict) or obj.get("name") not in names:
            continue
        kept.append(text[at: m.start()])
        at = m.end()
        calls.append({"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                      "function": {"name": obj["name"], "arguments": json.dumps(obj.get("arguments", {}))}})
    kept.append(text[at:])
    content = "".join(kept).strip()
    return (content or None), calls


def held_back(text: str) -> int:
    """Where streamed text must stop while tools are offered: at a tool-call block, or at
    a tail that may become one (``<tool`` ...)."""
    at = text.find(OPEN)
    if at >= 0:
        return at
    for k in range(min(len(OPEN) - 1, len(text)), 0, -1):
        if OPEN.startswith(text[-k:]):
            return len(text) - k
    return len(text)
