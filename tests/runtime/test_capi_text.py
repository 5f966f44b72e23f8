"""Text in and out through the C API, twinned with the Python runtime on SmolLM2: the example
`spc_generate --prompt TEXT --json` prints what `speccompile generate --prompt TEXT --json`
prints (prompt ids, token ids, text, finish reason) on prompts outside bench/, plainly and with
n-gram speculation, raw or through the chat format, with stop strings; and a conversation is
rendered as the Jinja chat template renders it."""
from __future__ import annotations

import ctypes as C
import json
import subprocess
import sys

import pytest
from capi_ctypes import SPC_ERR_INCOMPATIBLE, SPC_ERR_INVALID_ARGUMENT, Capi, CapiError, ChatMessage, Stats, run_example

from speccompile.runtime.engine import Engine
from speccompile.runtime.sampling import SamplingParams
from speccompile.runtime.tokenizer import render_messages

pytestmark = pytest.mark.real_model

MAX_TOKENS = 40
# not in bench/: the twin must hold on text nobody tuned for
PROMPTS = [
    "Name three rivers in Africa and one fact about each.",
    "Translate to French: the train leaves at seven o'clock.",
    "List the numbers 1 2 3 4 5 6 7 8 in words, separated by commas.",
]


@pytest.fixture(scope="module")
def engine(smollm2_q4) -> Engine:
    model_dir, lib = smollm2_q4
    return Engine(model_dir, lib)


def spc_generate(capi_build, model_dir, lib, prompt: str, *flags: str) -> dict:
    proc = run_example(capi_build / "spc_generate", model_dir, lib, "--prompt", prompt, "--max-tokens", str(MAX_TOKENS),
                       "--json", *flags)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def same_answer(c: dict, py: dict) -> None:
    for key in ("prompt_token_ids", "token_ids", "text", "finish_reason"):
        assert c[key] == py[key], key


def test_the_cli_and_the_c_example_print_the_same(capi_build, smollm2_q4):
    """`speccompile generate` and `spc_generate`, same flags, one prompt, each as a user runs it."""
    model_dir, lib = smollm2_q4
    flags = ["--speculative-mode", "ngram"]
    proc = subprocess.run([sys.executable, "-m", "speccompile.cli", "generate", str(model_dir), "--model-lib", str(lib),
                           "--prompt", PROMPTS[0], "--max-tokens", str(MAX_TOKENS), "--json", *flags],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    py = json.loads(proc.stdout.strip().splitlines()[-1])
    c = spc_generate(capi_build, model_dir, lib, PROMPTS[0], *flags)
    same_answer(c, py)
    assert c["stats"]["prefill_tokens"] == len(py["prompt_token_ids"])
    assert c["stats"]["request_seconds"] > 0


@pytest.mark.parametrize("mode", ["disable", "ngram"])
@pytest.mark.parametrize("raw", [False, True])
def test_text_equals_python(capi_build, engine, smollm2_q4, mode, raw):
    model_dir, lib = smollm2_q4
    for prompt in PROMPTS:
        ids = engine.encode_prompt(prompt, raw=raw)
        py = engine.generate(ids, MAX_TOKENS, SamplingParams(temperature=0.0)).to_dict()
        flags = ["--speculative-mode", mode] + (["--raw"] if raw else [])
        c = spc_generate(capi_build, model_dir, lib, prompt, *flags)
        same_answer(c, py)
        if mode == "disable":
            assert c["stats"]["draft_tokens"] == 0


def test_stop_strings_as_python(capi_build, engine, smollm2_q4):
    """A stop string ends the text before it, whichever token it falls in, as in Python."""
    model_dir, lib = smollm2_q4
    prompt = PROMPTS[2]
    full = engine.generate(engine.encode_prompt(prompt), MAX_TOKENS).text
    words = full.split()
    long_word = next(w for w in words[2:] if len(w) >= 4)
    # a whole word, the middle of one (it may fall inside a token), a line break
    for stop in (words[3], long_word[1:3], "\n"):
        assert stop in full
        py = engine.generate(engine.encode_prompt(prompt), MAX_TOKENS, stop=[stop, "never there"]).to_dict()
        c = spc_generate(capi_build, model_dir, lib, prompt, "--stop", stop, "--stop", "never there")
        same_answer(c, py)
        assert c["finish_reason"] == "stop" and stop not in c["text"]


def test_chat_rendering_equals_the_template(capi_build, engine, smollm2_q4):
    """spc_chat_render (the chat format gen_config recorded) against the Jinja template, on
    conversations with and without a system prompt and several turns."""
    model_dir, lib = smollm2_q4
    capi = Capi(capi_build)
    model = C.c_void_p()
    capi.check(capi.lib.spc_model_load(str(model_dir).encode(), str(lib).encode(), b"cpu", C.byref(model)))
    conversations = [
        [{"role": "user", "content": "hi"}],
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "  spaces  \n"}],
        [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "日本"}],
        [{"role": "system", "content": ""}, {"role": "user", "content": "x"}, {"role": "assistant", "content": "y\n"},
         {"role": "user", "content": "<|im_end|> inside"}],
    ]
    try:
        for conv in conversations:
            msgs = (ChatMessage * len(conv))(*[ChatMessage(m["role"].encode(), m["content"].encode()) for m in conv])
            n = C.c_size_t()
            capi.check(capi.lib.spc_chat_render(model, msgs, C.c_size_t(len(conv)), 1, None, C.c_size_t(0),
                                                C.byref(n)))
            buf = C.create_string_buffer(n.value + 1)
            capi.check(capi.lib.spc_chat_render(model, msgs, C.c_size_t(len(conv)), 1, buf, C.c_size_t(n.value + 1),
                                                C.byref(n)))
            assert buf.raw[: n.value].decode() == render_messages(engine.config, conv)
        bad = (ChatMessage * 1)(ChatMessage(b"narrator", b"x"))
        rc = capi.lib.spc_chat_render(model, bad, C.c_size_t(1), 1, None, C.c_size_t(0), None)
        assert rc == SPC_ERR_INVALID_ARGUMENT and "narrator" in capi.lib.spc_last_error().decode()
    finally:
        capi.lib.spc_model_free(model)


