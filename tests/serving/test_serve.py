"""``speccompile serve``: the OpenAI-compatible API over the continuous-batching scheduler.

Most tests drive the FastAPI app that speccompile/serving/app.py builds (``create_app``) in this
process through starlette's TestClient: the same routes, scheduler thread and engine,
without a socket, a subprocess or a start-up poll. Three apps over SmolLM2-135M-Instruct
q4f32_1: ngram speculation with an API key and a small prefill chunk per step (so long
prompts are prefilled across decode steps), plain decoding, and ngram with a tiny KV cache
(256 tokens) for floods and preemption. One real ``speccompile serve`` subprocess on a
loopback port covers what needs a socket: the OpenAI client end to end, clients that
disconnect mid-generation, and ``bench --endpoint``. Every greedy output is compared with
the Engine's own greedy output for the same prompt run alone: batching, chunked prefill,
speculation and preemption must not change a token.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.real_model

API_KEY = "test-key"
BASE_PROMPTS = [
    "What is the capital of France?",
    "List the days of the week.",
    "Repeat after me: the quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy dog.",
    "Count from one to twenty in words.",
    "Write a Python function that returns the n-th Fibonacci number.",
    "Explain what a hash table is in one paragraph.",
    "Translate 'good morning' into French and Spanish.",
    "Summarize: The cat sat on the mat. The mat was red. The cat liked the red mat very much.",
]
# a long prompt: several prefill chunks at --prefill-tokens-per-step 64
LONG_PROMPT = "Summarize this text. " + " ".join(
    f"Sentence {i}: the river {['rose', 'fell', 'froze', 'flooded'][i % 4]} near town number {i}." for i in range(40))


def poll(condition, what: str, deadline: float = 120.0):
    """condition()'s first truthy value; a generous deadline, never an assumed speed."""
    end = time.monotonic() + deadline
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"gave up waiting after {deadline:.0f} s: {what}")
        time.sleep(0.05)


class Server:
    """One interface over both kinds of server under test: ``http`` is an httpx.Client, a real
    one on a loopback port or starlette's TestClient (an httpx.Client too) on the app."""

    def __init__(self, http: httpx.Client, name: str, api_key: str | None, proc: subprocess.Popen | None = None):
        self.http, self.name, self.proc = http, name, proc
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    @property
    def url(self) -> str:
        return str(self.http.base_url).rstrip("/")

    def post(self, path: str, body, **kw) -> httpx.Response:
        data = body if isinstance(body, (bytes, str)) else json.dumps(body)
        return self.http.post(path, content=data, headers={"Content-Type": "application/json", **self.headers}, **kw)

    def openai(self):
        """The OpenAI client: over its own connection to a real server, through the TestClient
        in process."""
        from openai import OpenAI

        return OpenAI(base_url=self.url + "/v1", api_key=API_KEY, max_retries=0, timeout=120,
                      http_client=None if self.proc else self.http)

    def metrics(self) -> dict[str, float]:
        """Samples of /metrics by 'name{labels}' (labels sorted), parsed with prometheus_client."""
        from prometheus_client.parser import text_string_to_metric_families

        out = {}
        for fam in text_string_to_metric_families(self.http.get("/metrics").text):
            for s in fam.samples:
                labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
                out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
        return out

    def wait_idle(self) -> dict[str, float]:
        """Metrics once nothing runs or waits (the engine frees pages at step boundaries)."""
        def idle():
            m = self.metrics()
            done = (m["speccompile_running_requests"] == 0 and m["speccompile_queue_length"] == 0
                    and m["speccompile_kv_pages_used"] == 0)
            return m if done else None

        return poll(idle, "the server to become idle")


@pytest.fixture(scope="module")
def model(smollm2_q4):
    return smollm2_q4


