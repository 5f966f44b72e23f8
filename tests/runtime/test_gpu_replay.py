"""Never slower on a GPU, checked without one: the committed H100 run's costs replayed through
the real engine, proposers and policy.

The H100 check (``bench/results/gpu-check-nvidia-h100-*-e-*.json``) measured SmolLM2-135M's
target forward per row count and its step's wall time; its EAGLE and Medusa heads ran at
0.55x plain there. Here SmolLM2 q4f32_1 and the same committed heads decode the check's own
prompts on this CPU -- real drafts, real verdicts, greedy -- while every clock the engine, the
proposers and the policy read runs on the H100's costs instead: a target forward advances it
by the measured forward of its row count, a head call by a head forward's price, a step by
the host time the check measured. So each decision is the one the policy would make at the
H100's step times, and each mode's decode time is what those decisions would cost there.
The head's forward was not measured on the H100: it is swept, from a fifth of a step to half
of one (a head call launched without a CUDA graph). Nothing here is timed.

What it holds: every mode's expected decode time at most 1/0.97 of plain decoding's, and
its greedy tokens plain's. Steps that draft nothing are priced as plain steps; that they cost
no more on the GPU (the feature path in the step's CUDA graph) is for the GPU check to show.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from speccompile.gpu_check.check import SPEC_PROMPTS
from speccompile.runtime.costs import CostModel, CostTable

RUN = Path(__file__).parents[2] / "bench" / "results" / "gpu-check-nvidia-h100-80gb-hbm3-20261127-e-hidden-graph.json"
NEW_TOKENS = 128  # as the check decoded


def _h100() -> tuple[dict[int, float], float]:
    """(SmolLM2's target forward seconds per row count, a step's host seconds beyond it) on the H100."""
    rec = json.loads(RUN.read_text())["models"]["SmolLM2-135M-Instruct"]
    rows = {int(r): ms * 1e-3 for r, ms in rec["forward_ms_vs_rows"].items()}
    step = 1.0 / rec["decode_tok_s"]  # wall time of a plain step, graphed
    return rows, max(step - rows[1], 0.0)


class GpuClock:
    """time.perf_counter for the engine: advanced by what the H100 would have spent."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _replay(eng, prompts: list[list[int]], cost: CostModel, host: float, head_s: float, per_row: float):
    """Decode each prompt on the GPU clock; (decode seconds, decode tokens, drafted tokens, outputs)."""
    clock = GpuClock()
    model, proposer = eng.model, eng.proposer
    forward = model._forward

    def target(name, ids, *args, **kwargs):
        clock.now += cost.target_table(int(ids.size))
        return forward(name, ids, *args, **kwargs)

    model._forward = target
    head = getattr(proposer, "head", None) or getattr(proposer, "heads", None)
    for name, extra in (("step", None), ("catch_up", per_row), ("forward", None)):
        call = getattr(head, name, None)
        if call is None or head is None:
            continue

        def priced(*args, _call=call, _extra=extra, **kwargs):
            rows = len(args[3]) if _extra is not None else 0  # catch_up(target, kv, batch, tokens, ...)
            clock.now += head_s + (_extra or 0.0) * rows
            return _call(*args, **kwargs)

        setattr(head, name, priced)
    if eng.policy is not None:  # the H100's costs, and nothing this CPU's runs taught it
        eng.policy.cost, eng.policy.host, eng.policy.saved = cost, host, {}
        eng.policy._hopeless.clear()
        eng.policy.acceptance.restore({"hits": [0.0] * 10, "trials": [0.0] * 10, "first_hits": 0, "first_trials": 0})
    commit = eng._commit

    def timed_commit(*args):
        clock.now += host  # sampling, bookkeeping, the launch: what a graphed plain step adds
        return commit(*args)

    eng._commit = timed_commit
    seconds = tokens = drafted = 0
    outputs = []
    real = time.perf_counter
    time.perf_counter = clock
    try:
        for ids in prompts:
            res = eng.generate(ids, NEW_TOKENS, ignore_eos=True)
            seconds += res.stats.decode_seconds
            tokens += len(res.token_ids) - 1  # the first comes from the prefill
            drafted += res.stats.spec.draft_tokens if res.stats.spec else 0
            outputs.append(res.token_ids)
    finally:
        time.perf_counter = real
    return seconds, tokens, drafted, outputs


