"""Import TVM as a runtime alone, for processes that only load and run compiled libraries.

Why. ``import tvm`` loads TVM's compiler library and its Python packages (relax, tirx,
script, ...), and tvm_ffi imports torch whenever torch is installed (our venv has it, for
head training) -- measured on a 2-core Zen 5: 2.3 s, against 0.37 s for the runtime alone.
A one-off ``speccompile generate`` of Qwen2.5-Coder-1.5B spent about 8 s in all, 2.9 s of
it decoding 128 tokens, so the import was a quarter of what a user waited for.

How. TVM's own switch ``TVM_USE_RUNTIME_LIB=1`` (read once, when tvm is first imported)
loads libtvm_runtime without the compiler; we set it for that import only, so that child
processes are not affected. torch is hidden during that import only: tvm_ffi's torch
bridge is for DLPack exchange, which the runtime never uses, and a later ``import torch``
in the same process works as usual. The ``speccompile`` commands that only run libraries
(generate, chat, serve) call this first; the compiler, the tests and the Python API import
TVM whole, as before.

One more cost of that import: TVM's Python packages declare ~140 object types that only the
compiler library defines, and tvm-ffi looks each up by key; a key it lacks raises a C++
error whose backtrace, the first time, reads the library's debug info -- 0.2 s of every
process (Zen 4), for errors nobody sees. During the import those lookups first consult the
keys the runtime has registered (``ffi.GetRegisteredTypeKeys``, fetched again after each miss,
as a library loaded since may have added some): an absent key is answered "absent" without
the error, a present one by tvm-ffi as before.
"""
from __future__ import annotations

import os
import sys
from contextlib import contextmanager

SWITCH = "TVM_USE_RUNTIME_LIB"


def import_runtime_only() -> bool:
    """Import tvm as a runtime alone, unless some module already imported it (then it is
    too late, and the process keeps the full TVM). Returns whether it did."""
    if "tvm" in sys.modules:
        return False
    before = os.environ.get(SWITCH)
    os.environ[SWITCH] = "1"
    hide_torch = "torch" not in sys.modules
    if hide_torch:
        sys.modules["torch"] = None  # makes `import torch` raise ImportError, which tvm_ffi tolerates
    try:
        with _lookups_without_errors():
            import tvm  # noqa: F401
    finally:
        if hide_torch and sys.modules.get("torch", 0) is None:
            del sys.modules["torch"]
        if before is None:
            del os.environ[SWITCH]
        else:
            os.environ[SWITCH] = before
    return True


@contextmanager
def _lookups_without_errors():
    """tvm-ffi's type-key lookup, answering absent keys from the registered ones (see the
    module's docstring); tvm-ffi's own is back afterwards. A tvm-ffi without the listing is
    left as it is."""
    import tvm_ffi
    from tvm_ffi import core

    lookup = core._object_type_key_to_index
    listing = tvm_ffi.get_global_func("ffi.GetRegisteredTypeKeys", allow_missing=True)
    if listing is None:
        yield
        return
    known: set[str] = set()

    def checked(type_key: str):
        nonlocal known
        if type_key not in known:
            known = {str(k) for k in listing()}
            if type_key not in known:
                return None
        return lookup(type_key)

    core._object_type_key_to_index = checked
    try:
        yield
    finally:
        core._object_type_key_to_index = lookup
