"""The continuous-batching scheduler (runtime/scheduler.py) over a fake engine.

No model, no socket, no sleep: ``FakeEngine`` implements the engine's per-step primitives
(``new_sequence``, ``attach``, ``prefill``, ``step``, ``detach``) over the real ``PagedKV``
bookkeeping (no tensor), and the tests call ``Scheduler.run_once`` -- one iteration of the
engine thread's loop -- themselves. The fake "model" predicts the next token from what its
KV cache holds plus the pending token, the way a real model only sees its cache: a
scheduler that stepped a sequence before its prefill ended, or resumed a preempted one
from the wrong tokens, would change the output (and the fake checks the cache against the
history before every step). With ``draft_length > 0`` a step verifies a chain of drafts,
some of them wrong, and emits several tokens, as speculative decoding does: the output
must be the same.
"""
from __future__ import annotations

import threading
from types import SimpleNamespace

import numpy as np
import pytest

from speccompile.runtime.kv_cache import PAGE, KVCacheFull, PagedKV
from speccompile.runtime.sampling import SamplingParams
from speccompile.runtime.scheduler import QueueFull, Scheduler
from speccompile.runtime.sequence import GenerationError, GenerationResult, Sequence
from speccompile.runtime.tokenizer import StreamDecoder

V = 26  # token t is the letter chr(97 + t)


class Letters:
    """A tokenizer stand-in for the real StreamDecoder: one letter per token."""

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(97 + i) for i in ids)


def predict(context: list[int]) -> int:
    """The fake model's next token after ``context`` (a function of the whole context)."""
    h = 7
    for t in context:
        h = (h * 131 + t + 1) % 1_000_003
    return h % V


def expected(prompt: list[int], n: int, eos: set[int] = frozenset()) -> list[int]:
    """What any correct schedule must emit: greedy continuation, stopping at EOS."""
    history, out = list(prompt), []
    for _ in range(n):
        tok = predict(history)
        if tok in eos:
            break
        out.append(tok)
        history.append(tok)
    return out


def prompt(seed: int, n: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, V, n).tolist()


