"""``speccompile train-draft --method medusa``: train Medusa-1 heads for a converted target.

The data is the EAGLE path's (speccompile/training/distill.py): the target's own greedy answers and
its final-normed feature of every token, read through ``training/common.Features``. A work dir
holding EAGLE data serves Medusa too (only the checkpoint file differs).

The heads are exactly what models/medusa.py compiles: head k is ``num_layers`` residual
blocks ``x + SiLU(Linear(x))`` and a bias-free Linear to the vocabulary, and from the
feature at position t it predicts token t+k+2 (runtime/drafters/medusa.py: the feature of position
L-1 drafts tokens L+1, L+2, ...; the target's own logits give token L).

Training choices, and why:
- each vocabulary Linear starts as the target's lm_head and every residual Linear at zero,
  so an untrained head is the base lm_head (the Medusa paper's initialisation);
- the vocabulary Linear is frozen by default (``--medusa-freeze-lm-head``): the blocks
  alone are cheap to train on a CPU, and the exported weight is the target's lm_head;
- like EAGLE, the loss is a cross entropy over a draft vocabulary (the ``draft_vocab``
  tokens most frequent in the target's answers), head k weighted 0.8**k, on the rows the
  runtime drafts from (the last prompt token's feature and the answer's; every label is an
  answer token); with the projection frozen the heads are exported with that vocabulary
  (``d2t``, no vocabulary weights), so the runtime drafts over it too;
- rows are independent (a head sees one feature), so a step takes every answer row of
  ``batch`` conversations without padding, and each head backpropagates on its own;
- every 25th conversation is held out and the checkpoint with the best mean held-out top-1
  over heads is exported (``training/common.split_held_out``).
"""
from __future__ import annotations

import json
import math
import time
from pathlib import Path

import numpy as np

from speccompile.training.common import (Features, bf16_pays, draft_vocabulary, require_torch, split_held_out, target_config,
                           target_embedding_and_head)

HEAD_DECAY = 0.8  # head k's loss weight is HEAD_DECAY ** k: later heads are less often reached


