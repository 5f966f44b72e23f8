"""What forwards cost on this machine, known before the first decode step (and what the
draft's confidence is worth, as learned by earlier processes).

Speculation pays only when a draft and a verify of k+1 rows cost less than the tokens they
save, and those costs differ by 10x between hosts (an extra verified row of Qwen2.5-1.5B is
~5% of a decode step on Zen 5's full-width AVX-512 VNNI, ~20% on Zen 4's half-width one, 30-90%
with AVX2 only). Learned from zero in every
process, the costs arrived after the request they were needed for: a fresh ``generate`` ran
plainly while a fixed k = 3 was 1.7x faster. So:

- ``CostTable``: seconds of one forward per row count, measured once per (library, host
  CPU, threads) by timing real forwards on scratch sequences, and kept in
  ``$SPECCOMPILE_CACHE/costs/`` keyed by the libraries' fingerprints and the host. The
  measuring is what a user's first request waits for, so it is bounded: the row counts a
  single stream's steps use (1, 2, 4, 8) always, the others in order of use while the
  profile has taken under ``PROFILE_SECONDS``, and at most ``TIMED_SECONDS`` of timed calls
  per count (a 1.5B model on a 2-core CPU: ~1 s, where timing all twelve counts three
  times took 3.7 s of a first ``generate``'s 8.2). Counts left out interpolate, and what
  real steps observe heals the table for the next process (below);
- ``CostModel``: the target's and the proposer's tables plus *one* pace factor that online
  observations move (this machine's clock changes 10-30% within seconds: the ratios between
  row counts hold, the absolute level does not). What real steps measure per row count is
  written back into the cached profile, so one taken in a noisy second heals.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import statistics
import time
from pathlib import Path

from .tensor_cache import cache_root
from .threads import thread_count

PACE_WINDOW = 15  # recent observed/predicted ratios of target forwards whose median is the pace
# Row counts whose forward cost is measured before the first step (others interpolate), in the
# order they are measured: the first ``CORE_ROWS`` always, the rest while the profile is under
# PROFILE_SECONDS -- the doublings first (a batch's rows; the GPU kernels' row chunks of 8 and
# 32 show as steps between them), then the counts between.
TARGET_ROWS = (1, 2, 4, 8, 16, 32, 3, 6, 12, 24, 5, 10)
CORE_ROWS = 4
PROFILE_SECONDS = 1.0
TIMED_SECONDS = 0.15  # timed calls of one row count stop once they add up to this (at least one)
DRAFT_ROWS = (1, 2, 3, 4, 6, 8)
PROFILE_FORMAT = 2  # part of a profile's cache key: bumped when what a profile means changes
REFRESH = 0.1  # weight of one observation in its row count's running cost


class CostTable:
    """Seconds of one forward per total row count; linear between measured counts, and
    beyond the largest along the slope of the last two (forwards grow linearly once
    compute-bound). Made monotone when built (pool-adjacent-violators: one forward slowed
    by another process, or one lucky one, must not make 4 rows look dearer than 6)."""

    def __init__(self, seconds: dict[int, float]):
        if not seconds:
            raise ValueError("a cost table needs at least one measured row count")
        rows = sorted(int(r) for r in seconds)
        self.seconds = dict(zip(rows, _monotone([float(seconds[r]) for r in rows])))
        self._memo: dict[int, float] = {}

    def __call__(self, rows: int) -> float:
        if rows not in self._memo:  # a plan asks for the same few row counts every step
            self._memo[rows] = self._interpolate(rows)
        return self._memo[rows]

    def _interpolate(self, rows: int) -> float:
        known = sorted(self.seconds)
        if rows <= known[0]:
            return self.seconds[known[0]]
        for lo, hi in zip(known, known[1:]):
            if rows <= hi:
                a, b = self.seconds[lo], self.seconds[hi]
                return a + (b - a) * (rows - lo) / (hi - lo)
        if len(known) == 1:
            return self.seconds[known[0]] * rows / known[0]
        a, b = known[-2], known[-1]
        slope = (self.seconds[b] - self.seconds[a]) / (b - a)
        return self.seconds[b] + slope * (rows - b)

    def to_json(self) -> dict:
        return {str(r): s for r, s in sorted(self.seconds.items())}


def _monotone(values: list[float]) -> list[float]:
    """The non-decreasing sequence closest to ``values`` in least squares."""
    blocks: list[list[float]] = []  # [sum, count]
    for v in values:
        blocks.append([v, 1.0])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            s, n = blocks.pop()
            blocks[-1][0] += s
            blocks[-1][1] += n
    out: list[float] = []
    for s, n in blocks:
        out.extend([s / n] * int(n))
    return out


class CostModel:
    """Target and draft forward costs at the machine's current pace.

    target(rows): one target forward (and its verification kernel) over ``rows`` tokens;
    draft(rows): one draft forward over ``rows`` rows, the proposer's host work included
    (microseconds for n-gram lookups); catch_up(tokens): feeding a draft model committed
    tokens it has not seen (per-token prefill price).

    The pace is the median ratio of recent target forwards to the table: one number, so
    that the table's shape -- what the decisions depend on -- is never pulled around by
    it. Draft work has its own factor, ``draft_overhead``: the median ratio of what real
    steps spent proposing (the catch-up, the head or draft calls and the host work around
    them) to what the table priced those forwards at (StepPlan.priced). Timed alone, a Qwen
    EAGLE-3 head forward is 0.8 ms; real asks cost ~1.5x that. It is learned in each
    process, from 1, and not kept: a value kept from a process whose asks were dear would
    stop the next one from drafting, and so from ever measuring it again.

    Target observations are also kept per row count (pace removed) and written back into
    the cached profile, anchored at the one-row entry, so the next process starts from a
    profile healed by real steps."""

    def __init__(self, target: CostTable, draft: CostTable, catch_up_per_token: float = 0.0,
                 path: Path | None = None):
        self.target_table, self.draft_table = target, draft
        self.catch_up_per_token = catch_up_per_token
        self.path = path
        self.ratios: list[float] = []
        self.pace = 1.0
        self.seen: dict[int, tuple[float, int]] = {}  # rows -> (EMA of seconds / table / pace, count)
        self.draft_ratios: list[float] = []
        self.draft_overhead = 1.0  # real draft work / the table at the current pace (median of draft_ratios)
        self.acceptance: dict | None = None  # what the acceptance model learned (runtime/adaptive.py)
        self.acceptance_of: str | None = None  # ...with which weights (weights_key): another head's is not ours

    def target(self, rows: int) -> float:
        return self.pace * self.target_table(rows)

    def draft(self, rows: int) -> float:
        return self.pace * self.draft_overhead * self.draft_table(rows) if rows > 0 else 0.0

    def catch_up(self, tokens: int) -> float:
        return self.pace * self.draft_overhead * self.catch_up_per_token * max(tokens, 0)

    def marginal(self, rows: int) -> float:
        """What one more verified row costs on top of ``rows``: never below 1% of a one-row
        step, so that a flat stretch of the table does not make rows look free."""
        return max(self.target(rows + 1) - self.target(rows), 0.01 * self.target(1))

    # --------------------------------------------------------------- online
    def observe_target(self, rows: int, seconds: float) -> None:
        """A real target forward. Its ratio to the table moves the pace (the median of the
        recent ratios); its ratio to their geometric mean -- the machine's speed *at that
        moment*, symmetric when row counts alternate -- is what it says about the table's
        shape, kept per row count."""
        predicted = self.target_table(rows)
        if predicted <= 0 or seconds <= 0:
            return
        self.ratios.append(seconds / predicted)
        del self.ratios[:-PACE_WINDOW]
        self.pace = statistics.median(self.ratios)
        if len(self.ratios) < PACE_WINDOW:  # too few neighbours yet to say what "this moment" is
            return
        relative = seconds / predicted / math.exp(statistics.fmean(math.log(r) for r in self.ratios))
        ema, n = self.seen.get(rows, (relative, 0))
        self.seen[rows] = ((1 - REFRESH) * ema + REFRESH * relative, n + 1)

    def observe_draft(self, seconds: float, priced: float) -> None:
        """A real step's proposing took ``seconds`` (host work included), where the table
        priced the forwards it ran -- a catch-up's rows included -- at ``priced`` seconds
        at the current pace."""
        if priced <= 0 or seconds <= 0:
            return
        self.draft_ratios.append(seconds / priced)
        del self.draft_ratios[:-PACE_WINDOW]
        self.draft_overhead = min(max(statistics.median(self.draft_ratios), 0.5), 20.0)

    # ------------------------------------------------------------ the cache
    def refreshed(self) -> CostTable:
        """The target table with each row count seen often enough corrected by how real
        steps compared with the steps around them, relative to the one-row entry, which
        keeps the profile's level. Only row counts observed side by side say anything about
        the shape: a stretch of plain steps in a fast second followed by drafting steps in a
        slow one is the machine's drift, and leaves the table as it was (a table healed
        from that drift once priced two rows at 1.5 steps, and nothing drafted again)."""
        seen = {r: v for r, (v, n) in self.seen.items() if n >= 8}
        if 1 not in seen or len(seen) < 2:
            return self.target_table
        merged = dict(self.target_table.seconds)
        merged.update({r: self.target_table(r) * v / seen[1] for r, v in seen.items()})
        return CostTable(merged)

    def to_json(self) -> dict:
        return {"target": self.refreshed().to_json(), "draft": self.draft_table.to_json(),
                "catch_up_per_token": self.catch_up_per_token, "acceptance": self.acceptance,
                "acceptance_of": self.acceptance_of}

    def save(self) -> None:
        """Write the refreshed profile (best effort: a read-only cache only loses the refresh)."""
        if self.path is None:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(f".tmp{os.getpid()}")
            tmp.write_text(json.dumps(self.to_json(), indent=1))
            tmp.replace(self.path)
        except OSError:
            pass

    @classmethod
    def load(cls, path: Path) -> "CostModel | None":
        try:
            data = json.loads(Path(path).read_text())
            cost = cls(CostTable({int(r): s for r, s in data["target"].items()}),
                       CostTable({int(r): s for r, s in data["draft"].items()}),
                       float(data.get("catch_up_per_token", 0.0)), Path(path))
            cost.acceptance, cost.acceptance_of = data.get("acceptance"), data.get("acceptance_of")
            return cost
        except (OSError, ValueError, KeyError, TypeError):
            return None  # absent or unreadable: measure again


def time_min(fn, repeat: int = 3, budget: float | None = None) -> float:
    """Best of ``repeat`` timed calls after one untimed call (which allocates buffers); with
    ``budget``, fewer once the timed calls add up to that many seconds (at least one)."""
    fn()
    best, spent = float("inf"), 0.0
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        dt = time.perf_counter() - t0
        best, spent = min(best, dt), spent + dt
        if budget is not None and spent >= budget:
            break
    return best


def measure_target(model, kv, rows: list[int], features: str, budget: float | None = None) -> dict[int, float]:
    """Seconds of a target forward plus greedy verification over r rows of one scratch
    sequence (after a 16-token prefix), through the very calls a decode step makes: the
    fused logits entry points, or (for heads that read ``features``: the Proposer's
    attribute) hidden states or layer features with their logits. With ``budget`` (seconds),
    the profile's bounded form: the first CORE_ROWS counts of ``rows`` always, each further
    one only while the measuring so far took less, and each count's timed calls capped at
    TIMED_SECONDS; without, every count, best of three."""
    sid = -1
    kv.add_sequence(sid)
    try:
        model.prefill(kv, [sid], [list(range(16))])

        def forward(r):
            tokens = [list(range(16, 16 + r))]
            parents = [list(range(-1, r - 1))]
            if features == "layers":
                hidden, feats, logits = model.forward(kv, [sid], tokens, outputs=("hidden", "features", "logits"))
                feats.numpy()
            elif features:
                hidden, logits = model.forward(kv, [sid], tokens, outputs=("hidden", "logits"))
                hidden.numpy()
            elif r == 1:
                logits = model.decode(kv, [sid], tokens[0], on_device=True)
            else:
                logits = model.forward(kv, [sid], tokens, on_device=True)
            model.accept_greedy(logits, tokens, parents)
            kv.popn(sid, r)

        graphs = getattr(model, "graphs", None) is not None
        t0, out = time.perf_counter(), {}
        for i, r in enumerate(rows):
            if budget is not None and i >= CORE_ROWS and time.perf_counter() - t0 >= budget:
                break
            if graphs:  # a CUDA graph is captured at its shape's second use: not a timed call
                forward(r)
            out[r] = time_min(lambda: forward(r), budget=None if budget is None else TIMED_SECONDS)
        return out
    finally:
        kv.remove_sequence(sid)


def load_or_measure(libraries: list[Path], mode: str, model, kv, proposer, max_rows: int) -> CostModel:
    """The forward costs of a target and its proposer on this host: read from the cache,
    or measured now on scratch sequences (about a second per model) and cached. The key
    covers the libraries' contents, the mode (with its tree shape) and the host."""
    rows = [r for r in TARGET_ROWS if r <= max_rows]
    path = profile_path(libraries, mode, f"rows<={max(rows)}")
    cost = CostModel.load(path)
    if cost is None:
        target = CostTable(measure_target(model, kv, rows, proposer.features, budget=PROFILE_SECONDS))
        draft, per_token = proposer.measure(list(DRAFT_ROWS))
        cost = CostModel(target, CostTable(draft), per_token, path)
        cost.save()
    return cost