class FakeEngine:
    """The engine's step primitives (same names and signatures) over a PagedKV without a
    tensor. ``cache[seq_id]`` is what the fake model "has seen": the tokens written into
    the sequence's KV rows, kept in step with the PagedKV's lengths."""

    def __init__(self, num_pages: int = 32, max_num_sequence: int = 8, context_window: int = 4096,
                 chunk: int = 64, draft_length: int = 0):
        self.kv = PagedKV(None, num_pages)
        self.model = SimpleNamespace(prefill_chunk_size=chunk)
        self.context_window = context_window
        self.max_num_sequence = max_num_sequence
        self.draft_length = draft_length
        self.stop_token_ids: set[int] = set()
        self.cache: dict[int, list[int]] = {}
        self.attached: list[int] = []  # seq ids in attach order (resumes included)
        self.prefills: list[tuple[int, list[tuple[int, int]]]] = []  # (budget, [(seq_id, tokens)])
        self.most_attached = 0
        self.steps = 0
        self.fail_at_step: int | None = None
        self._next = 0

    def new_sequence(self, prompt_ids, max_tokens, sampling=None, stop=None, ignore_eos=False, max_len=None,
                     speculative=True, grammar=None, top_logprobs=None, tenant=None, prediction=None) -> Sequence:
        if not prompt_ids or max_tokens <= 0:
            raise GenerationError("empty prompt or no tokens asked for")
        limit = min(self.context_window, max_len or self.context_window)
        if len(prompt_ids) >= limit:
            raise GenerationError(f"the prompt has {len(prompt_ids)} tokens but at most {limit - 1} fit")
        seq = Sequence(self._next, list(prompt_ids), min(max_tokens, limit - len(prompt_ids)),
                       sampling or SamplingParams(), np.random.default_rng(0), list(stop or []), ignore_eos,
                       GenerationResult(list(prompt_ids)), StreamDecoder(Letters()))
        seq.speculative = speculative
        self._next += 1
        return seq

    def attach(self, seq: Sequence) -> None:
        self.kv.add_sequence(seq.seq_id)
        self.cache[seq.seq_id] = []
        self.attached.append(seq.seq_id)
        self.most_attached = max(self.most_attached, len(self.kv.seqs))
        seq.to_prefill = list(seq.history if not seq.result.token_ids else seq.history[:-1])

    def detach(self, seq: Sequence, keep: bool = False) -> None:  # (no prefix cache here: freed either way)
        self.kv.remove_sequence(seq.seq_id)
        self.cache.pop(seq.seq_id, None)
        seq.to_prefill = []

    def prefill(self, seqs: list[Sequence], budget: int) -> list[Sequence]:
        budget = min(budget, self.model.prefill_chunk_size)
        batch, chunks = [], []
        for s in seqs:
            n = min(len(s.to_prefill), budget)
            if n:
                batch.append(s)
                chunks.append(s.to_prefill[:n])
                budget -= n
        if not batch:
            return []
        self.kv.plan_chain([s.seq_id for s in batch], [len(c) for c in chunks])  # KVCacheFull: nothing changed
        self.prefills.append((budget + sum(map(len, chunks)), [(s.seq_id, len(c)) for s, c in zip(batch, chunks)]))
        done = []
        for s, c in zip(batch, chunks):
            self.cache[s.seq_id] += c
            del s.to_prefill[: len(c)]
            if not s.to_prefill:
                done.append(s)
                if not s.result.token_ids:
                    s.emit([predict(self.cache[s.seq_id])], self.stop_token_ids)
        return done

    def step(self, active: list[Sequence]) -> None:
        self.steps += 1
        if self.steps == self.fail_at_step:
            raise RuntimeError("injected failure")
        for s in active:
            assert not s.done and not s.to_prefill, f"sequence {s.seq_id} stepped while prefilling or done"
            assert self.cache[s.seq_id] == s.history[:-1], f"sequence {s.seq_id}: the KV cache disagrees"
            assert self.kv.length(s.seq_id) == len(s.history) - 1
        drafts = [self._draft(s) for s in active]
        try:
            self.kv.plan_chain([s.seq_id for s in active], [len(d) + 1 for d in drafts])
        except KVCacheFull:  # as the engine does: verify no drafts when they do not fit
            drafts = [[] for _ in active]
            self.kv.plan_chain([s.seq_id for s in active], [1] * len(active))
        for s, d in zip(active, drafts):
            context = s.history[:]
            accepted = []
            for tok in d:  # greedy acceptance: the longest correct prefix, then the bonus
                if tok != predict(context):
                    break
                accepted.append(tok)
                context.append(tok)
            self.kv.popn(s.seq_id, len(d) - len(accepted))
            self.cache[s.seq_id] += [s.history[-1]] + accepted
            s.emit(accepted + [predict(context)], self.stop_token_ids)

    def _draft(self, s: Sequence) -> list[int]:
        """The true continuation with one wrong token at a position that varies per step."""
        context, out = s.history[:], []
        for _ in range(self.draft_length):
            out.append(predict(context))
            context.append(out[-1])
        wrong = (s.seq_id + len(s.history)) % (self.draft_length + 2)
        if wrong < len(out):
            out[wrong] = (out[wrong] + 1) % V
        return out


class Client:
    """Submits requests and records every event each one receives, in order."""

    def __init__(self, sched: Scheduler):
        self.sched = sched
        self.events: dict[int, list] = {}

    def submit(self, ids, max_tokens, stop=None, callback=None, **kw):
        def record(req, event):
            self.events[req.id].append(event)
            if callback is not None:
                callback(req, event)

        req = self.sched.submit(ids, max_tokens, SamplingParams(), stop, record, **kw)
        self.events[req.id] = []
        return req


def drain(sched: Scheduler, limit: int = 10_000) -> int:
    """Run iterations until the scheduler is idle; returns how many it took."""
    for n in range(limit):
        if sched.idle:
            return n
        sched.run_once()
    raise AssertionError("the scheduler never became idle")


def check_events(events: list, tokens: list[int], finish: str) -> None:
    """One request's events: token counts add up and grow, the text grows, and exactly one
    finishing event, the last, carries the whole output."""
    assert events and all(e.error is None for e in events), [e.error for e in events]
    assert [e.finished for e in events] == [False] * (len(events) - 1) + [True]
    counts = [e.completion_tokens for e in events]
    assert counts == sorted(counts) and sum(e.new_tokens for e in events) == counts[-1] == len(tokens)
    assert all(e.new_tokens > 0 for e in events[:-1])
    assert all(b.text.startswith(a.text) for a, b in zip(events, events[1:]))
    assert events[-1].finish_reason == finish


