"""Per-kernel device time of our library's forwards, for ``make gpu-check``.

Why. The check's wall-clock figures (decode tok/s, the row-cost ratios, prefill tok/s) say
how fast a forward is, not where its time goes: in the projections, in attention, in the
small kernels between them, or on the host between launches. CUPTI (through
torch.profiler, which records every kernel launched in the process, TVM's included) gives
each kernel's device time, so the next kernel work aims at what dominates.

It runs in a process of its own (``python -m speccompile.gpu_check.profile TASK_JSON``): torch
and TVM's runtime share the process only here, and a crash or a hang costs this one
measurement, not the check.

Output (one JSON line): per phase (``decode`` 1 row, ``rows8``, ``rows32``, ``prefill512``
forwards after a 16-token prefix, and ``engine_step_ctx128``: plain engine steps at a
128-token context, whose wall less device time is the host's share of a step;
``engine_spec_step_ctx128``: the same with n-gram drafts of 4, each step proposing,
verifying 5 rows, accepting and rolling back, ``tokens_per_step`` its emitted tokens;
``engine_head_nodraft_ctx128`` where the model ships a head: steps of an EAGLE (or Medusa)
engine whose policy drafts nothing -- what a losing head's steps cost against plain ones,
0.55x plain on the H100 in bench/results/*-e-*.json) the wall ms per forward, the
device-busy ms per forward (the sum of its kernels' times), the kernel launches per forward,
and the top kernels by total time with their share. The engine phases also give
``host_top``: the Python functions that took the most of a step's own time (cProfile, over
further steps: its overhead inflates them, evenly), where a step's host time goes.
"""
from __future__ import annotations

import cProfile
import json
import pstats
import sys
import time
from collections import defaultdict
from pathlib import Path

TOP = 12
# the speculative step's prompt, repeated to its context: each token's last occurrence is a
# sentence back, so the n-gram proposer always has 4 tokens to draft (a single repeated
# token would give it 1: its latest match is the token before)
REPEATED = "The quick brown fox jumps over the lazy dog. "


def _phases(model, kv, prefill_tokens: int):
    """name -> (a callable doing one forward, repetitions)."""
    import numpy as np

    sid = -3
    ids = np.random.default_rng(1).integers(0, min(model.vocab_size, 32000), prefill_tokens + 64).tolist()

    def rows(r):
        def run():
            toks = [ids[16:16 + r]]
            if r == 1:
                model.decode(kv, [sid], toks[0], on_device=True)
            else:
                model.forward(kv, [sid], toks, on_device=True)
            model.device.sync()
            kv.popn(sid, r)
        return run

    def prefill():
        kv.add_sequence(-4)
        try:
            model.prefill(kv, [-4], [ids[:prefill_tokens]])
            model.device.sync()
        finally:
            kv.remove_sequence(-4)

    kv.add_sequence(sid)
    model.prefill(kv, [sid], [ids[:16]])
    out = {"decode": (rows(1), 20), "rows8": (rows(8), 10)}
    if model.max_forward_tokens >= 32:
        out["rows32"] = (rows(32), 5)
    out["prefill%d" % prefill_tokens] = (prefill, 3)  # chunks of max_forward_tokens where it is smaller
    return out


