"""The chat format gen_config records (runtime/chat_format.py, speccompile/compiler/chat_format.py,
runtime/capi/src/chat_format.cc) renders every conversation exactly as the Jinja template does.

The model-family templates below are written from those families' published template behaviour
(Llama 3 / 3.1, Phi-3 / 3.5 / 4, Mistral v0.1 / v0.3, Qwen2.5); the real SmolLM2 and Qwen2.5-Coder
templates come from their GGUF metadata (real_model tier: fetch_tokenizer downloads ~50 MB once).
"""
from __future__ import annotations

import functools
import json
import random
import shutil
import subprocess
from pathlib import Path

import pytest

from speccompile.compiler.chat_format import derive_chat_format
from speccompile.compiler.gen_config import CONV_TEMPLATES, gen_config
from speccompile.runtime.chat_format import ChatFormatError, render_with_format
from speccompile.runtime.tokenizer import render_chat

LLAMA3 = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + "
    "message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}")
LLAMA31 = r"""{{- bos_token }}
{%- if not date_string is defined %}
    {%- set date_string = "26 Jul 2024" %}
{%- endif %}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{{- "Cutting Knowledge Date: December 2023\n" }}
{{- "Today Date: " + date_string + "\n\n" }}
{{- system_message }}
{{- "<|eot_id|>" }}
{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- elif message.role == "tool" or message.role == "ipython" %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\n\n" }}
        {%- if message.content is mapping or message.content is iterable %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
"""
PHI3 = ("{% for message in messages %}{% if message['role'] == 'system' %}{{'<|system|>\\n' + message['content'] + "
        "'<|end|>\\n'}}{% elif message['role'] == 'user' %}{{'<|user|>\\n' + message['content'] + '<|end|>\\n'}}"
        "{% elif message['role'] == 'assistant' %}{{'<|assistant|>\\n' + message['content'] + '<|end|>\\n'}}{% endif %}"
        "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% else %}{{ eos_token }}{% endif %}")
PHI35 = PHI3.replace("message['role'] == 'system' %}", "message['role'] == 'system' and message['content'] %}")
PHI4 = ("{% for message in messages %}{% if (message['role'] == 'system') %}{{'<|im_start|>system<|im_sep|>' + "
        "message['content'] + '<|im_end|>'}}{% elif (message['role'] == 'user') %}{{'<|im_start|>user<|im_sep|>' + "
        "message['content'] + '<|im_end|>'}}{% elif (message['role'] == 'assistant') %}{{'<|im_start|>assistant<|im_sep|>'"
        " + message['content'] + '<|im_end|>'}}{% endif %}{% endfor %}{% if add_generation_prompt %}"
        "{{ '<|im_start|>assistant<|im_sep|>' }}{% endif %}")
MISTRAL = ("{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
           "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
           "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
           "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}"
           "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}")
