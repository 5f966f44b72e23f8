"""The GPU check's comparison of a forward replayed from a CUDA graph with the same forward
called, for the forward whose graph the runtime only builds with the library's help: an
EAGLE-3 step's (``Model.forward`` of hidden, features and logits, whose layer features keep their block
through ``feature_buffer``; runtime/cuda_graph.py). The decode and verify forwards are
compared in the check's decode runs (``cuda_graph``)."""
from __future__ import annotations

import time

import numpy as np


def features_step(model, kv, steps: int) -> dict:
    """The verify forward of a step with an EAGLE-3 head (layer features, hidden states and
    logits), one row at a time as a plain step makes it, after a 16-token prefix: ms per step
    replayed from a CUDA graph and called (features and logits read on the host, as the engine
    reads them; the second of two runs each), and whether every output has the same bits."""
    graphs, sid = model.graphs, -9
    out, times = {}, {}
    for mode in (True, False, True, False):  # the first of each warms up
        graphs.enabled = mode
        kv.add_sequence(sid)
        try:
            model.prefill(kv, [sid], [list(range(100, 116))])
            got, t0 = [], time.perf_counter()
            for i in range(steps):
                _, feats, logits = model.forward(kv, [sid], [[200 + i]], outputs=("hidden", "features", "logits"))
                got.append((feats.numpy(), logits.numpy()))
            times[mode] = 1e3 * (time.perf_counter() - t0) / steps
            out.setdefault(mode, got)
        finally:
            kv.remove_sequence(sid)
    graphs.enabled = True
    same = all(np.array_equal(a, b) for x, y in zip(out[True], out[False]) for a, b in zip(x, y))
    return {"graph_ms": round(times[True], 3), "calls_ms": round(times[False], 3), "identical_to_no_graph": same,
            "graphed": "feature_buffer" in model._fn, "failed": graphs.failed}
