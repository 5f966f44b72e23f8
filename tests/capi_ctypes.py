"""The C API (runtime/capi/include/speccompile.h) through ctypes, for the twin tests that hold
its tokenizer and chat rendering equal to Python's, and for fuzzing its arguments."""
from __future__ import annotations

import ctypes as C
from pathlib import Path

SPC_OK, SPC_ERR_INVALID_ARGUMENT, SPC_ERR_IO, SPC_ERR_INCOMPATIBLE = 0, -1, -2, -3


class ChatMessage(C.Structure):
    _fields_ = [("role", C.c_char_p), ("content", C.c_char_p)]


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
