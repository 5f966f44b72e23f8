"""The cost model, the acceptance model and the draft-length policy, on synthetic costs.

Nothing here is timed: every cost is given, every acceptance drawn from a seeded generator.
"""
import numpy as np
import pytest

from speccompile.runtime.adaptive import COOLDOWN_MAX, MAX_BACKOFF, AcceptanceModel, Policy, node_probs
from speccompile.runtime.costs import CostModel, CostTable, profile_path
from speccompile.runtime.acceptance import Draft

MS = 1e-3


def _model(verify_ms: dict, draft_ms: float = 0.0, catch_up_ms: float = 0.0) -> CostModel:
    return CostModel(CostTable({r: v * MS for r, v in verify_ms.items()}),
                     CostTable({1: draft_ms * MS, 8: 8 * draft_ms * MS}), catch_up_ms * MS)


# what one VNNI host measured for Qwen2.5-Coder-1.5B (rows -> ms) and a 0.5B draft step
QWEN = {1: 38, 2: 44, 4: 46, 8: 54, 16: 103}
FLAT = {1: 10, 2: 10.3, 4: 10.9, 8: 12, 16: 14}  # memory-bound: extra rows nearly free
LINEAR = {1: 10, 2: 20, 4: 40, 8: 80, 16: 160}  # compute-bound: a row costs a whole step


# ------------------------------------------------------------------ costs
def test_cost_table_interpolates_extrapolates_and_is_monotone():
    t = CostTable({1: 10.0, 2: 12.0, 4: 30.0, 6: 20.0, 8: 40.0})  # 4 was measured in a slow moment
    values = [t(r) for r in range(1, 12)]
    assert values == sorted(values)  # never cheaper with more rows
    assert t(4) == t(6) == 25.0  # the violating pair pooled
    assert t(10) == pytest.approx(40.0 + 2 * (40.0 - 25.0) / 2)  # the last slope carries on
    assert t(3) == pytest.approx(12.0 + (25.0 - 12.0) / 2)


def test_pace_scales_every_cost_and_keeps_the_shape():
    cost = _model(QWEN, draft_ms=13)
    for _ in range(15):  # the machine runs 30% faster than when profiled
        cost.observe_target(1, 0.7 * 38 * MS)
        cost.observe_target(4, 0.7 * 46 * MS)
    assert cost.pace == pytest.approx(0.7)
    assert cost.target(8) == pytest.approx(0.7 * 54 * MS)
    assert cost.draft(1) == pytest.approx(0.7 * 13 * MS)
    assert cost.target(8) / cost.target(1) == pytest.approx(54 / 38)


def test_refreshed_profile_is_anchored_at_one_row(tmp_path):
    """Real steps rewrite the cached table's shape (a 4-row forward that was profiled in a
    noisy second), never its level: the next process starts from the healed profile."""
    cost = _model({1: 10, 2: 11, 4: 30, 8: 40})
    cost.path = tmp_path / "p.json"
    for _ in range(30):  # now 2x slower overall; 4 rows really cost 1.3x one row
        cost.observe_target(1, 20 * MS)
        cost.observe_target(4, 26 * MS)
    cost.save()
    again = CostModel.load(cost.path)
    assert again.target_table(1) == pytest.approx(10 * MS)
    assert again.target_table(4) == pytest.approx(13 * MS, rel=0.1)  # (an odd window of alternating rows)
    assert CostModel.load(tmp_path / "missing.json") is None


def test_drift_between_plain_and_drafting_stretches_leaves_the_shape_alone(tmp_path):
    """Plain steps in a fast second, then drafting steps in a 1.5x slower one: that is
    the machine, not the table, and the healed profile must not price extra rows higher
    (it once did, and a profile that made drafting look hopeless was never corrected)."""
    cost = _model({1: 10, 2: 11, 4: 13, 8: 20})
    cost.path = tmp_path / "p.json"
    for _ in range(30):
        cost.observe_target(1, 10 * MS)
    for _ in range(30):
        cost.observe_target(4, 1.5 * 13 * MS)
        cost.observe_target(2, 1.5 * 11 * MS)
    cost.save()
    again = CostModel.load(cost.path)
    for rows, ms in ((1, 10), (2, 11), (4, 13)):
        assert again.target_table(rows) == pytest.approx(ms * MS, rel=0.05)