def serve_in_process(model, mode: str, max_num_sequence: int, prefill_tokens_per_step: int,
                max_total_tokens: int | None = None, api_key: str | None = None):
    """The app ``speccompile serve`` would run with these options (warm-up aside, which only
    saves the first request's latency), driven in process; its lifespan runs the engine thread."""
    from starlette.testclient import TestClient

    from speccompile.runtime.engine import Engine
    from speccompile.runtime.scheduler import Scheduler
    from speccompile.serving.app import create_app

    model_dir, lib = model
    engine = Engine(model_dir, lib, speculative_mode=mode, max_num_sequence=max_num_sequence,
                    max_total_seq_length=max_total_tokens)
    scheduler = Scheduler(engine, max_num_sequence, prefill_tokens_per_step)
    with TestClient(create_app(scheduler, model_dir.name, api_key)) as client:
        yield Server(client, model_dir.name, api_key)
    assert not scheduler.alive


@pytest.fixture(scope="module")
def ngram_app(model):
    yield from serve_in_process(model, "ngram", 8, 64, api_key=API_KEY)


@pytest.fixture(scope="module")
def plain_app(model):
    yield from serve_in_process(model, "disable", 4, 256)


@pytest.fixture(scope="module")
def tiny_app(model):
    yield from serve_in_process(model, "ngram", 4, 32, max_total_tokens=256)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def socket_server(model, tmp_path_factory):
    """``speccompile serve`` in a subprocess: ngram, an API key, 8 sequences, 64 prefill tokens per step."""
    model_dir, lib = model
    port = _free_port()
    log_path = tmp_path_factory.mktemp("serve") / "server.log"
    args = [sys.executable, "-m", "speccompile.cli", "serve", str(model_dir), "--model-lib", str(lib),
            "--port", str(port), "--log-level", "warning", "--speculative-mode", "ngram", "--max-num-sequence", "8",
            "--prefill-tokens-per-step", "64", "--api-key", API_KEY]
    with open(log_path, "w") as log:
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    http = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=300)

    def healthy() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}:\n{log_path.read_text()}")
        try:
            return http.get("/health", timeout=5).status_code == 200
        except httpx.TransportError:
            return False

    try:
        poll(healthy, f"the server to come up (log: {log_path})", deadline=300)
        yield Server(http, model_dir.name, API_KEY, proc)
    finally:
        http.close()
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def reference(model):
    """greedy(prompt, max_tokens, raw=False) -> the Engine's result for that prompt run alone."""
    from speccompile.runtime.engine import Engine

    model_dir, lib = model
    engine = Engine(model_dir, lib)
    cache = {}

    def greedy(prompt: str, max_tokens: int, raw: bool = False, stop: tuple[str, ...] = ()):
        key = (prompt, max_tokens, raw, stop)
        if key not in cache:
            cache[key] = engine.generate(engine.encode_prompt(prompt, raw=raw), max_tokens, stop=list(stop))
        return cache[key]

    greedy.engine = engine
    return greedy


def _stream_chat(server: Server, prompt: str, max_tokens: int) -> tuple[str, str | None]:
    """(text, finish_reason) of a streamed greedy chat completion, parsed by hand from SSE."""
    body = {"model": server.name, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0, "stream": True}
    text, finish = "", None
    with server.http.stream("POST", "/v1/chat/completions", json=body, headers=server.headers) as r:
        assert r.status_code == 200, r.read()
        lines = [ln for ln in r.iter_lines() if ln]
    assert lines[-1] == "data: [DONE]"
    for ln in lines[:-1]:
        assert ln.startswith("data: ")
        choice = json.loads(ln[6:])["choices"][0]
        text += choice["delta"].get("content") or ""
        finish = choice["finish_reason"] or finish
    return text, finish


