"""Rotary position embeddings: the per-layer frequency table every family's attention uses.

Why a table: the families differ only in how the inverse frequencies are made (plain
``theta^(-2i/d)``, Llama 3's band-wise scaling, Phi's LongRoPE factors, YaRN, a linear
factor), in how many of a head's dims rotate (Phi's partial rotary), and in a factor on
cos/sin (LongRoPE, YaRN). The kernels (kernels/attention.py, kernels/attention_gpu.py) take
a :class:`Rope` and rotate by ``angle = position * inv_freq[i]`` from its table, so each
family is a few lines here and none in the kernels. The tables are computed in float32 the
way transformers computes them, so logits match its reference within float rounding.

Gemma 3 uses two ropes, one for its sliding-window layers and one for its global layers:
:func:`layer_ropes` gives one per layer. Pure numpy: conversion and the runtime read it
without TVM's compiler.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "longrope", "yarn", "freq_factors")


class RopeError(ValueError):
    """A RoPE setting that cannot be used; the message says which and what is supported."""


@dataclass(frozen=True)
class Rope:
    """What the attention kernels need: ``rotary_dim`` leading dims of each head rotate (the
    rest pass through), pair ``i`` (of ``rotary_dim // 2``) by ``position * inv_freq[i]``,
    and cos/sin are multiplied by ``scale``. Frozen and hashable: kernels are cached by it."""

    rotary_dim: int
    inv_freq: tuple[float, ...]  # float32 values
    scale: float = 1.0

    def angles(self, positions: np.ndarray) -> np.ndarray:
        """[n] positions -> [n, rotary_dim // 2] float32 angles, as the kernels compute them."""
        return np.asarray(positions, np.float32)[:, None] * np.asarray(self.inv_freq, np.float32)[None, :]


def _base_inv_freq(theta: float, dim: int) -> np.ndarray:
    # float32, as transformers: 1 / theta ** (arange(0, dim, 2) / dim)
    exponent = np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / np.float32(dim)
    return (np.float32(1.0) / np.power(np.float32(theta), exponent, dtype=np.float32)).astype(np.float32)


def make_rope(params: dict[str, Any] | None, theta: float, head_dim: int, partial_rotary_factor: float = 1.0,
              max_position_embeddings: int = 0) -> Rope:
    """The Rope of an HF ``rope_parameters`` / ``rope_scaling`` dict (None: plain RoPE)."""
    params = dict(params or {})
    kind = params.get("rope_type", params.get("type")) or "default"
    theta = float(params.get("rope_theta", theta))
    partial = float(params.get("partial_rotary_factor", partial_rotary_factor))
    dim = int(head_dim * partial)
    if dim % 2 or not 0 < dim <= head_dim:
        raise RopeError(f"partial_rotary_factor {partial} gives {dim} rotary dims of {head_dim}: must be even")
    inv = _base_inv_freq(theta, dim)
    scale = 1.0
    if kind == "default":
        pass
    elif kind == "linear":
        inv = (inv / np.float32(params["factor"])).astype(np.float32)
    elif kind == "llama3":
        inv = _llama3(inv, params)
    elif kind == "longrope":
        inv, scale = _longrope(params, theta, dim, max_position_embeddings)
    elif kind == "yarn":
        inv, scale = _yarn(params, theta, dim, max_position_embeddings)
    elif kind == "freq_factors":  # llama.cpp's rope_freqs tensor (how its GGUFs carry Llama 3's bands)
        (factors,) = _need(params, "factors")
        if len(factors) != dim // 2:
            raise RopeError(f"rope_freqs has {len(factors)} factors; the {dim} rotary dims need {dim // 2}")
        inv = (inv / np.asarray(factors, np.float32)).astype(np.float32)
    else:
        raise RopeError(f"rope_type {kind!r} is not supported; supported: {', '.join(SUPPORTED_ROPE_TYPES)}")
    return Rope(dim, tuple(float(f) for f in np.asarray(inv, np.float32)), float(scale))


def _need(params: dict[str, Any], *keys: str) -> list[Any]:
    missing = [k for k in keys if params.get(k) is None]
    if missing:
        raise RopeError(f"rope_type {params.get('rope_type', params.get('type'))!r} needs {', '.join(missing)}")
    return [params[k] for k in keys]


def _llama3(inv: np.ndarray, params: dict[str, Any]) -> np.ndarray:
    """Llama 3.1's bands: long wavelengths divided by ``factor``, short ones kept, the band
    between interpolated smoothly."""
    factor, low, high, old = _need(params, "factor", "low_freq_factor", "high_freq_factor",
                                   "original_max_position_embeddings")
    low_wavelen, high_wavelen = old / low, old / high
    wavelen = np.float32(2 * math.pi) / inv
    scaled = np.where(wavelen > low_wavelen, inv / np.float32(factor), inv).astype(np.float32)
    smooth = ((np.float32(old) / wavelen - np.float32(low)) / np.float32(high - low)).astype(np.float32)
    smoothed = ((1 - smooth) * scaled / np.float32(factor) + smooth * scaled).astype(np.float32)
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return np.where(medium, smoothed, scaled).astype(np.float32)


def _longrope(params: dict[str, Any], theta: float, dim: int, max_pos: int) -> tuple[np.ndarray, float]:
    """LongRoPE's per-pair short factors, and its attention factor on cos/sin. The long
    factors apply past ``original_max_position_embeddings``; a model using this rope is
    served up to that length (:func:`rope_context_limit`), where the short ones hold."""
    short, old = _need(params, "short_factor", "original_max_position_embeddings")
    if len(short) != dim // 2:
        raise RopeError(f"longrope short_factor has {len(short)} entries; the {dim} rotary dims need {dim // 2}")
    factor = params.get("factor") or (max_pos / old if max_pos else 1.0)
    attention = params.get("attention_factor")
    if attention is None:
        attention = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(old))
    shape = np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / np.float32(dim)
    base = np.power(np.float32(theta), shape, dtype=np.float32)
    inv = np.float32(1.0) / (np.asarray(short, np.float32) * base)
    return inv.astype(np.float32), float(attention)


def _yarn(params: dict[str, Any], theta: float, dim: int, max_pos: int) -> tuple[np.ndarray, float]:
    """YaRN: interpolation below ``beta_slow`` rotations over the original context,
    extrapolation above ``beta_fast``, a linear ramp between; cos/sin scaled by
    ``0.1 ln(factor) + 1`` (``mscale`` forms as transformers reads them)."""
    (factor,) = _need(params, "factor")
    old = params.get("original_max_position_embeddings") or max_pos
    if not old:
        raise RopeError("rope_type 'yarn' needs original_max_position_embeddings")

    def get_mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention = params.get("attention_factor")
    if attention is None:
        mscale, mscale_all = params.get("mscale"), params.get("mscale_all_dim")
        attention = (get_mscale(factor, mscale) / get_mscale(factor, mscale_all) if mscale and mscale_all
                     else get_mscale(factor))
    beta_fast, beta_slow = params.get("beta_fast") or 32, params.get("beta_slow") or 1

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(old / (rotations * 2 * math.pi))) / (2 * math.log(theta))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if params.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(dim // 2, dtype=np.float32) - np.float32(low)) / np.float32(high - low), 0, 1)
    extrapolation_factor = (1 - ramp).astype(np.float32)
    pos_freqs = np.power(np.float32(theta), np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / np.float32(dim),
                         dtype=np.float32)
    extrapolation, interpolation = np.float32(1.0) / pos_freqs, np.float32(1.0) / (np.float32(factor) * pos_freqs)
    inv = interpolation * (1 - extrapolation_factor) + extrapolation * extrapolation_factor
    return inv.astype(np.float32), float(attention)


def rope_context_limit(params: dict[str, Any] | None) -> int:
    """The longest context a rope is exact for here (0: no limit of its own)."""
    params = params or {}
    if (params.get("rope_type", params.get("type")) or "default") == "longrope":
        return int(params.get("original_max_position_embeddings") or 0)
    return 0
