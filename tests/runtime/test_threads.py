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

ROOT = Path(__file__).resolve().parents[2]
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

    from speccompile.cli.main import main

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
model.forward(kv, [0], [[1, 2, 3]], outputs="hidden").numpy()  # the first parallel kernel starts the pool
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


# ---------------------------------------------------------------- PoolTuner
class FakeHost:
    """Step seconds by pool size: ``cost(size, step) -> seconds``; records what was applied."""

    def __init__(self, size: int = 2):
        self.applied: list[int] = []
        self.tuner = threads.PoolTuner(size, apply=self.applied.append)
        self.sizes: list[int] = []

    def run(self, cost, steps: int) -> list[int]:
        sizes = []
        for _ in range(steps):
            size = self.tuner.begin()
            sizes.append(size)
            self.tuner.end((1, 0), cost(size, len(self.sizes)))
            self.sizes.append(size)
        return sizes


def idle(size: int, step: int) -> float:
    """Two threads 1.6x faster than one, with a 3x outlier (a page fault) every 97 steps."""
    base = 0.006 if size == 2 else 0.0095
    return base * (3 if step % 97 == 0 else 1)


def busy_core(size: int, step: int) -> float:
    """One core taken by another process: one thread is steady, two are usually a little
    slower and now and then wait a whole time slice (the pattern measured beside `yes`)."""
    if size == 1:
        return 0.0085 * (2 if step % 40 < 3 else 1)
    return 0.3 if step % 17 == 0 else 0.0095


def test_pool_tuner_keeps_all_threads_on_an_idle_host_and_its_probes_cost_little():
    host = FakeHost()
    sizes = host.run(idle, 2000)
    assert host.tuner.current == 2 and host.tuner.switches == 0
    lost = sum(idle(s, i) - idle(2, i) for i, s in enumerate(sizes))
    assert lost / sum(idle(2, i) for i in range(2000)) < host.tuner.BUDGET  # what the probes cost
    assert host.applied[0] == 2  # the pool is set before the first step


def test_pool_tuner_drops_a_thread_beside_a_busy_process_and_comes_back_when_it_ends():
    host = FakeHost()
    host.run(idle, 100)
    busy = host.run(busy_core, 600)
    assert host.tuner.current == 1
    assert busy[100:].count(1) > 0.9 * 500  # settled on one thread, probing rarely
    spent = sum(busy_core(s, i) for i, s in enumerate(busy))
    assert spent < 1.25 * sum(busy_core(1, i) for i in range(600))  # close to the best fixed choice
    back = host.run(idle, 600)
    assert host.tuner.current == 2 and back[300:].count(2) > 0.98 * 300


def test_pool_tuner_sets_the_pool_of_the_thread_that_runs_the_step():
    """TVM keeps one pool per launching thread: a step run from another thread (a server's
    engine thread) sets that thread's pool, even at the same size."""
    import threading

    host = FakeHost()
    host.tuner.begin()
    host.tuner.end((1, 0), 0.01)
    before = len(host.applied)
    worker = threading.Thread(target=lambda: (host.tuner.begin(), host.tuner.end((1, 0), 0.01)))
    worker.start()
    worker.join()
    assert len(host.applied) > before and host.applied[-1] == 2


def test_thread_options():
    assert threads.thread_options(2) == [2, 1]
    assert threads.thread_options(1) == [1]
    assert threads.thread_options(8) == [8, 7, 4, 1]


def test_logits_do_not_depend_on_the_pool_size(build_tiny):
    """The tuner may change the pool size between any two steps: every kernel must give the
    same bits on any number of threads (they split outputs, never a reduction)."""
    import numpy as np

    from speccompile.runtime.model import Model

    outs = []
    for quant in ("q0f32", "q4f32_1"):
        built = build_tiny("tiny-llama", quant)
        model = Model(built.model_dir, built.lib)
        per_size = []
        for size in (2, 1, 3, 2):
            threads._config_pool(size)
            kv = model.create_kv_cache(256)
            kv.add_sequence(0)
            prefill = model.prefill(kv, [0], [list(range(3, 60))])
            chain = model.forward(kv, [0], [[5, 6, 7, 8]])
            per_size.append((prefill, chain))
        threads._config_pool(threads.thread_count())
        outs.append(all(np.array_equal(a, b) for ref in per_size[1:] for a, b in zip(per_size[0], ref)))
    assert outs == [True, True]