# ---------------------------------------------------------------- basic API
@pytest.mark.parametrize("which", ["socket_server", "plain_app"])
def test_openai_client_chat_streamed_and_not(request, which, reference):
    """The OpenAI client end to end over a real socket (ngram), and in process (plain)."""
    server = request.getfixturevalue(which)
    client = server.openai()
    prompt, n = BASE_PROMPTS[2], 32
    expected = reference(prompt, n)
    res = client.chat.completions.create(model=server.name, messages=[{"role": "user", "content": prompt}],
                                         max_tokens=n, temperature=0)
    assert res.choices[0].message.content == expected.text
    assert res.choices[0].finish_reason == expected.finish_reason
    assert res.usage.prompt_tokens == len(expected.prompt_token_ids)
    assert res.usage.completion_tokens == len(expected.token_ids)
    assert res.usage.total_tokens == res.usage.prompt_tokens + res.usage.completion_tokens

    chunks = list(client.chat.completions.create(model=server.name, messages=[{"role": "user", "content": prompt}],
                                                 max_tokens=n, temperature=0, stream=True,
                                                 stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == expected.text
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == \
        [expected.finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(expected.token_ids)
    assert [m.id for m in client.models.list().data] == [server.name]


def test_completions_endpoint_and_stop_strings(ngram_app, reference):
    client = ngram_app.openai()
    raw = "The three primary colors are"
    expected = reference(raw, 24, raw=True)
    res = client.completions.create(model=ngram_app.name, prompt=raw, max_tokens=24, temperature=0)
    assert res.choices[0].text == expected.text and res.usage.completion_tokens == len(expected.token_ids)
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=ngram_app.name, prompt=raw, max_tokens=24, temperature=0, stream=True))
    assert streamed == expected.text
    # a stop string inside the output: cut before it, finish_reason "stop", also when streamed
    full = reference(BASE_PROMPTS[1], 40)
    stop = full.text.split()[4]
    cut = reference(BASE_PROMPTS[1], 40, stop=(stop,))
    assert stop not in cut.text and cut.finish_reason == "stop"
    for stream in (False, True):
        out = client.chat.completions.create(model=ngram_app.name, max_tokens=40, temperature=0, stop=[stop],
                                             messages=[{"role": "user", "content": BASE_PROMPTS[1]}], stream=stream)
        if stream:
            chunks = list(out)
            text = "".join(c.choices[0].delta.content or "" for c in chunks)
            finish = [c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason]
        else:
            text, finish = out.choices[0].message.content, [out.choices[0].finish_reason]
        assert text == cut.text and finish == ["stop"]


def test_seeded_sampling_is_reproducible(plain_app):
    """Plain decoding: nothing but the seed decides the draws (a speculative server's draft
    length, chosen from measured times, would decide how many are taken)."""
    body = {"model": plain_app.name, "messages": [{"role": "user", "content": BASE_PROMPTS[5]}],
            "max_tokens": 16, "temperature": 0.9, "top_p": 0.9, "top_k": 40, "seed": 1234}
    a, b = plain_app.post("/v1/chat/completions", body).json(), plain_app.post("/v1/chat/completions", body).json()
    assert a["choices"][0]["message"]["content"] == b["choices"][0]["message"]["content"]
    assert a["usage"]["completion_tokens"] == 16


# -------------------------------------------------------------------- load
def test_32_concurrent_streams_match_their_solo_outputs(ngram_app, reference):
    jobs = [(p, n) for n in (12, 40) for p in BASE_PROMPTS]
    jobs += [(LONG_PROMPT, 16), (LONG_PROMPT, 24)]
    jobs += [(f"{p} Answer briefly.", n) for n, p in zip((8, 20, 28, 36, 8, 20, 28, 36, 8, 20, 28, 36, 8, 20),
                                                          BASE_PROMPTS * 2)]
    assert len(jobs) == 32
    expected = [reference(p, n) for p, n in jobs]

    def completed(m: dict) -> float:
        return sum(m.get(f"speccompile_requests_total{{endpoint=chat,outcome={o}}}", 0) for o in ("stop", "length"))

    before = completed(ngram_app.wait_idle())
    with ThreadPoolExecutor(32) as pool:
        outputs = list(pool.map(lambda job: _stream_chat(ngram_app, *job), jobs))
    for (p, n), exp, (text, finish) in zip(jobs, expected, outputs):
        assert text == exp.text, f"{p[:40]!r} max_tokens={n}"
        assert finish == exp.finish_reason
    m = ngram_app.wait_idle()
    assert m["speccompile_kv_pages_used"] == 0 and m["speccompile_running_requests"] == 0
    assert completed(m) - before == 32
    assert ngram_app.http.get("/health").status_code == 200


# ------------------------------------------------------------------ faults
def _assert_openai_error(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    return err


@pytest.mark.parametrize("body, param", [
    (b'{"model": "m", "messages": [', None),  # malformed JSON
    (b"[1, 2, 3]", None),  # not an object
    ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": "8"}, "max_tokens"),  # wrong type
    ({"messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}, "temperature"),
    ({"messages": [{"role": "user", "content": "hi"}], "stream": 1}, "stream"),
    ({"messages": "hi"}, "messages"),
    ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages.0.role"),
    ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": -5}, "max_tokens"),  # negative
    ({"messages": [{"role": "user", "content": "hi"}], "top_p": 0}, "top_p"),
    ({"messages": [{"role": "user", "content": "hi"}], "n": 99}, "n"),  # over --max-num-sequence
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "user", "content": "hi " * 9000}]}, "messages"),  # over the context window
])
def test_bad_requests_get_400_in_openai_schema(ngram_app, body, param):
    if isinstance(body, dict):
        body = {"model": ngram_app.name, **body}
    err = _assert_openai_error(ngram_app.post("/v1/chat/completions", body), 400)
    assert err["param"] == param and err["type"] == "invalid_request_error"


