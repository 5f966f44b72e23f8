"""One generation request as the engine carries it from step to step (public: the
scheduler holds these, and tests build them through ``Engine.new_sequence``).

A ``Sequence`` owns everything that is per request: its token history, budget, sampling
parameters and random stream, stop strings, streaming detokenizer and its result. The
engine's steps read and extend it; the scheduler only decides which sequences take part.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .metrics import SpecMetrics, prediction_usage
from .sampling import SamplingParams
from .tokenizer import StreamDecoder


class GenerationError(ValueError):
    """A request that cannot run as asked (bad prompt, options, or a full cache); the
    message says what to change."""


@dataclass
class Stats:
    prefill_tokens: int = 0
    prefill_seconds: float = 0.0
    cached_prompt_tokens: int = 0  # prompt tokens whose KV a kept sequence held (runtime/prefix_cache.py)
    decode_tokens: int = 0
    decode_seconds: float = 0.0
    spec: SpecMetrics | None = None
    grammar_steps: int = 0  # decode steps under a grammar, and the seconds its masks took in them
    grammar_seconds: float = 0.0

    def to_dict(self) -> dict:
        out = {
            "prefill_tokens": self.prefill_tokens,
            "cached_prompt_tokens": self.cached_prompt_tokens,
            "decode_tokens": self.decode_tokens,
            "prefill_tokens_per_s": self.prefill_tokens / self.prefill_seconds if self.prefill_seconds else 0.0,
            "decode_tokens_per_s": self.decode_tokens / self.decode_seconds if self.decode_seconds else 0.0,
            "prefill_seconds": self.prefill_seconds,  # the time to the first token
            "decode_seconds": self.decode_seconds,
            "request_seconds": self.prefill_seconds + self.decode_seconds,  # what the caller waited, end to end
        }
        if self.grammar_steps:
            out["grammar_ms_per_step"] = 1e3 * self.grammar_seconds / self.grammar_steps
        if self.spec is not None:
            out.update(self.spec.to_dict())
        return out


@dataclass
class GenerationResult:
    prompt_token_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None
    stats: Stats = field(default_factory=Stats)
    logprobs: list | None = None  # per token: (id, logprob, [(id, logprob)] of the top ones), when asked for
    prediction: list[int] | None = None  # the request's prediction (Predicted Outputs), if any

    def to_dict(self) -> dict:
        out = {"prompt_token_ids": self.prompt_token_ids, "token_ids": self.token_ids, "text": self.text,
               "finish_reason": self.finish_reason, "stats": self.stats.to_dict()}
        if self.prediction is not None:
            out["completion_tokens_details"] = prediction_usage(self.prediction, self.token_ids)
        if self.logprobs is not None:
            out["logprobs"] = [{"token_id": t, "logprob": lp, "top_logprobs": [{"token_id": i, "logprob": v}
                                                                                for i, v in top]}
                               for t, lp, top in self.logprobs]
        return out


@dataclass
class Sequence:
    """One sequence in the decode loop."""

    seq_id: int
    history: list[int]  # prompt + emitted tokens; history[-1] is not yet in the target's KV
    budget: int  # most tokens to emit
    sampling: SamplingParams
    rng: np.random.Generator
    stop: list[str]
    ignore_eos: bool
    result: GenerationResult
    decoder: StreamDecoder
    pending_text: str = ""  # text emitted since the caller last took it
    to_prefill: list[int] = field(default_factory=list)  # history not yet in the target's KV (besides history[-1])
    speculative: bool = True  # False: never drafted for (a server's per-request A/B)
    grammar: Any = None  # runtime/grammar.py Constraint: the structure every token obeys, or None
    top_logprobs: int | None = None  # report logprobs with this many alternatives (0..20); None: none
    tenant: str | None = None  # whose earlier requests may draft for this one (a server's API key); None: none
    prefill_from: "Sequence | None" = None  # a sequence of the same prompt whose prefill this one copies (n > 1)
    shares_prefill: bool = False  # other choices copy this one's prefill: keep its first_logits
    first_logits: np.ndarray | None = None  # [vocab] its prompt's last row, kept while other choices copy it

    @property
    def done(self) -> bool:
        return self.result.finish_reason is not None

    @property
    def prefilling(self) -> bool:
        return bool(self.to_prefill)

    def emit(self, tokens: list[int], stop_token_ids: set[int]) -> int:
        """Append accepted tokens, stopping at EOS, a stop string or the budget; returns
        how many were emitted (tokens past a stop are dropped, never shown)."""
        n = 0
        for tok in tokens:
            if tok in stop_token_ids and not self.ignore_eos:
                self.result.finish_reason = "stop"
                break
            self.history.append(tok)
            self.result.token_ids.append(tok)
            n += 1
            delta = self.decoder.push([tok])
            hit = find_stop(self.decoder.text, self.stop)
            if hit is not None:
                self.pending_text += delta[: max(0, len(delta) - (len(self.decoder.text) - hit))]
                self.result.text = self.decoder.text[:hit]
                self.result.finish_reason = "stop"
                break
            self.pending_text += delta
            self.result.text = self.decoder.text
            if len(self.result.token_ids) >= self.budget:
                self.result.finish_reason = "length"
                break
        return n


def find_stop(text: str, stop: list[str] | None) -> int | None:
    """Where the earliest stop string begins in text, or None."""
    if not stop:
        return None
    hits = [text.find(s) for s in stop if s and s in text]
    return min(hits) if hits else None