def build_medusa(hidden: int, num_heads: int, num_layers: int, torch, lm_head: np.ndarray | None = None):
    """The heads in torch, named as FasterDecoding names them (``medusa_head.I.J.linear.*``).
    With ``lm_head`` (the target's, [vocab, h]) each head also holds its own trainable
    vocabulary Linear ``medusa_head.I.{num_layers}`` initialised from it; without, the
    vocabulary projection is shared and frozen outside the module."""
    nn = torch.nn

    class ResBlock(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(hidden, hidden, bias=True)
            nn.init.zeros_(self.linear.weight)  # SiLU(0) = 0: the block starts as the identity
            nn.init.zeros_(self.linear.bias)

        def forward(self, x):
            return x + torch.nn.functional.silu(self.linear(x))

    class Medusa(nn.Module):
        def __init__(self):
            super().__init__()
            heads = []
            for _ in range(num_heads):
                blocks = [ResBlock() for _ in range(num_layers)]
                if lm_head is not None:
                    out = nn.Linear(hidden, lm_head.shape[0], bias=False)
                    with torch.no_grad():
                        out.weight.copy_(torch.from_numpy(lm_head))
                    blocks.append(out)
                heads.append(nn.ModuleList(blocks))
            self.medusa_head = nn.ModuleList(heads)
            self.trains_lm_head = lm_head is not None

        def features(self, k: int, x):
            """Head k's input to its vocabulary projection."""
            blocks = list(self.medusa_head[k])
            for block in blocks[:num_layers]:
                x = block(x)
            return x

        def vocab_rows(self, k: int, rows):
            """Head k's vocabulary weight restricted to the ids ``rows`` (trainable only when not frozen)."""
            return self.medusa_head[k][num_layers].weight[rows]

    return Medusa()


# ------------------------------------------------------------------ data
def answer_items(split_dir: Path) -> list:
    """(tokens [L], final hidden states [L-1, h] fp16, answer start) of train-answers' conversations."""
    from speccompile.training.answers import conversations, read_shards

    return [(t, f, plen) for shard in read_shards(split_dir) for _, t, plen, f in conversations(shard, hidden=True)]


def medusa_rows(items: list, num_heads: int) -> tuple[np.ndarray, np.ndarray]:
    """The training rows of some conversations: features f_i [N, h] (float32) and labels
    [K, N], t_{i+k+2} for head k (-1 past the end of the conversation).

    Rows are the ones the runtime drafts from: the feature of the last prompt token
    (position a-1, whose logits give the first answer token t_a) and every answer
    feature after it, so every label is an answer token. (EAGLE's mask also keeps row
    a-2, whose label t_a the target itself produces at prefill; no Medusa head is ever
    asked for it.)"""
    feats, labels = [], []
    for t, f, a in items:
        first, n = max(0, a - 1), len(t) - 2  # head 0 of row n-1 predicts the last token
        if n <= first:
            continue
        lab = np.full((num_heads, n - first), -1, np.int64)
        for k in range(num_heads):
            pos = np.arange(first, n) + k + 2
            ok = pos < len(t)
            lab[k, ok] = t[pos[ok]]
        feats.append(f[first:n])
        labels.append(lab)
    if not feats:
        return np.zeros((0, 0), np.float32), np.zeros((num_heads, 0), np.int64)
    return np.concatenate(feats).astype(np.float32), np.concatenate(labels, 1)


def _head_losses(model, feats, labels, lm, remap_t, vocab_t, torch, backward: bool) -> list[dict]:
    """Per head: cross entropy over the draft vocabulary and top-1 hits on labelled rows.
    With ``backward`` each head's weighted loss is backpropagated at once (heads share no
    parameters and the features are data, so this equals one backward of the sum while
    keeping only one head's logits alive)."""
    out = []
    lab_all = remap_t[labels.clamp(min=0)].masked_fill(labels < 0, -1)
    for k in range(lab_all.shape[0]):
        lab = lab_all[k]
        keep = lab >= 0
        if not bool(keep.any()):
            out.append({"loss": 0.0, "hits": 0.0, "rows": 0.0})
            continue
        x = model.features(k, feats[keep])
        w = model.vocab_rows(k, vocab_t) if model.trains_lm_head else lm
        logits = x @ w.T
        loss = torch.nn.functional.cross_entropy(logits, lab[keep])
        if backward:
            (HEAD_DECAY ** k * loss).backward()
        with torch.no_grad():
            hits = float((logits.argmax(-1) == lab[keep]).float().sum())
        out.append({"loss": float(loss.detach()), "hits": hits, "rows": float(keep.sum())})
    return out


def held_out_score(model, items: list, lm, remap_t, vocab_t, num_heads: int, torch, chunk: int = 2048,
                   bf16: bool = False) -> dict:
    """Top-1 of every head on held-out answers, their mean (the checkpoint score), the mean
    cross entropy per head, and a chain's expected accepted drafts a1 + a1*a2 + ..."""
    feats, labels = medusa_rows(items, num_heads)
    hits, rows, nll = np.zeros(num_heads), np.zeros(num_heads), np.zeros(num_heads)
    model.eval()
    with torch.no_grad():
        for s in range(0, feats.shape[0], chunk):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                st = _head_losses(model, torch.from_numpy(feats[s:s + chunk]), torch.from_numpy(labels[:, s:s + chunk]),
                                  lm, remap_t, vocab_t, torch, backward=False)
            hits += [r["hits"] for r in st]
            rows += [r["rows"] for r in st]
            nll += [r["loss"] * r["rows"] for r in st]
    model.train()
    top1 = hits / np.maximum(rows, 1.0)
    return {"top1": [round(float(a), 4) for a in top1], "mean_top1": round(float(top1.mean()), 4),
            "loss": [round(float(x), 4) for x in nll / np.maximum(rows, 1.0)],
            "expected_chain": round(float(np.cumprod(top1).sum()), 4)}


# ------------------------------------------------------------------ training
def train_medusa(feature_paths: list[Path], target_dir: Path, out_dir: Path, steps: int, batch: int = 4,
                 num_heads: int = 4, num_layers: int = 1, freeze_lm_head: bool = True, lr: float = 1e-3,
                 draft_vocab: int = 16384, seed: int = 0, checkpoint_every: int = 200, progress: bool = True,
                 checkpoint: Path | None = None, answers: Path | None = None) -> dict:
    """``answers``: train-answers' folder (its train and held_out splits, hidden states kept
    beside the EAGLE-3 features) instead of ``feature_paths`` (distill.py's shards)."""
    torch = require_torch()
    from tqdm import tqdm

    check_medusa_options(num_heads, num_layers, freeze_lm_head)
    torch.manual_seed(seed)
    tcfg = target_config(target_dir)
    _, head_w = target_embedding_and_head(target_dir, tcfg)
    if answers is not None:
        train_items, held_out = answer_items(Path(answers) / "train"), answer_items(Path(answers) / "held_out")
    else:
        train_items, held_out = split_held_out(Features(feature_paths).items)
    if medusa_rows(train_items, num_heads)[0].shape[0] == 0:
        raise ValueError("no conversation has an answer to train on: raise --max-tokens or --num-prompts")
    vocab = draft_vocabulary(np.concatenate([t[a:] for t, _, a in train_items]), draft_vocab, tcfg.vocab_size)
    remap = np.full(tcfg.vocab_size, -1, np.int64)
    remap[vocab] = np.arange(len(vocab))
    remap_t, vocab_t = torch.from_numpy(remap), torch.from_numpy(vocab.astype(np.int64))
    lm = torch.from_numpy(head_w[vocab])  # [dv, h]: the frozen projection's draft-vocabulary rows
    model = build_medusa(tcfg.hidden_size, num_heads, num_layers, torch, None if freeze_lm_head else head_w)
    bf16 = bf16_pays(torch)  # matmuls in bf16 where this CPU does them faster (measured)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    shape = {"num_heads": num_heads, "num_layers": num_layers, "freeze_lm_head": freeze_lm_head}
    ckpt = Path(checkpoint) if checkpoint else Path(out_dir) / "work" / "medusa-checkpoint.pt"
    ckpt.parent.mkdir(parents=True, exist_ok=True)
    step, log, best, init = 0, [], None, None
    if ckpt.exists():
        state = torch.load(ckpt, weights_only=False)
        if state.get("shape") != shape:
            raise ValueError(f"{ckpt} holds heads trained with {state.get('shape')}, not {shape}: "
                             "use another --work-dir or delete that checkpoint")
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        step, log, best, init = state["step"], state["log"], state.get("best"), state.get("init")
    elif held_out:  # what the untrained heads (= the base lm_head) score, to compare against
        init = held_out_score(model, held_out, lm, remap_t, vocab_t, num_heads, torch, bf16=bf16)
    rng = np.random.default_rng(seed + step)
    warm = max(1, min(100, steps // 10))
    bar = tqdm(total=steps, initial=step, desc="train medusa", unit="step", disable=not progress)
    t0, seen = time.time(), 0
    while step < steps:
        for g in opt.param_groups:  # linear warm-up then cosine decay
            g["lr"] = lr * min(1.0, (step + 1) / warm) * 0.5 * (1 + math.cos(math.pi * step / steps))
        feats, labels = medusa_rows([train_items[i] for i in rng.integers(0, len(train_items), batch)], num_heads)
        if feats.shape[0] == 0:
            continue  # conversations without answer rows
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):  # the weights and their updates stay fp32
            st = _head_losses(model, torch.from_numpy(feats), torch.from_numpy(labels), lm, remap_t, vocab_t, torch,
                              backward=True)
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        step += 1
        seen += feats.shape[0]
        stats = {"step": step, "loss": sum(HEAD_DECAY ** k * r["loss"] for k, r in enumerate(st)),
                 **{f"top1_{k}": r["hits"] / max(r["rows"], 1.0) for k, r in enumerate(st)}}
        log.append(stats)
        bar.set_postfix(loss=f"{stats['loss']:.3f}", top1=f"{stats['top1_0']:.2f}", rows_s=f"{seen / (time.time() - t0):.0f}")
        bar.update(1)
        if step % checkpoint_every == 0 or step == steps:
            if held_out:
                score = held_out_score(model, held_out, lm, remap_t, vocab_t, num_heads, torch, bf16=bf16)
                if best is None or score["mean_top1"] > best["score"]["mean_top1"]:
                    best = {"step": step, "score": score, "model": {k: v.clone() for k, v in model.state_dict().items()}}
                bar.write(f"step {step}: held-out {score} (best at step {best['step']})")
            tmp = ckpt.with_suffix(".tmp")
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step, "log": log,
                        "best": best, "init": init, "shape": shape}, tmp)
            tmp.rename(ckpt)
    bar.close()
    if best is not None:  # the checkpoint that generalized best, not the last one
        model.load_state_dict(best["model"])
    export_medusa(model, num_heads, num_layers, Path(out_dir), torch, head_w, Path(target_dir).name, vocab)
    recent = log[-50:]
    return {"method": "medusa", "steps": step, "medusa_num_heads": num_heads, "medusa_num_layers": num_layers,
            "freeze_lm_head": freeze_lm_head, "draft_vocab": len(vocab), "held_out_conversations": len(held_out),
            "dtype": "bfloat16" if bf16 else "float32",
            "exported_step": best["step"] if best else step, "held_out": best["score"] if best else None,
            "held_out_untrained": init,
            "recent_train_top1": [float(np.mean([r[f"top1_{k}"] for r in recent])) for k in range(num_heads)]}