def test_unknown_model_auth_and_routes(ngram_app):
    msg = [{"role": "user", "content": "hi"}]
    err = _assert_openai_error(ngram_app.post("/v1/chat/completions", {"model": "gpt-9", "messages": msg}), 404)
    assert err["code"] == "model_not_found"
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": API_KEY}):
        r = ngram_app.http.post("/v1/chat/completions", json={"model": ngram_app.name, "messages": msg},
                                headers=headers)
        assert _assert_openai_error(r, 401)["code"] == "invalid_api_key"
    _assert_openai_error(ngram_app.http.get("/v1/nothing-here"), 404)
    _assert_openai_error(ngram_app.http.get("/v1/completions"), 405)
    err = _assert_openai_error(ngram_app.post("/v1/completions", {"model": ngram_app.name, "prompt": [49152]}), 400)
    assert "out of range" in err["message"]


def test_flood_beyond_kv_capacity_queues_preempts_and_stays_up(tiny_app, reference):
    # 256 KV tokens (16 pages): a prompt that can never fit is refused up front
    err = _assert_openai_error(tiny_app.post("/v1/chat/completions", {
        "model": tiny_app.name, "messages": [{"role": "user", "content": LONG_PROMPT}]}), 400)
    assert err["code"] == "context_length_exceeded"
    jobs = [(p, 60) for p in BASE_PROMPTS] * 2
    expected = [reference(p, n) for p, n in jobs]
    with ThreadPoolExecutor(len(jobs)) as pool:
        outputs = list(pool.map(lambda job: _stream_chat(tiny_app, *job), jobs))
    for (p, n), exp, (text, _) in zip(jobs, expected, outputs):
        assert text == exp.text, f"{p[:40]!r}: corrupted under KV pressure"
    m = tiny_app.wait_idle()
    assert m["speccompile_kv_pages_used"] == 0 and m["speccompile_kv_pages_free"] == 16
    print("preemptions under the flood:", m["speccompile_preemptions_total"])
    assert m["speccompile_engine_errors_total"] == 0
    assert tiny_app.http.get("/health").json()["status"] == "ok"


