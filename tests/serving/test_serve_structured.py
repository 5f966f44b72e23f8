"""The server's structured output, through the official OpenAI client: ``response_format``
on chat and completions, streamed and not, with and without speculation (n-gram), and a
400 naming the field for every schema or OpenAI field the server cannot honour."""
from __future__ import annotations

import json

import pytest
from pydantic import BaseModel, Field

from test_serve import serve_in_process

pytestmark = pytest.mark.real_model

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["city", "country", "population"],
          "properties": {"city": {"type": "string", "maxLength": 30}, "country": {"type": "string", "maxLength": 30},
                         "population": {"type": "integer", "minimum": 0, "maximum": 99999999}}}
FORMAT = {"type": "json_schema", "json_schema": {"name": "city", "schema": SCHEMA, "strict": True}}
PROMPT = "Give the largest city of France, its country and its population, as JSON."


class City(BaseModel):
    city: str = Field(max_length=30)
    country: str = Field(max_length=30)
    population: int = Field(ge=0, le=99999999)


@pytest.fixture(scope="module")
def app(smollm2_q4):
    yield from serve_in_process(smollm2_q4, "ngram", 4, 64)


def _ask(app, **kw):
    return app.openai().chat.completions.create(model=app.name, messages=[{"role": "user", "content": PROMPT}],
                                                max_tokens=64, temperature=0, **kw)


def test_a_strict_schema_answer_parses_and_is_the_same_every_way(app):
    r = _ask(app, response_format=FORMAT)
    text = r.choices[0].message.content
    assert r.choices[0].finish_reason == "stop"
    obj = json.loads(text)
    assert set(obj) == {"city", "country", "population"} and isinstance(obj["population"], int)
    plain = _ask(app, response_format=FORMAT, extra_body={"speculative": False})
    assert plain.choices[0].message.content == text  # speculation changes nothing under a grammar
    chunks = list(_ask(app, response_format=FORMAT, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    free = _ask(app).choices[0].message.content
    assert free != text  # the schema is what made it JSON
    parsed = app.openai().beta.chat.completions.parse(
        model=app.name, messages=[{"role": "user", "content": PROMPT}], max_tokens=64, temperature=0,
        response_format=City)
    assert isinstance(parsed.choices[0].message.parsed, City)


def test_json_object_on_the_completions_endpoint(app):
    r = app.openai().completions.create(model=app.name, prompt="The capital of Italy, as a JSON object:",
                                        max_tokens=48, temperature=0, extra_body={"response_format":
                                                                                  {"type": "json_object"}})
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(r.choices[0].text), dict)
    else:  # cut by max_tokens: still the start of an object
        assert r.choices[0].text.lstrip().startswith("{")


@pytest.mark.parametrize("extra, param", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strnig"}}}},
     "response_format.json_schema.schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "properties": {"a": {"$ref": "#/nowhere"}}}}}}, "response_format.json_schema.schema"),
    ({"response_format": {"type": "yaml"}}, "response_format.type"),
    ({"response_format": "json"}, "response_format"),
    ({"functions": [{"name": "f", "parameters": {"type": "object"}}]}, "functions"),  # the deprecated form
    ({"logit_bias": {"a42": 5}}, "logit_bias"),  # a key that is not a token id
    ({"logit_bias": {"49152": -100}}, "logit_bias"),  # past SmolLM2's vocabulary
    ({"logit_bias": {"42": 101}}, "logit_bias"),
    ({"frequency_penalty": 2.5}, "frequency_penalty"),
    ({"repetition_penalty": 0}, "repetition_penalty"),
    ({"min_p": 1.5}, "min_p"),
    ({"modalities": ["text", "audio"]}, "modalities"),
])
def test_what_cannot_be_honoured_is_a_400_naming_the_field(app, extra, param):
    body = {"model": app.name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **extra}
    r = app.post("/v1/chat/completions", body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["type"] == "invalid_request_error", err
    ok = app.post("/v1/chat/completions", {**body, **{k: None for k in extra}})
    assert ok.status_code == 200  # and the server keeps serving


def test_fields_that_ask_for_nothing_are_accepted(app):
    body = {"model": app.name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "tools": [],
            "tool_choice": "none", "logit_bias": {}, "modalities": ["text"], "response_format": {"type": "text"},
            "user": "u1", "store": False, "metadata": {"k": "v"}}
    assert app.post("/v1/chat/completions", body).status_code == 200


def test_logprobs_with_and_without_speculation_streamed_and_not(app):
    def entries(r):
        return [(c.token, c.logprob, [(t.token, t.logprob) for t in c.top_logprobs]) for c in r.choices[0].logprobs.content]

    spec = _ask(app, logprobs=True, top_logprobs=3)
    got = entries(spec)
    assert len(got) == spec.usage.completion_tokens and all(len(top) == 3 for _, _, top in got)
    assert all(top[0] == (tok, lp) for tok, lp, top in got)  # greedy: the chosen token is the likeliest
    assert "".join(tok for tok, _, _ in got) == spec.choices[0].message.content
    plain = _ask(app, logprobs=True, top_logprobs=3, extra_body={"speculative": False})
    assert entries(plain) == got  # bit for bit: the same rows, the same kernels
    chunks = list(_ask(app, logprobs=True, top_logprobs=3, stream=True))
    streamed = [(c.token, c.logprob, [(t.token, t.logprob) for t in c.top_logprobs])
                for ch in chunks if ch.choices and ch.choices[0].logprobs for c in ch.choices[0].logprobs.content]
    assert streamed == got
    schema = _ask(app, logprobs=True, top_logprobs=5, response_format=FORMAT)  # the mask shows in the alternatives
    first = schema.choices[0].logprobs.content[0]
    assert first.token.startswith("{") and all(t.token.lstrip().startswith("{") for t in first.top_logprobs)
    r = app.openai().completions.create(model=app.name, prompt="The three primary colors are", max_tokens=8,
                                        temperature=0, logprobs=2)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == r.usage.completion_tokens
    assert "".join(lp.tokens) == r.choices[0].text and lp.text_offset[0] == 0
    assert all(len(t) == 2 for t in lp.top_logprobs)


@pytest.mark.parametrize("extra, param", [({"top_logprobs": 2}, "top_logprobs"),
                                          ({"logprobs": True, "top_logprobs": 21}, "top_logprobs")])
def test_bad_logprob_requests(app, extra, param):
    body = {"model": app.name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **extra}
    r = app.post("/v1/chat/completions", body)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city",
    "parameters": {"type": "object", "additionalProperties": False, "required": ["city", "unit"],
                   "properties": {"city": {"type": "string", "maxLength": 30},
                                  "unit": {"enum": ["celsius", "fahrenheit"]}}}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"zone": {"type": "string", "maxLength": 20}}, "required": ["zone"],
    "additionalProperties": False}}}


