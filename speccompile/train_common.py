"""What the EAGLE and Medusa trainers share: torch, the target's weights, the data.

Both trainers (speccompile/train_draft.py for EAGLE, speccompile/train_medusa.py for
Medusa) read the same self-distillation shards (speccompile/distill.py), restrict their
loss to the same draft vocabulary, hold out the same conversations and project through the
same frozen target ``lm_head``. Those pieces live here, under public names, so that each
trainer imports this module and neither imports the other's internals (the two used to
import each other, which made a cycle).

Nothing here imports torch or the TVM compiler at import time: torch is an optional extra
(``pip install '.[train]'``), and the CLI imports the trainers to list their options.
"""
from __future__ import annotations

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


def target_config(target_dir: Path):
    """The model config of a converted target (``speccompile-config.json``'s ``model_config``)."""
    from .models import config_from_dict
    from .runtime.contract import read_model_config

    conf = read_model_config(Path(target_dir))
    return config_from_dict(conf["model_type"], conf["model_config"])


def target_embedding_and_head(target_dir: Path, tcfg) -> tuple[np.ndarray, np.ndarray]:
    """The target's token embedding and lm_head as float32 [vocab, h] (tied or not).

    Heads are trained against the weights the runtime will use, so q4 weights are
    dequantized exactly as the compiled kernels read them."""
    from .models.quantization import dequantize_q4
    from .runtime.tensor_cache import load_params, read_index, records

    target_dir = Path(target_dir)
    names = {r["name"] for r in records(read_index(target_dir))}

    def get(base: str) -> np.ndarray:
        if f"{base}.q_weight" in names:
            p = load_params(target_dir, [f"{base}.q_weight", f"{base}.q_scale"], verify_md5=False)
            return dequantize_q4(p[f"{base}.q_weight"], p[f"{base}.q_scale"]).astype(np.float32)
        return load_params(target_dir, [f"{base}.weight"], verify_md5=False)[f"{base}.weight"].astype(np.float32)

    emb = get("embed_tokens")
    head = emb if tcfg.tie_word_embeddings else get("lm_head")
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