def test_real_draft_work_is_learned_in_the_process():
    cost = _model(QWEN, draft_ms=1.0, catch_up_ms=0.1)
    for _ in range(10):  # real asks took 6 ms where the table priced their forwards at 2 ms
        cost.observe_draft(6 * MS, 2 * MS)
    assert cost.draft(1) == pytest.approx(3 * MS) and cost.catch_up(10) == pytest.approx(3 * MS)
    assert cost.target(1) == pytest.approx(38 * MS)  # the target's pace is another matter


def test_the_plan_prices_what_it_allows_and_the_policy_learns_from_it():
    policy = Policy(_model(QWEN, draft_ms=1.0, catch_up_ms=0.1), AcceptanceModel(first_prior=0.9))
    plan = policy.plan(1)
    assert plan.should_draft(1, [(1.0, policy.acceptance.first())], catch_up_tokens=5)
    assert plan.priced == pytest.approx(1.5 * MS)  # the forward and the whole catch-up inside it (5 x 0.1 ms)

    class Step:  # what a decode step records (metrics.StepRecord's fields the policy reads)
        rows, batch, target_seconds, draft_forwards, draft_seconds = 2, 1, 44 * MS, 1, 4.5 * MS
        drafts, verdicts, speculative, seq_ids, drafted, emitted = [], [], [], [], True, [1]
        seconds, forward_seconds = 49 * MS, 48 * MS

    for _ in range(5):
        policy.observe(Step(), plan)
    assert policy.cost.draft_overhead == pytest.approx(3.0)


def test_profile_key_depends_on_library_mode_and_host(tmp_path, monkeypatch):
    lib = tmp_path / "a.so"
    lib.write_bytes(b"x" * 100)
    monkeypatch.setenv("SPECCOMPILE_CACHE", str(tmp_path))
    a = profile_path([lib], "ngram")
    assert a.parent == tmp_path / "costs" and profile_path([lib], "ngram") == a
    assert profile_path([lib], "small_draft") != a
    monkeypatch.setenv("TVM_NUM_THREADS", "1")
    assert profile_path([lib], "ngram") != a
    lib.write_bytes(b"y" * 100)
    monkeypatch.delenv("TVM_NUM_THREADS")
    assert profile_path([lib], "ngram") != a


