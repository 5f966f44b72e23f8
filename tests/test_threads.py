"""runtime/threads.py: who sets TVM's thread count, and that it still takes effect.

Importing the library must leave the process's environment alone; our entry points (the
CLI's main group, the runtime's Model loader) set ``TVM_NUM_THREADS`` before the first
kernel, and TVM's thread pool then runs on that many threads.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from speccompile.runtime import threads

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {"speccompile": "speccompile", "speccompile.runtime": "runtime", "speccompile.models": "models",
            "speccompile.passes": "passes"}


def clean_env() -> dict[str, str]:
    """A minimal environment: no thread settings, nothing of the test session's."""
    return {k: os.environ[k] for k in ("PATH", "HOME", "LANG", "TMPDIR", "SPECCOMPILE_CACHE") if k in os.environ}


def run_python(code: str, *args: str) -> dict:
    done = subprocess.run([sys.executable, "-c", code, *args], env=clean_env(), capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def every_module() -> list[str]:
    names = []
    for pkg, folder in PACKAGES.items():
        for path in sorted((ROOT / folder).glob("*.py")):
            names.append(pkg if path.stem == "__init__" else f"{pkg}.{path.stem}")
    return names


IMPORT_ALL = """
import importlib, json, os, sys
before = dict(os.environ)
import speccompile
after_package = dict(os.environ)
for name in sys.argv[1:]:
    importlib.import_module(name)
changed = lambda a, b: {k: [a.get(k), b.get(k)] for k in set(a) | set(b) if a.get(k) != b.get(k)}
print(json.dumps({"package": changed(before, after_package), "all": changed(before, dict(os.environ))}))
"""


def test_importing_speccompile_leaves_the_environment_unchanged():
    out = run_python(IMPORT_ALL, *every_module())
    assert out["package"] == {}, f"import speccompile changed the environment: {out['package']}"
    assert out["all"] == {}, f"importing the package's modules changed the environment: {out['all']}"


def test_configure_threads_sets_physical_cores_unless_the_user_chose(monkeypatch):
    monkeypatch.delenv("TVM_NUM_THREADS", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(threads, "physical_cores", lambda: 3)
    assert threads.thread_count() == 3 and "TVM_NUM_THREADS" not in os.environ  # asking changes nothing
    assert threads.configure_threads() == 3 and os.environ["TVM_NUM_THREADS"] == "3"
    monkeypatch.setenv("TVM_NUM_THREADS", "5")
    assert threads.configure_threads() == 5 and threads.thread_count() == 5
    monkeypatch.delenv("TVM_NUM_THREADS")
    monkeypatch.setenv("OMP_NUM_THREADS", "4")  # TVM honours it too: left as the user set it
    assert threads.configure_threads() == 4 and threads.thread_count() == 4 and "TVM_NUM_THREADS" not in os.environ


def test_the_cost_profile_key_follows_the_thread_count(monkeypatch):
    from speccompile.runtime.costs import host_fingerprint

    monkeypatch.delenv("TVM_NUM_THREADS", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(threads, "physical_cores", lambda: 3)
    unset = host_fingerprint()
    threads.configure_threads()  # the same key before and after: profiles taken either way match
    assert host_fingerprint() == unset and "threads=3|" in unset
    monkeypatch.setenv("TVM_NUM_THREADS", "1")
    assert host_fingerprint() != unset


def test_the_cli_sets_threads_before_any_subcommand(monkeypatch):
    from click.testing import CliRunner

    from speccompile.cli import main

    monkeypatch.delenv("TVM_NUM_THREADS", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(threads, "physical_cores", lambda: 3)
    res = CliRunner().invoke(main, ["gen_config", "--help"])  # the group runs before the subcommand parses
    assert res.exit_code == 0, res.output
    assert os.environ.get("TVM_NUM_THREADS") == "3"


LOAD_AND_RUN = """
import json, os, sys
import tvm
from speccompile.runtime.model import Model
from speccompile.runtime.threads import physical_cores
unset = "TVM_NUM_THREADS" not in os.environ
model = Model(sys.argv[1], sys.argv[2])
kv = model.create_kv_cache(64)
kv.add_sequence(0)
model.forward_hidden(kv, [0], [[1, 2, 3]]).numpy()  # the first parallel kernel starts the pool
print(json.dumps({"unset_before": unset, "env": os.environ.get("TVM_NUM_THREADS"),
                  "pool": tvm.get_global_func("runtime.NumThreads")(), "physical": physical_cores(),
                  "cpus": len(os.sched_getaffinity(0))}))
"""


def test_loading_a_model_sets_the_threads_tvms_pool_runs_on(build_tiny):
    """TVM's default here is half the logical CPUs (one thread on 2 vCPUs); after a Model
    load the pool has one thread per physical core (TVM caps it at the CPUs available)."""
    built = build_tiny("tiny-llama", "q0f32")
    out = run_python(LOAD_AND_RUN, str(built.model_dir), str(built.lib))
    assert out["unset_before"] and out["env"] == str(out["physical"])
    assert out["pool"] == min(out["physical"], out["cpus"]), out
