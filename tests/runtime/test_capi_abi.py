"""The test suite's ctypes mirrors of the C API's structs (tests/capi_ctypes.py) have the
header's layout: every field's offset and each struct's size, as the C compiler lays them
out. Why: a mirror smaller than its struct lets the library write past it into Python's
heap -- spc_generate_params grew from 64 to 88 bytes while one caller still passed 64, and
the corrupted heap crashed or hung test workers far from the cause."""
from __future__ import annotations

import ctypes as C
import shutil
import subprocess
from pathlib import Path

import pytest

from capi_ctypes import ChatMessage, GenerateParams, SessionConfig, Stats

pytestmark = pytest.mark.unit

INCLUDE = Path(__file__).resolve().parents[2] / "runtime" / "capi" / "include"
MIRRORS = {"spc_generate_params": GenerateParams, "spc_session_config": SessionConfig, "spc_stats": Stats,
           "spc_chat_message": ChatMessage}


def test_ctypes_mirrors_match_the_header(tmp_path):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    lines = ['#include <stdio.h>', '#include <stddef.h>', '#include "speccompile.h"', "int main(void) {"]
    for struct, mirror in MIRRORS.items():
        lines.append(f'  printf("{struct} size %zu\\n", sizeof({struct}));')
        for name, *_ in mirror._fields_:
            lines.append(f'  printf("{struct} {name} %zu\\n", offsetof({struct}, {name}));')
    lines += ["  return 0;", "}"]
    (tmp_path / "abi.c").write_text("\n".join(lines) + "\n")
    subprocess.run([cc, "-I", str(INCLUDE), str(tmp_path / "abi.c"), "-o", str(tmp_path / "abi")], check=True,
                   capture_output=True)
    out = subprocess.run([str(tmp_path / "abi")], check=True, capture_output=True, text=True).stdout.split("\n")
    got = {(s, f): int(v) for s, f, v in (line.split() for line in out if line)}
    for struct, mirror in MIRRORS.items():
        assert got[(struct, "size")] == C.sizeof(mirror), struct
        for name, *_ in mirror._fields_:
            assert got[(struct, name)] == getattr(mirror, name).offset, (struct, name)