class _Clock:
    """A fake ``time.perf_counter`` that only the fake model's forwards advance."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class _TimedModel:
    """What measure_target calls of a model and a KV cache, each forward of r rows taking
    ``ms_per_row * r`` on the fake clock; ``calls`` counts the forwards per row count."""

    def __init__(self, clock: _Clock, ms_per_row: float):
        self.clock, self.ms, self.calls = clock, ms_per_row, {}

    def _forward(self, r: int):
        self.clock.now += self.ms * r * MS
        self.calls[r] = self.calls.get(r, 0) + 1

    def prefill(self, kv, ids, chunks):
        pass

    def decode(self, kv, ids, tokens, on_device=False):
        self._forward(len(tokens))

    def forward(self, kv, ids, tokens, on_device=False):
        self._forward(len(tokens[0]))

    def accept_greedy(self, logits, tokens, parents):
        pass

    add_sequence = remove_sequence = popn = lambda self, *a: None


def test_the_profile_is_bounded_and_keeps_the_rows_a_stream_uses(monkeypatch):
    """A first request waits for the profile: every count of TARGET_ROWS is timed only while
    the profile is under its budget, the first CORE_ROWS (1, 2, 4, 8) always; without a
    budget (the GPU check's row costs) every count, best of three after a warm-up."""
    from speccompile.runtime import costs

    clock = _Clock()
    monkeypatch.setattr(costs.time, "perf_counter", clock)
    rows = list(costs.TARGET_ROWS)
    assert sorted(rows[: costs.CORE_ROWS]) == [1, 2, 4, 8]
    fast = _TimedModel(clock, 1.0)  # 1 ms a row: all twelve counts fit a second
    assert set(costs.measure_target(fast, fast, rows, "", budget=1.0)) == set(rows)
    assert all(n == 4 for n in fast.calls.values())
    slow = _TimedModel(clock, 20.0)  # 20 ms a row: the core, then 16 rows, then the budget is spent
    seconds = costs.measure_target(slow, slow, rows, "", budget=1.0)
    assert list(seconds) == [1, 2, 4, 8, 16]
    assert seconds[8] == pytest.approx(0.16)
    assert slow.calls[1] == 4 and slow.calls[8] == 2 and slow.calls[16] == 2  # timed calls capped at TIMED_SECONDS
    slow.calls.clear()
    assert list(costs.measure_target(slow, slow, rows, "", budget=0.0)) == rows[: costs.CORE_ROWS]
    slow.calls.clear()
    assert set(costs.measure_target(slow, slow, rows, "")) == set(rows) and set(slow.calls.values()) == {4}
    graphed = _TimedModel(clock, 1.0)  # with CUDA graphs the capture (a shape's second use) is untimed too
    graphed.graphs = object()
    costs.measure_target(graphed, graphed, [1, 2], "", budget=1.0)
    assert graphed.calls == {1: 5, 2: 5}


# ------------------------------------------------------------- acceptance
def test_calibration_learns_what_a_confidence_is_worth():
    acc = AcceptanceModel()
    assert acc.predict(0.95) == pytest.approx(0.95)  # the prior: confidence is acceptance
    rng = np.random.default_rng(0)
    for _ in range(300):  # an over-confident draft: 0.95 means 0.5
        acc.observe([0.95], [-1], [0] if rng.random() < 0.5 else [])
    assert acc.calibrated(0.95) == pytest.approx(0.5, abs=0.08)
    assert acc.calibrated(0.25) == pytest.approx(0.25)  # other bins keep their prior


def test_a_prompt_where_confident_drafts_miss_scales_predictions_down_then_recovers():
    acc = AcceptanceModel()
    for _ in range(200):  # calibrated: confidence 0.6 is accepted 60% of the time
        acc.observe([0.65], [-1], [0] if _ % 5 < 3 else [])
    base = acc.calibrated(0.65)
    assert acc.predict(0.65) == pytest.approx(base, abs=0.15)
    for _ in range(6):  # a translation prompt: the same confidence, nothing accepted
        acc.observe([0.65], [-1], [])
    assert acc.predict(0.65) < 0.55 * base  # the next drafts look poor at once ...
    assert acc.calibrated(0.65) > 0.9 * base  # ... while the long-run calibration barely moves
    for _ in range(6):  # drafts that land again
        acc.observe([0.65], [-1], [0])
    assert acc.predict(0.65) > 0.9 * base
    for _ in range(6):
        acc.observe([0.65], [-1], [])
    low = acc.predict(0.65)
    for _ in range(100 * MAX_BACKOFF):  # a plain stretch: the prompt's scaling drifts back (slowly
        acc.relax()                     # after six misses), so drafting is retried
    assert low < acc.predict(0.65) == pytest.approx(acc.calibrated(0.65), rel=0.1)
    for _ in range(6):
        acc.observe([0.65], [-1], [])
    acc.new_prompt()  # and a new prompt starts its scaling over
    assert acc.predict(0.65) == pytest.approx(acc.calibrated(0.65))


def test_each_sequence_of_a_batch_keeps_its_own_corrections():
    """A translation whose confident drafts miss beside a code sequence whose drafts land:
    each is predicted by its own record, and a third joining resets neither."""
    acc = AcceptanceModel()
    for _ in range(8):
        acc.observe([0.65], [-1], [], seq=1)  # translation: nothing accepted
        acc.observe([0.65], [-1], [0], seq=2)  # code: everything accepted
    assert acc.predict(0.65, 1) < 0.5 * acc.predict(0.65, 2)
    assert acc.first(1) < 0.5 < acc.first(2)
    low, high = acc.predict(0.65, 1), acc.predict(0.65, 2)
    acc.new_prompt(3)
    assert acc.predict(0.65, 1) == low and acc.predict(0.65, 2) == high
    assert acc.predict(0.65, 3) == pytest.approx(acc.calibrated(0.65))  # the newcomer: calibration alone
    acc.forget(1)
    assert 1 not in acc.prompts


def test_only_nodes_whose_parent_was_accepted_are_evidence():
    acc = AcceptanceModel()
    acc.observe([0.95, 0.95, 0.15], [-1, 0, 1], [0])  # node 1 rejected, node 2 never reached
    assert acc.trials[0, 9] == pytest.approx(1 + 0.998)  # nodes 0 and 1, decayed once
    assert acc.hits[0, 9] == pytest.approx(0.998)
    assert acc.trials[0, 1] == 0 and not acc.trials[1].any()  # all source 0's


def test_first_token_estimate_falls_with_misses_and_recovers_slower_after_each():
    acc = AcceptanceModel(first_prior=0.6)
    acc.observe([0.5], [-1], [])
    for _ in range(80):
        acc.relax()
    fast = acc.first()  # one miss: back near the prior after a plain stretch
    assert fast > 0.5
    for _ in range(20):
        acc.observe([0.5], [-1], [])
    low = acc.first()
    assert low < 0.1  # a weak prior (FIRST_PRIOR_TRIALS): 20 misses say this prompt is hopeless
    assert acc.state_of().backoff == MAX_BACKOFF
    for _ in range(80):
        acc.relax()
    assert acc.first() < 0.15  # every miss slowed the drift: not asked again within 80 tokens
    for _ in range(80 * MAX_BACKOFF):
        acc.relax()
    assert acc.first() > 0.35  # ... but retried in the end
    acc.observe([0.5], [-1], [0])  # a retry that hits resets the wait
    assert acc.state_of().backoff == 1


def test_dropped_drafts_back_off_and_a_new_prompt_asks_again_at_once():
    acc = AcceptanceModel(first_prior=0.7)
    for _ in range(12):
        acc.observe_unverified(0.05)  # asked, nothing worth a row
    assert acc.first() < 0.2 and acc.state_of().backoff == MAX_BACKOFF
    acc.new_prompt()  # new content: the old prompt weighs no more than the prior
    assert acc.first() > 0.35 and acc.state_of().backoff == 1


def test_learned_calibration_survives_the_process():
    acc = AcceptanceModel()
    for _ in range(50):
        acc.observe([0.95], [-1], [])
    again = AcceptanceModel().restore(acc.state())
    assert again.predict(0.95) < 0.2  # what was learned carries over ...
    assert again.trials[0, 9] == pytest.approx(20.0)  # ... worth at most 20 observations: a new prompt moves it
    assert AcceptanceModel().restore({"hits": [1] * 3}).predict(0.95) == pytest.approx(0.95)  # malformed: ignored


# ----------------------------------------------------------------- policy
def test_a_draft_model_drafts_long_when_verify_is_cheap_and_stops_where_confidence_drops():
    """Per-token stopping: the chain goes on while the draft is sure and stops right after
    the token it is unsure of; that token is verified only where a row is nearly free."""
    policy = Policy(_model(FLAT, draft_ms=1.0), AcceptanceModel())
    plan = policy.plan(1)
    confs = [0.97, 0.95, 0.96, 0.1, 0.9, 0.9]
    assert plan.should_draft(1, [(1.0, policy.acceptance.first())])
    drafted, p = [], 1.0
    for c in confs:
        drafted.append(c)
        p *= plan.p(c)
        plan.spent(1 * MS)
        plan.drafted([p])
        if not plan.should_draft(1, [(p, plan.p(c))]):
            break
    assert drafted == confs[:4]
    kept = plan.select([Draft(list(range(4)), conf=drafted)])[0]
    assert kept.tokens == [0, 1, 2, 3]
    dear = Policy(_model(QWEN, draft_ms=1.0), AcceptanceModel()).plan(1)
    assert dear.select([Draft(list(range(4)), conf=drafted)])[0].tokens == [0, 1, 2]


def test_no_drafting_where_verify_rows_cost_whole_steps():
    policy = Policy(_model(LINEAR), AcceptanceModel())
    plan = policy.plan(1)
    assert not plan.should_draft(1, [(1.0, 0.99)])  # not even near-perfect acceptance pays
    assert plan.select([Draft([1, 2, 3], conf=[0.99, 0.99, 0.99])])[0].tokens == []


def test_a_draft_slower_than_its_target_never_drafts():
    """Qwen2.5-Coder-0.5B as target and the 1.5B as its draft: a draft step costs more
    than a target step, so no acceptance can pay for it."""
    policy = Policy(_model({1: 13, 2: 15, 4: 17, 8: 22}, draft_ms=38), AcceptanceModel(first_prior=1.0))
    assert not policy.plan(1).should_draft(1, [(1.0, policy.acceptance.first())])
    assert not policy.expects_drafting([None])
    assert policy.hopeless(1) and policy.hopeless(4)  # the step does not even ask the proposer
    assert not Policy(_model(QWEN, draft_ms=13), AcceptanceModel()).hopeless(1)
    # ... unless it also drafts for free (the suffix index merged with that draft): then only
    # verify rows that cost whole steps make it hopeless
    assert not policy.hopeless(1, free_drafts=True)
    assert Policy(_model({1: 40, 2: 80, 4: 160}), AcceptanceModel()).hopeless(1, free_drafts=True)


def test_measured_qwen_costs_draft_at_good_acceptance_and_not_at_poor():
    """The 1.5B + 0.5B costs above: a first token accepted 80% of the time is worth a
    draft forward of 0.34 steps, one accepted 30% of the time is not."""
    good = Policy(_model(QWEN, draft_ms=13), AcceptanceModel(first_prior=0.8))
    poor = Policy(_model(QWEN, draft_ms=13), AcceptanceModel(first_prior=0.3))
    assert good.plan(1).should_draft(1, [(1.0, good.acceptance.first())])
    assert not poor.plan(1).should_draft(1, [(1.0, poor.acceptance.first())])


def test_batch_sizes_use_the_costs_of_their_row_counts():
    """A batch of 8 drafting one token each forwards 16 rows, which costs 2x a plain step
    of 8 here: drafting pays at batch 1 and not at batch 8."""
    policy = Policy(_model(QWEN), AcceptanceModel(first_prior=0.7))
    assert policy.plan(1).should_draft(1, [(1.0, policy.acceptance.first())])
    plan8 = policy.plan(8)
    drafts = plan8.select([Draft([1, 2], conf=[0.7, 0.7]) for _ in range(8)])
    assert sum(len(d) for d in drafts) <= 8  # at most one extra row per sequence is worth its cost
    assert policy.plan(1).select([Draft([1, 2], conf=[0.7, 0.7])])[0].tokens == [1, 2]


def test_tree_selection_keeps_parents_and_the_most_probable_nodes():
    policy = Policy(_model(QWEN), AcceptanceModel())
    d = Draft([10, 11, 12, 13, 14], parents=[-1, -1, 0, 0, 2], conf=[0.9, 0.05, 0.8, 0.05, 0.7])
    probs, depths = node_probs(d, lambda c, src: policy.acceptance.predict(c, None, src))
    assert depths == [1, 1, 2, 2, 3] and probs[4] == pytest.approx(0.95 * 0.85 * 0.75)  # bin centers
    kept = policy.plan(1).select([d])[0]
    assert kept.tokens == [10, 12, 14] and kept.parents == [-1, 0, 1]


def test_drafts_found_not_worth_a_row_teach_the_first_token_estimate():
    policy = Policy(_model(QWEN, draft_ms=3.0), AcceptanceModel(first_prior=0.7))
    asks = 0
    for _ in range(40):  # a head that is asked (its catch-up and forward run), then drafts at 5% confidence
        plan = policy.plan(1)
        if not plan.should_draft(1, [(1.0, policy.acceptance.first())]):
            break
        asks += 1
        assert plan.select([Draft([5], conf=[0.03])])[0].tokens == []  # nothing worth verifying
    assert asks < 40 and policy.acceptance.first() < 0.3  # it stops being asked (plain steps retry it later)


def test_fixed_length_is_left_alone():
    policy = Policy(_model(LINEAR), AcceptanceModel(), fixed_k=3)
    plan = policy.plan(1)
    assert plan.should_draft(1, [(1.0, 0.01)])
    assert plan.select([Draft([1, 2, 3], conf=[0.01] * 3)])[0].tokens == [1, 2, 3]


def _steps(policy: Policy, batch: int, speedup: float, n: int) -> list[bool]:
    """n steps of a world where drafting delivers ``speedup`` x plain at this batch size
    (when the policy drafts); returns whether each step was allowed to draft."""
    drafted = []
    plain = policy.plain_step_time(batch)
    for _ in range(n):
        on = not policy.guard_off(batch)
        drafted.append(on)
        if on:
            policy.observe_step(batch, True, 2 * batch, 2 * plain / speedup, 2 * plain / speedup)
        else:
            policy.observe_step(batch, False, batch, plain, plain)
    return drafted


def test_guard_switches_drafting_off_only_when_measurably_slower_and_retries():
    policy = Policy(_model(QWEN), AcceptanceModel())
    steps = _steps(policy, 1, 0.8, 200)  # drafting delivers 0.8x: switched off after a few steps
    assert not all(steps[:40]) and steps[:8] == [True] * 8
    assert sum(steps) < 60  # mostly plain, with retries that grow rarer
    fine = Policy(_model(QWEN), AcceptanceModel())
    assert all(_steps(fine, 1, 1.02, 300))  # a small but real gain is never switched off
    noisy = Policy(_model(QWEN), AcceptanceModel())
    rng = np.random.default_rng(1)
    plain = noisy.plain_step_time(2)
    for _ in range(300):  # a gain of 10% with 40% step-to-step noise: the guard stays quiet
        seconds = 2 * plain / (1.1 * rng.uniform(0.6, 1.4))
        noisy.observe_step(2, True, 4, seconds, seconds)
    assert not noisy.guard_off(2)


def test_guard_off_is_per_batch_size():
    policy = Policy(_model(QWEN), AcceptanceModel())
    _steps(policy, 4, 0.7, 20)
    assert policy.guard_off(4) and not policy.guard_off(1)
    assert policy.plan(4).select([Draft([1], conf=[0.99])] * 4) == [Draft()] * 4


def test_guard_reacts_within_seconds_and_recovers_when_the_load_falls():
    """A server where drafting paid at 4 streams until another process took a core: the guard
    switches drafting off within a second or two of decoding, keeps it off (retries cost little)
    while the loss lasts, drafts at once at a batch size where it still pays, and drafts
    again at 4 streams within seconds once the other process is gone -- also after the loss
    lasted long enough for the step cooldown to reach its ceiling."""
    policy = Policy(_model(QWEN), AcceptanceModel())
    assert all(_steps(policy, 4, 1.2, 100))
    lossy = _steps(policy, 4, 0.7, 1500)  # 0.7x for 1,500 steps: another process took a core
    first_off = lossy.index(False)  # the drafting steps it took to see the loss: 2 plain steps each
    assert first_off * 2 * policy.plain_step_time(4) / 0.7 < 2.0
    assert sum(lossy) / len(lossy) < 0.1  # mostly plain: retries cost little
    while policy.cooldown[4] < COOLDOWN_MAX or not policy.guard_off(4):  # the loss lasts until a
        lossy += _steps(policy, 4, 0.7, 1)  # trip at the longest cooldown, then it ends
    assert all(_steps(policy, 1, 1.3, 20))  # one stream left: drafts at once
    recovered = _steps(policy, 4, 1.2, 2000)
    resumed = recovered.index(True)
    assert resumed * policy.plain_step_time(4) <= 10.5  # within seconds, not 1,024 steps (47 s here)
    assert all(recovered[resumed:])  # and stays on: drafting pays again


def test_a_draft_model_prefills_a_prompt_only_when_drafting_can_win_its_cost_back():
    """Qwen2.5-Coder-1.5B-like costs: 40 ms a step, a 0.5B draft at 12 ms a token and 4 ms a
    prompt token. A 683-token document with little left to emit is decoded plainly; a short
    prompt, or a long answer, gets the draft's prefill; a head (no prefill cost) always does."""
    policy = Policy(_model({1: 40, 2: 42, 4: 45, 8: 52}, draft_ms=12, catch_up_ms=4), AcceptanceModel())
    saving = policy.saving_per_token(1)
    assert 0 < saving < 0.040  # drafting helps at the prior's acceptance, and never by a whole step
    assert not policy.draft_prefill_pays(683, 9, 1)
    assert not policy.draft_prefill_pays(683, 96, 1)  # 2.7 s of prefill against ~96 * saving
    assert policy.draft_prefill_pays(40, 96, 1)
    assert policy.draft_prefill_pays(683, 4096, 1)
    head = Policy(_model({1: 40, 2: 42, 4: 45, 8: 52}, draft_ms=3), AcceptanceModel())
    assert head.draft_prefill_pays(683, 9, 1)
    hopeless = Policy(_model({1: 40, 2: 80, 4: 160, 8: 320}, draft_ms=12, catch_up_ms=4), AcceptanceModel())
    assert hopeless.saving_per_token(1) == 0.0 and not hopeless.draft_prefill_pays(40, 4096, 1)


def test_realized_savings_replace_the_cautious_model_and_outlive_the_process(tmp_path, monkeypatch):
    """Once drafting steps have run at a batch size, what they saved per token prices the
    draft's prefill; the next process starts from it."""
    monkeypatch.setenv("SPECCOMPILE_CACHE", str(tmp_path))
    policy = Policy(_model({1: 40, 2: 42, 4: 45, 8: 52}, draft_ms=12, catch_up_ms=4), AcceptanceModel())
    policy.cost.path = tmp_path / "profile.json"
    modelled, other = policy.saving_per_token(1), policy.saving_per_token(2)
    _steps(policy, 1, 1.5, 12)  # drafting delivered 1.5x plain
    plain = policy.plain_step_time(1)
    assert policy.saving_per_token(1) == pytest.approx(plain / 3, rel=1e-6) and plain / 3 > modelled
    assert policy.saving_per_token(2) == other  # a batch size not yet drafted at: the model
    policy.save()
    again = Policy(policy.cost, AcceptanceModel())
    assert again.saving_per_token(1) == pytest.approx(plain / 3, rel=1e-6)
    _steps(policy, 1, 1.5, 12)
    for _ in range(100):  # a plain stretch: the measurement fades and the model prices again
        policy.observe_step(1, False, 1, plain, plain)
    assert policy.saving_per_token(1) == pytest.approx(modelled)


def test_a_draft_model_prefill_is_priced_by_what_requests_emit_not_their_max_tokens():
    policy = Policy(_model(QWEN, draft_ms=15.0, catch_up_ms=2.0), AcceptanceModel())
    policy.saved[1] = [0.004 * 100, 100.0]  # drafting saved 4 ms a token at batch 1
    assert policy.expected_output(400, 0) == 400  # nothing finished yet: its budget
    assert policy.draft_prefill_pays(300, policy.expected_output(400, 0), 1)  # 300 x 2 ms < 400 x 4 ms
    for _ in range(20):  # requests that stop after ~100 of their 400 tokens (an answer, a JSON object)
        policy.observe_output(100)
    assert 99 <= policy.expected_output(400, 0) <= 101 and policy.expected_output(400, 60) == pytest.approx(40, abs=1)
    assert policy.expected_output(30, 0) == 30  # never more than its budget
    assert not policy.draft_prefill_pays(300, policy.expected_output(400, 0), 1)  # 600 ms for ~400 ms saved
