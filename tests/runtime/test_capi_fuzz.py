"""The C API's arguments fuzzed through ctypes (hypothesis): whatever an app passes -- bytes that
are not UTF-8, ids out of range, NULLs, freed handles, odd sampling settings, stop lists with
holes -- comes back as SPC_OK or a negative SPC_ERR_* with a message, never a crash of the
process that embeds it."""
from __future__ import annotations

import ctypes as C
import json
import subprocess
import sys
import textwrap

import pytest
from capi_ctypes import SPC_ERR_INVALID_ARGUMENT, SPC_OK, Capi, GenerateParams
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer

pytestmark = pytest.mark.real_model

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


Params = GenerateParams  # include/speccompile.h's spc_generate_params


@pytest.fixture(scope="module")
def capi(capi_build) -> Capi:
    return Capi(capi_build)


@pytest.fixture(scope="module")
def smol(capi, smollm2_q4):
    """(model handle, session handle, tokenizer handle, HF tokenizer) on SmolLM2."""
    model_dir, lib = smollm2_q4
    model, session, tok = C.c_void_p(), C.c_void_p(), C.c_void_p()
    capi.check(capi.lib.spc_model_load(str(model_dir).encode(), str(lib).encode(), b"cpu", C.byref(model)))
    capi.check(capi.lib.spc_session_create(model, None, C.byref(session)))
    capi.check(capi.lib.spc_model_tokenizer(model, C.byref(tok)))
    yield model, session, tok, Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    capi.lib.spc_session_free(session)
    capi.lib.spc_model_free(model)


@FUZZ
@given(data=st.binary(max_size=200))
def test_any_bytes_tokenize_or_are_refused(capi, smol, data):
    _, _, tok, hf = smol
    n = C.c_size_t()
    out = (C.c_int32 * (len(data) + 8))()
    rc = capi.lib.spc_tokenize(tok, data, C.c_size_t(len(data)), out, C.c_size_t(len(data) + 8), C.byref(n))
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        assert rc == SPC_ERR_INVALID_ARGUMENT and b"UTF-8" in capi.lib.spc_last_error()
        return
    assert rc == SPC_OK
    assert list(out[: n.value]) == hf.encode(text, add_special_tokens=False).ids
    small = (C.c_int32 * 1)()  # a buffer too small: the count says how many there are, nothing overflows
    assert capi.lib.spc_tokenize(tok, data, C.c_size_t(len(data)), small, C.c_size_t(1), C.byref(n)) == SPC_OK


@FUZZ
@given(ids=st.lists(st.integers(-2 ** 31, 2 ** 31 - 1) | st.integers(0, 49151), max_size=20),
       cap=st.integers(0, 64), skip=st.booleans())
def test_any_ids_detokenize_or_are_refused(capi, smol, ids, cap, skip):
    _, _, tok, hf = smol
    arr = (C.c_int32 * max(1, len(ids)))(*ids)
    buf = C.create_string_buffer(max(1, cap))
    n = C.c_size_t()
    rc = capi.lib.spc_detokenize(tok, arr, C.c_size_t(len(ids)), int(skip), buf if cap else None, C.c_size_t(cap),
                                 C.byref(n))
    if all(0 <= i < hf.get_vocab_size() for i in ids):
        assert rc == SPC_OK
        want = hf.decode(ids, skip_special_tokens=skip).encode()
        assert n.value == len(want)
        if cap:
            assert buf.raw[: min(cap - 1, n.value)] == want[: cap - 1]  # cut to fit, NUL-terminated
    else:
        assert rc == SPC_ERR_INVALID_ARGUMENT and b"not in the vocabulary" in capi.lib.spc_last_error()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(max_tokens=st.integers(-3, 6), temperature=st.sampled_from([-1.0, 0.0, 0.7, float("nan"), float("inf")]),
       top_p=st.sampled_from([-0.5, 0.0, 0.3, 1.0, 1.5, float("nan")]), top_k=st.integers(-2, 5),
       stop=st.lists(st.sampled_from([b"the", b"", b"\xff\xfe", None, b"."]), max_size=3),
       prompt=st.sampled_from([b"hi", b"", b"\xc3", "好的".encode()]), raw=st.booleans())
def test_generation_settings_give_text_or_an_error(capi, smol, max_tokens, temperature, top_p, top_k, stop, prompt,
                                                   raw):
    _, session, _, _ = smol
    stops = (C.c_char_p * max(1, len(stop)))(*stop)
    p = Params(max_tokens, temperature, top_p, top_k, 1, 0, stops if stop else None, len(stop))
    out = C.create_string_buffer(256)
    n = C.c_size_t()
    rc = capi.lib.spc_generate_text(session, prompt, int(raw), C.byref(p), None, None, out, C.c_size_t(256),
                                    C.byref(n))
    ok = (max_tokens > 0 and 0 <= temperature < float("inf") and 0 < top_p <= 1 and top_k >= 0 and None not in stop
          and prompt != b"\xc3" and (prompt or not raw))
    if ok:
        assert rc == SPC_OK, capi.lib.spc_last_error()
        assert n.value == len(out.value)
    else:
        assert rc == SPC_ERR_INVALID_ARGUMENT
        assert capi.lib.spc_last_error()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(mode=st.integers(-1, 6), draft_length=st.integers(-1, 9), width=st.sampled_from([0, 1, 2, 99]),
       nodes=st.sampled_from([0, 1, 64, 257]), additional=st.sampled_from([None, "eagle", "medusa", "target", "freed"]),
       recycling=st.integers(-1, 2))