# ----------------------------------------------------------------- metrics
def test_metrics_have_one_clean_name_each(ngram_app, reference):
    # a repetitive prompt so that n-gram drafts are proposed and verified
    _stream_chat(ngram_app, BASE_PROMPTS[2] + " " + BASE_PROMPTS[2], 48)
    text = ngram_app.http.get("/metrics").text
    names = [ln.split()[2] for ln in text.splitlines() if ln.startswith("# TYPE")]
    assert len(names) == len(set(names))
    assert not any(n.endswith("_created") for n in names) and "_created" not in text
    m = ngram_app.wait_idle()
    for name in ("speccompile_time_to_first_token_seconds_count", "speccompile_inter_token_latency_seconds_count",
                 "speccompile_prefill_tokens_per_second", "speccompile_decode_tokens_per_second",
                 "speccompile_draft_tokens_total", "speccompile_accepted_tokens_total", "speccompile_acceptance_rate",
                 "speccompile_mean_accepted_length", "speccompile_draft_seconds_total",
                 "speccompile_verify_seconds_total", "speccompile_kv_pages_used", "speccompile_kv_pages_free",
                 "speccompile_queue_length"):
        assert name in m, name
    assert m["speccompile_time_to_first_token_seconds_count"] >= 1
    assert m["speccompile_draft_tokens_total"] > 0
    assert 0 <= m["speccompile_acceptance_rate"] <= 1 and m["speccompile_mean_accepted_length"] >= 1
    assert m["speccompile_position_acceptance_rate{position=1}"] >= 0
    assert m["speccompile_decode_tokens_per_second"] > 0


# -------------------------------------------------------------------- fuzz
_ANY = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=False),
                 st.text(max_size=20), st.lists(st.integers(-5, 60000), max_size=4),
                 st.dictionaries(st.text(max_size=5), st.integers(), max_size=2))
_MESSAGE = st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant", "developer", "tool", "bot", 3]),
                                  "content": st.one_of(st.text(max_size=40), _ANY,
                                                       st.lists(st.fixed_dictionaries(
                                                           {"type": st.sampled_from(["text", "image_url"]),
                                                            "text": st.text(max_size=20)}), max_size=2))})
_FIELDS = {
    "temperature": st.one_of(st.floats(-1, 3, allow_nan=False), _ANY),
    "top_p": st.one_of(st.floats(-0.5, 1.5, allow_nan=False), _ANY),
    "top_k": st.one_of(st.integers(-3, 100000), _ANY),
    "seed": st.one_of(st.integers(-2**64, 2**64), _ANY),
    "stop": st.one_of(st.text(max_size=3), st.lists(st.text(max_size=3), max_size=6), _ANY),
    "stream": st.one_of(st.booleans(), _ANY),
    "stream_options": st.one_of(st.fixed_dictionaries({"include_usage": st.booleans()}), _ANY),
    "n": st.one_of(st.integers(-1, 3), _ANY),
    "presence_penalty": _ANY, "ignore_eos": _ANY, "logprobs": _ANY, "user": _ANY, "unknown_field": _ANY,
    "top_logprobs": st.one_of(st.integers(-1, 25), _ANY),
    "response_format": st.one_of(st.sampled_from([{"type": "json_object"}, {"type": "text"}, {"type": "json_schema"},
                                                  {"type": "json_schema", "json_schema": {"name": "x", "schema": {
                                                      "type": "object", "properties": {"a": {"type": "integer"}}}}},
                                                  {"type": "json_schema", "json_schema": {"schema": {"type": 3}}}]),
                                 _ANY),
    "tools": st.one_of(st.lists(st.one_of(
        st.sampled_from([{"type": "function", "function": {"name": "f"}}, {"type": "function"}]),
        st.fixed_dictionaries({"type": st.just("function"), "function": st.fixed_dictionaries(
            {"name": st.just("g"), "parameters": _ANY})})), max_size=2), _ANY),
    "tool_choice": st.one_of(st.sampled_from(["none", "auto", "required", {"type": "function",
                                                                            "function": {"name": "f"}}]), _ANY),
}