def test_model_without_chat_format_is_refused_with_the_fix(capi_build, smollm2_q4, tmp_path):
    """A folder converted before gen_config recorded chat formats: raw text still runs, a chat
    prompt says what to do."""
    model_dir, lib = smollm2_q4
    old = tmp_path / "old"
    old.mkdir()
    for f in model_dir.iterdir():
        if f.name != "speccompile-config.json":
            (old / f.name).symlink_to(f)
    conf = json.loads((model_dir / "speccompile-config.json").read_text())
    conf.pop("chat_format", None)
    (old / "speccompile-config.json").write_text(json.dumps(conf))
    proc = run_example(capi_build / "spc_generate", old, lib, "--prompt", "hi", "--max-tokens", "2", "--json")
    assert proc.returncode != 0 and "gen_config" in proc.stderr
    assert spc_generate(capi_build, old, lib, "hi", "--raw")["token_ids"]
    capi = Capi(capi_build)
    model = C.c_void_p()
    capi.check(capi.lib.spc_model_load(str(old).encode(), str(lib).encode(), b"cpu", C.byref(model)))
    try:
        msgs = (ChatMessage * 1)(ChatMessage(b"user", b"hi"))
        with pytest.raises(CapiError) as err:
            capi.check(capi.lib.spc_chat_render(model, msgs, C.c_size_t(1), 1, None, C.c_size_t(0), None))
        assert err.value.code == SPC_ERR_INCOMPATIBLE
    finally:
        capi.lib.spc_model_free(model)