def check_medusa_options(num_heads: int, num_layers: int, freeze_lm_head: bool) -> None:
    if num_heads < 1:
        raise ValueError(f"--medusa-num-heads must be >= 1, not {num_heads}")
    if num_layers < 0 or (num_layers == 0 and freeze_lm_head):
        raise ValueError(f"--medusa-num-layers must be >= 1 (0 only with --no-medusa-freeze-lm-head: "
                         f"otherwise there is nothing to train), not {num_layers}")


def export_medusa(model, num_heads: int, num_layers: int, out_dir: Path, torch, head_w: np.ndarray,
                  base: str, vocab: np.ndarray) -> None:
    """config.json + model.safetensors in FasterDecoding's layout (fp16): the residual
    blocks ``medusa_head.I.J.linear.{weight,bias}``, then either every head's trained
    vocabulary weight ``medusa_head.I.{num_layers}.weight``, or -- when the projection was
    frozen -- only ``d2t`` of ``vocab`` (the draft vocabulary's target ids, sorted):
    the heads then share the target's lm_head rows of the draft vocabulary they were trained
    on (models/medusa.py; ``convert_weight --target`` reads those rows), which keeps the head
    small and a CPU draft step cheap."""
    from safetensors.numpy import save_file

    tensors = {k: v.detach().to(torch.float16).numpy() for k, v in model.state_dict().items()}
    cfg = {"medusa_num_heads": num_heads, "medusa_num_layers": num_layers, "base_model_name_or_path": base,
           "hidden_size": int(head_w.shape[1]), "vocab_size": int(head_w.shape[0]), "torch_dtype": "float16"}
    if not model.trains_lm_head:
        tensors["d2t"] = (np.asarray(vocab, np.int64) - np.arange(len(vocab))).astype(np.int64)
        cfg["draft_vocab_size"] = int(len(vocab))
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out_dir / "model.safetensors"))
    (out_dir / "config.json").write_text(json.dumps(cfg, indent=1))
