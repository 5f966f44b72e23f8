"""Token sampling from logits: greedy, temperature, top-k, top-p (numpy, per sequence).

``probs_from_logits`` is the one place that turns logits into the distribution that is
sampled from; speculative verification applies the same function to target and draft.
Penalties, logit biases and min-p change the logits first, row by row (runtime/penalties.py).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .options import check_options, option

# commands that take sampling options (a server's requests carry their own; bench: --one-shot's processes)
SAMPLED = ("generate", "chat", "bench")


@dataclass
class SamplingParams:
    """A request's sampling (runtime/options.py: one definition each; not --overrides keys)."""

    temperature: float = option(0.0, "0 = greedy (the target's own argmax, speculation included)", low=0.0,
                                override=False, commands=SAMPLED)
    top_p: float = option(1.0, "nucleus sampling: the smallest set of tokens holding this much probability", low=0.0,
                          high=1.0, open_low=True, override=False, commands=SAMPLED)
    top_k: int = option(0, "sample among the k likeliest tokens; 0 = all", low=0, override=False, commands=SAMPLED)
    seed: int | None = option(None, "seed of the request's random numbers (default: fresh)", kind=int, override=False,
                              commands=SAMPLED)
    min_p: float = option(0.0, "drop tokens less likely than min_p times the likeliest one; 0 = off", low=0.0,
                          high=1.0, override=False, commands=SAMPLED)
    frequency_penalty: float = option(0.0, "subtract this times a token's count in the output so far (OpenAI's)",
                                      low=-2.0, high=2.0, override=False, commands=SAMPLED)
    presence_penalty: float = option(0.0, "subtract this from every token already in the output (OpenAI's)",
                                     low=-2.0, high=2.0, override=False, commands=SAMPLED)
    repetition_penalty: float = option(1.0, "divide positive logits (multiply negative ones) of tokens in the prompt "
                                       "or output by this (HF's and llama.cpp's); 1 = off", low=0.0, high=10.0,
                                       open_low=True, override=False, commands=SAMPLED)
    # ((token id, bias), ...); the CLI form is "ID:BIAS,ID:BIAS", the API's {"ID": BIAS}
    logit_bias: tuple[tuple[int, float], ...] = option((), "add BIAS to token ID's logit, -100..100 (-100 bans it): "
                                                       "ID:BIAS,ID:BIAS", kind=str, override=False, commands=SAMPLED)

    def __post_init__(self) -> None:
        object.__setattr__(self, "logit_bias", parse_logit_bias(self.logit_bias))
        check_options(self)

    @property
    def adjusts_logits(self) -> bool:
        """Whether this request changes the target's logits before sampling (runtime/penalties.py)."""
        return bool(self.frequency_penalty or self.presence_penalty or self.repetition_penalty != 1.0
                    or self.logit_bias or (self.min_p and not self.greedy))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def parse_logit_bias(value) -> tuple[tuple[int, float], ...]:
    """``"ID:BIAS,..."`` (the CLI), ``{"ID": BIAS}`` (OpenAI's JSON) or pairs -> sorted (id, bias)
    pairs; a key that is not a token id or a bias outside -100..100 raises ValueError naming it."""
    if not value:
        return ()
    if isinstance(value, str):
        pairs = []
        for item in (p for p in value.split(",") if p.strip()):
            key, sep, bias = item.partition(":")
            if not sep:
                raise ValueError(f"logit_bias item {item!r}: write TOKEN_ID:BIAS, e.g. 1234:-100")
            pairs.append((key.strip(), bias.strip()))
    else:
        pairs = list(value.items()) if isinstance(value, dict) else list(value)
    out = {}
    for key, bias in pairs:
        try:
            token = int(key)
        except (TypeError, ValueError):
            raise ValueError(f"logit_bias key {key!r} is not a token id (an integer)") from None
        try:
            b = float(bias)
        except (TypeError, ValueError):
            raise ValueError(f"logit_bias[{key}] = {bias!r} is not a number") from None
        if token < 0 or not -100.0 <= b <= 100.0:
            raise ValueError(f"logit_bias[{key}] = {bias}: token ids are >= 0 and biases within -100..100")
        out[token] = b
    return tuple(sorted(out.items()))