def free_everything(engine: FakeEngine) -> bool:
    return engine.kv.num_free_pages() == engine.kv.num_pages and not engine.kv.seqs


# ------------------------------------------------------------------ outputs
@pytest.mark.parametrize("draft_length", [0, 3])
def test_batched_outputs_equal_solo_outputs_with_events_in_order(draft_length):
    eng = FakeEngine(draft_length=draft_length)
    sched = Scheduler(eng, max_num_sequence=4, prefill_tokens_per_step=32)
    client = Client(sched)
    jobs = [(prompt(i, 5 + 13 * i), 10 + 7 * i) for i in range(6)]
    reqs = [client.submit(p, n) for p, n in jobs]
    drain(sched)
    for req, (p, n) in zip(reqs, jobs):
        assert req.result.token_ids == expected(p, n)
        check_events(client.events[req.id], req.result.token_ids, "length")
        assert client.events[req.id][-1].text == Letters().decode(expected(p, n))
    if draft_length:  # several tokens in one event: counted, not one per event
        assert max(e.new_tokens for ev in client.events.values() for e in ev) > 1
    assert free_everything(eng) and sched.engine_errors == 0 and sched.preemptions == 0


def test_stop_string_and_eos_end_a_request_with_finish_reason_stop():
    eng = FakeEngine(draft_length=2)
    sched = Scheduler(eng, prefill_tokens_per_step=64)
    client = Client(sched)
    p = prompt(1, 9)
    full = Letters().decode(expected(p, 40))
    stop = full[10:12]
    cut = full.index(stop)
    a = client.submit(p, 40, stop=[stop])
    drain(sched)
    assert a.result.text == full[:cut] and a.result.finish_reason == "stop"
    check_events(client.events[a.id], a.result.token_ids, "stop")
    assert client.events[a.id][-1].text == full[:cut]
    eos = expected(p, 40)[7]
    eng.stop_token_ids = {eos}
    b = client.submit(p, 40)
    drain(sched)
    assert b.result.token_ids == expected(p, 40, {eos}) and b.result.finish_reason == "stop"
    check_events(client.events[b.id], b.result.token_ids, "stop")


# ---------------------------------------------------------------- admission
def test_admission_in_arrival_order_up_to_max_num_sequence():
    eng = FakeEngine()
    sched = Scheduler(eng, max_num_sequence=2)
    client = Client(sched)
    reqs = [client.submit(prompt(i, 6), 3 + 4 * i) for i in range(5)]
    sched.run_once()
    assert [r.id for r in sched.prefilling + sched.running] == [0, 1]
    assert [r.id for r in sched.waiting] == [2, 3, 4]
    assert sched.snapshot()["waiting"] == 3 and sched.snapshot()["running"] == 2
    drain(sched)
    assert eng.attached == [r.seq.seq_id for r in reqs]  # first come, first admitted
    assert eng.most_attached == 2
    assert all(r.result.token_ids == expected(prompt(i, 6), 3 + 4 * i) for i, r in enumerate(reqs))
    with pytest.raises(GenerationError, match="exceeds"):
        Scheduler(eng, max_num_sequence=9)
    with pytest.raises(GenerationError, match="positive"):
        Scheduler(eng, prefill_tokens_per_step=0)


