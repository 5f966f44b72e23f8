"""Adaptive draft length: pick the k that maximizes expected tokens per second.

Estimated online, per engine:
- alpha[i]: probability that draft position i+1 is accepted given position i was
  (exponentially decayed hit / trial counts over verify steps that drafted that far, so
  the first observations count fully instead of being averaged against a prior); a
  position never reached yet takes the estimate of the deepest one measured -- with a
  fixed prior instead, a controller that starts at k = 1 believes position 2 is worse than
  position 1 and never finds out that k = 3 pays (Qwen 1.5B + 0.5B draft, coding: adaptive
  settled on k = 1 at 1.25x while k = 3 ran at 1.5-2.1x);
- draft_cost: seconds per draft forward (0 for n-gram), the median of recent draft steps;
- verify_cost[n]: seconds of a target forward over n tokens in all (batch * (k + 1) for
  chains), measured per n; unmeasured n interpolate linearly from measured ones.

Expected tokens of a k-chain = 1 + sum_{i<=k} prod_{j<=i} alpha[j] (the bonus included);
its time = k * draft_cost + verify_cost[batch * (k + 1)]. k = 0 is plain decoding and is chosen
whenever speculation does not pay. Every ``probe_every`` steps one step drafts one token
longer than the best k (k = 1 while plain decoding wins), so that a change in acceptance
or a stale cost is noticed; each probe that does not change the decision doubles the
interval (up to 256 steps). When even perfect acceptance could not pay at the measured
costs, probes are rarer (every 64 steps, doubling to 1024): a draft model has to catch up on
the skipped tokens, but a cost measured while another process held the CPU must not switch
speculation off for good. Costs are medians of the last 9 forwards, robust to such spikes,
each rescaled by how the plain step time of its batch size has moved since (the machine's
clock changes).

The model above cannot see every cost: a draft model catching up on a new request's prompt
inside a decode step, n-gram drafts that exist for only some sequences of a batch, Python
work around the forwards. So the controller also keeps the *realized* throughput of recent
whole steps at each batch size, with and without drafts; when drafting has measurably
delivered fewer tokens per second than plain steps at this batch size (by more than
``REALIZED_TOLERANCE``: the two are sampled at different moments of a machine whose speed
drifts by 10-30% over seconds), it decodes plainly
(still probing now and then, so that a change -- an extraction prompt joining -- is seen).
While drafting, one step in 64 (16 until there are enough) is plain, as the reference.
"""
from __future__ import annotations

import statistics

# A longer draft must promise this much more throughput to be chosen: step times on a busy
# 2-core machine jitter by several percent, and a marginal "win" measured on noise (2%
# margin, EMA costs) was a 0.92x loss in practice (Qwen 1.5B, n-gram, coding prompts).
MARGIN = 1.05
COST_WINDOW = 9  # recent forwards per forward size whose median is the cost estimate
IDLE_PROBE_EVERY, IDLE_PROBE_MAX = 64, 1024  # probes when even perfect acceptance looks unprofitable
REALIZED_WINDOW, REALIZED_MIN = 16, 6  # recent whole steps per (batch, drafted) kept / needed to judge
PLAIN_PROBE_EVERY, PLAIN_PROBE_RARE = 16, 64  # drafting steps between plain reference steps
REALIZED_TOLERANCE = 0.92  # drafting "loses" below this share of the plain steps' realized rate
MIN_TRIALS = 2.0  # decayed trials a draft position needs before its own estimate is used
# A draft *model* also prefills every new request's prompt and catches up after plain
# stretches, costs that grow with the number of sequences coming and going and that the
# per-step model does not see: served with 4 and 8 concurrent requests, Qwen 1.5B + 0.5B
# drafting that the step model called a 5-9% win measured 0.84-0.90x (A/B in one server).
# So a draft model must promise this much more per extra sequence in the batch.
DRAFT_MODEL_BATCH_MARGIN = 0.15
# ... and 5% more even alone: on an AVX2 host where one extra verified row costs 0.3-0.9x a
# decode step, the step model's 5-9% wins at k = 1 were 0.86-0.95x in plain/spec/spec/plain
# benches (its cost medians swing with the machine's 10-30% speed changes).
DRAFT_MODEL_MARGIN = 0.05


