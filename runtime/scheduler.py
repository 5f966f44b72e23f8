"""Continuous batching over one Engine: an engine thread admits, prefills and steps requests.

The thread is the only code that touches the Engine (TVM calls, KV pages, proposer state),
so no lock guards the model; other threads only submit and cancel through a small
locked inbox. Each iteration of the loop:

1. drops cancelled requests (their KV pages go back to the pool at once);
2. admits waiting requests in arrival order while the batch has room and the KV cache has
   the pages of their whole prompt plus one page of growth per running sequence
   (admission control by pages needed; a preempted request waits at the front);
3. prefills admitted prompts in chunks of at most ``prefill_tokens_per_step`` tokens in
   all, so a long prompt delays the running batch by one bounded chunk per step rather
   than by its whole prefill (with nothing running, a whole library chunk is used);
4. makes sure every running sequence has a page for its next token, preempting the most
   recently admitted sequences otherwise (their pages are freed; they are re-prefilled
   from their tokens so far when pages return: prefill and decode give bit-identical
   logits, so the output is exactly what it would have been);
5. runs ``Engine.step`` once for all running sequences: with speculation on, one draft
   and one target forward for the whole batch, the draft length chosen by the adaptive
   policy from the measured costs of its row counts (runtime/adaptive.py).

Every sequence's length is capped at the KV capacity when it is submitted, so a sequence
alone always fits and preemption cannot loop. Results are delivered through a callback
invoked on the engine thread; the HTTP layer turns it into asyncio queue events.
"""
from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from .engine import Engine
from .sequence import GenerationError, Sequence
from .contract import KV_PAGE_SIZE as PAGE
from .kv_cache import KVCacheFull
from .sampling import SamplingParams

log = logging.getLogger("speccompile.scheduler")


class QueueFull(RuntimeError):
    """More requests are waiting than the scheduler accepts."""


@dataclass
class Event:
    """What the engine thread reports to a request: new tokens, the end, or an error."""

    new_tokens: int = 0
    finished: bool = False
    error: str | None = None
    time: float = field(default_factory=time.perf_counter)
    text: str = ""  # the whole output text so far (stop strings already cut)
    completion_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens a kept sequence's KV held (runtime/prefix_cache.py)
    finish_reason: str | None = None
    logprobs: list | None = None  # entries of the tokens new since the last event (GenerationResult.logprobs)


@dataclass
class Request:
    """One submitted generation. ``seq`` belongs to the engine thread; read ``seq.result``
    from other threads only after the finishing event."""

    id: int
    seq: Sequence
    callback: Callable[[Request, Event], None]
    arrival: float = field(default_factory=time.perf_counter)
    first_token: float | None = None
    cancelled: bool = False
    preemptions: int = 0
    admitted_at: int = 0  # admission order, for choosing preemption victims
    logprobs_sent: int = 0  # logprob entries already delivered

    @property
    def result(self):
        return self.seq.result


