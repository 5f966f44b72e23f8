"""How much to draft: a cost model, an acceptance model and one policy.

- Costs (``runtime/costs.py``): what a target forward of n rows and a draft forward cost,
  measured before the first step and tracked online by one pace factor.
- ``AcceptanceModel``: P(a draft token is accepted | its parent was), predicted from the
  draft's own confidence (the draft model's or head's probability of the token, or an
  n-gram match's strength) through a calibration curve -- confidence bins -> measured
  acceptance -- that starts from a prior and learns from every verified node, corrected
  per sequence by how that sequence's own drafts fared (so a batch's predictions are as
  good as one stream's: tests/runtime/test_acceptance_replay.py replays a concurrent workload).
- ``StepPlan`` (one per decode step): every drafted node has a path probability P (the
  product of its and its ancestors' predicted acceptances), and a step's expected output
  is ``batch + sum(P)``. Its time is the draft forwards already run plus the target forward
  over all rows: the nodes of every sequence compete for the batch's rows, so a batch
  verifies the few drafts that pay (a code sequence's long chain) and none of the others.
  A proposer asks before each draft forward whether the nodes it would add can raise the
  step's rate above what the step has (or plain decoding would give); the engine then
  verifies only the nodes whose P pays for their row. This is the per-token
  stopping of llama.cpp's ``p_min``, EAGLE-2's confidence-driven expansion and
  SpecDec++/AdaEDL, with the threshold coming from measured costs instead of a constant:
  short drafts where the draft is unsure (translation), long ones where it is sure (code).
- ``Policy``: makes the plans and keeps the one guard: drafting is switched off at a batch
  size only when its realized steps were measurably slower than plain decoding would have
  been at the current pace (mean speedup's upper confidence bound below 1), for a cooldown
  that doubles each time it trips again; a draft that never agrees or is slower than its
  target ends up plain through the plan alone.
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np

from .costs import CostModel
from .acceptance import Draft

BINS = 10  # confidence bins of the calibration curve
# Sources of one draft, each with its own calibration and prompt scaling: a merged draft's
# suffix-index nodes (source 0) and its drafter's (source 1, runtime/drafters/merged.py); a proposer of
# one source uses 0. A suffix match of confidence 0.5 and a head's probability 0.5 are accepted
# at different rates, and a head confidently wrong on a prompt must not silence the index.
SOURCES = 2
PRIOR_TRIALS = 4.0  # pseudo-observations of the prior per bin: a few real ones outweigh it
DECAY = 0.998  # per verified node: evidence fades over ~500 nodes (prompts change)
RESTORED_TRIALS = 20.0  # most observations per bin carried over from earlier processes
# A first draft token's acceptance, before any confidence is known: decayed hit / trial
# counts (about the last 20 drafting steps) over a prior worth FIRST_PRIOR_TRIALS of them.
# Plain steps decay the counts too, so a low estimate drifts back to the prior and drafting
# is retried -- a probe that costs a draft forward (and a draft model's catch-up). Every ask
# that yields nothing (a first token rejected, or no node worth its row) halves that drift,
# up to MAX_BACKOFF times; a hit or a new prompt resets it. Without the backoff the estimate
# settles where it just pays and the head is asked every few steps for good: Medusa for
# Qwen2.5-Coder-1.5B on a translation prompt, 0 of ~25 asks accepted, asked every 5 steps.
# The prior is weak (2 trials): one head's first-token acceptance ranges from 0 to 0.5 over
# prompts (the Qwen EAGLE-3 head: translation 0.00, code 0.45), and with 6 trials a prompt
# where nothing is accepted was asked ~30 times in a 63-token answer (77 ms of 1.4 s).
FIRST_DECAY, FIRST_PLAIN_DECAY, FIRST_PRIOR_TRIALS = 0.95, 0.97, 2.0
MAX_BACKOFF = 16
# What this prompt does to the calibration: realized / predicted acceptance of the last few
# tried nodes (decayed counts over LOCAL_PRIOR pseudo-nodes at the calibrated rate) scales
# every prediction. The calibration is learned over hundreds of nodes and kept across
# processes; a head that is confidently wrong on one kind of prompt (translation: the
# EAGLE-3 head for Qwen2.5-Coder-1.5B drafted at 0.3-0.5 confidence and was accepted 0-5%
# of the time, and ran at 0.91-0.95x) would otherwise keep drafting through a whole answer.
# One pseudo-node, not two: with two the scaling could not fall below ~0.5 over the ~5 nodes
# it remembers, and Medusa's heads for Qwen, confidently wrong on translation, kept being
# verified (14 rows, 0 accepted, in 62 tokens; 0.955x). With one: 2-9 rows, translation 0.99x,
# mean of categories 1.27x against 1.25x (--repeat 3, one machine, 12/12 identical).
LOCAL_DECAY, LOCAL_PRIOR, LOCAL_MAX = 0.8, 1.0, 2.0
# A draft model's catch-up after a plain stretch buys drafting for the steps that follow,
# not only for the one it happens in: a plan charges this share of it to the step.
CATCH_UP_AMORTIZED = 1 / 8
MAX_DEPTH = 8  # the longest chain / deepest tree an adaptive step drafts
LOOKAHEAD = 8  # draft forwards a plan looks ahead when deciding whether to run the next one
GUARD_WINDOW, GUARD_MIN = 24, 8  # realized drafting steps kept / needed per batch size
# What drafting steps realized: seconds saved per output token against plain steps, decayed
# per step at that batch size (~50 steps remembered), used once SAVED_MIN tokens' worth is
# known, and carried to the next process worth at most that much. Plain steps decay it too:
# kept, a saving measured low in a busy moment stopped every draft prefill, so no drafting
# step ever measured it again (a server on Zen 3, restarted, never drafted).
SAVED_DECAY, SAVED_MIN = 0.98, 8.0
COOLDOWN_MIN, COOLDOWN_MAX = 32, 1024  # plain steps after the guard trips (doubling)
# ... and at most this many seconds of decoding: 1,024 steps of 8 rows took 150 s on a 2-core
# Zen 3, far too long to notice that the load which made drafting lose has gone. A retry
# costs GUARD_MIN drafting steps, so on that host it loses at most ~1.2 s in 10 of the loss.
COOLDOWN_SECONDS = 10.0
SAVE_EVERY = 256  # steps between writes of what was learned (a server never ends a generate)
# Tokens finished requests emitted, decayed per request (~20 remembered): a draft model's
# prefill is priced against what a request is expected to emit, not its max_tokens (JSON
# answers under a schema, Qwen2.5-Coder-1.5B with its 0.5B draft on Zen 3: ~70% of max_tokens;
# priced at all of it, the draft's prefill cost more than drafting saved, 0.94x end to end; a
# request without max_tokens has the whole context as its budget).
OUTPUT_DECAY = 0.95


class PromptState:
    """What one sequence's own drafts have shown, beside the shared calibration: its
    first-token evidence (and the backoff of its retries) and its prompt's scaling. Kept per
    sequence so that in a batch a translation whose drafts miss is silenced while a code
    sequence beside it drafts long: with one state for the engine, every arrival reset the
    scaling of all, and one sequence's hits raised another's estimate."""

    __slots__ = ("first_hits", "first_trials", "backoff", "local_hits", "local_expected")

    def __init__(self, first_hits: float = 0.0, first_trials: float = 0.0):
        self.first_hits, self.first_trials = first_hits, first_trials
        self.backoff = 1.0  # how much slower plain steps relax the first-token evidence
        # [SOURCES] decayed, of the last tried nodes of each source (LOCAL_DECAY)
        self.local_hits, self.local_expected = np.zeros(SOURCES), np.zeros(SOURCES)


class AcceptanceModel:
    """Calibration of draft confidence to acceptance (shared: a property of the draft and
    the target), the first-token estimate used before a draft forward has produced any
    confidence, and each sequence's corrections (``PromptState``). Methods take the
    sequence's id; ``None`` is a default sequence (one stream, tests)."""

    def __init__(self, first_prior: float = 0.7):
        self.prior = np.clip((np.arange(BINS) + 0.5) / BINS, 0.01, 0.99)  # confidence is acceptance
        self.hits = np.zeros((SOURCES, BINS))
        self.trials = np.zeros((SOURCES, BINS))
        self.first_prior = first_prior
        # first-token evidence pooled over every sequence: what a new sequence starts from
        self.first_hits = self.first_trials = 0.0
        self.prompts: dict = {}

    @staticmethod
    def _bin(conf: float) -> int:
        return min(BINS - 1, max(0, int(conf * BINS)))

    def state_of(self, seq=None) -> PromptState:
        state = self.prompts.get(seq)
        if state is None:
            state = self.prompts[seq] = self._seeded()
        return state

    def _seeded(self) -> PromptState:
        """A new sequence's state: the pooled first-token evidence worth at most the prior."""
        keep = min(1.0, FIRST_PRIOR_TRIALS / max(self.first_trials, 1e-9))
        return PromptState(self.first_hits * keep, self.first_trials * keep)

    def calibrated(self, conf: float, source: int = 0) -> float:
        """Acceptance of a draft token of this confidence from this source, by its calibration
        curve alone."""
        b = self._bin(conf)
        return float((self.prior[b] * PRIOR_TRIALS + self.hits[source, b]) / (PRIOR_TRIALS + self.trials[source, b]))

    def local(self, seq=None, source: int = 0) -> float:
        """How this sequence's recent drafts from this source fared against their calibrated
        predictions (1: as predicted; LOCAL_PRIOR pseudo-nodes keep a single miss from
        silencing a draft)."""
        st = self.state_of(seq)
        return min(LOCAL_MAX, (st.local_hits[source] + LOCAL_PRIOR) / (st.local_expected[source] + LOCAL_PRIOR))

    def predict(self, conf: float, seq=None, source: int = 0) -> float:
        return min(0.99, self.calibrated(conf, source) * self.local(seq, source))

    def observe(self, conf: list[float], parents: list[int], path: list[int], seq=None,
                sources: list[int] | None = None) -> None:
        """One verified draft of sequence ``seq``: node j was *tried* if its parent was
        accepted (or it hangs off the root), and accepted if it is on the accepted path;
        ``sources``: each node's (None: all 0)."""
        st = self.state_of(seq)
        on_path = set(path)
        for j, (c, p) in enumerate(zip(conf, parents)):
            if p < 0 or p in on_path:
                src = sources[j] if sources is not None else 0
                st.local_hits[src] = LOCAL_DECAY * st.local_hits[src] + (j in on_path)
                st.local_expected[src] = LOCAL_DECAY * st.local_expected[src] + self.calibrated(c, src)
                b = self._bin(c)
                self.hits[src] *= DECAY
                self.trials[src] *= DECAY
                self.hits[src, b] += j in on_path
                self.trials[src, b] += 1.0
        self._first(st, 1.0 if path else 0.0)
        st.backoff = 1.0 if path else min(2 * st.backoff, MAX_BACKOFF)

    def _first(self, st: PromptState, hit: float) -> None:
        for owner in (st, self):
            owner.first_hits = FIRST_DECAY * owner.first_hits + hit
            owner.first_trials = FIRST_DECAY * owner.first_trials + 1.0

    def observe_unverified(self, p: float, seq=None) -> None:
        """A first draft token the plan found not worth its row (``p``: its predicted
        acceptance) counts as a trial worth ``p``: otherwise a head whose drafts keep being
        dropped is asked again every step, and each ask costs a catch-up and a draft forward
        (translation with the Qwen EAGLE-3 head: 20 of 32 asks dropped, each ~1.3 ms)."""
        st = self.state_of(seq)
        self._first(st, p)
        st.backoff = min(2 * st.backoff, MAX_BACKOFF)

    def new_prompt(self, seq=None) -> None:
        """Sequence ``seq`` joined: new content. It starts from the pooled first-token
        evidence, worth at most the prior (a head silenced by a translation request is asked
        again on the next request at once), with no backoff and no scaling of its own."""
        self.prompts[seq] = self._seeded()

    def forget(self, seq) -> None:
        self.prompts.pop(seq, None)

    def first(self, seq=None) -> float:
        """Predicted acceptance of sequence ``seq``'s next first draft token."""
        st = self.state_of(seq)
        return (self.first_prior * FIRST_PRIOR_TRIALS + st.first_hits) / (FIRST_PRIOR_TRIALS + st.first_trials)

    def relax(self, seq=None) -> None:
        """A plain step of sequence ``seq``: its first-token evidence fades (slower after
        failed retries), and so does its scaling: the next drafts are a retry."""
        st = self.state_of(seq)
        decay = FIRST_PLAIN_DECAY ** (1 / st.backoff)
        st.first_hits *= decay
        st.first_trials *= decay
        st.local_hits *= decay
        st.local_expected *= decay

    def state(self) -> dict:
        return {"hits": self.hits.tolist(), "trials": self.trials.tolist(),
                "first_hits": self.first_hits, "first_trials": self.first_trials}

    def restore(self, state: dict | None) -> "AcceptanceModel":
        """Start from what an earlier process learned with this draft and target (the
        calibration is theirs more than the prompt's), each bin worth at most
        RESTORED_TRIALS observations and the first-token counts halved, so that this
        process's prompt -- n-gram matches on a Q&A prompt are far worse than on a summary --
        moves them within a few dozen nodes. A malformed state is ignored; one saved with a
        single curve ([BINS]) is source 0's."""
        try:
            hits, trials = np.asarray(state["hits"], float), np.asarray(state["trials"], float)
            if hits.shape == trials.shape == (BINS,):
                hits, trials = (np.stack([a] + [np.zeros(BINS)] * (SOURCES - 1)) for a in (hits, trials))
            if hits.shape == trials.shape == (SOURCES, BINS) and (0 <= hits).all() and (hits <= trials).all():
                keep = np.minimum(1.0, RESTORED_TRIALS / np.maximum(trials, 1e-9))
                self.hits, self.trials = hits * keep, trials * keep
                self.first_hits = 0.5 * float(state["first_hits"])
                self.first_trials = 0.5 * float(state["first_trials"])
                self.prompts.clear()
        except (TypeError, KeyError, ValueError):
            pass
        return self