def test_session_configs_give_a_session_or_an_error(capi, smol, smollm2_heads, mode, draft_length, width, nodes,
                                                    additional, recycling):
    """Every speculative setting, with a head, a draft model, the target itself or a freed handle as
    the additional model: a session that generates, or SPC_ERR_INVALID_ARGUMENT /
    SPC_ERR_INCOMPATIBLE with a message."""
    from capi_ctypes import SPC_ERR_INCOMPATIBLE, SessionConfig

    model = smol[0]
    handles = {"eagle": capi.model(*smollm2_heads[0]), "medusa": capi.model(*smollm2_heads[1])}
    handles["freed"] = capi.model(*smollm2_heads[1])
    capi.lib.spc_model_free(handles["freed"])
    cfg = SessionConfig()
    capi.lib.spc_session_config_default(C.byref(cfg))
    cfg.speculative_mode, cfg.draft_length, cfg.spec_tree_width, cfg.spec_tree_nodes = mode, draft_length, width, nodes
    cfg.prefix_cache_max_num_recycling_seqs = recycling
    cfg.draft_model = model.value if additional == "target" else handles[additional].value if additional else None
    session = C.c_void_p()
    try:
        rc = capi.lib.spc_session_create(model, C.byref(cfg), C.byref(session))
        if rc == SPC_OK:
            p = Params(4, 0.0, 1.0, 0, 1, 0, None, 0)
            n = C.c_size_t()
            capi.check(capi.lib.spc_generate_text(session, b"Name a fruit.", 0, C.byref(p), None, None, None,
                                                  C.c_size_t(0), C.byref(n)))
            capi.lib.spc_session_free(session)
        else:
            assert rc in (SPC_ERR_INVALID_ARGUMENT, SPC_ERR_INCOMPATIBLE) and capi.lib.spc_last_error(), rc
    finally:
        for name in ("eagle", "medusa"):
            capi.lib.spc_model_free(handles[name])


def test_null_and_freed_handles_are_errors_not_crashes(capi_build, smollm2_q4):
    """Run in a child process: if a call crashed, this test fails instead of the test run."""
    model_dir, lib = smollm2_q4
    script = textwrap.dedent(f"""
        import ctypes as C, json, sys
        sys.path.insert(0, {str(capi_build.parent.parent / 'tests')!r})
        from capi_ctypes import Capi, ChatMessage
        capi = Capi(__import__('pathlib').Path({str(capi_build)!r}))
        L = capi.lib
        out = {{}}
        model, session, tok = C.c_void_p(), C.c_void_p(), C.c_void_p()
        out['load_null'] = L.spc_model_load(None, None, None, C.byref(model))
        assert L.spc_model_load({str(model_dir).encode()!r}, {str(lib).encode()!r}, b"cpu", C.byref(model)) == 0
        assert L.spc_session_create(model, None, C.byref(session)) == 0
        assert L.spc_model_tokenizer(model, C.byref(tok)) == 0
        n = C.c_size_t()
        msgs = (ChatMessage * 1)(ChatMessage(b"user", None))
        out['chat_null_content'] = L.spc_chat_render(model, msgs, 1, 1, None, 0, C.byref(n))
        out['text_null_session'] = L.spc_generate_text(None, b"hi", 0, None, None, None, None, 0, None)
        out['tokenize_null_text'] = L.spc_tokenize(tok, None, 5, None, 0, C.byref(n))
        L.spc_tokenizer_free(tok)  # the model's own: ignored
        out['tokenize_after_free_of_model_tokenizer'] = L.spc_tokenize(tok, b"a", 1, None, 0, C.byref(n))
        L.spc_model_free(model)
        out['generate_after_model_freed'] = L.spc_generate_text(session, b"hi", 1, None, None, None, None, 0, None)
        out['generate_after_model_freed_msg'] = L.spc_last_error().decode()
        out['tokenize_after_model_freed'] = L.spc_tokenize(tok, b"a", 1, None, 0, C.byref(n))
        L.spc_session_free(session)
        L.spc_session_free(session)  # twice: harmless
        L.spc_model_free(model)
        out['stats_after_free'] = L.spc_session_stats(session, C.byref(C.create_string_buffer(256)))
        out['session_create_freed_model'] = L.spc_session_create(model, None, C.byref(session))
        out['bogus_handle'] = L.spc_tokenize(C.c_void_p(12345), b"a", 1, None, 0, C.byref(n))
        print(json.dumps(out))
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out.pop("tokenize_after_free_of_model_tokenizer") == SPC_OK
    assert "freed" in out.pop("generate_after_model_freed_msg")
    assert out == {k: SPC_ERR_INVALID_ARGUMENT for k in out}, out