def _tool_ask(app, **kw):
    return app.openai().chat.completions.create(
        model=app.name, messages=[{"role": "user", "content": "What is the weather in Paris?"}], max_tokens=64,
        temperature=0, tools=[WEATHER, TIME], **kw)


@pytest.mark.parametrize("choice", [{"type": "function", "function": {"name": "get_weather"}}, "required"])
def test_a_forced_tool_call_returns_tool_calls_with_valid_arguments(app, choice):
    r = _tool_ask(app, tool_choice=choice)
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls" and msg.tool_calls, msg
    call = msg.tool_calls[0]
    assert call.id.startswith("call_") and call.type == "function"
    args = json.loads(call.function.arguments)
    if call.function.name == "get_weather":
        assert set(args) == {"city", "unit"} and args["unit"] in ("celsius", "fahrenheit")
    else:
        assert choice == "required" and call.function.name == "get_time" and set(args) == {"zone"}
    plain = _tool_ask(app, tool_choice=choice, extra_body={"speculative": False}).choices[0].message
    assert [(c.function.name, c.function.arguments) for c in plain.tool_calls] == \
        [(c.function.name, c.function.arguments) for c in msg.tool_calls]
    chunks = list(_tool_ask(app, tool_choice=choice, stream=True))
    deltas = [tc for c in chunks if c.choices and c.choices[0].delta.tool_calls for tc in c.choices[0].delta.tool_calls]
    assert [(d.function.name, d.function.arguments) for d in deltas] == \
        [(c.function.name, c.function.arguments) for c in msg.tool_calls]
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["tool_calls"]
    # the conversation goes on with the tool's answer (rendered by the fallback for SmolLM2's template)
    follow = app.openai().chat.completions.create(model=app.name, max_tokens=16, temperature=0, tools=[WEATHER, TIME],
                                                  messages=[{"role": "user", "content": "What is the weather in Paris?"},
                                                            msg.model_dump(exclude_none=True),
                                                            {"role": "tool", "tool_call_id": call.id,
                                                             "content": '{"temperature": 21}'}])
    assert follow.choices[0].finish_reason in ("stop", "length", "tool_calls")


