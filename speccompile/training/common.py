"""What the EAGLE and Medusa trainers share: torch, the target's weights, the data.

Both trainers (speccompile/training/eagle.py for EAGLE, speccompile/training/medusa.py for
Medusa) read the same self-distillation shards (speccompile/training/distill.py), restrict their
loss to the same draft vocabulary, hold out the same conversations and project through the
same frozen target ``lm_head``. Those pieces live here, under public names, so that each
trainer imports this module and neither imports the other's internals (the two used to
import each other, which made a cycle).

Nothing here imports torch or the TVM compiler at import time: torch is an optional extra
(``pip install '.[train]'``), and the CLI imports the trainers to list their options.
"""
from __future__ import annotations

import functools
import time
from pathlib import Path

import numpy as np


def require_torch():
    """The torch module, or a one-line exit telling how to install it.

    Called first by every training entry point, so a missing extra is reported before
    hours of self-distillation rather than after."""
    try:
        import torch
    except ImportError as err:
        raise SystemExit("train-draft needs torch: pip install '.[train]' (or make install, which includes it)") from err
    return torch


@functools.cache
def _libc():
    import ctypes
    import ctypes.util

    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


def release_free_memory() -> None:
    """Hand the allocator's free pages back to the system (glibc ``malloc_trim``; elsewhere a
    no-op). Why: torch's CPU tensors of a training step change size with every batch, and
    glibc keeps what they freed. The EAGLE-3 run on Qwen2.5-Coder-1.5B grew from 5 GB to 15 GB
    of anonymous memory in 55 minutes (of 24 GB); one malloc_trim brought it to 4 GB."""
    trim = getattr(_libc(), "malloc_trim", None)
    if trim is not None:
        trim(0)


def target_config(target_dir: Path):
    """The model config of a converted target (``speccompile-config.json``'s ``model_config``)."""
    from speccompile.models import config_from_dict
    from speccompile.runtime.contract import read_model_config

    conf = read_model_config(Path(target_dir))
    return config_from_dict(conf["model_type"], conf["model_config"])


def target_weight(target_dir: Path, base: str) -> np.ndarray:
    """One of the target's weights as float32 (``embed_tokens``, ``layers.25.mlp.down_proj``, ...),
    q4 weights dequantized exactly as the compiled kernels read them: heads are trained
    against the weights the runtime will use."""
    from speccompile.models.quantization import dequantize_q4
    from speccompile.runtime.tensor_cache import load_params, read_index, records

    target_dir = Path(target_dir)
    names = {r["name"] for r in records(read_index(target_dir))}
    if f"{base}.q_weight" in names:
        p = load_params(target_dir, [f"{base}.q_weight", f"{base}.q_scale"], verify_md5=False)
        return dequantize_q4(p[f"{base}.q_weight"], p[f"{base}.q_scale"]).astype(np.float32)
    name = base if base in names else f"{base}.weight"
    return np.array(load_params(target_dir, [name], verify_md5=False)[name], np.float32)  # a writable copy


def target_embedding_and_head(target_dir: Path, tcfg) -> tuple[np.ndarray, np.ndarray]:
    """The target's token embedding and lm_head as float32 [vocab, h] (tied or not)."""
    emb = target_weight(target_dir, "embed_tokens")
    head = emb if tcfg.tie_word_embeddings else target_weight(target_dir, "lm_head")
    return np.ascontiguousarray(emb), np.ascontiguousarray(head)


class Features:
    """Conversations from the feature shards: (tokens [L], feats [L, h] fp16, answer start)."""

    def __init__(self, paths: list[Path]):
        self.items = []
        for p in paths:
            z = np.load(p)
            toks, feats, starts, ans = z["tokens"], z["feats"], z["starts"], z["answer_start"]
            ends = list(starts[1:]) + [len(toks)]
            for s, e, a in zip(starts, ends, ans):
                self.items.append((toks[s:e], feats[s:e], int(a)))

    def answer_tokens(self) -> np.ndarray:
        return np.concatenate([t[a:] for t, _, a in self.items])


def draft_vocabulary(tokens: np.ndarray, size: int, vocab_size: int) -> np.ndarray:
    """The ``size`` ids most frequent in the target's answers (ties: lower id)."""
    counts = np.bincount(tokens, minlength=vocab_size)
    order = np.lexsort((np.arange(vocab_size), -counts))
    return np.sort(order[:min(size, vocab_size)])