class DraftLengthController:
    def __init__(self, max_k: int = 8, fixed_k: int | None = None, ema: float = 0.05, probe_every: int = 16,
                 prior_alpha: float = 0.6, draft_is_free: bool = False):
        self.max_k, self.fixed_k, self.ema, self.probe_every = max_k, fixed_k, ema, probe_every
        self.prior_alpha = prior_alpha
        self.hits = [0.0] * max_k  # exponentially decayed accepted / tried counts per position
        self.trials = [0.0] * max_k
        self.draft_cost = 0.0 if draft_is_free else None
        # recent (seconds, batch size, plain step time then): per draft forward, per forward rows
        self.draft_samples: list[tuple[float, int, float | None]] = []
        self.verify_samples: dict[int, list[tuple[float, int, float | None]]] = {}
        self.plain_recent: dict[int, list[float]] = {}  # batch -> recent plain step seconds
        self.seen_shapes: set[int] = set()
        self.since_probe = 0
        self.probe_interval = probe_every
        self.last_best = 0
        self.realized: dict[tuple[int, bool], list[tuple[int, float]]] = {}  # (batch, drafted) -> (tokens, s)
        self.since_plain: dict[int, int] = {}  # drafting steps since the last plain one, per batch size
        self.state_by_batch: dict[int, int] = {}  # last decision per batch size (-1: hopeless)
        self.probing = False  # the last choose() returned a probe, not a length it believes in

    # ------------------------------------------------------------ estimates
    def observe_verify(self, batch: int, k: int, seconds: float, rows: int | None = None) -> None:
        """A target forward of ``rows`` tokens in all (default batch * (k + 1), a chain each)."""
        rows = rows if rows is not None else batch * (k + 1)
        if rows not in self.seen_shapes:  # the first forward of a shape allocates its buffers
            self.seen_shapes.add(rows)
            return
        if k == 0:
            plain = self.plain_recent.setdefault(batch, [])
            plain.append(seconds)
            del plain[:-COST_WINDOW]
        samples = self.verify_samples.setdefault(rows, [])
        samples.append((seconds, batch, self._speed(batch)))
        del samples[:-COST_WINDOW]

    def _speed(self, batch: int) -> float | None:
        """What a plain step at this batch size costs now: the machine's current pace."""
        plain = self.plain_recent.get(batch)
        return statistics.median(plain) if plain else None

    def _scaled_median(self, samples: list[tuple[float, int, float | None]]) -> float:
        """Median of samples each rescaled by how much faster or slower plain steps of its
        batch size run now than when it was taken. This 2-core machine (like any laptop
        changing its clock) switches between speeds ~30% apart within minutes: without
        the rescaling, verify costs measured in a slow minute and rarely re-measured made
        drafting look too dear once the machine was fast, and speculation stayed off on
        coding prompts it sped up 1.5x."""
        scaled = []
        for sec, batch, then in samples:
            now = self._speed(batch)
            scaled.append(sec * now / then if now and then else sec)
        return statistics.median(scaled)

    @property
    def verify_cost(self) -> dict[int, float]:
        """rows -> median of the recent forwards (rescaled to the machine's current pace):
        one step slowed by another process must not decide the next hundreds (a mean or
        EMA would carry it). Keyed by the forward's total rows, not (batch, k): a forward's
        time depends on how many tokens it carries, so what plain batches of 4 and 8 cost
        also tells what a batch of 4 drafting one token each would, and a server whose
        batch size keeps changing need not relearn it."""
        return {rows: self._scaled_median(v) for rows, v in self.verify_samples.items()}

    def observe_draft(self, forwards: int, seconds: float, batch: int = 1) -> None:
        """Seconds of a draft step of ``forwards`` forwards. The cost is the median per forward
        of the recent steps, like verify costs: a first call that allocated buffers, or one
        slowed by another process, once made drafting look hopeless, and with probes that
        rare an average would have kept it so for the rest of a server's life."""
        if forwards <= 0 or self.draft_cost == 0.0:
            return
        self.draft_samples.append((seconds / forwards, batch, self._speed(batch)))
        del self.draft_samples[:-COST_WINDOW]  # choose() turns them into draft_cost

    def observe_step(self, batch: int, drafted: bool, tokens: int, seconds: float) -> None:
        """A whole decode step (drafting, verify, bookkeeping) of ``batch`` sequences that
        emitted ``tokens``; ``drafted``: whether any draft token was verified."""
        steps = self.realized.setdefault((batch, drafted), [])
        steps.append((tokens, seconds))
        del steps[:-REALIZED_WINDOW]

    def drafting_loses(self, batch: int) -> bool:
        """True when recent drafting steps at this batch size delivered fewer tokens per
        second than recent plain ones (both with enough samples)."""
        spec, plain = self.realized.get((batch, True), []), self.realized.get((batch, False), [])
        if len(spec) < REALIZED_MIN or len(plain) < REALIZED_MIN:
            return False
        rate = lambda steps: sum(t for t, _ in steps) / max(sum(s for _, s in steps), 1e-9)
        return rate(spec) < REALIZED_TOLERANCE * rate(plain)

    def observe_acceptance(self, drafted: int, accepted: int) -> None:
        """drafted: chain length proposed; accepted: how many of them were accepted."""
        for i in range(min(drafted, self.max_k)):
            hit = 1.0 if i < accepted else 0.0
            self.hits[i] = (1 - self.ema) * self.hits[i] + hit
            self.trials[i] = (1 - self.ema) * self.trials[i] + 1.0
            if not hit:
                break  # later positions were not reached: no evidence about them

    @property
    def alpha(self) -> list[float]:
        """Per-position acceptance estimates; unmeasured positions inherit the deepest measured."""
        out, last = [], self.prior_alpha
        for h, n in zip(self.hits, self.trials):
            if n >= MIN_TRIALS:
                last = h / n
            out.append(last)
        return out

    def _verify_time(self, batch: int, k: int, cost: dict | None = None) -> float | None:
        cost = self.verify_cost if cost is None else cost
        n = batch * (k + 1)
        known = sorted(cost)
        if not known:
            return None
        if n in cost:
            return cost[n]
        lo = max((r for r in known if r < n), default=None)
        hi = min((r for r in known if r > n), default=None)
        if lo is not None and hi is not None:
            return cost[lo] + (cost[hi] - cost[lo]) * (n - lo) / (hi - lo)
        # extrapolate: each extra row costs at least 10% of a one-row step (CPU verify is not free)
        slope = 0.1 * cost[known[0]] / known[0]
        if len(known) >= 2:
            a, b = (known[-2], known[-1]) if n > known[-1] else (known[0], known[1])
            slope = max(slope, (cost[b] - cost[a]) / (b - a))
        ref = known[-1] if n > known[-1] else known[0]
        return max(cost[ref] + slope * (n - ref), 0.0)

    def expected_tokens(self, k: int, perfect: bool = False) -> float:
        total, run, alpha = 1.0, 1.0, self.alpha
        for i in range(k):
            run *= 1.0 if perfect else alpha[i]
            total += run
        return total

    def _best(self, batch: int, cap: int, t0: float, cost: dict, perfect: bool = False) -> int:
        """The fastest k >= 1 by expected tokens per second, if it beats plain decoding by
        MARGIN (never trade speed for noise), else 0. Draft lengths are compared with each
        other without a margin: near the optimum they differ by a few percent, and a
        margin there kept k = 1 where k = 3 was 9% faster."""
        best_k, best_rate = 0, 0.0
        for k in range(1, cap + 1):
            tv = self._verify_time(batch, k, cost)
            if tv is None:
                continue
            rate = self.expected_tokens(k, perfect) / (k * self.draft_cost + tv)
            if rate > best_rate:
                best_k, best_rate = k, rate
        margin = MARGIN
        if self.draft_cost:  # a draft model: per-request costs the step model does not see
            margin *= 1 + DRAFT_MODEL_MARGIN + DRAFT_MODEL_BATCH_MARGIN * (batch - 1)
        return best_k if best_rate > margin / t0 else 0

    # ---------------------------------------------------------------- choose
    def choose(self, batch: int = 1, limit: int | None = None) -> int:
        """Draft length for the next step (limit: the most the token budget allows)."""
        cap = self.max_k if limit is None else max(0, min(self.max_k, limit))
        self.probing = False
        if self.fixed_k is not None:
            return min(self.fixed_k, cap)
        if cap == 0:
            return 0
        cost = self.verify_cost
        if self.draft_samples:  # rescaled to the current pace at each decision
            self.draft_cost = self._scaled_median(self.draft_samples)
        t0 = self._verify_time(batch, 0, cost)
        if t0 is None or self.draft_cost is None:
            return 1 if t0 is not None else 0  # measure plain first, then one probe
        best_k = self._best(batch, cap, t0, cost)
        if best_k > 0 and self.drafting_loses(batch):
            best_k = 0  # the estimate promises a gain the realized steps do not show
        if best_k > 0:  # now and then a plain step, the reference drafting is judged against
            self.since_plain[batch] = self.since_plain.get(batch, 0) + 1
            few = len(self.realized.get((batch, False), [])) < REALIZED_MIN
            if self.since_plain[batch] >= (PLAIN_PROBE_EVERY if few else PLAIN_PROBE_RARE):
                self.since_plain[batch] = 0
                return 0
        hopeless = best_k == 0 and self._best(batch, cap, t0, cost, perfect=True) == 0
        state = -1 if hopeless else best_k  # not even perfect acceptance would pay at these costs
        self.state_by_batch[batch] = state
        if state != self.last_best:  # the decision moved: probe at the base rate again
            self.last_best, self.since_probe = state, 0
            self.probe_interval = IDLE_PROBE_EVERY if hopeless else self.probe_every
        self.since_probe += 1
        if self.since_probe >= self.probe_interval and best_k < cap:
            # one step one draft longer refreshes that length's cost and the next position's
            # acceptance; otherwise a cost measured in a noisy moment would stick forever
            self.since_probe = 0
            self.probe_interval = min(2 * self.probe_interval, IDLE_PROBE_MAX if hopeless else 256)
            self.probing = True
            return best_k + 1
        return best_k

    def drafting_at(self, batch: int) -> bool:
        """Drafting was chosen at this batch size the last time. Undecided: yes at batch 1,
        no above (where it rarely pays, and a server's batch passes through every size as
        requests arrive: a draft model prefilling each arrival cost 5% at concurrency 8)."""
        return self.state_by_batch.get(batch, 1 if batch <= 1 else 0) > 0

    def new_sequence(self) -> None:
        """A new request may draft very differently (code after prose): probe at the base rate."""
        if self.probe_interval > self.probe_every:
            self.probe_interval, self.since_probe = self.probe_every, 0
