"""The C API (runtime/capi/include/speccompile.h) through ctypes, for the twin tests that hold
its tokenizer and chat rendering equal to Python's, and for fuzzing its arguments."""
from __future__ import annotations

import ctypes as C
import os
import subprocess
from pathlib import Path

SPC_OK, SPC_ERR_INVALID_ARGUMENT, SPC_ERR_IO, SPC_ERR_INCOMPATIBLE = 0, -1, -2, -3


def run_example(exe: Path, model_dir, lib, *args: str, env_extra: dict | None = None,
                stdin: str | None = None) -> subprocess.CompletedProcess:
    """An example program (spc_generate, spc_chat) as a user runs it: MODEL_DIR --model-lib LIB
    ARGS..., without LD_LIBRARY_PATH (the RUNPATH must suffice). errors="replace": a random
    tiny model's text may hold bytes cut mid-character."""
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    env.update(env_extra or {})
    return subprocess.run([str(exe), str(model_dir), "--model-lib", str(lib), *args], input=stdin, capture_output=True,
                          text=True, errors="replace", env=env, timeout=600)


class GenerateParams(C.Structure):
    """spc_generate_params, field for field (include/speccompile.h)."""
    _fields_ = [("max_tokens", C.c_int32), ("temperature", C.c_float), ("top_p", C.c_float), ("top_k", C.c_int32),
                ("seed", C.c_uint64), ("ignore_eos", C.c_int), ("stop", C.POINTER(C.c_char_p)), ("n_stop", C.c_size_t),
                ("min_p", C.c_float), ("frequency_penalty", C.c_float), ("presence_penalty", C.c_float),
                ("repetition_penalty", C.c_float), ("logit_bias_tokens", C.POINTER(C.c_int32)),
                ("logit_bias", C.POINTER(C.c_float)), ("n_logit_bias", C.c_size_t)]


class ChatMessage(C.Structure):
    _fields_ = [("role", C.c_char_p), ("content", C.c_char_p)]


class SessionConfig(C.Structure):
    _fields_ = [("speculative_mode", C.c_int), ("ngram_min", C.c_int), ("ngram_max", C.c_int),
                ("draft_length", C.c_int), ("max_total_seq_len", C.c_int64),
                ("prefix_cache_max_num_recycling_seqs", C.c_int), ("draft_model", C.c_void_p),
                ("spec_tree_width", C.c_int), ("spec_tree_nodes", C.c_int)]


class Stats(C.Structure):
    _fields_ = [(name, C.c_int64) for name in ("prefill_tokens", "cached_prompt_tokens", "decode_tokens", "draft_tokens",
                                               "accepted_tokens", "verify_steps", "plain_steps")] + \
               [(name, C.c_double) for name in ("prefill_seconds", "decode_seconds", "prefill_tokens_per_s",
                                                "decode_tokens_per_s", "accept_rate", "mean_accepted_length")] + \
               [("finish_reason", C.c_int)]


class CapiError(RuntimeError):
    def __init__(self, code: int, message: str):
        super().__init__(f"{code}: {message}")
        self.code, self.message = code, message


class Capi:
    def __init__(self, build: Path):
        lib = C.CDLL(str(build / "libspeccompile_capi.so"))
        lib.spc_last_error.restype = C.c_char_p
        lib.spc_token_id.restype = C.c_int32
        self.lib = lib

    def check(self, rc: int) -> None:
        if rc != SPC_OK:
            raise CapiError(rc, self.lib.spc_last_error().decode())

    # ---------------------------------------------------------------- model, session
    def model(self, model_dir, lib, device: str = "cpu") -> C.c_void_p:
        out = C.c_void_p()
        self.check(self.lib.spc_model_load(str(model_dir).encode(), str(lib).encode(), device.encode(), C.byref(out)))
        return out

    def session(self, model, **config) -> C.c_void_p:
        cfg = SessionConfig()
        self.lib.spc_session_config_default(C.byref(cfg))
        for k, v in config.items():
            setattr(cfg, k, v.value if isinstance(v, C.c_void_p) else v)
        out = C.c_void_p()
        self.check(self.lib.spc_session_create(model, C.byref(cfg), C.byref(out)))
        return out

    def chat(self, session, messages: list[dict], max_tokens: int) -> tuple[str, Stats]:
        """spc_generate_chat at temperature 0: (the answer, the call's stats)."""
        msgs = (ChatMessage * len(messages))(*[ChatMessage(m["role"].encode(), m["content"].encode())
                                               for m in messages])
        params = GenerateParams()  # the whole struct: the C default function writes every field
        self.lib.spc_generate_params_default(C.byref(params))
        params.max_tokens = max_tokens
        self.check(self.lib.spc_generate_chat(session, msgs, C.c_size_t(len(messages)), C.byref(params), None, None,
                                              None, C.c_size_t(0), None))
        text, n = C.c_char_p(), C.c_size_t()
        self.check(self.lib.spc_session_last_text(session, C.byref(text), C.byref(n)))
        stats = Stats()
        self.check(self.lib.spc_session_stats(session, C.byref(stats)))
        return C.string_at(text, n.value).decode(), stats

    # ---------------------------------------------------------------- tokenizer
    def tokenizer(self, path: Path | str) -> C.c_void_p:
        out = C.c_void_p()
        self.check(self.lib.spc_tokenizer_load(str(path).encode(), C.byref(out)))
        return out

    def free_tokenizer(self, tok: C.c_void_p) -> None:
        self.lib.spc_tokenizer_free(tok)

    def encode(self, tok, text: str | bytes) -> list[int]:
        data = text.encode() if isinstance(text, str) else text
        n = C.c_size_t()
        cap = len(data) + 8  # byte-level BPE gives at most one id per byte
        ids = (C.c_int32 * cap)()
        self.check(self.lib.spc_tokenize(tok, data, C.c_size_t(len(data)), ids, C.c_size_t(cap), C.byref(n)))
        assert n.value <= cap
        return list(ids[: n.value])

    def decode(self, tok, ids: list[int], skip_special: bool = True) -> str:
        arr = (C.c_int32 * max(1, len(ids)))(*ids)
        n = C.c_size_t()
        self.check(self.lib.spc_detokenize(tok, arr, C.c_size_t(len(ids)), int(skip_special), None, C.c_size_t(0),
                                           C.byref(n)))
        buf = C.create_string_buffer(n.value + 1)
        self.check(self.lib.spc_detokenize(tok, arr, C.c_size_t(len(ids)), int(skip_special), buf,
                                           C.c_size_t(n.value + 1), C.byref(n)))
        return buf.raw[: n.value].decode()

    def token_id(self, tok, text: str) -> int:
        return self.lib.spc_token_id(tok, text.encode())