def test_long_prompt_is_prefilled_in_bounded_chunks_while_the_batch_decodes():
    eng = FakeEngine(chunk=64)
    sched = Scheduler(eng, prefill_tokens_per_step=16)
    client = Client(sched)
    a = client.submit(prompt(0, 10), 100)
    sched.run_once()  # nothing running yet: a whole library chunk is allowed
    assert eng.prefills == [(64, [(a.seq.seq_id, 10)])] and sched.running == [a]
    b = client.submit(prompt(1, 100), 5)
    tokens_before = len(a.result.token_ids)
    iterations = 0
    while b not in sched.running:
        sched.run_once()
        iterations += 1
        budget, chunks = eng.prefills[-1]
        assert budget == 16 and sum(n for _, n in chunks) <= 16
    assert iterations == -(-100 // 16)
    assert len(a.result.token_ids) - tokens_before >= iterations  # a decoded at every one of them
    drain(sched)
    assert b.result.token_ids == expected(prompt(1, 100), 5) and a.result.token_ids == expected(prompt(0, 10), 100)
    c = client.submit(prompt(2, 100), 3)  # alone again: library-sized chunks
    drain(sched)
    assert [n for _, chunks in eng.prefills[-2:] for _, n in chunks] == [64, 36]
    assert c.result.token_ids == expected(prompt(2, 100), 3)


def test_queue_full_is_refused_until_requests_are_admitted():
    eng = FakeEngine()
    sched = Scheduler(eng, max_queue=2)
    client = Client(sched)
    client.submit(prompt(0, 4), 2)
    client.submit(prompt(1, 4), 2)
    with pytest.raises(QueueFull):
        client.submit(prompt(2, 4), 2)
    assert sched.snapshot()["waiting"] == 2
    sched.run_once()  # both admitted: the queue has room again
    late = client.submit(prompt(2, 4), 2)
    drain(sched)
    assert late.result.token_ids == expected(prompt(2, 4), 2)


def test_a_request_that_can_never_fit_is_refused_and_one_that_fits_alone_runs():
    eng = FakeEngine(num_pages=4)  # 64 tokens of KV, a far larger context window
    sched = Scheduler(eng)
    client = Client(sched)
    with pytest.raises(GenerationError, match="at most 63 fit"):
        client.submit(prompt(0, 4 * PAGE), 8)
    assert sched.idle
    # prompt + max_tokens beyond the KV capacity: capped, so it can run alone to the end
    big = client.submit(prompt(1, 20), 500)
    none_given = client.submit(prompt(2, 60), None)
    drain(sched)
    assert big.result.token_ids == expected(prompt(1, 20), 44) and big.result.finish_reason == "length"
    assert none_given.result.token_ids == expected(prompt(2, 60), 4)
    assert free_everything(eng)


# --------------------------------------------------------------- preemption
@pytest.mark.parametrize("draft_length", [0, 3])
def test_preempted_requests_resume_to_the_same_output(draft_length):
    eng = FakeEngine(num_pages=8, draft_length=draft_length)  # 128 tokens for 4 x (20 + 40)
    sched = Scheduler(eng, max_num_sequence=4, prefill_tokens_per_step=32)
    client = Client(sched)
    jobs = [(prompt(10 + i, 20), 40) for i in range(4)]
    reqs = [client.submit(p, n) for p, n in jobs]
    drain(sched)
    assert sched.preemptions > 0 and sum(r.preemptions for r in reqs) == sched.preemptions
    for req, (p, n) in zip(reqs, jobs):
        assert req.result.token_ids == expected(p, n)
        check_events(client.events[req.id], req.result.token_ids, "length")
    assert free_everything(eng) and sched.engine_errors == 0


def test_a_prompt_whose_pages_were_taken_waits_at_the_front_and_resumes():
    """Running sequences can grow into the pages a prompt was admitted against; its next
    prefill chunk then finds the cache full: it gives its pages back and waits first in line.
    (The pages are taken here by a foreign sequence, standing in for that growth.)"""
    eng = FakeEngine(num_pages=6)
    sched = Scheduler(eng, prefill_tokens_per_step=16)
    client = Client(sched)
    a = client.submit(prompt(0, 10), 30)
    sched.run_once()
    b = client.submit(prompt(1, 60), 5)
    c = client.submit(prompt(2, 4), 5)
    sched.run_once()
    assert sched.prefilling == [b] and eng.kv.length(b.seq.seq_id) == 16
    eng.kv.add_sequence(-1)
    eng.kv.plan_chain([-1], [eng.kv.num_free_pages() * PAGE])  # every free page
    sched.run_once()
    assert b.preemptions == 1 and b.seq.seq_id not in eng.kv.seqs and list(sched.waiting)[:2] == [b, c]
    sched.run_once()
    assert sched.waiting[0] is b  # still no room: nobody overtakes it
    eng.kv.remove_sequence(-1)
    drain(sched)
    assert a.result.token_ids == expected(prompt(0, 10), 30)
    assert b.result.token_ids == expected(prompt(1, 60), 5)
    assert c.result.token_ids == expected(prompt(2, 4), 5)
    assert eng.attached.index(b.seq.seq_id, 2) < eng.attached.index(c.seq.seq_id)
    assert free_everything(eng)


# ------------------------------------------------------------ cancellation
def test_cancel_frees_pages_and_silences_the_request():
    eng = FakeEngine()
    sched = Scheduler(eng, max_num_sequence=2, prefill_tokens_per_step=8)
    client = Client(sched)
    running = client.submit(prompt(0, 10), 1000)
    prefilling = client.submit(prompt(1, 200), 10)
    waiting = client.submit(prompt(2, 10), 10)
    for _ in range(3):
        sched.run_once()
    assert sched.running == [running] and sched.prefilling == [prefilling] and list(sched.waiting) == [waiting]
    assert eng.kv.num_free_pages() < eng.kv.num_pages
    seen = {r.id: len(client.events[r.id]) for r in (running, prefilling, waiting)}
    for r in (running, prefilling, waiting):
        sched.cancel(r)
    sched.run_once()
    assert sched.idle and free_everything(eng)
    assert {r.id: len(client.events[r.id]) for r in (running, prefilling, waiting)} == seen  # nobody to tell
    assert waiting.seq.seq_id not in eng.attached
    after = client.submit(prompt(3, 10), 6)  # the freed pages serve the next request
    drain(sched)
    assert after.result.token_ids == expected(prompt(3, 10), 6)


# ------------------------------------------------------------------ faults
def test_an_engine_error_fails_its_requests_and_the_loop_goes_on():
    eng = FakeEngine()
    eng.fail_at_step = 3
    sched = Scheduler(eng)
    client = Client(sched)
    victims = [client.submit(prompt(i, 8), 50) for i in range(2)]
    drain(sched)
    assert sched.engine_errors == 1 and free_everything(eng)
    for r in victims:
        events = client.events[r.id]
        assert [e.finished for e in events].count(True) == 1 and events[-1].finished
        assert events[-1].error == "engine failure: injected failure"
    survivor = client.submit(prompt(5, 8), 12)
    drain(sched)
    assert survivor.result.token_ids == expected(prompt(5, 8), 12)
    check_events(client.events[survivor.id], survivor.result.token_ids, "length")


def test_a_failing_callback_does_not_stop_the_others():
    eng = FakeEngine()
    sched = Scheduler(eng)
    client = Client(sched)

    def broken(req, event):
        raise ValueError("consumer bug")

    bad = client.submit(prompt(0, 8), 10, callback=broken)
    good = client.submit(prompt(1, 8), 10)
    drain(sched)
    assert sched.engine_errors == 0 and bad.result.token_ids == expected(prompt(0, 8), 10)
    check_events(client.events[good.id], good.result.token_ids, "length")


# ------------------------------------------------------------ engine thread
def test_engine_thread_serves_requests_and_shutdown_tells_everyone():
    """The only threaded test: the engine thread runs the same iterations, and at shutdown
    every request it holds -- running, or submitted while the last step ran and still in
    the inbox -- gets an error rather than waiting forever. Events and a gate order the
    threads; nothing sleeps."""
    eng = FakeEngine()
    sched = Scheduler(eng)
    client = Client(sched)
    done = threading.Event()
    served = client.submit(prompt(0, 8), 5, callback=lambda r, e: e.finished and done.set())
    sched.start()
    assert done.wait(30)
    check_events(client.events[served.id], expected(prompt(0, 8), 5), "length")

    gate, stepping = threading.Event(), threading.Event()
    step = eng.step

    def gated_step(active):
        stepping.set()
        assert gate.wait(30)
        step(active)

    eng.step = gated_step
    running = client.submit(prompt(1, 8), 50)
    assert stepping.wait(30)  # the engine thread is inside a step
    queued = client.submit(prompt(2, 8), 5)
    sched.stop(timeout=0)  # asks the loop to end after this step
    gate.set()
    sched.stop()
    assert not sched.alive and free_everything(eng)
    for req in (running, queued):
        last = client.events[req.id][-1]
        assert last.finished and last.error == "the server is shutting down"
    assert len(client.events[queued.id]) == 1