MISTRAL_V3 = r"""{%- if messages[0]["role"] == "system" %}
    {%- set system_message = messages[0]["content"] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}
{{- bos_token }}
{%- for message in loop_messages %}
    {%- if (message["role"] == "user") != (loop.index0 % 2 == 0) %}
        {{- raise_exception("After the optional system message, conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif %}
    {%- if message["role"] == "user" %}
        {%- if loop.last and system_message is defined %}
            {{- "[INST] " + system_message + "\n\n" + message["content"] + "[/INST]" }}
        {%- else %}
            {{- "[INST] " + message["content"] + "[/INST]" }}
        {%- endif %}
    {%- elif message["role"] == "assistant" %}
        {{- " " + message["content"]|trim + eos_token}}
    {%- else %}
        {{- raise_exception("Only user and assistant roles are supported, with the exception of an initial optional system message!") }}
    {%- endif %}
{%- endfor %}
"""
# Qwen2.5's template without its tools section: a user turn wraps each run of tool messages.
QWEN_LIKE = r"""{%- if messages[0]['role'] == 'system' %}
    {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
{%- else %}
    {{- '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant") %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""
# ChatML that refuses a system message after the first: its format cannot place one there.
SYSTEM_FIRST = ("{% for m in messages %}{% if m['role'] == 'system' and not loop.first %}"
                "{{ raise_exception('System message must be first') }}{% endif %}"
                "<|im_start|>{{ m['role'] }}\\n{{ m['content'] }}<|im_end|>\\n{% endfor %}"
                "{% if add_generation_prompt %}<|im_start|>assistant\\n{% endif %}")

# name -> (template, bos_token, eos_token)
EXPRESSIBLE = {
    "chatml": (CONV_TEMPLATES["chatml"], None, None),
    "raw": (CONV_TEMPLATES["raw"], None, None),
    "llama3": (LLAMA3, "<|begin_of_text|>", "<|eot_id|>"),
    "llama3.1": (LLAMA31, "<|begin_of_text|>", "<|eot_id|>"),
    "phi3": (PHI3, "<s>", "<|endoftext|>"),
    "phi4": (PHI4, "<|endoftext|>", "<|im_end|>"),
    "mistral": (MISTRAL, "<s>", "</s>"),
    "qwen-like": (QWEN_LIKE, None, "<|im_end|>"),
    "system-first": (SYSTEM_FIRST, None, None),
}
NOT_EXPRESSIBLE = {  # name -> (template, bos, eos, words the reason has)
    "mistral-v0.3": (MISTRAL_V3, "<s>", "</s>", "the start of a user message"),  # system moved into the last user turn
    "phi3.5": (PHI35, "<s>", "<|endoftext|>", "[system: '']"),  # an empty system message is dropped
}
AWKWARD = ["", " ", "hi", "  padded  ", "\nnewlines\ninside\n", "\t\u3000\u00a0unicode spaces\u2009\n",
           "héllo — 世界 🎉", "<|im_start|>user\nnot a turn<|im_end|>\n", "[INST] x [/INST]",
           '{"a": "q\\"b\\\\"}', "\x0bctl\x1f", "</s><s>"]
REAL_MODELS = ("SmolLM2-135M-Instruct", "Qwen2.5-Coder-1.5B-Instruct")


@functools.lru_cache(maxsize=None)
def _derived(name: str) -> str:
    template, bos, eos = EXPRESSIBLE[name]
    fmt, why = derive_chat_format(template, bos, eos)
    assert why is None and fmt is not None, why
    return json.dumps(fmt)


def derive(name: str) -> dict:
    """The format of EXPRESSIBLE[name], derived once (Jinja compiles the template on every render)."""
    return json.loads(_derived(name))


def conversations(fmt: dict, seed: int, n: int = 260) -> list[list[dict]]:
    """Chats the format can render: an optional system message, 1-6 user turns with replies (the
    last one may be missing), runs of 1-3 tool results after a reply, now and then a later
    system message; contents from AWKWARD, alone or glued together."""
    rng = random.Random(seed)
    roles = fmt["roles"]

    def text() -> str:
        return "".join(rng.choice(AWKWARD) for _ in range(rng.choice((1, 1, 2, 3))))

    out = []
    for _ in range(n):
        shape = ["system"] if "system" in roles and rng.random() < 0.5 else []
        turns = rng.randint(1, 6)
        for turn in range(turns):
            if turn and "later_system" in fmt and rng.random() < 0.1:
                shape.append("system")
            shape.append("user")
            if rng.random() < (0.5 if turn == turns - 1 else 0.95):  # some user turns in a row (Mistral refuses)
                shape.append("assistant")
                if "tool" in roles and rng.random() < 0.4:
                    shape += ["tool"] * rng.randint(1, 3) + (["assistant"] if rng.random() < 0.7 else [])
        out.append([{"role": r, "content": text()} for r in shape])
    return out


def check_like_jinja(fmt: dict, template: str, bos: str | None, eos: str | None, seed: int) -> None:
    accepted = 0
    for msgs in conversations(fmt, seed):
        for gen in (False, True):
            try:
                want = render_chat(template, msgs, add_generation_prompt=gen, bos_token=bos or "", eos_token=eos or "")
            except Exception:  # noqa: BLE001 - a conversation the template refuses: not the format's business
                continue
            assert render_with_format(fmt, msgs, gen) == want, (msgs, gen)
            accepted += 1
    assert accepted >= 400, f"only {accepted} renders to compare: the generator misses the template"


@pytest.mark.parametrize("name", list(EXPRESSIBLE))
def test_derived_format_renders_like_jinja(name):
    template, bos, eos = EXPRESSIBLE[name]
    check_like_jinja(derive(name), template, bos, eos, seed=sum(map(ord, name)))


def test_the_pieces_of_known_templates():
    """What each family's quirks became (the check above only says the whole matches)."""
    llama3, llama31, phi3, mistral = derive("llama3"), derive("llama3.1"), derive("phi3"), derive("mistral")
    assert llama3["prefix"] == "<|begin_of_text|>" and llama3["default_system"] == ""
    assert all(p["content"] == "trim" for p in llama3["roles"].values())
    assert llama31["default_system"].startswith("<|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge")
    assert llama31["roles"]["system"]["begin"] != llama31["later_system"]["begin"]  # the first one carries the date
    assert llama31["roles"]["tool"] == {"begin": "<|start_header_id|>ipython<|end_header_id|>\n\n", "end": "<|eot_id|>",
                                        "content": "json"}
    assert (phi3["closing"], phi3["roles"]["user"]["end"]) == ("<|endoftext|>", "<|end|>\n")  # not "<|end|>\n<|"
    assert "tool" not in phi3["roles"]  # the template drops tool messages: the format refuses them
    assert set(mistral["roles"]) == {"user", "assistant"} and mistral["prefix"] == "<s>"
    assert derive("qwen-like")["tool_group"] == {"begin": "<|im_start|>user", "end": "<|im_end|>\n"}
    assert "later_system" not in derive("system-first") and "tool_group" not in derive("chatml")