class StepPlan:
    """The drafting budget of one decode step for ``batch`` sequences (see module doc)."""

    def __init__(self, policy: "Policy", batch: int, seq_ids: list | None = None):
        self.policy, self.cost, self.batch = policy, policy.cost, batch
        self.seq_ids = list(seq_ids) if seq_ids is not None else [None] * batch  # batch order
        self.fixed = policy.fixed_k is not None
        self.off = not self.fixed and policy.guard_off(batch)
        self.sunk = 0.0  # seconds of draft forwards run this step
        self.priced = 0.0  # what the table priced the forwards this plan allowed at (draft_overhead left out)
        self.probs: list[float] = []  # path probability of every node drafted so far
        self.plain_rate = batch / policy.plain_step_time(batch)

    def p(self, conf: float, seq=None, source: int = 0) -> float:
        """Predicted acceptance of a token that sequence ``seq`` (its id) drafted with this
        confidence, from this source."""
        return self.policy.acceptance.predict(conf, seq, source)

    def first(self, seq=None) -> float:
        """Predicted acceptance of sequence ``seq``'s next first draft token."""
        return self.policy.acceptance.first(seq)

    def _best(self, probs: list[float], extra: float = 0.0) -> tuple[float, float, int]:
        """(expected tokens, seconds, rows) of the best node set among ``probs``: nodes in
        order of P while each pays for its row at the step's rate (or plain decoding's)."""
        e, rows = float(self.batch), self.batch
        t = self.sunk + extra + self.policy.host + self.cost.target(rows)
        for p in sorted(probs, reverse=True):
            dt = self.cost.marginal(rows)
            if p / dt <= max(e / t, self.plain_rate):
                break
            e, rows, t = e + p, rows + 1, t + dt
        return e, t, rows

    def should_draft(self, rows: int, expansions: list[tuple[float, float]], catch_up_tokens: int = 0,
                     free: bool = False) -> bool:
        """Whether to run a draft forward over ``rows`` rows that extends these nodes:
        (P of the node, predicted acceptance of its best child -- for a sequence's first
        token, ``first(seq)``). True if some number of such forwards (up to LOOKAHEAD) raises the step's
        expected rate above both what it has and plain decoding. ``catch_up_tokens``: rows the
        draft must build first, inside the first forward (a prompt, a plain stretch); the
        decision charges CATCH_UP_AMORTIZED of them, what the plan prices is all of them.
        ``free``: nodes that cost no draft forward (an index's)."""
        if self.fixed:
            return True
        if self.off or not expansions:
            return False
        e0, t0, _ = self._best(self.probs)
        bar = max(e0 / t0, self.plain_rate)
        probs = list(self.probs)
        extra_seconds = CATCH_UP_AMORTIZED * self.cost.catch_up(catch_up_tokens)
        runs = list(expansions)
        for j in range(1, LOOKAHEAD + 1):
            runs = [(p * a, a) for p, a in runs]
            probs.extend(p for p, _ in runs if p >= 1e-3)
            e, t, _ = self._best(probs, extra_seconds + (0.0 if free else j * self.cost.draft(rows)))
            if e / t > bar * (1 + 1e-9):
                self.priced += (self.cost.catch_up(catch_up_tokens) + self.cost.draft(rows)) / self.cost.draft_overhead
                return True
        return False

    def drafted(self, probs: list[float]) -> None:
        self.probs.extend(probs)

    def spent(self, seconds: float) -> None:
        """A draft forward (and the proposer's work around it) took this long."""
        self.sunk += seconds

    def select(self, drafts: list[Draft]) -> list[Draft]:
        """Each draft cut to the nodes worth verifying (parents before children)."""
        if self.fixed or all(not len(d) for d in drafts):
            return drafts
        if self.off:
            return [Draft() for _ in drafts]
        nodes = []  # (P, depth, sequence, node): every sequence's nodes compete for the batch's rows
        for i, d in enumerate(drafts):
            probs, depths = node_probs(d, lambda c, src: self.p(c, self.seq_ids[i], src))
            nodes.extend((probs[j], depths[j], i, j) for j in range(len(d)))
        nodes.sort(key=lambda n: (-n[0], n[1]))
        keep: list[set[int]] = [set() for _ in drafts]
        e, t, rows = self._best([])
        for p, _, i, j in nodes:
            parent = drafts[i].parent_list()[j]
            dt = self.cost.marginal(rows)
            if p / dt <= max(e / t, self.plain_rate):
                break
            if parent >= 0 and parent not in keep[i]:
                continue
            keep[i].add(j)
            e, rows, t = e + p, rows + 1, t + dt
        for i, d in enumerate(drafts):
            if len(d) and not keep[i]:  # drafted, none worth a row: evidence for the first-token estimate
                self.policy.acceptance.observe_unverified(max(p for p, depth, s, _ in nodes if s == i and depth == 1),
                                                          self.seq_ids[i])
        return [d.subset(sorted(k)) for d, k in zip(drafts, keep)]


