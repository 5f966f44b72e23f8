"""Adaptive draft length: pick the k that maximizes expected tokens per second.

Estimated online, per engine:
- alpha[i]: probability that draft position i+1 is accepted given position i was
  (exponential moving average over verify steps that drafted that far);
- draft_cost: seconds per draft forward (0 for n-gram);
- verify_cost[k]: seconds of a target forward over k+1 tokens per sequence at the current
  batch size (measured per k; unmeasured k interpolate linearly from measured ones).

Expected tokens of a k-chain = 1 + sum_{i<=k} prod_{j<=i} alpha[j] (the bonus included);
its time = k * draft_cost + verify_cost[k]. k = 0 is plain decoding and is chosen
whenever speculation does not pay. Every ``probe_every`` steps one step drafts one token
longer than the best k (k = 1 while plain decoding wins), so that a change in acceptance
or a stale cost is noticed; each probe that does not change the decision doubles the
interval (up to 256 steps). No probe runs when
speculation could not pay even if every draft were accepted (measured costs alone rule
it out): a draft model would have to catch up on every skipped token for nothing.
"""
from __future__ import annotations

# A longer draft must promise this much more throughput to be chosen: step times on a busy
# 2-core machine jitter by several percent, and a marginal "win" measured on noise was a
# 0.92x loss in practice (Qwen 1.5B, n-gram, coding prompts).
MARGIN = 1.08


class DraftLengthController:
    def __init__(self, max_k: int = 8, fixed_k: int | None = None, ema: float = 0.1, probe_every: int = 16,
                 prior_alpha: float = 0.6, draft_is_free: bool = False):
        self.max_k, self.fixed_k, self.ema, self.probe_every = max_k, fixed_k, ema, probe_every
        self.alpha = [prior_alpha] * max_k
        self.draft_cost = 0.0 if draft_is_free else None
        self.verify_cost: dict[tuple[int, int], float] = {}  # (batch, k) -> seconds
        self.since_probe = 0
        self.probe_interval = probe_every
        self.last_best = 0

    # ------------------------------------------------------------ estimates
    def observe_verify(self, batch: int, k: int, seconds: float) -> None:
        key = (batch, k)
        old = self.verify_cost.get(key)
        self.verify_cost[key] = seconds if old is None else (1 - self.ema) * old + self.ema * seconds

    def observe_draft(self, forwards: int, seconds: float) -> None:
        if forwards <= 0 or self.draft_cost == 0.0:
            return
        per = seconds / forwards
        self.draft_cost = per if self.draft_cost is None else (1 - self.ema) * self.draft_cost + self.ema * per

    def observe_acceptance(self, drafted: int, accepted: int) -> None:
        """drafted: chain length proposed; accepted: how many of them were accepted."""
        for i in range(min(drafted, self.max_k)):
            hit = 1.0 if i < accepted else 0.0
            self.alpha[i] = (1 - self.ema) * self.alpha[i] + self.ema * hit
            if not hit:
                break  # later positions were not reached: no evidence about them

    def _verify_time(self, batch: int, k: int) -> float | None:
        known = sorted(kk for (b, kk) in self.verify_cost if b == batch)
        if not known:
            return None
        if k in known:
            return self.verify_cost[(batch, k)]
        lo = max((kk for kk in known if kk < k), default=None)
        hi = min((kk for kk in known if kk > k), default=None)
        if lo is not None and hi is not None:
            t_lo, t_hi = self.verify_cost[(batch, lo)], self.verify_cost[(batch, hi)]
            return t_lo + (t_hi - t_lo) * (k - lo) / (hi - lo)
        base = self.verify_cost[(batch, known[0])]
        # extrapolate: each extra token costs at least 10% of a base step (CPU verify is not free)
        slope = 0.1 * base
        if len(known) >= 2:
            a, b = known[-2], known[-1]
            slope = max(slope, (self.verify_cost[(batch, b)] - self.verify_cost[(batch, a)]) / (b - a))
        ref = known[-1] if k > known[-1] else known[0]
        return self.verify_cost[(batch, ref)] + slope * (k - ref)

    def expected_tokens(self, k: int, perfect: bool = False) -> float:
        total, run = 1.0, 1.0
        for i in range(k):
            run *= 1.0 if perfect else self.alpha[i]
            total += run
        return total

    def _best(self, batch: int, cap: int, t0: float, perfect: bool = False) -> int:
        best_k, best_rate = 0, 1.0 / t0
        for k in range(1, cap + 1):
            tv = self._verify_time(batch, k)
            if tv is None:
                continue
            rate = self.expected_tokens(k, perfect) / (k * self.draft_cost + tv)
            if rate > best_rate * MARGIN:  # never trade speed for noise
                best_k, best_rate = k, rate
        return best_k

    # ---------------------------------------------------------------- choose
    def choose(self, batch: int = 1, limit: int | None = None) -> int:
        """Draft length for the next step (limit: the most the token budget allows)."""
        cap = self.max_k if limit is None else max(0, min(self.max_k, limit))
        if self.fixed_k is not None:
            return min(self.fixed_k, cap)
        if cap == 0:
            return 0
        t0 = self._verify_time(batch, 0)
        if t0 is None or self.draft_cost is None:
            return 1 if t0 is not None else 0  # measure plain first, then one probe
        best_k = self._best(batch, cap, t0)
        if best_k == 0 and self._best(batch, cap, t0, perfect=True) == 0:
            return 0  # not even perfect acceptance would pay at these costs
        if best_k != self.last_best:  # the decision moved: probe at the base rate again
            self.last_best, self.since_probe, self.probe_interval = best_k, 0, self.probe_every
        self.since_probe += 1
        if self.since_probe >= self.probe_interval and best_k < cap:
            # one step one draft longer refreshes that length's cost and the next position's
            # acceptance; otherwise a cost measured in a noisy moment would stick forever
            self.since_probe = 0
            self.probe_interval = min(2 * self.probe_interval, 256)
            return best_k + 1
        return best_k