def probs_from_logits(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """logits [..., vocab] -> probabilities with temperature, top-k and top-p applied."""
    z = logits.astype(np.float64) / params.temperature
    if params.top_k and params.top_k < z.shape[-1]:
        kth = np.partition(z, -params.top_k, axis=-1)[..., -params.top_k][..., None]
        z = np.where(z < kth, -np.inf, z)
    z = z - z.max(axis=-1, keepdims=True)
    p = np.exp(z)
    p /= p.sum(axis=-1, keepdims=True)
    if params.top_p < 1.0:
        keep = np.zeros(p.shape, dtype=bool)
        for row, out in zip(p.reshape(-1, p.shape[-1]), keep.reshape(-1, p.shape[-1])):
            out[_nucleus(row, params.top_p)] = True
        p = np.where(keep, p, 0.0)
        p /= p.sum(axis=-1, keepdims=True)
    return p


def _nucleus(p: np.ndarray, top_p: float, first: int = 64) -> np.ndarray:
    """Indices of the smallest prefix of ``p`` [vocab], in descending order (ties by index), that
    holds ``top_p``: every token whose predecessors in that order hold less than ``top_p``.

    Why not one argsort: sorting a 152k vocabulary costs ~25 ms a row, more than a 1.5B model's
    decode step on two cores, and the nucleus is almost always a few dozen tokens. So the
    likeliest ``first`` tokens with mass are found by partition, with every token tied with the last of them
    (so the candidates are exactly a prefix of the full order), and sorted alone; only when they
    hold less than ``top_p`` is the set widened (up to the whole vocabulary). The cumulative sums
    run over the same values in the same order as a full sort's, so the set is the same, bit for bit."""
    # Only tokens with mass are ranked: a top-k below ``first`` leaves the rest at 0, and the
    # zeros sort last, after the whole mass, so they join only if rounding left that mass short
    # of top_p. (np.partition over a 152k row of tied zeros took ~40 ms.)
    nz = np.flatnonzero(p)  # ascending index: the tie order of a stable sort
    pn, m = p[nz], len(nz)
    k = min(first, m)
    while True:
        kth = np.partition(pn, m - k)[m - k] if k < m else -np.inf
        cand = nz[pn >= kth]
        order = cand[np.argsort(-p[cand], kind="stable")]
        sorted_p = p[order]
        cum = np.cumsum(sorted_p)
        if k >= m or cum[-1] >= top_p:
            keep = order[(cum - sorted_p) < top_p]
            return keep if cum[-1] >= top_p else np.concatenate([keep, np.flatnonzero(p == 0)])
        k *= 4


def sample(logits: np.ndarray, params: SamplingParams, rng: np.random.Generator) -> int:
    """One token from one row of logits [vocab]."""
    if params.greedy:
        return int(np.argmax(logits))
    return draw(probs_from_logits(logits, params), rng)


def draw(p: np.ndarray, rng: np.random.Generator) -> int:
    """``rng.choice(len(p), p=p)``'s token from the same random number, by the inverse CDF over
    the tokens with mass only: their partial sums are the full row's (zeros add nothing), and
    the first index past the draw always has mass. Why: after a top-k or top-p most of a 152k
    row is zero, and the full row's CDF took ~1.2 ms a draw (0.5 ms over the support, Zen 4)."""
    support = np.flatnonzero(p)
    cdf = np.cumsum(p[support])
    cdf /= cdf[-1]
    return int(support[cdf.searchsorted(rng.random(), side="right")])


def token_logprobs(logits: np.ndarray, tokens: list[int], temperature: float, top: int) -> list[tuple]:
    """What OpenAI's ``logprobs`` report for tokens chosen at rows of logits [n, vocab]: per
    row (token, its log-probability, the ``top`` most likely (token, log-probability) pairs).
    The distribution is the one the token was drawn from before top-k/top-p truncation:
    logits / temperature (temperature 1 when decoding greedily), grammar masks included
    (forbidden tokens are -inf and never listed)."""
    z = logits.astype(np.float64) / (temperature if temperature > 0 else 1.0)
    z = z - z.max(axis=-1, keepdims=True)
    lp = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
    out = []
    for row, tok in zip(lp, tokens):
        best = []
        if top:
            idx = np.argpartition(-row, top - 1)[:top]
            idx = idx[np.argsort(-row[idx], kind="stable")]
            best = [(int(i), float(row[i])) for i in idx if np.isfinite(row[i])]
        out.append((int(tok), float(row[tok]), best))
    return out
