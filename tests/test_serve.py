"""``speccompile serve`` end to end: real uvicorn servers (subprocesses) on loopback ports.

Three servers over SmolLM2-135M-Instruct q4f32_1: ngram speculation with an API key and a
small prefill chunk per step (so long prompts are prefilled across decode steps), plain
decoding, and a plain server with a tiny KV cache (256 tokens) for floods and preemption.
Every greedy output is compared with the Engine's own greedy output for the same prompt
run alone: batching, chunked prefill, speculation and preemption must not change a token.
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


class Server:
    def __init__(self, proc: subprocess.Popen, url: str, name: str, log_path: str, api_key: str | None):
        self.proc, self.url, self.name, self.log_path = proc, url, name, log_path
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    def post(self, path: str, body, timeout: float = 120.0, **kw) -> httpx.Response:
        data = body if isinstance(body, (bytes, str)) else json.dumps(body)
        return httpx.post(self.url + path, content=data, headers={"Content-Type": "application/json", **self.headers},
                          timeout=timeout, **kw)

    def metrics(self) -> dict[str, float]:
        """Samples of /metrics by 'name{labels}' (labels sorted), parsed with prometheus_client."""
        from prometheus_client.parser import text_string_to_metric_families

        out = {}
        for fam in text_string_to_metric_families(httpx.get(self.url + "/metrics", timeout=30).text):
            for s in fam.samples:
                labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
                out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
        return out

    def wait_idle(self, deadline: float = 60.0) -> dict[str, float]:
        """Metrics once nothing runs or waits (the engine frees pages at step boundaries)."""
        end = time.monotonic() + deadline
        while True:
            m = self.metrics()
            idle = m["speccompile_running_requests"] == 0 and m["speccompile_queue_length"] == 0
            if idle and m["speccompile_kv_pages_used"] == 0 or time.monotonic() > end:
                return m
            time.sleep(0.1)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def model(smollm2_q4):
    return smollm2_q4


def _start(model, tmp_path_factory, *extra: str, api_key: str | None = None) -> Server:
    model_dir, lib = model
    port = _free_port()
    log_path = str(tmp_path_factory.mktemp("serve") / "server.log")
    args = [sys.executable, "-m", "speccompile.cli", "serve", str(model_dir), "--model-lib", str(lib),
            "--port", str(port), "--log-level", "warning", *extra]
    if api_key:
        args += ["--api-key", api_key]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    with open(log_path, "w") as log:
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env)
    server = Server(proc, f"http://127.0.0.1:{port}", model_dir.name, log_path, api_key)
    end = time.monotonic() + 300
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}:\n{Path(log_path).read_text()}")
        try:
            if httpx.get(server.url + "/health", timeout=5).status_code == 200:
                return server
        except httpx.TransportError:
            pass
        if time.monotonic() > end:
            proc.kill()
            raise RuntimeError(f"server did not come up:\n{Path(log_path).read_text()}")
        time.sleep(0.25)


def _stop(server: Server) -> None:
    server.proc.terminate()
    try:
        server.proc.wait(30)
    except subprocess.TimeoutExpired:
        server.proc.kill()
        server.proc.wait()


@pytest.fixture(scope="module")
def ngram_server(model, tmp_path_factory):
    server = _start(model, tmp_path_factory, "--speculative-mode", "ngram", "--max-num-sequence", "8",
                    "--prefill-tokens-per-step", "64", api_key=API_KEY)
    yield server
    _stop(server)


@pytest.fixture(scope="module")
def plain_server(model, tmp_path_factory):
    server = _start(model, tmp_path_factory, "--max-num-sequence", "4")
    yield server
    _stop(server)


@pytest.fixture(scope="module")
def tiny_server(model, tmp_path_factory):
    server = _start(model, tmp_path_factory, "--speculative-mode", "ngram", "--max-num-sequence", "4",
                    "--max-total-tokens", "256", "--prefill-tokens-per-step", "32")
    yield server
    _stop(server)


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


def _client(server: Server):
    from openai import OpenAI

    return OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=120)


def _stream_chat(server: Server, prompt: str, max_tokens: int) -> tuple[str, str | None]:
    """(text, finish_reason) of a streamed greedy chat completion, parsed by hand from SSE."""
    body = {"model": server.name, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0, "stream": True}
    text, finish = "", None
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, headers=server.headers,
                      timeout=300) as r:
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
@pytest.mark.parametrize("which", ["ngram_server", "plain_server"])
def test_openai_client_chat_streamed_and_not(request, which, reference):
    server = request.getfixturevalue(which)
    client = _client(server)
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


def test_completions_endpoint_and_stop_strings(ngram_server, reference):
    client = _client(ngram_server)
    raw = "The three primary colors are"
    expected = reference(raw, 24, raw=True)
    res = client.completions.create(model=ngram_server.name, prompt=raw, max_tokens=24, temperature=0)
    assert res.choices[0].text == expected.text and res.usage.completion_tokens == len(expected.token_ids)
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=ngram_server.name, prompt=raw, max_tokens=24, temperature=0, stream=True))
    assert streamed == expected.text
    # a stop string inside the output: cut before it, finish_reason "stop", also when streamed
    full = reference(BASE_PROMPTS[1], 40)
    stop = full.text.split()[4]
    cut = reference(BASE_PROMPTS[1], 40, stop=(stop,))
    assert stop not in cut.text and cut.finish_reason == "stop"
    for stream in (False, True):
        out = client.chat.completions.create(model=ngram_server.name, max_tokens=40, temperature=0, stop=[stop],
                                             messages=[{"role": "user", "content": BASE_PROMPTS[1]}], stream=stream)
        if stream:
            chunks = list(out)
            text = "".join(c.choices[0].delta.content or "" for c in chunks)
            finish = [c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason]
        else:
            text, finish = out.choices[0].message.content, [out.choices[0].finish_reason]
        assert text == cut.text and finish == ["stop"]


def test_seeded_sampling_is_reproducible(plain_server):
    body = {"model": plain_server.name, "messages": [{"role": "user", "content": BASE_PROMPTS[5]}],
            "max_tokens": 16, "temperature": 0.9, "top_p": 0.9, "top_k": 40, "seed": 1234}
    a, b = plain_server.post("/v1/chat/completions", body).json(), plain_server.post("/v1/chat/completions", body).json()
    assert a["choices"][0]["message"]["content"] == b["choices"][0]["message"]["content"]
    assert a["usage"]["completion_tokens"] == 16


# -------------------------------------------------------------------- load
def test_32_concurrent_streams_match_their_solo_outputs(ngram_server, reference):
    jobs = [(p, n) for n in (12, 40) for p in BASE_PROMPTS]
    jobs += [(LONG_PROMPT, 16), (LONG_PROMPT, 24)]
    jobs += [(f"{p} Answer briefly.", n) for n, p in zip((8, 20, 28, 36, 8, 20, 28, 36, 8, 20, 28, 36, 8, 20),
                                                          BASE_PROMPTS * 2)]
    assert len(jobs) == 32
    expected = [reference(p, n) for p, n in jobs]

    def completed(m: dict) -> float:
        return sum(m.get(f"speccompile_requests_total{{endpoint=chat,outcome={o}}}", 0) for o in ("stop", "length"))

    before = completed(ngram_server.wait_idle())
    with ThreadPoolExecutor(32) as pool:
        outputs = list(pool.map(lambda job: _stream_chat(ngram_server, *job), jobs))
    for (p, n), exp, (text, finish) in zip(jobs, expected, outputs):
        assert text == exp.text, f"{p[:40]!r} max_tokens={n}"
        assert finish == exp.finish_reason
    m = ngram_server.wait_idle()
    assert m["speccompile_kv_pages_used"] == 0 and m["speccompile_running_requests"] == 0
    assert completed(m) - before == 32
    assert httpx.get(ngram_server.url + "/health").status_code == 200


# ------------------------------------------------------------------ faults
def test_client_disconnect_frees_pages(ngram_server):
    before = ngram_server.wait_idle()
    body = {"model": ngram_server.name, "messages": [{"role": "user", "content": "Write a long story about a ship."}],
            "max_tokens": 4000, "temperature": 0, "stream": True}
    with httpx.stream("POST", ngram_server.url + "/v1/chat/completions", json=body, headers=ngram_server.headers,
                      timeout=60) as r:
        lines = r.iter_lines()
        got = [next(lines) for _ in range(12)]
        assert all(g.startswith("data: ") or not g for g in got)
        busy = ngram_server.metrics()
        assert busy["speccompile_kv_pages_used"] > 0 and busy["speccompile_running_requests"] == 1
    # non-streaming: the client gives up waiting
    with pytest.raises(httpx.ReadTimeout):
        ngram_server.post("/v1/chat/completions", {**body, "stream": False}, timeout=1.0)
    after = ngram_server.wait_idle()
    assert after["speccompile_kv_pages_used"] == 0 and after["speccompile_running_requests"] == 0
    cancelled = "speccompile_requests_total{endpoint=chat,outcome=cancelled}"
    assert after[cancelled] - before.get(cancelled, 0) == 2


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
    ({"messages": [{"role": "user", "content": "hi"}], "n": 2}, "n"),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "user", "content": "hi " * 9000}]}, "messages"),  # over the context window
])
def test_bad_requests_get_400_in_openai_schema(ngram_server, body, param):
    if isinstance(body, dict):
        body = {"model": ngram_server.name, **body}
    err = _assert_openai_error(ngram_server.post("/v1/chat/completions", body), 400)
    assert err["param"] == param and err["type"] == "invalid_request_error"


def test_unknown_model_auth_and_routes(ngram_server):
    msg = [{"role": "user", "content": "hi"}]
    err = _assert_openai_error(ngram_server.post("/v1/chat/completions", {"model": "gpt-9", "messages": msg}), 404)
    assert err["code"] == "model_not_found"
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": API_KEY}):
        r = httpx.post(ngram_server.url + "/v1/chat/completions", json={"model": ngram_server.name, "messages": msg},
                       headers=headers)
        assert _assert_openai_error(r, 401)["code"] == "invalid_api_key"
    _assert_openai_error(httpx.get(ngram_server.url + "/v1/nothing-here"), 404)
    _assert_openai_error(httpx.get(ngram_server.url + "/v1/completions"), 405)
    err = _assert_openai_error(ngram_server.post("/v1/completions", {"model": ngram_server.name, "prompt": [49152]}), 400)
    assert "out of range" in err["message"]


def test_flood_beyond_kv_capacity_queues_preempts_and_stays_up(tiny_server, reference):
    # 256 KV tokens (16 pages): a prompt that can never fit is refused up front
    err = _assert_openai_error(tiny_server.post("/v1/chat/completions", {
        "model": tiny_server.name, "messages": [{"role": "user", "content": LONG_PROMPT}]}), 400)
    assert err["code"] == "context_length_exceeded"
    jobs = [(p, 60) for p in BASE_PROMPTS] * 2
    expected = [reference(p, n) for p, n in jobs]
    with ThreadPoolExecutor(len(jobs)) as pool:
        outputs = list(pool.map(lambda job: _stream_chat(tiny_server, *job), jobs))
    for (p, n), exp, (text, _) in zip(jobs, expected, outputs):
        assert text == exp.text, f"{p[:40]!r}: corrupted under KV pressure"
    m = tiny_server.wait_idle()
    assert m["speccompile_kv_pages_used"] == 0 and m["speccompile_kv_pages_free"] == 16
    print("preemptions under the flood:", m["speccompile_preemptions_total"])
    assert m["speccompile_engine_errors_total"] == 0
    assert httpx.get(tiny_server.url + "/health").json()["status"] == "ok"


# ----------------------------------------------------------------- metrics
def test_metrics_have_one_clean_name_each(ngram_server, reference):
    # a repetitive prompt so that n-gram drafts are proposed and verified
    _stream_chat(ngram_server, BASE_PROMPTS[2] + " " + BASE_PROMPTS[2], 48)
    text = httpx.get(ngram_server.url + "/metrics").text
    names = [ln.split()[2] for ln in text.splitlines() if ln.startswith("# TYPE")]
    assert len(names) == len(set(names))
    assert not any(n.endswith("_created") for n in names) and "_created" not in text
    m = ngram_server.wait_idle()
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
_MESSAGE = st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant", "developer", "bot", 3]),
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
def test_fuzzed_requests_never_get_a_5xx(plain_server, req):
    path, body = req
    if body.get("model") == "MODEL":
        body["model"] = plain_server.name
    with httpx.stream("POST", plain_server.url + path, content=json.dumps(body),
                      headers={"Content-Type": "application/json"}, timeout=120) as r:
        payload = r.read().decode()
    event(f"HTTP {r.status_code}")
    assert r.status_code < 500, payload
    if r.status_code >= 400:
        assert set(json.loads(payload)["error"]) == {"message", "type", "param", "code"}
    elif body.get("stream") is True:
        assert payload.rstrip().endswith("data: [DONE]")
    else:
        assert json.loads(payload)["choices"][0]["finish_reason"] in ("stop", "length")
    assert httpx.get(plain_server.url + "/health").status_code == 200


# ---------------------------------------------------------------- commands
def test_bench_endpoint_reports_throughput_and_percentiles(ngram_server, tmp_path):
    from click.testing import CliRunner

    from speccompile.cli import main

    out = tmp_path / "bench.json"
    res = CliRunner().invoke(main, ["bench", "--endpoint", ngram_server.url + "/v1", "--concurrency", "1,2",
                                    "--num-prompts", "2", "--max-tokens", "8", "--api-key", API_KEY,
                                    "--json", str(out)])
    assert res.exit_code == 0, res.output
    report = json.loads(out.read_text())
    assert [lv["concurrency"] for lv in report["levels"]] == [1, 2]
    for lv in report["levels"]:
        assert lv["errors"] == 0 and lv["output_tokens"] == 16  # ignore_eos: every request runs to max_tokens
        assert lv["output_tokens_per_s"] > 0
        assert set(lv["ttft_s"]) == set(lv["itl_s"]) == {"p50", "p90", "p99", "mean"}
    res = CliRunner().invoke(main, ["bench", "--endpoint", ngram_server.url, "--concurrency", "0"])
    assert res.exit_code == 2 and "positive" in res.output
    # --ab: the same server decodes half the prompts without speculation, ABBA-interleaved
    res = CliRunner().invoke(main, ["bench", "--endpoint", ngram_server.url, "--concurrency", "2", "--num-prompts", "4",
                                    "--max-tokens", "8", "--api-key", API_KEY, "--ab", "--json", str(out)])
    assert res.exit_code == 0, res.output
    (lv,) = json.loads(out.read_text())["levels"]
    assert lv["output_tokens"] == lv["plain"]["output_tokens"] == 32 and lv["errors"] == lv["plain"]["errors"] == 0
    assert lv["speedup"] > 0 and "| plain" in res.output  # the printed line carries the plain side


def test_a_request_can_opt_out_of_speculation(ngram_server, reference):
    """``speculative: false`` (the A/B extension): the same greedy text, no draft tokens."""
    def drafted() -> float:
        text = httpx.get(ngram_server.url + "/metrics").text
        return float(next(line.split()[-1] for line in text.splitlines()
                          if line.startswith("speccompile_draft_tokens_total ")))

    prompt, n = BASE_PROMPTS[2], 32
    before = drafted()
    r = _client(ngram_server).chat.completions.create(
        model=ngram_server.name, messages=[{"role": "user", "content": prompt}], max_tokens=n, temperature=0,
        extra_body={"speculative": False})
    assert r.choices[0].message.content == reference(prompt, n).text
    assert drafted() == before
    r = _client(ngram_server).chat.completions.create(
        model=ngram_server.name, messages=[{"role": "user", "content": prompt}], max_tokens=n, temperature=0)
    assert r.choices[0].message.content == reference(prompt, n).text
    assert drafted() > before  # the same request drafts when it does not opt out


def test_serve_rejects_bad_options_before_loading(model):
    from click.testing import CliRunner

    from speccompile.cli import main

    model_dir, lib = model
    for extra, msg in ((["--port", "70000"], "--port"), (["--max-num-sequence", "0"], "--max-num-sequence"),
                       (["--max-total-tokens", "4"], "--max-total-tokens")):
        res = CliRunner().invoke(main, ["serve", str(model_dir), "--model-lib", str(lib), *extra])
        assert res.exit_code == 2 and msg in res.output, res.output