@pytest.mark.parametrize("prefix_cache", [1, 0])
def test_a_conversation_prefills_only_its_new_message(capi_build, engine, smollm2_q4, prefix_cache):
    """spc_generate_chat over a growing conversation: each answer is what a cold Python engine
    answers to the same conversation, and with the prefix cache each turn after the first
    prefills only what is new (the previous answer's tail and the new message)."""
    model_dir, lib = smollm2_q4
    capi = Capi(capi_build)
    model = capi.model(model_dir, lib)
    session = capi.session(model, speculative_mode=1, prefix_cache_max_num_recycling_seqs=prefix_cache)
    messages = []
    try:
        for turn, text in enumerate(["Name a prime number below 20.", "And one above 20?", "Add the two."]):
            messages.append({"role": "user", "content": text})
            answer, stats = capi.chat(session, messages, 24)
            ids = engine.tokenizer.encode(engine.render(messages), add_special_tokens=False).ids
            assert answer == engine.generate(ids, 24).text
            assert stats.prefill_tokens + stats.cached_prompt_tokens == len(ids)
            if prefix_cache and turn > 0:
                assert stats.cached_prompt_tokens > 0.6 * len(ids), (stats.cached_prompt_tokens, len(ids))
            else:
                assert stats.cached_prompt_tokens == 0
            messages.append({"role": "assistant", "content": answer})
    finally:
        capi.lib.spc_session_free(session)
        capi.lib.spc_model_free(model)


def test_the_chat_example_holds_a_conversation(capi_build, engine, smollm2_q4):
    """spc_chat: one user message per line, each answer streamed; the second turn prefills only
    what is new, and its answer is what the Python engine answers to the whole conversation."""
    model_dir, lib = smollm2_q4
    turns = ["Name a fruit.", "And a vegetable?"]
    proc = run_example(capi_build / "spc_chat", model_dir, lib, "--max-tokens", "20", stdin="\n".join(turns) + "\n")
    assert proc.returncode == 0, proc.stderr
    stats = [line for line in proc.stderr.splitlines() if line.startswith("[turn")]
    assert len(stats) == 2 and " 0 cached" in stats[0] and " 0 cached" not in stats[1], stats
    messages = []
    for text in turns:
        messages.append({"role": "user", "content": text})
        ids = engine.tokenizer.encode(engine.render(messages), add_special_tokens=False).ids
        messages.append({"role": "assistant", "content": engine.generate(ids, 20).text})
    assert proc.stdout == "".join(m["content"] + "\n" for m in messages if m["role"] == "assistant")


def test_cancellation_and_an_over_long_prompt(capi_build, smollm2_q4):
    """The text callback cancels by returning nonzero (finish reason cancelled; a generation cut
    short is not kept by the prefix cache); a prompt longer than the context window is a clear
    SPC_ERR_INVALID_ARGUMENT before anything runs."""
    model_dir, lib = smollm2_q4
    capi = Capi(capi_build)
    model = capi.model(model_dir, lib)
    session = capi.session(model)
    seen = []
    callback_type = C.CFUNCTYPE(C.c_int, C.c_char_p, C.c_size_t, C.c_void_p)

    @callback_type
    def stop_after_two(delta, n, user):
        seen.append(n)
        return int(len(seen) >= 2)

    try:
        capi.check(capi.lib.spc_generate_text(session, b"Tell me a long story about the sea.", 0, None, stop_after_two,
                                              None, None, C.c_size_t(0), None))
        stats = Stats()
        capi.check(capi.lib.spc_session_stats(session, C.byref(stats)))
        assert len(seen) == 2 and stats.finish_reason == 3  # SPC_FINISH_CANCELLED
        capi.check(capi.lib.spc_generate_text(session, b"Tell me a long story about the sea.", 0, None, None, None, None,
                                              C.c_size_t(0), None))
        capi.check(capi.lib.spc_session_stats(session, C.byref(stats)))
        assert stats.cached_prompt_tokens == 0  # nothing was kept from the cancelled run
        window = capi.lib.spc_model_context_window(model)
        rc = capi.lib.spc_generate_text(session, b" word" * (window + 10), 1, None, None, None, None, C.c_size_t(0),
                                        None)
        assert rc == SPC_ERR_INVALID_ARGUMENT
        assert f"the context window is {window}" in capi.lib.spc_last_error().decode()
    finally:
        capi.lib.spc_session_free(session)
        capi.lib.spc_model_free(model)