class Policy:
    """The draft-length policy of one engine: plans per step, learns from each verdict,
    guards realized throughput per batch size."""

    def __init__(self, cost: CostModel, acceptance: AcceptanceModel, fixed_k: int | None = None):
        self.cost, self.acceptance, self.fixed_k = cost, acceptance, fixed_k
        self.host = 0.0  # seconds of a step outside its forwards (sampling, bookkeeping)
        self.steps = 0
        self.clock = 0.0  # seconds of decode steps observed: the guard's cooldowns end on it too
        self.speedups: dict[int, list[float]] = {}  # batch -> realized speedups of drafting steps
        self.off_until: dict[int, tuple[int, float]] = {}  # batch -> (step, clock) drafting resumes at
        self.cooldown: dict[int, int] = {}
        self._hopeless: dict[tuple[int, int], bool] = {}
        # batch -> [decayed seconds saved, decayed per-sequence tokens] of drafting steps
        self.saved: dict[int, list[float]] = {}
        self.outputs = [0.0, 0.0]  # decayed sum of finished requests' output tokens, and their count
        try:
            for b, (sec, tok) in (cost.acceptance or {}).get("saved", {}).items():
                keep = min(1.0, SAVED_MIN / max(float(tok), 1e-9))
                self.saved[int(b)] = [float(sec) * keep, float(tok) * keep]
        except (AttributeError, TypeError, ValueError):
            self.saved = {}

    def plan(self, batch: int, seq_ids: list | None = None) -> StepPlan:
        return StepPlan(self, batch, seq_ids)

    def hopeless(self, batch: int, free_drafts: bool = False) -> bool:
        """Not even drafts accepted every time could pay at this batch size (a draft slower
        than its target, verify rows that cost whole steps): the step skips the proposer.
        ``free_drafts``: the proposer has drafts that cost no forward (an index), so only the
        verify rows' cost can make it hopeless. Cached per batch size while the pace stays
        within 5%."""
        if self.fixed_k is not None:
            return False
        key = (batch, round(math.log(max(self.cost.pace, 1e-9)) * 20), free_drafts)
        if key not in self._hopeless:
            plan = self.plan(batch)
            plan.off = False
            self._hopeless[key] = not plan.should_draft(batch, [(1.0, 1.0)] * batch, free=free_drafts)
        return self._hopeless[key]

    def save(self) -> None:
        """Keep what was learned (costs and calibration) for the next process."""
        self.cost.acceptance = {**self.acceptance.state(), "saved": {str(b): v for b, v in self.saved.items()}}
        self.cost.save()

    def plain_step_time(self, batch: int) -> float:
        return self.host + self.cost.target(batch)

    def guard_off(self, batch: int) -> bool:
        step, clock = self.off_until.get(batch, (0, 0.0))
        return self.steps < step and self.clock < clock

    def expects_drafting(self, seq_ids: list) -> bool:
        """Would a step of these sequences draft now? (A draft model prefills new prompts
        only then: at batch sizes where drafting does not pay, that prefill is pure loss.)"""
        batch = len(seq_ids)
        if self.hopeless(batch):
            return False
        return self.plan(batch, seq_ids).should_draft(batch, [(1.0, self.acceptance.first(s)) for s in seq_ids])

    def saving_per_token(self, batch: int, seq=None) -> float:
        """Seconds per output token of a sequence that drafting is expected to save at this
        batch size: what drafting steps realized here (``saved``), once known; before that the
        plan's own costs -- the best chain, each token accepted with ``seq``'s first-token
        estimate, against a plain step (0 when no chain beats it). The model alone is
        cautious: deeper tokens are accepted more often than first ones (Qwen2.5-Coder-1.5B
        with its 0.5B draft on Zen 3: 5-6 ms predicted, 8-11 ms realized)."""
        sec, tok = self.saved.get(batch, (0.0, 0.0))
        if tok >= SAVED_MIN:
            return max(sec / tok, 0.0)
        a, plain = self.acceptance.first(seq), self.plain_step_time(batch)
        best, tokens = plain, 1.0
        for depth in range(1, MAX_DEPTH + 1):
            tokens += a ** depth
            step = self.host + self.cost.target(batch * (depth + 1)) + depth * self.cost.draft(batch)
            best = min(best, step / tokens)
        return plain - best

    def observe_output(self, emitted: int) -> None:
        """A request finished after emitting this many tokens."""
        self.outputs = [OUTPUT_DECAY * self.outputs[0] + emitted, OUTPUT_DECAY * self.outputs[1] + 1.0]

    def expected_output(self, budget: int, emitted: int) -> float:
        """Tokens a request with ``budget`` tokens left, ``emitted`` so far, is expected to
        emit still: as many as finished requests emitted on average (its budget before any
        finished), at most its budget."""
        if self.outputs[1] < 1.0:
            return float(budget)
        return float(min(budget, max(self.outputs[0] / self.outputs[1] - emitted, 1.0)))

    def draft_prefill_pays(self, prompt_tokens: int, output_tokens: float, batch: int, seq=None) -> bool:
        """Whether a draft model should prefill a new prompt of ``prompt_tokens`` for a sequence
        expected to emit ``output_tokens`` more (``expected_output``): what drafting is expected to save over them must
        exceed what the draft's prefill costs. A long document with a short answer is decoded
        plainly (Qwen2.5-Coder-1.5B with a 0.5B draft, 683-token prompt, 9-token answer: 12.0-
        12.8 s plain, 13.5-16.7 s with the draft prefilling). Proposers without a prefill cost
        (n-gram, heads) always pay. (Prefilling only the prompt's tail was tried: on three
        700-850-token documents the draft, lacking the document, was accepted 0-57% and the
        requests took 0.83-0.96x as long as plain.)"""
        cost = self.cost.catch_up(prompt_tokens)
        return cost <= 0.0 or self.fixed_k is not None or output_tokens * self.saving_per_token(batch, seq) > cost

    def observe(self, step, plan: StepPlan | None = None) -> None:
        """Everything one decode step (a metrics.StepRecord) teaches: the target forward's
        cost, what its proposing cost against what ``plan`` (the step's) priced it at, the
        calibration from every speculative sequence's verdict, and the guard."""
        self.cost.observe_target(step.rows, step.target_seconds)
        if plan is not None and step.draft_forwards:
            self.cost.observe_draft(step.draft_seconds, plan.priced)
        for seq, d, v, on in zip(step.seq_ids, step.drafts, step.verdicts, step.speculative):
            if not on:
                continue
            if len(d):
                self.observe_verdict(d, v.path, seq)
            else:  # a plain step for this sequence: its evidence fades, drafting is retried
                self.acceptance.relax(seq)
        if any(step.speculative):
            self.observe_step(step.batch, step.drafted, sum(step.emitted), step.seconds, step.forward_seconds)

    def observe_verdict(self, draft: Draft, path: list[int], seq=None) -> None:
        if len(draft) and draft.conf is not None:
            self.acceptance.observe(draft.conf, draft.parent_list(), path, seq, draft.source)

    def observe_step(self, batch: int, drafted: bool, tokens: int, seconds: float, forward_seconds: float) -> None:
        """A whole decode step: ``forward_seconds`` of it in target and draft forwards."""
        self.steps += 1
        self.clock += seconds
        if self.steps % SAVE_EVERY == 0:
            self.save()
        self.host += 0.1 * (max(seconds - forward_seconds, 0.0) - self.host)
        if not drafted or self.fixed_k is not None:
            if batch in self.saved:  # the evidence fades: a saving measured low is tested again
                self.saved[batch] = [SAVED_DECAY * v for v in self.saved[batch]]
            return
        saved = self.saved.setdefault(batch, [0.0, 0.0])  # a plain engine: tokens / batch steps
        saved[0] = SAVED_DECAY * saved[0] + tokens / batch * self.plain_step_time(batch) - seconds
        saved[1] = SAVED_DECAY * saved[1] + tokens / batch
        window = self.speedups.setdefault(batch, [])
        window.append(tokens * self.plain_step_time(batch) / (batch * max(seconds, 1e-9)))
        del window[:-GUARD_WINDOW]
        if len(window) < GUARD_MIN:
            return
        mean = sum(window) / len(window)
        sd = math.sqrt(sum((x - mean) ** 2 for x in window) / (len(window) - 1))
        if mean + 2.0 * sd / math.sqrt(len(window)) < 1.0:  # measurably slower than plain
            wait = self.cooldown.get(batch, COOLDOWN_MIN // 2) * 2
            self.cooldown[batch] = min(wait, COOLDOWN_MAX)
            self.off_until[batch] = (self.steps + self.cooldown[batch], self.clock + COOLDOWN_SECONDS)
            window.clear()
        elif len(window) >= GUARD_WINDOW and mean >= 1.0:
            self.cooldown.pop(batch, None)  # drafting pays again: a later trip starts short


def node_probs(draft: Draft, predict: Callable[[float, int], float]) -> tuple[list[float], list[int]]:
    """(path probability, depth) of every node of a draft, from its per-node confidences
    (``predict(conf, source)``: a node's acceptance)."""
    probs: list[float] = []
    depths: list[int] = []
    conf = draft.conf if draft.conf is not None else [1.0] * len(draft)
    sources = draft.source if draft.source is not None else [0] * len(draft)
    for j, p in enumerate(draft.parent_list()):
        a = predict(conf[j], sources[j])
        probs.append(a if p < 0 else probs[p] * a)
        depths.append(1 if p < 0 else depths[p] + 1)
    return probs, depths