class Scheduler:
    def __init__(self, engine: Engine, max_num_sequence: int | None = None, prefill_tokens_per_step: int = 256,
                 max_queue: int = 1024):
        self.engine = engine
        self.max_num_sequence = max_num_sequence or engine.max_num_sequence
        if self.max_num_sequence > engine.max_num_sequence:
            raise GenerationError(f"max_num_sequence {self.max_num_sequence} exceeds the engine's "
                                  f"{engine.max_num_sequence}")
        if prefill_tokens_per_step <= 0:
            raise GenerationError("prefill_tokens_per_step must be positive")
        self.prefill_tokens_per_step = prefill_tokens_per_step
        self.max_queue = max_queue
        self.capacity_tokens = engine.kv.num_pages * PAGE
        self._inbox: list[Request] = []
        self._cancels: list[Request] = []
        self._wake = threading.Condition()
        self._ids = itertools.count()
        self._admissions = itertools.count()
        self.waiting: deque[Request] = deque()
        self.prefilling: list[Request] = []
        self.running: list[Request] = []
        self.preemptions = 0
        self.steps = 0
        self.engine_errors = 0
        self._stop = False
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------- any thread
    def submit(self, prompt_ids: list[int], max_tokens: int | None, sampling: SamplingParams,
               stop: list[str] | None, callback: Callable[[Request, Event], None],
               ignore_eos: bool = False, speculative: bool = True, grammar=None,
               top_logprobs: int | None = None, tenant: str | None = None,
               prediction: list[int] | None = None, prefill_from: Request | None = None) -> Request:
        """Validate and enqueue; raises GenerationError for a request that can never run
        (empty or over-long prompt, bad token ids, a prompt larger than the KV cache) and
        QueueFull when too many requests wait. ``prefill_from``: an earlier request of the
        same prompt (another choice of it) whose prefill this one copies (runtime/shared_prefill.py)."""
        limit = min(self.engine.context_window, self.capacity_tokens)
        budget = max_tokens if max_tokens is not None else max(1, limit - len(prompt_ids))
        seq = self.engine.new_sequence(prompt_ids, budget, sampling, stop, ignore_eos, max_len=self.capacity_tokens,
                                       speculative=speculative, grammar=grammar, top_logprobs=top_logprobs,
                                       tenant=tenant, prediction=prediction)
        if prefill_from is not None and prefill_from.seq.history == seq.history:
            seq.prefill_from, prefill_from.seq.shares_prefill = prefill_from.seq, True
        req = Request(next(self._ids), seq, callback)
        with self._wake:
            if len(self._inbox) + len(self.waiting) >= self.max_queue:
                raise QueueFull(f"{self.max_queue} requests are already waiting")
            self._inbox.append(req)
            self._wake.notify()
        return req

    def cancel(self, req: Request) -> None:
        """Stop generating for this request and free its pages (client went away)."""
        with self._wake:
            req.cancelled = True
            self._cancels.append(req)
            self._wake.notify()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="speccompile-engine", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        with self._wake:
            self._stop = True
            self._wake.notify()
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def snapshot(self) -> dict:
        """Counts for /metrics and /health (plain ints, safe to read from any thread)."""
        kv = self.engine.kv
        free = kv.num_free_pages()
        return {"waiting": len(self.waiting) + len(self._inbox), "running": len(self.running),
                "prefilling": len(self.prefilling), "kv_pages_total": kv.num_pages,
                "kv_pages_free": free, "kv_pages_used": kv.num_pages - free, "kv_pages_kept": kv.recycled_pages,
                "preemptions": self.preemptions, "steps": self.steps, "engine_errors": self.engine_errors}

    # ------------------------------------------------------------ engine thread
    @property
    def idle(self) -> bool:
        """Nothing submitted, cancelled, waiting, prefilling or running."""
        return not (self._inbox or self._cancels or self.waiting or self.prefilling or self.running)

    def _loop(self) -> None:
        while True:
            with self._wake:
                while not self._stop and self.idle:
                    self._wake.wait()
                if self._stop:
                    break
            self.run_once()
        with self._wake:  # requests submitted after the last iteration are told too
            self.waiting.extend(self._inbox)
            self._inbox.clear()
        for req in list(self.waiting) + self.prefilling + self.running:
            self._finish(req, error="the server is shutting down")

    def run_once(self) -> None:
        """One iteration of the engine loop: take new submissions and cancellations, then
        drop, admit, prefill and step once. The engine thread calls it in a loop; tests call
        it directly (without ``start``) to drive the scheduler step by step, deterministically."""
        with self._wake:
            self.waiting.extend(self._inbox)
            self._inbox.clear()
            cancels, self._cancels = self._cancels, []
        try:
            self._iteration(cancels)
        except Exception as err:  # the server must outlive any engine failure
            log.exception("engine step failed")
            self.engine_errors += 1
            for req in self.prefilling + self.running:
                self._finish(req, error=f"engine failure: {err}")

    def _iteration(self, cancels: list[Request]) -> None:
        for req in cancels:
            if req in self.waiting:
                self.waiting.remove(req)
            self._drop(req)
        self._admit()
        self._prefill()
        if not self.running:
            return
        self._make_room()
        if not self.running:
            return
        active = [r.seq for r in self.running]
        counts = [len(s.result.token_ids) for s in active]
        self.engine.step(active)
        self.steps += 1
        for req, n in zip(list(self.running), counts):
            self._report(req, len(req.seq.result.token_ids) - n)

    def _admit(self) -> None:
        kv = self.engine.kv
        while self.waiting and len(self.prefilling) + len(self.running) < self.max_num_sequence:
            req = self.waiting[0]
            if req.cancelled:
                self.waiting.popleft()
                continue
            need = -(-(len(req.seq.history) + 1) // PAGE)
            reserved = sum(-(-len(r.seq.to_prefill) // PAGE) for r in self.prefilling) + len(self.running)
            if need + reserved > kv.num_free_pages() and (self.prefilling or self.running):
                break  # wait for pages to come back (alone, any request fits: its length is capped)
            self.waiting.popleft()
            self.engine.attach(req.seq)
            req.admitted_at = next(self._admissions)
            self.prefilling.append(req)

    def _prefill(self) -> None:
        if not self.prefilling:
            return
        budget = self.prefill_tokens_per_step if self.running else self.engine.model.prefill_chunk_size
        counts = {r.id: len(r.seq.result.token_ids) for r in self.prefilling}
        try:
            done = self.engine.prefill([r.seq for r in self.prefilling], budget)
        except KVCacheFull:
            # running sequences grew into the pages this prompt was admitted against:
            # give its pages back and let it wait at the front of the queue
            self._preempt(max(self.prefilling, key=lambda r: r.admitted_at))
            return
        for req in [r for r in self.prefilling if r.seq in done]:
            self.prefilling.remove(req)
            self.running.append(req)
            self._report(req, len(req.seq.result.token_ids) - counts[req.id])

    def _make_room(self) -> None:
        """Free pages until every running sequence can write its next token."""
        kv = self.engine.kv
        while self.running:
            need = sum(kv.pages_needed(r.seq.seq_id, 1) for r in self.running)
            if need <= kv.num_free_pages():
                return
            self._preempt(max(self.prefilling + self.running, key=lambda r: r.admitted_at))

    def _preempt(self, req: Request) -> None:
        self.engine.detach(req.seq)
        if req in self.prefilling:
            self.prefilling.remove(req)
        if req in self.running:
            self.running.remove(req)
        req.preemptions += 1
        self.preemptions += 1
        self.waiting.appendleft(req)

    def _report(self, req: Request, new_tokens: int) -> None:
        seq = req.seq
        if req.first_token is None and (new_tokens or seq.done):
            req.first_token = time.perf_counter()
        if seq.done:
            self._finish(req, new_tokens=new_tokens)
        elif new_tokens:
            self._deliver(req, Event(new_tokens=new_tokens))

    def _finish(self, req: Request, new_tokens: int = 0, error: str | None = None) -> None:
        self.engine.detach(req.seq, keep=error is None)  # finished: kept for a prompt that starts the same way
        for group in (self.prefilling, self.running):
            if req in group:
                group.remove(req)
        if req in self.waiting:
            self.waiting.remove(req)
        if error is None and not req.seq.done:
            error = "generation stopped"
        self._deliver(req, Event(new_tokens=new_tokens, finished=True, error=error if not req.seq.done else None))

    def _drop(self, req: Request) -> None:
        """A cancelled request: free everything, tell nobody (the client is gone)."""
        self.engine.detach(req.seq)
        for group in (self.prefilling, self.running):
            if req in group:
                group.remove(req)

    def _deliver(self, req: Request, event: Event) -> None:
        if req.cancelled:
            return
        res = req.seq.result
        event.text, event.completion_tokens, event.finish_reason = res.text, len(res.token_ids), res.finish_reason
        event.cached_tokens = res.stats.cached_prompt_tokens
        if res.logprobs is not None:
            event.logprobs, req.logprobs_sent = res.logprobs[req.logprobs_sent:], len(res.logprobs)
        try:
            req.callback(req, event)
        except Exception:  # a broken consumer must not stop the engine
            log.exception("request %d: result callback failed", req.id)
