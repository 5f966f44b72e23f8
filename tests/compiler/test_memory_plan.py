"""A running library's memory does not grow with the shapes it runs (passes/memory_plan.py).

Before, the entry points' buffers were sized by the token count at run time, and the relax
VM's pooled allocator kept one set per token count for good: memory grew with every new
prompt length. The compiler now plans every buffer for the library's bound
(prefill_chunk_size); these tests compile the tiny model with and without the bounds -- the
unbounded build is the old behaviour, kept here as the control that shows the RSS test
would catch it -- and check the plan, the memory, the logits and the runtime's guards.
"""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from speccompile.compiler.compile import CompileError, check_memory_plan


@pytest.fixture(scope="module")
def libs(build_tiny, tmp_path_factory):
    """(model_dir, planned lib + its compile report, unbounded lib + its plan)."""
    import speccompile.compiler.compile as C

    built = build_tiny("tiny-llama", "q0f32")
    root = tmp_path_factory.mktemp("memplan")
    config = built.model_dir / "speccompile-config.json"
    planned = C.compile_model(config, "llvm", root / "planned.so", verbose=False)
    seen = {}
    with pytest.MonkeyPatch.context() as mp:  # the old compile: no bounds, no check
        mp.setattr(C, "attach_upper_bounds", lambda mod, chunk: mod)
        mp.setattr(C, "check_memory_plan", lambda plan: seen.setdefault("plan", plan) and {})
        C.compile_model(config, "llvm", root / "unbounded.so", verbose=False)
    return built.model_dir, (root / "planned.so", planned), (root / "unbounded.so", seen["plan"])


def test_every_buffer_is_sized_at_compile_time(libs):
    _, (_, planned), (_, unbounded) = libs
    chunk = planned["prefill_chunk_size"]
    assert planned["symbolic_dim_bounds"]["n"] == chunk and "slots" not in planned["symbolic_dim_bounds"]
    mem = planned["build"]["memory_plan"]
    # one forward's buffers at the bound: at least its logits [chunk, vocab] (and far less than 1 GB)
    assert chunk * planned["vocab_size"] * 4 <= mem["forward_tokens"] < 1e9
    assert mem["prefill"] > 0 and mem["decode"] > 0
    # without bounds every forward's buffers are sized at run time, which compile now refuses
    assert unbounded["prefill"]["dynamic"] and unbounded["decode"]["dynamic"]
    with pytest.raises(CompileError, match="SYMBOLIC_DIM_BOUNDS"):
        check_memory_plan(unbounded)


# One library's RSS growth (MB) over 64 forward lengths after one at the bound, in a fresh
# process: the VM's buffer pool is per process, and earlier tests of a suite run fill it with
# the same shapes, which would hide the growth of the control.
_RSS_PROBE = """
import os, sys
import numpy as np
from speccompile.runtime.model import Model

def rss_mb():
    return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6

model = Model(sys.argv[1], sys.argv[2])
chunk = model.prefill_chunk_size
kv = model.create_kv_cache(chunk)
rng = np.random.default_rng(0)

def forward(n):  # logits at every row: the forward with the most buffers per token
    kv.add_sequence(0)
    model.forward(kv, [0], [rng.integers(0, model.vocab_size, n).tolist()], on_device=True)
    kv.remove_sequence(0)

forward(chunk)  # the largest shape first: every page the library will touch
before = rss_mb()
for n in range(chunk // 64, chunk + 1, chunk // 64):
    forward(n)
print(rss_mb() - before)
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads RSS from /proc")
def test_memory_stays_flat_across_forward_lengths(libs):
    """64 distinct forward lengths after one at the bound: the planned library's RSS stays
    put (~0.1 MB); the unbounded one (the old behaviour) keeps a buffer set per length
    (~20 MB here; ~350 MB for SmolLM2 over 55 prompt lengths)."""
    model_dir, (planned, _), (unbounded, _) = libs
    growth = {}
    for lib in (planned, unbounded):
        out = subprocess.run([sys.executable, "-c", _RSS_PROBE, str(model_dir), str(lib)], capture_output=True,
                             text=True, timeout=600)
        assert out.returncode == 0, out.stderr[-2000:]
        growth[lib.stem] = float(out.stdout.split()[-1])
    print(f"RSS growth (MB) over 64 forward lengths: {growth}")
    assert growth["planned"] < 2, growth
    assert growth["unbounded"] > 6, growth  # the control: this test sees the old growth


def test_planned_library_gives_the_same_logits(libs):
    """Planning moves buffers, not arithmetic: prefill, decode and verify logits are
    bit-identical to the unbounded build's."""
    from speccompile.runtime.model import Model

    model_dir, (planned, _), (unbounded, _) = libs
    rng = np.random.default_rng(1)
    prompts = [rng.integers(0, 272, n).tolist() for n in (1, 37, 300)]
    outs = []
    for lib in (planned, unbounded):
        model = Model(model_dir, lib)
        kv = model.create_kv_cache(1024)
        for s in range(3):
            kv.add_sequence(s)
        got = [model.prefill(kv, [0, 1, 2], prompts)]
        got.append(model.decode(kv, [0, 1, 2], [5, 6, 7]))
        got.append(model.forward(kv, [0, 2], [[8, 9, 10], [11]]))
        got.append(model.forward(kv, [1], [[12, 13, 14, 15]], tree_parents=[[-1, 0, 0, 1]]))
        outs.append(got)
    for a, b in zip(*outs):
        np.testing.assert_array_equal(a, b)


def test_runtime_keeps_forwards_within_the_bound(libs):
    """Forwards over the bound are refused by name; a longer prefill is split over forwards
    with the very logits of a prefill fed in pieces; engines cannot be set up past it."""
    from speccompile.runtime.engine import Engine
    from speccompile.runtime.kv_cache import KVCacheFull
    from speccompile.runtime.model import Model
    from speccompile.runtime.sequence import GenerationError

    model_dir, (planned, meta), _ = libs
    chunk = meta["prefill_chunk_size"]
    model = Model(model_dir, planned)
    assert model.max_forward_tokens == chunk
    kv = model.create_kv_cache(4 * chunk)
    kv.add_sequence(0)
    kv.add_sequence(1)
    with pytest.raises(ValueError, match="prefill_chunk_size"):
        model.forward(kv, [0], [[1] * (chunk + 1)])
    with pytest.raises(ValueError, match="prefill_chunk_size"):
        model.get_logits(np.zeros((chunk + 1, model.hidden_size), np.float32))
    assert kv.length(0) == 0 and kv.num_free_pages() == kv.num_pages  # refused before the cache moved
    long = np.random.default_rng(2).integers(0, 272, chunk + chunk // 2 + 3).tolist()
    whole = model.prefill(kv, [0], [long])  # two forwards
    for start in range(0, len(long), 100):
        piece = model.prefill(kv, [1], [long[start:start + 100]])
    np.testing.assert_array_equal(whole[0], piece[0])
    assert kv.length(0) == kv.length(1) == len(long)
    free = kv.num_free_pages()
    kv.add_sequence(2)
    with pytest.raises(KVCacheFull):  # all or nothing, as a single forward
        model.prefill(kv, [2], [[1] * (free * 16 + 1)])
    assert kv.length(2) == 0 and kv.num_free_pages() == free
    for option in ({"max_num_sequence": chunk + 1}, {"max_batch_tokens": chunk + 1}):
        with pytest.raises(GenerationError, match="prefill_chunk_size"):
            Engine(model_dir, planned, **option)