# well-typed values in range: half of the examples use only these, so that generation runs
_VALID = {
    "temperature": st.floats(0, 2), "top_p": st.floats(0.01, 1), "top_k": st.integers(0, 100000),
    "seed": st.integers(-2**64, 2**64), "stop": st.one_of(st.text(max_size=3), st.lists(st.text(max_size=3), max_size=4)),
    "stream": st.booleans(), "ignore_eos": st.booleans(), "user": st.text(max_size=5), "unknown_field": _ANY,
}


@st.composite
def _requests(draw):
    chat, valid = draw(st.booleans()), draw(st.booleans())
    fields = _VALID if valid else _FIELDS
    body = {"model": "MODEL" if valid else draw(st.sampled_from(["MODEL", "MODEL", "other", 7]))}
    if chat:
        messages = st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "system"]),
                                                   "content": st.text(max_size=40)}), min_size=1, max_size=3)
        body["messages"] = draw(messages if valid else st.one_of(st.lists(_MESSAGE, max_size=3), _ANY))
    else:
        body["prompt"] = draw(st.one_of(st.text(min_size=1, max_size=40), st.lists(st.integers(0, 49151), min_size=1,
                                                                                   max_size=6))
                              if valid else st.one_of(st.text(max_size=40), st.lists(st.integers(-3, 60000),
                                                                                     max_size=6), _ANY))
    # always a small (or invalid) budget so that every example stays fast
    budget_key = draw(st.sampled_from(["max_tokens", "max_completion_tokens"])) if chat else "max_tokens"
    body[budget_key] = draw(st.integers(1, 6) if valid else st.one_of(
        st.integers(-3, 6), st.floats(allow_nan=False), st.text(max_size=3), st.booleans()))
    for key in draw(st.lists(st.sampled_from(sorted(fields)), unique=True, max_size=5)):
        body[key] = draw(fields[key])
    return ("/v1/chat/completions" if chat else "/v1/completions"), body