@pytest.mark.real_model
@pytest.mark.parametrize("model", REAL_MODELS)
def test_real_templates(model):
    from speccompile.compiler.fetch import fetch_tokenizer

    tc = json.loads((fetch_tokenizer(model, quiet=True) / "tokenizer_config.json").read_text())
    fmt, why = derive_chat_format(tc["chat_template"], tc["bos_token"], tc["eos_token"])
    assert why is None, why
    assert fmt["default_system"].startswith("<|im_start|>system\nYou are")
    assert fmt["default_system"].endswith("<|im_end|>\n")
    if model.startswith("Qwen"):
        assert fmt["tool_group"] == {"begin": "<|im_start|>user", "end": "<|im_end|>\n"}
        assert fmt["roles"]["tool"] == {"begin": "\n<tool_response>\n", "end": "\n</tool_response>"}
    check_like_jinja(fmt, tc["chat_template"], tc["bos_token"], tc["eos_token"], seed=len(model))


@pytest.mark.parametrize("name", list(NOT_EXPRESSIBLE))
def test_templates_that_are_not_concatenations(name):
    template, bos, eos, words = NOT_EXPRESSIBLE[name]
    fmt, why = derive_chat_format(template, bos, eos)
    assert fmt is None and words in why, why


def test_derive_never_raises():
    for template in ("{{ messages[0]['nope'].x() }}", "{% for", "{{ raise_exception('no') }}", ""):
        fmt, why = derive_chat_format(template, None, None)
        assert fmt is None and why


def test_errors():
    qwen, first = derive("qwen-like"), derive("system-first")
    cases = [
        (qwen, [], "no messages"),
        (qwen, [{"role": "critic", "content": "x"}], "role 'critic'"),
        (qwen, [{"role": "user", "content": "x"}, {"role": "assistant", "content": None,
                                                    "tool_calls": [{"function": {"name": "f"}}]}], "tool_calls"),
        (qwen, [{"role": "user", "content": [{"type": "text", "text": "x"}]}], "content of type list"),
        (qwen, [{"content": "x"}], "string 'role'"),
        (first, [{"role": "user", "content": "x"}, {"role": "system", "content": "y"}], "only as the first message"),
        (derive("mistral"), [{"role": "system", "content": "x"}], "renders assistant, user"),
        ({**qwen, "version": 2}, [{"role": "user", "content": "x"}], "rerun `speccompile gen_config`"),
    ]
    for fmt, msgs, words in cases:
        with pytest.raises(ChatFormatError, match=words.replace("(", r"\(").replace("[", r"\[")):
            render_with_format(fmt, msgs)
    assert issubclass(ChatFormatError, ValueError)


def test_gen_config_writes_the_chat_format(tmp_path):
    """The tiny checkpoint's ChatML template, a --conv-template, and a template that cannot be
    expressed: gen_config records the format, or null and why, and succeeds either way."""
    from conftest import make_hf_checkpoint

    hf = tmp_path / "hf"
    make_hf_checkpoint(hf, "tiny-llama")
    conf = json.loads(gen_config(hf, "q0f32", tmp_path / "a").read_text())
    msgs = [{"role": r, "content": t} for r, t in (("user", " hi "), ("assistant", "yo\n"), ("user", "é"))]
    assert render_with_format(conf["chat_format"], msgs) == render_chat(conf["chat_template"], msgs)
    assert "chat_format_error" not in conf
    conf = json.loads(gen_config(hf, "q0f32", tmp_path / "b", conv_template="raw").read_text())
    assert render_with_format(conf["chat_format"], msgs) == " hi yo\né"
    tc = json.loads((hf / "tokenizer_config.json").read_text())
    (hf / "tokenizer_config.json").write_text(json.dumps({**tc, "chat_template": MISTRAL_V3, "bos_token": "<s>"}))
    conf = json.loads(gen_config(hf, "q0f32", tmp_path / "c").read_text())
    assert conf["chat_format"] is None and "user message" in conf["chat_format_error"]


