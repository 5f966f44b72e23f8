"""The C API sizes TVM's CPU pool as the Python runtime does (runtime/threads.py; its twin
runtime/capi/src/threads.cc): the physical cores the process may run on, unless the app set
TVM_NUM_THREADS or OMP_NUM_THREADS. Each case runs in a child process with its own
environment and CPU affinity (the test session sets TVM_NUM_THREADS for its own workers)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.real_model

CHILD = textwrap.dedent("""
    import ctypes, json, sys
    from speccompile.runtime.threads import physical_cores, thread_count
    lib = ctypes.CDLL(sys.argv[1])
    model = ctypes.c_void_p()
    assert lib.spc_model_load(sys.argv[2].encode(), sys.argv[3].encode(), b"cpu", ctypes.byref(model)) == 0
    libc = ctypes.CDLL(None)
    libc.getenv.restype = ctypes.c_char_p
    env = libc.getenv(b"TVM_NUM_THREADS")
    print(json.dumps({"c": lib.spc_cpu_threads(), "python": thread_count(), "cores": physical_cores(),
                      "env": env.decode() if env else None}))
    lib.spc_model_free(model)
""")  # env: the process environment as C sees it (os.environ is Python's copy from startup)


def child(capi_build, smollm2_q4, env_extra: dict, cpus: str | None = None) -> dict:
    model_dir, lib = smollm2_q4
    env = {k: v for k, v in os.environ.items() if k not in ("TVM_NUM_THREADS", "OMP_NUM_THREADS")}
    env.update(env_extra)
    cmd = [sys.executable, "-c", CHILD, str(capi_build / "libspeccompile_capi.so"), str(model_dir), str(lib)]
    if cpus is not None:
        cmd = ["taskset", "-c", cpus, *cmd]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_threads_as_python_chooses_them(capi_build, smollm2_q4):
    out = child(capi_build, smollm2_q4, {})
    assert out["c"] == out["python"] == out["cores"] and out["env"] == str(out["cores"])  # spc_model_load set it
    assert child(capi_build, smollm2_q4, {"TVM_NUM_THREADS": "1"})["c"] == 1  # the app's choice stands
    assert child(capi_build, smollm2_q4, {"OMP_NUM_THREADS": "3"})["c"] == 3
    if shutil.which("taskset") and (os.cpu_count() or 1) > 1:
        pinned = child(capi_build, smollm2_q4, {}, cpus="0")  # one CPU allowed: one thread
        assert pinned["c"] == pinned["python"] == 1 and pinned["env"] == "1"