@settings(max_examples=40, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(_requests())
def test_fuzzed_requests_never_get_a_5xx(plain_app, req):
    path, body = req
    if body.get("model") == "MODEL":
        body["model"] = plain_app.name
    with plain_app.http.stream("POST", path, content=json.dumps(body), headers={"Content-Type": "application/json"}) as r:
        payload = r.read().decode()
    event(f"HTTP {r.status_code}")
    assert r.status_code < 500, payload
    if r.status_code >= 400:
        assert set(json.loads(payload)["error"]) == {"message", "type", "param", "code"}
    elif body.get("stream") is True:
        assert payload.rstrip().endswith("data: [DONE]")
    else:
        assert json.loads(payload)["choices"][0]["finish_reason"] in ("stop", "length", "tool_calls")
    assert plain_app.http.get("/health").status_code == 200


# ---------------------------------------------------------------- commands
def test_bench_endpoint_reports_throughput_and_percentiles(socket_server, tmp_path):
    from click.testing import CliRunner

    from speccompile.cli.main import main

    out = tmp_path / "bench.json"
    res = CliRunner().invoke(main, ["bench", "--endpoint", socket_server.url + "/v1", "--concurrency", "1,2",
                                    "--num-prompts", "2", "--max-tokens", "8", "--api-key", API_KEY,
                                    "--json", str(out)])
    assert res.exit_code == 0, res.output
    report = json.loads(out.read_text())
    assert [lv["concurrency"] for lv in report["levels"]] == [1, 2]
    for lv in report["levels"]:
        assert lv["errors"] == 0 and lv["output_tokens"] == 16  # ignore_eos: every request runs to max_tokens
        assert lv["output_tokens_per_s"] > 0
        assert set(lv["ttft_s"]) == set(lv["itl_s"]) == {"p50", "p90", "p99", "mean"}
    # the second level sends the first's prompts again: the server's prefix cache holds them, and bench says so
    assert report["levels"][1]["cached_prompt_tokens"] > 0 and "prefix cache" in res.output
    res = CliRunner().invoke(main, ["bench", "--endpoint", socket_server.url, "--concurrency", "0"])
    assert res.exit_code == 2 and "positive" in res.output
    # --ab: the same server decodes half the prompts without speculation, ABBA-interleaved
    res = CliRunner().invoke(main, ["bench", "--endpoint", socket_server.url, "--concurrency", "2", "--num-prompts", "4",
                                    "--max-tokens", "8", "--api-key", API_KEY, "--ab", "--json", str(out)])
    assert res.exit_code == 0, res.output
    (lv,) = json.loads(out.read_text())["levels"]
    assert lv["output_tokens"] == lv["plain"]["output_tokens"] == 32 and lv["errors"] == lv["plain"]["errors"] == 0
    assert lv["speedup"] > 0 and "| plain" in res.output  # the printed line carries the plain side
    assert lv["identical"] == lv["compared"] == 4  # greedy: each prompt reads the same both ways


def test_soak_mixes_loads_and_reports_errors_memory_latency_and_identity(socket_server, tmp_path):
    """A short soak (the real one runs for minutes): streams rising and falling each second,
    requests with and without speculation, streamed and not; resident memory sampled."""
    from click.testing import CliRunner

    from speccompile.bench.soak import run_soak
    from speccompile.cli.main import main

    prompts = [{"prompt": p} for p in BASE_PROMPTS]
    report = run_soak(socket_server.url, prompts, minutes=0.25, out_json=tmp_path / "soak.json", api_key=API_KEY,
                      segment=1.0, quiet=True)
    s = report["summary"]
    assert s["requests"] >= 8 and s["errors"] == 0, s["error_messages"]
    assert report["speculative"]["requests"] and report["plain"]["requests"]
    assert len({r["streams"] for r in report["requests"]}) > 1  # the load changed while it ran
    assert s["compared_pairs"] >= 1 and s["identical_pairs"] == s["compared_pairs"]
    assert s["rss_start_mib"] > 10 and s["rss_end_mib"] > 10 and len(report["memory"]) >= 2
    assert json.loads((tmp_path / "soak.json").read_text())["summary"] == s
    res = CliRunner().invoke(main, ["bench", "--soak", "1"])
    assert res.exit_code == 2 and "--endpoint" in res.output


def test_a_request_can_opt_out_of_speculation(ngram_app, reference):
    """``speculative: false`` (the A/B extension): the same greedy text, no draft tokens."""
    def drafted() -> float:
        return ngram_app.metrics()["speccompile_draft_tokens_total"]

    prompt, n = BASE_PROMPTS[2], 32
    # a fixed draft length for this test: the adaptive policy may rightly pause drafting after the
    # module's earlier load (its guard, under a busy CI host), and what is tested here is the opt-out
    engine = ngram_app.http.app.state.scheduler.engine
    engine.set_draft_length(4)
    before = drafted()
    r = ngram_app.openai().chat.completions.create(
        model=ngram_app.name, messages=[{"role": "user", "content": prompt}], max_tokens=n, temperature=0,
        extra_body={"speculative": False})
    assert r.choices[0].message.content == reference(prompt, n).text
    assert drafted() == before
    r = ngram_app.openai().chat.completions.create(
        model=ngram_app.name, messages=[{"role": "user", "content": prompt}], max_tokens=n, temperature=0)
    assert r.choices[0].message.content == reference(prompt, n).text
    assert drafted() > before  # the same request drafts when it does not opt out
    engine.set_draft_length(0)


def test_a_conversation_resent_is_prefilled_only_where_new(plain_app, model):
    """A chat client resends the whole conversation each turn: the server's prefix cache
    (runtime/prefix_cache.py) keeps the last answer's KV, the next turn prefills only the new
    message, says so in ``usage.prompt_tokens_details.cached_tokens``, and answers what an
    engine without the cache answers."""
    from speccompile.runtime.engine import Engine

    client = plain_app.openai()
    messages = [{"role": "user", "content": BASE_PROMPTS[0]}]
    first = client.chat.completions.create(model=plain_app.name, messages=messages, max_tokens=24, temperature=0)
    messages += [{"role": "assistant", "content": first.choices[0].message.content},
                 {"role": "user", "content": "Now say it in one sentence."}]
    second = client.chat.completions.create(model=plain_app.name, messages=messages, max_tokens=24, temperature=0)
    cold = Engine(*model, prefix_cache_max_num_recycling_seqs=0)
    ids = cold.tokenizer.encode(cold.render(messages), add_special_tokens=False).ids
    assert second.choices[0].message.content == cold.generate(ids, 24).text
    assert second.usage.prompt_tokens == len(ids)
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert first.usage.prompt_tokens < cached < len(ids), (first.usage, cached)
    m = plain_app.metrics()
    assert m["speccompile_cached_prompt_tokens_total"] >= cached and m["speccompile_kv_pages_kept"] > 0


def test_serve_rejects_bad_options_before_loading(model):
    from click.testing import CliRunner

    from speccompile.cli.main import main

    model_dir, lib = model
    for extra, msg in ((["--port", "70000"], "--port"), (["--max-num-sequence", "0"], "--max-num-sequence"),
                       (["--max-total-tokens", "4"], "--max-total-tokens")):
        res = CliRunner().invoke(main, ["serve", str(model_dir), "--model-lib", str(lib), *extra])
        assert res.exit_code == 2 and msg in res.output, res.output


# ------------------------------------------------------------- disconnects
def test_client_disconnect_frees_pages(socket_server):
    """A client that goes away mid-generation cancels its request and its KV pages come
    back, streamed or not. Nothing assumes a speed: each request may run to the end of the
    context window (no max_tokens, EOS ignored), the test sees it running before it
    disconnects, and polls the metrics for the pages with a generous deadline."""
    server = socket_server
    before = server.wait_idle()
    body = {"model": server.name, "messages": [{"role": "user", "content": "Write a long story about a ship."}],
            "temperature": 0, "ignore_eos": True, "stream": True}
    with server.http.stream("POST", "/v1/chat/completions", json=body, headers=server.headers) as r:
        lines = r.iter_lines()
        got = [next(lines) for _ in range(12)]
        assert all(g.startswith("data: ") or not g for g in got)
        busy = server.metrics()
        assert busy["speccompile_kv_pages_used"] > 0 and busy["speccompile_running_requests"] == 1
    # leaving the block closes the connection mid-stream
    assert server.wait_idle()["speccompile_kv_pages_used"] == 0
    # not streamed: a raw connection, closed once the request is seen running
    payload = json.dumps({**body, "stream": False}).encode()
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: {server.http.base_url.host}\r\n"
            f"Authorization: Bearer {API_KEY}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\n\r\n").encode()
    with socket.create_connection((server.http.base_url.host, server.http.base_url.port)) as conn:
        conn.sendall(head + payload)
        poll(lambda: server.metrics()["speccompile_running_requests"] == 1, "the request to run")
        assert server.metrics()["speccompile_kv_pages_used"] > 0
    after = server.wait_idle()
    assert after["speccompile_kv_pages_used"] == 0 and after["speccompile_running_requests"] == 0

    def count(m: dict, outcome: str) -> float:
        return m.get(f"speccompile_requests_total{{endpoint=chat,outcome={outcome}}}", 0)

    assert count(after, "cancelled") - count(before, "cancelled") == 2
    assert all(count(after, o) == count(before, o) for o in ("stop", "length", "error"))  # none ran to an end
