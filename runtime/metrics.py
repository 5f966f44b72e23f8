"""Speculative-decoding metrics, defined once for generate, bench, serve and the C API
(runtime/capi/src/metrics.h is the twin of the two ratios and the counts).

- draft_tokens: draft tokens proposed and verified;
- accepted_tokens: draft tokens the target accepted;
- accept_rate = accepted_tokens / draft_tokens;
- mean_accepted_length = tokens emitted per speculative verify step, *counting the
  bonus token* (plain decoding scores 1.0; a fully accepted k-chain scores k + 1);
- per_position_accept_rate[i] = accepted at draft position (tree depth) i+1 / proposed
  there;
- time is split into draft, verify and the rest of the decode loop.

Every count comes from one place: the engine's ``StepRecord`` of each decode step.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class StepRecord:
    """What one decode step did, per sequence of the batch: the one input of the metrics
    (sequences, engine totals, a server's /metrics) and of the draft-length policy."""

    drafts: list  # [Draft] per sequence, as verified (empty: plain decoding)
    verdicts: list  # [Verdict] per sequence: accepted path and emitted tokens
    emitted: list[int]  # tokens each sequence kept (a stop, EOS or the budget may cut a verdict)
    speculative: list[bool]  # per sequence: counted in speculative metrics
    draft_forwards: int  # draft forwards this step ran, for the whole batch
    draft_seconds: float  # proposing
    target_seconds: float  # the target forward and the acceptance kernel
    other_seconds: float  # commit or rollback, emission, proposer bookkeeping
    seq_ids: list[int]  # the sequences, in batch order (whose evidence each verdict is)

    @property
    def batch(self) -> int:
        return len(self.drafts)

    @property
    def rows(self) -> int:
        return sum(len(d) + 1 for d in self.drafts)

    @property
    def drafted(self) -> bool:
        return any(len(d) for d in self.drafts)

    @property
    def forward_seconds(self) -> float:
        return self.draft_seconds + self.target_seconds

    @property
    def seconds(self) -> float:
        return self.draft_seconds + self.target_seconds + self.other_seconds


def record_step(step: StepRecord, stats: list, totals) -> None:
    """Account one step: ``stats`` are the sequences' ``Stats`` (runtime/sequence.py), in
    batch order; ``totals`` the engine's. Each sequence sees the whole step's time; the
    totals count it once (per-sequence verify counts, batch-shared seconds and forwards)."""
    b = step.batch
    spec = [(st, d, v) for st, d, v, on in zip(stats, step.drafts, step.verdicts, step.speculative)
            if on and st.spec is not None]
    for st, n in zip(stats, step.emitted):
        st.decode_tokens += n
        st.decode_seconds += step.seconds
    totals.decode_tokens += sum(step.emitted)
    totals.decode_seconds += step.seconds
    for st, d, v in spec:
        st.spec.add_step(d, v, step.draft_seconds, step.target_seconds)
        st.spec.draft_steps += step.draft_forwards
        st.spec.other_seconds += step.other_seconds
        totals.spec.add_step(d, v, step.draft_seconds / b, step.target_seconds / b)
    if spec:
        totals.spec.draft_steps += step.draft_forwards
        totals.spec.other_seconds += step.other_seconds


def accept_rate(accepted_tokens: int, draft_tokens: int) -> float:
    """Draft tokens the target accepted, over those it verified (0 when none were)."""
    return accepted_tokens / draft_tokens if draft_tokens else 0.0


def mean_accepted_length(emitted_in_verify: int, verify_steps: int) -> float:
    """Tokens emitted per verify step, counting the bonus token (a full k-chain scores k + 1)."""
    return emitted_in_verify / verify_steps if verify_steps else 0.0


@dataclass
class SpecMetrics:
    draft_tokens: int = 0
    accepted_tokens: int = 0
    verify_steps: int = 0  # target forwards that verified at least one draft token
    plain_steps: int = 0  # target forwards with no draft (k = 0 or no proposal)
    draft_steps: int = 0  # draft-model forwards (0 for n-gram)
    emitted_in_verify: int = 0  # tokens emitted by verify steps, bonus included
    position_proposed: list[int] = field(default_factory=list)
    position_accepted: list[int] = field(default_factory=list)
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    other_seconds: float = 0.0

    def record_verify(self, depths_proposed: list[int], accepted: int, emitted: int) -> None:
        """depths_proposed: draft depth (1-based) of each verified node; accepted: path length."""
        self.verify_steps += 1
        self.draft_tokens += len(depths_proposed)
        self.accepted_tokens += accepted
        self.emitted_in_verify += emitted
        deepest = max(depths_proposed, default=0)
        while len(self.position_proposed) < deepest:
            self.position_proposed.append(0)
            self.position_accepted.append(0)
        for d in set(depths_proposed):  # a depth counts once per step, accepted if the path reached it
            self.position_proposed[d - 1] += 1
        for d in range(accepted):
            self.position_accepted[d] += 1

    def add_step(self, draft, verdict, draft_seconds: float, verify_seconds: float) -> None:
        """One step of one sequence: its verified draft (a Draft) and the verdict on it."""
        if len(draft):
            self.record_verify(draft.depths(), len(verdict.path), len(verdict.tokens))
        else:
            self.plain_steps += 1
        self.draft_seconds += draft_seconds
        self.verify_seconds += verify_seconds

    @property
    def accept_rate(self) -> float:
        return accept_rate(self.accepted_tokens, self.draft_tokens)

    @property
    def mean_accepted_length(self) -> float:
        return mean_accepted_length(self.emitted_in_verify, self.verify_steps)

    @property
    def per_position_accept_rate(self) -> list[float]:
        return [a / p if p else 0.0 for a, p in zip(self.position_accepted, self.position_proposed)]

    def to_dict(self) -> dict:
        return {
            "accept_rate": self.accept_rate,
            "mean_accepted_length": self.mean_accepted_length,
            "per_position_accept_rate": self.per_position_accept_rate,
            "draft_tokens": self.draft_tokens,
            "accepted_tokens": self.accepted_tokens,
            "draft_steps": self.draft_steps,
            "verify_steps": self.verify_steps,
            "plain_steps": self.plain_steps,
            "mean_tree_size": self.draft_tokens / self.verify_steps if self.verify_steps else 0.0,
            "draft_seconds": self.draft_seconds,
            "verify_seconds": self.verify_seconds,
            "other_seconds": self.other_seconds,
        }

    def merge(self, other: "SpecMetrics") -> None:
        for name in ("draft_tokens", "accepted_tokens", "verify_steps", "plain_steps", "draft_steps",
                     "emitted_in_verify", "draft_seconds", "verify_seconds", "other_seconds"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for i, (p, a) in enumerate(zip(other.position_proposed, other.position_accepted)):
            if i >= len(self.position_proposed):
                self.position_proposed.append(0)
                self.position_accepted.append(0)
            self.position_proposed[i] += p
            self.position_accepted[i] += a


def prediction_usage(prediction: list[int], output: list[int]) -> dict[str, int]:
    """OpenAI's ``completion_tokens_details`` for Predicted Outputs (runtime/prediction.py):
    ``accepted_prediction_tokens``, the prediction's tokens that appear in the answer (an
    alignment of the two token lists: difflib's matching blocks), and
    ``rejected_prediction_tokens``, the rest of the prediction."""
    import difflib

    matcher = difflib.SequenceMatcher(None, prediction, output, autojunk=False)
    accepted = sum(block.size for block in matcher.get_matching_blocks())
    return {"accepted_prediction_tokens": accepted, "rejected_prediction_tokens": len(prediction) - accepted}