def split_held_out(items: list, every: int = 25) -> tuple[list, list]:
    """Every ``every``-th conversation is held out (none when there are too few to spare):
    the training top-1 overstates what a head does on new prompts, so checkpoints are
    chosen on conversations the head never trained on."""
    if len(items) < 2 * every:
        return items, []
    return [x for i, x in enumerate(items) if i % every], items[::every]


# ------------------------------------------------------------------ torch layers
def llama_blocks(torch):
    """(RMSNorm, Attention, MLP): the Llama pieces both torch heads are built of (EAGLE-1 in
    training/eagle.py, EAGLE-3 in training/eagle3_torch.py), with HF's parameter names, so a head's
    state dict is already in the published layout. Built per call: torch is imported late."""
    nn, F = torch.nn, torch.nn.functional

    class RMSNorm(nn.Module):
        def __init__(self, width: int, eps: float):
            super().__init__()
            self.weight, self.eps = nn.Parameter(torch.ones(width)), eps

        def forward(self, x):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight

    class Attention(nn.Module):
        """Causal GQA self-attention of a ``cfg``-sized layer reading rows ``in_width`` wide
        (EAGLE-3's reads [embedding, feature]: 2h)."""

        def __init__(self, cfg, in_width: int, bias: bool = False):
            super().__init__()
            self.nh, self.nkv, self.hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
            self.q_proj = nn.Linear(in_width, self.nh * self.hd, bias=bias)
            self.k_proj = nn.Linear(in_width, self.nkv * self.hd, bias=bias)
            self.v_proj = nn.Linear(in_width, self.nkv * self.hd, bias=bias)
            self.o_proj = nn.Linear(self.nh * self.hd, cfg.hidden_size, bias=False)

        def forward(self, x, cos, sin):
            # x: [b, n, in_width]; cos, sin: [1, 1, n, hd] -> [b, n, hidden]
            b, n, _ = x.shape
            nh, nkv, hd = self.nh, self.nkv, self.hd
            q = rope(self.q_proj(x).view(b, n, nh, hd).transpose(1, 2), cos, sin)
            k = rope(self.k_proj(x).view(b, n, nkv, hd).transpose(1, 2), cos, sin)
            v = self.v_proj(x).view(b, n, nkv, hd).transpose(1, 2)
            k, v = k.repeat_interleave(nh // nkv, 1), v.repeat_interleave(nh // nkv, 1)
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.o_proj(out.transpose(1, 2).reshape(b, n, nh * hd))

    class MLP(nn.Module):
        def __init__(self, width: int, inter: int):
            super().__init__()
            self.gate_proj = nn.Linear(width, inter, bias=False)
            self.up_proj = nn.Linear(width, inter, bias=False)
            self.down_proj = nn.Linear(inter, width, bias=False)

        def forward(self, x):
            return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))

    return RMSNorm, Attention, MLP


def rope(x, cos, sin):
    """Rotate-half RoPE (HF Llama), x: [b, heads, n, hd]."""
    import torch

    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], -1) * sin


def rope_tables(n: int, head_dim: int, theta: float, torch):
    """cos, sin [1, 1, n, head_dim] for positions 0..n-1."""
    inv = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    ang = np.arange(n, dtype=np.float64)[:, None] * inv[None]
    cos = np.concatenate([np.cos(ang)] * 2, -1).astype(np.float32)
    sin = np.concatenate([np.sin(ang)] * 2, -1).astype(np.float32)
    return torch.from_numpy(cos)[None, None], torch.from_numpy(sin)[None, None]


@functools.cache
def bf16_pays(torch) -> bool:
    """bf16 autocast where this CPU multiplies bf16 faster than fp32 (AVX-512 BF16 or AMX:
    2-5x here), measured rather than assumed from the host's name. Both head trainers use it.
    Measured once per process, on a product small enough that a CPU which emulates bf16
    (seconds per product at training sizes) answers in well under a second."""
    a = torch.randn(256, 1024)
    b = torch.randn(1024, 1024)

    def best(dt, give_up: float = float("inf")) -> float:
        x, y = a.to(dt), b.to(dt)
        x @ y
        times = []
        for _ in range(4):
            t = time.perf_counter()
            x @ y
            times.append(time.perf_counter() - t)
            if times[-1] > give_up:  # already slower than it needs to be: emulated
                break
        return min(times)

    fp32 = best(torch.float32)
    return best(torch.bfloat16, give_up=2 * fp32) < 0.8 * fp32