@pytest.fixture(scope="module")
def smollm2_engines(smollm2_q4, smollm2_heads):
    """(make(mode, **options) -> a SmolLM2 engine with the committed head of that mode, the
    check's prompts, plain decoding's tokens and GPU-clock seconds for them)."""
    from speccompile.runtime import engine
    from speccompile.runtime.engine import Engine

    model_dir, lib = smollm2_q4
    eagle, medusa = smollm2_heads

    def make(mode: str, cost: CostModel | None = None, **options):
        """The engine takes ``cost`` as its profile (no forwards timed at load on this CPU)."""
        heads = {"eagle": [eagle], "medusa": [medusa]}.get(mode, [])
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(engine, "load_or_measure", lambda *args, **kwargs: cost or _cost(0.0, 0.0)[0])
            return Engine(model_dir, lib, speculative_mode=mode, additional_models=heads, **options)

    plain = make("disable")
    prompts = [plain.encode_prompt(p) for _, p in SPEC_PROMPTS]
    cost, host = _cost(0.0, 0.0)
    seconds, tokens, _, outputs = _replay(plain, prompts, cost, host, 0.0, 0.0)
    rows, host = _h100()
    assert seconds == pytest.approx(tokens * (rows[1] + host), rel=1e-6)  # plain steps priced as measured
    return make, prompts, (seconds / tokens, outputs)


def _cost(head_s: float, per_row: float) -> tuple[CostModel, float]:
    rows, host = _h100()
    return CostModel(CostTable(rows), CostTable({1: head_s, 4: head_s, 16: head_s}), per_row), host


@pytest.mark.parametrize("mode, head_share", [("eagle", 0.2), ("eagle", 0.5), ("medusa", 0.2), ("medusa", 0.5),
                                              ("ngram", 0.0), ("suffix", 0.0)])
def test_every_mode_at_the_h100_costs_is_at_least_097x_plain(smollm2_engines, mode, head_share):
    make, prompts, (plain_step, want) = smollm2_engines
    head_s, per_row = head_share * plain_step, 0.01 * _h100()[0][1]  # a catch-up row: ~free on a GPU
    cost, host = _cost(head_s, per_row)
    spec_s, spec_tokens, drafted, got = _replay(make(mode, cost), prompts, cost, host, head_s, per_row)
    assert got == want  # greedy: the target's own tokens
    speed = spec_tokens / spec_s * plain_step  # x plain
    print(f"{mode}, a head call {head_share:.1f} of a step: x{speed:.3f} plain, {drafted} tokens drafted")
    assert speed >= 0.97, (mode, head_share, speed, drafted)


def test_the_same_head_at_a_fixed_length_loses_at_the_h100_costs(smollm2_engines):
    """The control: what the replay charges is real. The EAGLE head drafting 3 tokens every
    step -- no policy -- is slower than plain at these costs, as the H100 run was."""
    make, prompts, (plain_step, want) = smollm2_engines
    head_s, per_row = 0.2 * plain_step, 0.01 * _h100()[0][1]
    cost, host = _cost(head_s, per_row)
    spec_s, spec_tokens, drafted, got = _replay(make("eagle", cost, spec_draft_length=3), prompts[:1], cost, host, head_s,
                                                per_row)
    assert got == want[:1] and drafted > 0
    speed = spec_tokens / spec_s * plain_step
    print(f"eagle at a fixed 3: x{speed:.3f} plain, {drafted} tokens drafted")
    assert speed < 0.97


def test_the_guard_turns_a_losing_source_off_within_a_few_h100_steps():
    """Drafting that realizes 0.8x plain at the H100's step times (~1 ms): off within a few
    drafting steps, then plain but for rare retries; a real gain of 5% is never switched off."""
    from speccompile.runtime.adaptive import AcceptanceModel, Policy

    def run(speedup: float, n: int) -> list[bool]:
        cost, host = _cost(0.2e-3, 1e-5)
        policy = Policy(cost, AcceptanceModel())
        policy.host = host
        plain = policy.plain_step_time(1)
        drafted = []
        for _ in range(n):
            on = not policy.guard_off(1)
            drafted.append(on)
            seconds = 2 * plain / speedup if on else plain
            policy.observe_step(1, on, 2 if on else 1, seconds, seconds - host)
        return drafted

    losing = run(0.8, 3000)
    assert losing.index(False) <= 10  # a few drafting steps: ~10 ms of decoding
    assert sum(losing) / len(losing) < 0.05
    assert all(run(1.05, 3000))


def test_the_gpu_checks_profile_of_a_head_engine_that_drafts_nothing(smollm2_engines):
    """What the next H100 run profiles to find where a losing head's steps go
    (speccompile/gpu_check/profile.py): an EAGLE engine's speculative sequence whose steps
    draft nothing, read the head's features and emit one token each; host_top names the
    Python functions a step spent its own time in."""
    from speccompile.gpu_check.profile import head_steps_without_drafts, host_top

    make = smollm2_engines[0]
    fn, reps, seq = head_steps_without_drafts(make("eagle"), "Hello", 48)
    top = host_top(fn, 4)
    fn()
    assert seq.speculative and seq.result.stats.spec.draft_tokens == 0 and len(seq.result.token_ids) == 1 + 5
    assert len(top) == 10 and all(r["ms"] >= 0 and r["calls"] > 0 for r in top)
    assert sum(r["ms"] for r in top) > 0
