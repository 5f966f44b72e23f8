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
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]}, "tools"),
    ({"logit_bias": {"42": 5}}, "logit_bias"),
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