def _engine_steps(engine, prompt: str, context: int, speculative: bool = False):
    """(one greedy engine step -- propose, forward, accept, commit -- of a sequence ``context``
    tokens long, repetitions, the sequence): the host's share of a step is its wall time less
    the device's busy time. The prompt is repeated up to ``context`` tokens (prefilled): with
    ``speculative``, the engine's n-gram proposer drafts its fixed k from that repetition."""
    ids = engine.encode_prompt(prompt)
    ids = (ids * (context // len(ids) + 1))[:context]
    # 1 warm-up + 32 timed steps, twice at most (a verify step emits up to k + 1 tokens)
    seq = engine.new_sequence(ids, 128 * ((engine.policy.fixed_k or 0) + 1 if speculative else 1), ignore_eos=True,
                              speculative=speculative)
    engine.attach(seq)
    while seq.prefilling:
        engine.prefill([seq], engine.model.prefill_chunk_size)
    return (lambda: engine.step([seq])), 32, seq


def head_steps_without_drafts(engine, prompt: str, context: int):
    """_engine_steps of a head engine whose policy never drafts: the steps a losing head
    leaves, which should cost what plain ones do."""
    engine.policy.hopeless = lambda *args, **kwargs: True
    return _engine_steps(engine, prompt, context, speculative=True)


def host_top(fn, reps: int, top: int = 10) -> list[dict]:
    """The functions with the most own time over ``reps`` calls of ``fn``: ms per call each."""
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(reps):
        fn()
    prof.disable()
    stats = pstats.Stats(prof).stats  # (file, line, name) -> (calls, primitive calls, own s, cumulative s, callers)
    rows = sorted(stats.items(), key=lambda kv_: -kv_[1][2])[:top]
    return [{"function": f"{Path(f).name}:{line}({name})", "calls": round(v[0] / reps, 1), "ms": round(1e3 * v[2] / reps, 4)}
            for (f, line, name), v in rows]


def _without_graphs(model, fn):
    def run():
        model.graphs.enabled = False
        try:
            fn()
        finally:
            model.graphs.enabled = True
    return run


def profile(model_dir: str, lib: str, prefill_tokens: int = 512, prompt: str = "Hello", head: dict | None = None) -> dict:
    """``head``: {"mode", "dir", "lib"} of a head the model ships (its non-drafting steps)."""
    from speccompile.runtime.tvm_import import import_runtime_only

    import_runtime_only()
    from speccompile.runtime.engine import Engine

    engine = Engine(Path(model_dir), Path(lib), max_num_sequence=4)  # the engine's sequence and two scratch ones
    # the speculative step's own engine, as a user's: n-gram drafts of a fixed 4 (the plain phases stay
    # those of a plain engine, with no draft-length policy observing their steps)
    spec_engine = Engine(Path(model_dir), Path(lib), max_num_sequence=1, speculative_mode="ngram", spec_draft_length=4)
    head_engine = None if head is None else Engine(Path(model_dir), Path(lib), max_num_sequence=1,
                                                   speculative_mode=head["mode"],
                                                   additional_models=[(head["dir"], head["lib"])])
    model, kv = engine.model, engine.kv
    import torch  # after TVM: torch's own CUDA libraries must not replace the ones TVM loaded
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    result = {}
    phases = _phases(model, kv, prefill_tokens)
    phases["engine_step_ctx128"] = _engine_steps(engine, prompt, 128)
    if model.graphs is not None:  # the same sequence's steps run as calls, for the host time graphs save
        fn, reps, seq = phases["engine_step_ctx128"]
        phases["engine_step_ctx128_no_graph"] = (_without_graphs(model, fn), reps, seq)
    phases["engine_spec_step_ctx128"] = _engine_steps(spec_engine, REPEATED, 128, speculative=True)
    if head_engine is not None:
        phases["engine_head_nodraft_ctx128"] = head_steps_without_drafts(head_engine, prompt, 128)
    if model.context_window_size >= 2048 + 64:
        phases["engine_step_ctx2048"] = _engine_steps(engine, prompt, 2048)
    for name, (fn, reps, *seq) in phases.items():
        for _ in range(2):  # warm-up: first-launch module loading, and a graph's capture at its shape's
            fn()            # second use (runtime/cuda_graph.py CAPTURE_AT), stay out of the figures
        emitted = len(seq[0].result.token_ids) if seq else 0
        with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
            t0 = time.perf_counter()
            for _ in range(reps):
                fn()
            wall = time.perf_counter() - t0
        emitted = len(seq[0].result.token_ids) - emitted if seq else None
        per = defaultdict(lambda: [0, 0.0])
        for ev in prof.events():
            if ev.device_type == torch.autograd.DeviceType.CUDA:
                rec = per[ev.name]
                rec[0] += 1
                rec[1] += ev.device_time  # microseconds
        busy = sum(v[1] for v in per.values())
        top = sorted(per.items(), key=lambda kv_: -kv_[1][1])[:TOP]
        result[name] = {
            "reps": reps, "wall_ms": round(1e3 * wall / reps, 3), "device_busy_ms": round(busy / 1e3 / reps, 3),
            "launches": round(sum(v[0] for v in per.values()) / reps, 1),
            **({"tokens_per_step": round(emitted / reps, 2)} if emitted is not None else {}),
            "top": [{"kernel": k[:120], "calls": round(c / reps, 1), "ms": round(t / 1e3 / reps, 4),
                     "share": round(t / busy, 3) if busy else None} for k, (c, t) in top]}
        if name in ("engine_step_ctx128", "engine_head_nodraft_ctx128"):
            result[name]["host_top"] = host_top(fn, reps)
    return result


def main(argv: list[str] | None = None) -> int:
    task = json.loads((argv or sys.argv[1:])[0])
    out = profile(task["model_dir"], task["lib"], int(task.get("prefill_tokens", 512)), task.get("prompt", "Hello"),
                  task.get("head"))
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