def weights_key(model_dirs: list[Path]) -> str:
    """Which weights the models hold, by their ``tensor-cache.json`` (it lists every tensor's
    md5). A profile is keyed by the libraries, which say what a forward costs; what a draft
    is accepted at depends on the weights too: two heads of one shape share a library, and a
    random head's learned "nothing is accepted" once kept a trained head from drafting."""
    from .contract import TENSOR_CACHE_FILE

    h = hashlib.sha256()
    for d in model_dirs:
        index = Path(d) / TENSOR_CACHE_FILE
        h.update(index.read_bytes() if index.exists() else str(Path(d).resolve()).encode())
    return h.hexdigest()[:20]


def cache_dir() -> Path:
    return cache_root() / "costs"


def host_fingerprint() -> str:
    """The CPU model and the threads TVM runs on: a profile from another host kind or
    thread count says nothing about this one. The count is runtime/threads.py's, which
    does not depend on whether ``configure_threads`` has run yet in this process."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}|threads={thread_count()}|cpus={os.cpu_count()}"


def profile_path(libraries: list[Path], mode: str, extra: str = "") -> Path:
    """Cache file of the profile of these libraries (by content) in this mode on this host."""
    h = hashlib.sha256()
    for lib in libraries:
        h.update(_file_digest(Path(lib)).encode())
    h.update(f"{mode}|{extra}|{host_fingerprint()}|v{PROFILE_FORMAT}".encode())
    return cache_dir() / f"{h.hexdigest()[:20]}.json"


def _file_digest(path: Path) -> str:
    st = path.stat()
    h = hashlib.sha256(f"{st.st_size}".encode())
    with path.open("rb") as f:  # a library is a few MB; hashing it costs milliseconds
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