# A driver for chat_format.cc: renders the cases of a JSON file, one JSON string a line.
HARNESS = r"""
#include <iostream>
#include "chat_format.h"
#include "json_util.h"
#include "model.h"
int main(int argc, char** argv) {
  auto root = spc::json::AsObject(spc::json::ParseFile(argv[1]), "input");
  try {
    auto fmt = spc::ChatFormat::FromConfig(spc::json::GetObject(root, "config"));
    for (const auto& c : spc::json::GetArray(root, "cases")) {
      auto co = spc::json::AsObject(c, "case");
      std::vector<spc::ChatMessage> msgs;
      for (const auto& m : spc::json::GetArray(co, "messages")) {
        auto a = spc::json::AsArray(m, "message");
        msgs.push_back({spc::json::AsString(a[0], "role"), spc::json::AsString(a[1], "content")});
      }
      std::string out;
      try {
        out = "=" + fmt.Render(msgs, spc::json::Get(co, "gen").cast<bool>());
      } catch (const std::invalid_argument& e) {
        out = std::string("!") + e.what();
      }
      std::cout << spc::JsonQuote(out) << "\n";
    }
  } catch (const spc::IncompatibleError& e) {
    std::cout << spc::JsonQuote(std::string("incompatible: ") + e.what()) << "\n";
  }
}
"""
PY_SPACE = "".join(chr(c) for c in range(0x110000) if chr(c).isspace())


@pytest.fixture(scope="module")
def cpp_render(tmp_path_factory):
    """(config, cases) -> the C++ renderings ("=" text or "!" error), from chat_format.cc built
    with a small driver against tvm-ffi's JSON (libtvm_ffi), as the C API links it."""
    import tvm_ffi

    gxx = shutil.which("g++") or shutil.which("c++")
    if gxx is None:
        pytest.skip("no C++ compiler")
    root, tmp = Path(__file__).resolve().parents[2], tmp_path_factory.mktemp("chat_format_cc")
    ffi = Path(tvm_ffi.__file__).parent
    (tmp / "harness.cc").write_text(HARNESS)
    src = root / "runtime" / "capi" / "src"
    subprocess.run([gxx, "-std=c++17", "-O1", f"-I{src}", f"-I{root / 'runtime/capi/include'}", f"-I{ffi / 'include'}",
                    str(src / "chat_format.cc"), str(tmp / "harness.cc"), f"-L{ffi / 'lib'}", "-ltvm_ffi",
                    f"-Wl,-rpath,{ffi / 'lib'}", "-o", str(tmp / "harness")], check=True)

    def run(config: dict, cases: list[tuple[list[dict], bool]]) -> list[str]:
        path = tmp / "input.json"
        path.write_text(json.dumps({"config": config, "cases": [
            {"messages": [[m["role"], m["content"]] for m in msgs], "gen": gen} for msgs, gen in cases]}))
        res = subprocess.run([str(tmp / "harness"), str(path)], capture_output=True, text=True, check=True)
        return [json.loads(line) for line in res.stdout.split("\n")[:-1]]  # not splitlines: \u2028 is not escaped

    return run


def python_render(fmt: dict, msgs: list[dict], gen: bool) -> str:
    try:
        return "=" + render_with_format(fmt, msgs, gen)
    except ChatFormatError as err:
        return f"!{err}"


@pytest.mark.tiny  # compiles C++ (a few seconds), though no model
def test_cpp_renders_like_python(cpp_render):
    """Every format above, the generated chats, the errors and Python's whole whitespace set
    (trim) and JSON escapes, through chat_format.cc: the same text, the same error words."""
    edge = [PY_SPACE + "a" + PY_SPACE, "\u200bzero-width is not space\u200b", PY_SPACE, "a\x00\x01\x7f\u2028\"\\", "",
            "\u3000\U0001f389\u3000", "\xe9\u0301 "]
    for name in EXPRESSIBLE:
        fmt = derive(name)
        cases = [(msgs, gen) for msgs in conversations(fmt, seed=1, n=60) for gen in (False, True)]
        cases += [([{"role": r, "content": t}], False) for t in edge for r in fmt["roles"]]
        cases += [([], True), ([{"role": "critic", "content": "x"}], True),
                  ([{"role": "user", "content": "x"}, {"role": "system", "content": "y"}], True)]
        want = [python_render(fmt, msgs, gen) for msgs, gen in cases]
        assert cpp_render({"chat_format": fmt}, cases) == want, name
    out = cpp_render({"chat_format": None, "chat_format_error": "the start of a user message differs"}, [])
    assert "no chat_format" in out[0] and "the start of a user message differs" in out[0] and "gen_config" in out[0]
    assert "version 2 is not 1" in cpp_render({"chat_format": {**derive("chatml"), "version": 2}}, [])[0]
