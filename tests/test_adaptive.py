"""The adaptive draft-length controller on synthetic costs and acceptance."""
from speccompile.runtime.adaptive import DraftLengthController


def _run(ctrl: DraftLengthController, verify_ms, accept_prob: float, steps: int = 400) -> list[int]:
    """Feed the controller a deterministic world: verify of k drafts costs verify_ms[k], each
    draft position is accepted with ``accept_prob`` (as an exact long-run fraction)."""
    chosen, credit = [], 0.0
    for _ in range(steps):
        k = ctrl.choose(1, 8)
        chosen.append(k)
        ctrl.observe_verify(1, k, verify_ms[min(k, len(verify_ms) - 1)] / 1e3)
        if k:
            accepted = 0
            for _ in range(k):
                credit += accept_prob
                if credit >= 1.0:
                    credit -= 1.0
                    accepted += 1
                else:
                    break
            ctrl.observe_acceptance(k, accepted)
    return chosen


def test_speculates_deeper_when_acceptance_is_high_and_verify_is_cheap():
    ctrl = DraftLengthController(draft_is_free=True)
    chosen = _run(ctrl, [10, 11, 12, 13, 14, 15, 16, 17, 18], 0.95)
    assert sum(k >= 3 for k in chosen[-100:]) > 80


def test_plain_decoding_when_verify_is_nearly_linear():
    ctrl = DraftLengthController(draft_is_free=True)
    chosen = _run(ctrl, [10, 19, 28, 37, 46, 55, 64, 73, 82], 0.6)
    assert chosen[-100:].count(0) >= 99  # not even perfect acceptance pays: only rare probes


def test_marginal_gain_is_not_taken_and_probes_are_rare():
    # k = 1 would promise 1.3 tokens per 1.25 steps (1.04x): inside the noise margin
    ctrl = DraftLengthController(draft_is_free=True)
    chosen = _run(ctrl, [10, 12.5, 15, 17.5, 20, 22.5, 25, 27.5, 30], 0.3)
    tail = chosen[-200:]
    assert tail.count(0) >= 185 and max(tail) == 1  # at most a few probe steps


def test_probe_one_longer_refreshes_a_stale_cost():
    ctrl = DraftLengthController(draft_is_free=True)
    # a noisy first measurement makes k = 2 look expensive; probes must re-measure it
    ctrl.observe_verify(1, 2, 0.050)
    chosen = _run(ctrl, [10, 11, 12, 13, 14, 15, 16, 17, 18], 0.95, steps=600)
    assert sum(k >= 2 for k in chosen[-100:]) > 80


def test_a_cost_spike_does_not_switch_speculation_off_for_good():
    ctrl = DraftLengthController(draft_is_free=True)
    ctrl.observe_verify(1, 0, 0.010)
    ctrl.observe_verify(1, 1, 0.100)  # measured while another process held the CPU
    chosen = _run(ctrl, [10, 11, 12, 13, 14, 15, 16, 17, 18], 0.95, steps=800)
    assert sum(k >= 2 for k in chosen[-100:]) > 80


def test_costs_learned_at_one_batch_size_inform_another():
    """Forward time depends on the rows it carries: plain batches of 4 and 8 that cost
    nearly 2x apart (compute-bound) keep a batch of 8 from drafting at all."""
    ctrl = DraftLengthController(draft_is_free=True)
    for rows, ms in ((1, 10), (2, 12), (4, 20), (8, 40)):
        for _ in range(3):
            ctrl.observe_verify(rows, 0, ms / 1e3)
    for _ in range(3):
        ctrl.observe_acceptance(1, 1)
    assert ctrl.choose(1, 8) >= 1  # one sequence: a 2-row forward is nearly free
    assert [ctrl.choose(8, 8) for _ in range(20)].count(0) == 20  # 16 rows would cost ~2x


def test_realized_step_throughput_overrules_a_promising_estimate():
    """The cost model promises a gain (cheap verify, good acceptance), but whole drafting
    steps carry a cost it cannot see (say a draft model catching up inside the step): once
    drafting steps have delivered fewer tokens per second than plain ones at this batch
    size, the controller decodes plainly, apart from rare probes; at another batch size
    where drafting wins, it keeps drafting."""
    ctrl = DraftLengthController(draft_is_free=True)
    hidden_cost = {4: 0.050, 2: 0.0}  # seconds added to every drafting step, per batch size
    chosen = {4: [], 2: []}
    for step in range(600):
        for batch in (4, 2):
            k = ctrl.choose(batch, 8)
            chosen[batch].append(k)
            verify = 0.010 + 0.001 * batch * (k + 1)  # memory-bound: extra rows are cheap
            ctrl.observe_verify(batch, k, verify)
            accepted = min(k, 1)
            if k:
                ctrl.observe_acceptance(k, accepted)
            tokens = batch * (1 + accepted)
            ctrl.observe_step(batch, k > 0, tokens, verify + (hidden_cost[batch] if k else 0.0))
    assert sum(k > 0 for k in chosen[4][-200:]) <= 6  # plain, but for probes
    assert sum(k > 0 for k in chosen[2][-200:]) >= 190  # drafting pays here and continues


def test_a_draft_model_at_high_acceptance_drafts_beyond_one():
    """Measured Qwen2.5-Coder 1.5B target / 0.5B draft costs on a 2-core CPU (draft forward
    9.3 ms, verify of k+1 tokens 25-35 ms), every draft position accepted with probability
    0.85 independently: k = 2-3 promise ~1.35x over plain, k = 1 1.27x. Positions beyond
    the first are unmeasured until tried; they must not be assumed worse than the first,
    or the controller stays at k = 1."""
    import numpy as np

    rng = np.random.default_rng(0)
    verify_ms = [25, 26, 27.7, 28, 29.4, 30.5, 31.4, 33.3, 35.3]
    ctrl = DraftLengthController()
    ctrl.observe_draft(1, 0.0093)
    chosen = []
    for _ in range(600):
        k = ctrl.choose(1, 8)
        chosen.append(k)
        ctrl.observe_verify(1, k, verify_ms[k] / 1e3)
        if k:
            hits = rng.random(k) < 0.85
            ctrl.observe_acceptance(k, int(k if hits.all() else np.argmin(hits)))
    assert sum(k >= 2 for k in chosen[-200:]) > 180


def test_costs_measured_while_the_machine_was_slower_are_rescaled():
    """The CPU speeds up 30% (clock change) while the controller decodes plainly for a while:
    the draft and verify costs it measured before must scale with the plain steps it keeps
    measuring, or stale costs make drafting look too dear and speculation stays off."""
    verify_ms = [25, 26, 27.7, 28, 29.4]
    ctrl = DraftLengthController(max_k=4)
    for _ in range(12):  # slow phase: every length measured, acceptance 0.85 at every position
        for k in range(5):
            ctrl.observe_verify(1, k, verify_ms[k] / 1e3)
        ctrl.observe_draft(1, 0.0093)
        for _ in range(3):
            ctrl.observe_acceptance(4, 4)
        ctrl.observe_acceptance(4, 0)
    assert ctrl.choose(1, 4) >= 2
    for _ in range(12):  # fast phase: only plain steps are measured
        ctrl.observe_verify(1, 0, 0.7 * verify_ms[0] / 1e3)
    assert abs(ctrl.verify_cost[4] - 0.7 * verify_ms[3] / 1e3) < 1e-9
    chosen = [ctrl.choose(1, 4) for _ in range(10)]
    assert abs(ctrl.draft_cost - 0.7 * 0.0093) < 1e-9
    assert sum(k >= 2 for k in chosen) >= 8, chosen