def test_tool_choice_none_and_auto_answer_in_text_when_the_model_does(app):
    none = _tool_ask(app, tool_choice="none").choices[0]
    assert none.message.tool_calls is None and none.message.content
    auto = _tool_ask(app)  # SmolLM2 was not trained on tools: whatever it says is parsed, never lost
    m = auto.choices[0].message
    assert m.content or m.tool_calls


@pytest.mark.parametrize("extra, param", [
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools.0.function.name"),
    ({"tools": [{"type": "retrieval"}]}, "tools.0"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice"),
    ({"tools": [WEATHER], "response_format": {"type": "json_object"}}, "response_format"),
])
def test_bad_tool_requests(app, extra, param):
    body = {"model": app.name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **extra}
    r = app.post("/v1/chat/completions", body)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_tools_render_through_a_template_with_a_tools_section():
    from speccompile.runtime.tokenizer import render_chat
    from speccompile.runtime.tools import parse_calls, template_messages

    template = ("{% if tools %}TOOLS:{% for t in tools %}{{ t.function.name }};{% endfor %}\n{% endif %}"
                "{% for m in messages %}{{ m.role }}: {{ m.content }}"
                "{% for c in m.tool_calls or [] %}[{{ c.function.name }} {{ c.function.arguments | tojson }}]"
                "{% endfor %}\n{% endfor %}")
    fn = WEATHER["function"]
    msgs = template_messages([{"role": "user", "content": "hi"},
                              {"role": "assistant", "content": "", "tool_calls": [
                                  {"id": "c1", "type": "function",
                                   "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]}],
                             [fn], template_has_tools=True)
    text = render_chat(template, msgs, tools=[{"type": "function", "function": fn}])
    assert text.startswith("TOOLS:get_weather;") and '[get_weather {"city": "Oslo"}]' in text
    fallback = template_messages([{"role": "user", "content": "hi"}], [fn], template_has_tools=False)
    assert fallback[0]["role"] == "system" and "get_weather" in fallback[0]["content"]
    content, calls = parse_calls('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}'
                                 '\n</tool_call>\n<tool_call>\nnot json\n</tool_call>', [fn])
    assert [json.loads(c["function"]["arguments"]) for c in calls] == [{"city": "Oslo"}]
    assert content.startswith("Let me check.") and "not json" in content


def test_sampling_controls_through_the_official_client(app, smollm2_q4):
    """Penalties, logit_bias and min_p are accepted and change the answer; greedy answers are the
    same with and without speculation; a -100 bias keeps its token out."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(smollm2_q4[0] / "tokenizer.json"))
    free = _ask(app).choices[0].message.content
    banned = tok.encode(free, add_special_tokens=False).ids[0]
    for kw in ({"frequency_penalty": 1.0}, {"presence_penalty": 1.5}, {"logit_bias": {str(banned): -100}},
               {"extra_body": {"repetition_penalty": 1.4}}):
        spec = _ask(app, **kw).choices[0].message.content
        plain = _ask(app, **{**kw, "extra_body": {**kw.get("extra_body", {}), "speculative": False}})
        assert spec == plain.choices[0].message.content, kw
        assert spec != free, kw
    r = _ask(app, logit_bias={str(banned): -100}, logprobs=True)
    assert tok.id_to_token(banned) not in [c.token for c in r.choices[0].logprobs.content]
    sampled = app.openai().chat.completions.create(model=app.name, messages=[{"role": "user", "content": PROMPT}],
                                                   max_tokens=16, temperature=1.0, seed=3,
                                                   extra_body={"min_p": 0.2})
    assert sampled.choices[0].message.content


@pytest.fixture(scope="module")
def suffix_app(smollm2_q4):
    yield from serve_in_process(smollm2_q4, "suffix", 4, 64)


def test_predicted_outputs_through_the_official_client(suffix_app, app):
    """``prediction`` drafts, the answer is the one without it, and usage reports the
    prediction's tokens; a server that does not speculate through the index says so."""
    messages = [{"role": "user", "content": "Write a short story about a robot who learns to paint."}]

    def ask(target, **kw):
        return target.openai().chat.completions.create(model=target.name, messages=messages, max_tokens=64,
                                                       temperature=0, **kw)

    plain = ask(suffix_app, extra_body={"speculative": False})
    text = plain.choices[0].message.content
    r = ask(suffix_app, prediction={"type": "content", "content": text})
    assert r.choices[0].message.content == text
    details = r.usage.completion_tokens_details
    assert details.accepted_prediction_tokens >= 0.9 * r.usage.completion_tokens
    assert details.rejected_prediction_tokens <= 0.1 * r.usage.completion_tokens
    parts = ask(suffix_app, prediction={"type": "content", "content": [{"type": "text", "text": text}]})
    assert parts.choices[0].message.content == text
    chunks = list(ask(suffix_app, prediction={"type": "content", "content": text}, stream=True,
                      stream_options={"include_usage": True}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    assert chunks[-1].usage.completion_tokens_details.accepted_prediction_tokens == details.accepted_prediction_tokens
    for bad, param in (({"type": "file", "content": "x"}, "prediction"),
                       ({"type": "content", "content": [{"type": "image"}]}, "prediction.content"),
                       ({"type": "content", "content": "word " * 9000}, "prediction")):
        resp = suffix_app.post("/v1/chat/completions", {"model": suffix_app.name, "messages": messages,
                                                         "max_tokens": 4, "prediction": bad})
        assert resp.status_code == 400 and resp.json()["error"]["param"] == param, resp.text
    resp = app.post("/v1/chat/completions", {"model": app.name, "messages": messages, "max_tokens": 4,
                                             "prediction": {"type": "content", "content": text}})
    assert resp.status_code == 400 and "--speculative-mode suffix" in resp.json()["error"]["message"]
    assert ask(suffix_app).choices[0].message.content == text  # and it keeps serving


def test_n_choices_through_the_official_client(app):
    """n choices in one completion object: seeded choices differ from each other and each is
    the answer a request with its seed (seed + index) gets alone; greedy choices are the same
    answer; streamed, every choice's text arrives under its index; n over the server's
    sequences is a 400 naming n. (Seeded samples are compared without speculation: with it,
    how many random numbers a step draws follows the drafts, which the policy sizes by time.)"""
    messages = [{"role": "user", "content": "Name a fruit and say why you like it."}]
    kw = dict(model=app.name, messages=messages, max_tokens=24, temperature=1.0, seed=11,
              extra_body={"speculative": False})
    r = app.openai().chat.completions.create(n=3, **kw)
    texts = [c.message.content for c in sorted(r.choices, key=lambda c: c.index)]
    assert [c.index for c in r.choices] == [0, 1, 2] and len(set(texts)) >= 2
    for i in range(3):
        alone = app.openai().chat.completions.create(**{**kw, "seed": 11 + i})
        assert alone.choices[0].message.content == texts[i]
    assert r.usage.completion_tokens > 24  # every choice's tokens
    assert r.usage.prompt_tokens == alone.usage.prompt_tokens  # the prompt counted once
    greedy = app.openai().chat.completions.create(model=app.name, messages=messages, max_tokens=16, temperature=0, n=2)
    assert greedy.choices[0].message.content == greedy.choices[1].message.content
    chunks = list(app.openai().chat.completions.create(n=3, stream=True, stream_options={"include_usage": True}, **kw))
    streamed = {i: "".join(c.choices[0].delta.content or "" for c in chunks if c.choices and c.choices[0].index == i)
                for i in range(3)}
    assert [streamed[i] for i in range(3)] == texts
    assert len({c.id for c in chunks}) == 1 and chunks[-1].usage.completion_tokens == r.usage.completion_tokens
    resp = app.post("/v1/chat/completions", {"model": app.name, "messages": messages, "max_tokens": 4, "n": 99})
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "n"
