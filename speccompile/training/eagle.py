"""``speccompile train-draft --method eagle``: train an EAGLE head for a converted target.
(``--method medusa`` trains Medusa heads on the same data: speccompile/training/medusa.py.)

The pipeline (every stage resumable, so ``make heads`` can run for hours across sessions):

1. self-distillation with our own compiled engine, batched (speccompile/training/distill.py);
2. the target's final-normed features of every token (the same forward the runtime uses);
3. training with torch on the CPU, checkpointing every few hundred steps;
4. export in the official SafeAILab EAGLE layout (``config.json`` + ``model.safetensors``
   with ``fc.*`` and ``layers.N.*``), so ``convert_weight --model-type eagle`` reads a
   trained head exactly as it would read a downloaded one.

Training choices, and why (``../shared/DRAFT_TRAINING.md`` measured them):
- features *after* the final norm are the regression target, and the frozen target
  ``lm_head`` turns predictions into logits -- as the runtime does;
- the classification loss uses a draft vocabulary: the ``draft_vocab`` tokens most
  frequent in the target's own answers (5x cheaper than the full vocabulary); the loss
  only shapes training, the runtime still drafts over the full vocabulary;
- a second, unrolled pass feeds the head its *own* predicted features (EAGLE-3's
  training-time test) plus feature noise, so chains survive their own errors;
- loss only on answer positions; one conversation per row (no packing across them).

What both trainers share (torch, the target's embedding and lm_head, the feature shards,
the draft vocabulary, the held-out split) is in speccompile/training/common.py.

Torch is an optional extra: ``pip install '.[train]'``.
"""
from __future__ import annotations

import json
import math
import time
from pathlib import Path

import numpy as np

from speccompile.runtime.contract import MODEL_CONFIG_FILE
from speccompile.runtime.options import configs_from
from speccompile.training.common import (Features, draft_vocabulary, llama_blocks, require_torch, rope_tables, split_held_out,
                           target_config, target_embedding_and_head)
from speccompile.training.settings import DraftSettings


# ------------------------------------------------------------------ the head
def build_head(layer_cfg, torch):
    """The EAGLE-1 head in torch, named as SafeAILab names it."""
    nn = torch.nn
    c = layer_cfg
    h = c.hidden_size
    RMSNorm, Attention, MLP = llama_blocks(torch)

    class Layer(nn.Module):
        def __init__(self, first: bool):
            super().__init__()
            self.self_attn, self.mlp = Attention(c, h, bias=c.attention_bias), MLP(h, c.intermediate_size)
            if not first:  # the first layer reads fc's output unnormalized, as SafeAILab's
                self.input_layernorm = RMSNorm(h, c.rms_norm_eps)
            self.post_attention_layernorm = RMSNorm(h, c.rms_norm_eps)

        def forward(self, x, cos, sin):
            a = x if not hasattr(self, "input_layernorm") else self.input_layernorm(x)
            x = x + self.self_attn(a, cos, sin)
            return x + self.mlp(self.post_attention_layernorm(x))

    class Eagle(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(2 * h, h, bias=True)
            self.layers = nn.ModuleList([Layer(i == 0) for i in range(c.num_hidden_layers)])

        def forward(self, emb, feat, cos, sin):
            # emb, feat: [b, n, h] (embedding of token i+1, feature f_i) -> predicted f_{i+1}
            x = self.fc(torch.cat([emb, feat], -1))
            for layer in self.layers:
                x = layer(x, cos, sin)
            return x

    return Eagle()


# ------------------------------------------------------------------ data
def _batch(items, idx, max_len, torch):
    """Right-padded [b, n] rows of one conversation each: input pairs (f_i, t_{i+1}),
    regression targets f_{i+1}, labels t_{i+2}, and a mask of answer positions."""
    rows = [items[i] for i in idx]
    n = min(max_len, max(len(t) for t, _, _ in rows) - 2)
    b, h = len(rows), rows[0][1].shape[1]
    feat = np.zeros((b, n, h), np.float32)
    nxt_feat = np.zeros((b, n, h), np.float32)
    tok_in = np.zeros((b, n), np.int64)
    label = np.full((b, n), -1, np.int64)
    mask = np.zeros((b, n), np.float32)
    for r, (t, f, a) in enumerate(rows):
        m = min(n, len(t) - 2)
        feat[r, :m] = f[:m]
        nxt_feat[r, :m] = f[1:m + 1]
        tok_in[r, :m] = t[1:m + 1]
        label[r, :m] = t[2:m + 2]
        mask[r, max(0, a - 2):m] = 1.0  # rows whose predicted token t_{i+2} is part of the answer
    return [torch.from_numpy(x) for x in (feat, nxt_feat, tok_in, label, mask)]


# ------------------------------------------------------------------ training
def train_eagle(feature_paths: list[Path], target_dir: Path, out_dir: Path, steps: int, batch: int = 4,
                max_len: int = 512, lr: float = 3e-4, draft_vocab: int = 16384, noise: float = 0.1,
                unroll: int = 2, seed: int = 0, checkpoint_every: int = 200, progress: bool = True,
                checkpoint: Path | None = None) -> dict:
    torch = require_torch()
    from tqdm import tqdm

    torch.manual_seed(seed)
    tcfg = target_config(target_dir)
    layer_cfg = _head_layer_config(tcfg)
    emb_w, head_w = target_embedding_and_head(target_dir, tcfg)
    data = Features(feature_paths)
    if not any(len(t) >= 3 and len(t) - a >= 1 for t, _, a in data.items):
        raise ValueError("no conversation has an answer to train on: raise --max-tokens or --num-prompts")
    train_items, held_out = split_held_out(data.items)
    vocab = draft_vocabulary(np.concatenate([t[a:] for t, _, a in train_items]), draft_vocab, tcfg.vocab_size)
    remap = np.full(tcfg.vocab_size, -1, np.int64)
    remap[vocab] = np.arange(len(vocab))
    emb = torch.from_numpy(emb_w)
    lm = torch.from_numpy(head_w[vocab])  # [dv, h] frozen
    remap_t = torch.from_numpy(remap)
    model = build_head(layer_cfg, torch)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    ckpt = Path(checkpoint) if checkpoint else out_dir / "checkpoint.pt"
    step, log, best = 0, [], None
    if ckpt.exists():
        state = torch.load(ckpt, weights_only=False)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        step, log, best = state["step"], state["log"], state.get("best")
    cos, sin = rope_tables(max_len, layer_cfg.head_dim, layer_cfg.rope_theta, torch)
    rng = np.random.default_rng(seed + step)
    fstd = float(np.std(train_items[0][1].astype(np.float32)))
    bar = tqdm(total=steps, initial=step, desc="train eagle", unit="step", disable=not progress)
    t0, seen = time.time(), 0
    while step < steps:
        for g in opt.param_groups:  # linear warm-up then cosine decay
            g["lr"] = lr * min(1.0, (step + 1) / 100) * 0.5 * (1 + math.cos(math.pi * step / steps))
        batch_t = _batch(train_items, rng.integers(0, len(train_items), batch), max_len, torch)
        if batch_t[0].shape[1] < 1 or float(batch_t[4].sum()) == 0:
            continue  # conversations too short to hold a training row
        total, stats = _unrolled_loss(model, batch_t, emb, lm, remap_t, cos, sin, unroll, noise * fstd, torch)
        opt.zero_grad()
        total.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        opt.step()
        step += 1
        seen += int(stats["rows"])
        stats.update(step=step, loss=float(total.detach()))
        log.append(stats)
        bar.set_postfix(loss=f"{stats['loss']:.3f}", top1=f"{stats['top1_0']:.2f}", tok_s=f"{seen / (time.time() - t0):.0f}")
        bar.update(1)
        if step % checkpoint_every == 0 or step == steps:
            if held_out:
                score = _held_out_score(model, held_out, max_len, emb, lm, remap_t, cos, sin, unroll, torch)
                if best is None or score["expected_chain2"] > best["score"]["expected_chain2"]:
                    best = {"step": step, "score": score, "model": {k: v.clone() for k, v in model.state_dict().items()}}
                bar.write(f"step {step}: held-out {score} (best at step {best['step']})")
            tmp = ckpt.with_suffix(".tmp")
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step, "log": log, "best": best}, tmp)
            tmp.rename(ckpt)
    bar.close()
    if best is not None:  # the checkpoint that generalized best, not the last one (heads overfit chat data)
        model.load_state_dict(best["model"])
    export_eagle(model, layer_cfg, out_dir, torch, vocab)
    recent = log[-50:]
    return {"steps": step, "draft_vocab": len(vocab), "held_out_conversations": len(held_out),
            "exported_step": best["step"] if best else step, "held_out": best["score"] if best else None,
            "recent_train_top1_true_features": float(np.mean([r["top1_0"] for r in recent])),
            "recent_train_top1_own_features": float(np.mean([r[f"top1_{unroll - 1}"] for r in recent]))}


def _unrolled_loss(model, batch_t, emb, lm, remap_t, cos, sin, unroll: int, noise_std: float, torch):
    """Regression to the next feature plus draft-vocabulary cross entropy, over ``unroll``
    passes: pass u > 0 feeds the head its own predicted features (training-time test)."""
    feat, nxt, tok_in, label, mask = batch_t
    n = feat.shape[1]
    e = emb[tok_in]
    inp = feat + torch.randn_like(feat) * noise_std if noise_std else feat
    lab = remap_t[label.clamp(min=0)].masked_fill(label < 0, -1).masked_fill(mask == 0, -1)
    total, stats = 0.0, {}
    for u in range(unroll):
        pred = model(e, inp, cos[..., :n, :], sin[..., :n, :])
        reg = (torch.nn.functional.smooth_l1_loss(pred, nxt, reduction="none").mean(-1) * mask).sum() / mask.sum()
        logits = pred @ lm.T
        total = total + reg
        if bool((lab >= 0).any()):
            total = total + 0.1 * torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), lab.reshape(-1), ignore_index=-1)
        with torch.no_grad():
            stats[f"hits_{u}"] = float(((logits.argmax(-1) == lab) & (lab >= 0)).float().sum())
            stats[f"top1_{u}"] = stats[f"hits_{u}"] / max(1.0, float((lab >= 0).float().sum()))
        stats[f"reg_{u}"] = float(reg.detach())
        inp = torch.cat([feat[:, :1], pred[:, :-1]], 1)
    stats["rows"] = float((lab >= 0).float().sum())
    return total, stats


def _held_out_score(model, items: list, max_len: int, emb, lm, remap_t, cos, sin, unroll: int, torch) -> dict:
    """Top-1 on held-out answers with true features (depth 1) and with the head's own
    fed-back features (depth 2), and a k=2 chain's expected accepted drafts a1 * (1 + a2)."""
    hits, rows = np.zeros(unroll), 0.0
    model.eval()
    with torch.no_grad():
        for start in range(0, len(items), 8):
            batch_t = _batch(items, np.arange(start, min(start + 8, len(items))), max_len, torch)
            if batch_t[0].shape[1] < 1:
                continue
            _, st = _unrolled_loss(model, batch_t, emb, lm, remap_t, cos, sin, unroll, 0.0, torch)
            hits += [st[f"hits_{u}"] for u in range(unroll)]
            rows += st["rows"]
    model.train()
    a = hits / max(rows, 1.0)
    return {"top1_depth1": round(float(a[0]), 4), "top1_depth2": round(float(a[-1]), 4),
            "expected_chain2": round(float(a[0] * (1 + a[-1])), 4)}


def _head_layer_config(tcfg):
    """One decoder layer shaped like the target's (EAGLE-1 for a Llama-family target)."""
    import copy

    cfg = copy.deepcopy(tcfg)
    cfg.num_hidden_layers = 1
    cfg.tie_word_embeddings = False
    return cfg


def export_eagle(model, layer_cfg, out_dir: Path, torch, vocab: np.ndarray | None = None) -> None:
    """config.json + model.safetensors in SafeAILab's layout (fp16). With ``vocab`` (the
    draft vocabulary's target ids, sorted) the head also carries the EAGLE-3 style reduced
    vocabulary it was trained on, ``d2t`` (target id minus draft id), so that a draft step
    need not run the full lm_head. Its projection is the target's lm_head rows, frozen in
    training, so ``lm_head.weight`` is left out and ``convert_weight --target`` reads the
    rows from the target: 14 MB less."""
    from safetensors.numpy import save_file

    tensors = {k: v.detach().to(torch.float16).numpy() for k, v in model.state_dict().items()}
    if vocab is not None:
        tensors["d2t"] = (np.asarray(vocab, np.int64) - np.arange(len(vocab))).astype(np.int64)
    save_file(tensors, str(out_dir / "model.safetensors"))
    c = layer_cfg
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": c.hidden_size,
           "intermediate_size": c.intermediate_size, "num_attention_heads": c.num_attention_heads,
           "num_key_value_heads": c.num_key_value_heads, "num_hidden_layers": c.num_hidden_layers,
           "rms_norm_eps": c.rms_norm_eps, "rope_theta": c.rope_theta, "vocab_size": c.vocab_size,
           "max_position_embeddings": c.context_window_size, "head_dim": c.head_dim,
           "torch_dtype": "float16", "bias": True}
    if vocab is not None:
        cfg["draft_vocab_size"] = int(len(vocab))
    (out_dir / "config.json").write_text(json.dumps(cfg, indent=1))


# ------------------------------------------------------------------ the command
def run_train_draft(method: str, target_dir: Path, model_lib: Path | None, out_dir: Path,
                    settings: DraftSettings | None = None, *, progress: bool = True, work_dir: Path | None = None,
                    **options) -> dict:
    """Every stage skips the work already on disk, so an interrupted run resumes. The head
    goes to ``out_dir``; data and checkpoints to ``work_dir`` (default ``out_dir/work``).
    Both methods train on the same data, so one work dir can serve an EAGLE and a Medusa
    head (their checkpoints are ``checkpoint.pt`` and ``medusa-checkpoint.pt``).
    ``settings`` or its fields as keywords (``steps=...``): speccompile/training/settings.py."""
    (s,) = configs_from(options, (DraftSettings, settings))
    num_prompts, max_tokens, gen_batch, steps, train_batch = s.num_prompts, s.max_tokens, s.gen_batch, s.steps, \
        s.train_batch
    draft_vocab, medusa_num_heads, medusa_num_layers = s.draft_vocab or 16384, s.medusa_num_heads, s.medusa_num_layers
    medusa_freeze_lm_head = s.medusa_freeze_lm_head
    if method not in ("eagle", "medusa"):
        raise ValueError(f"train-draft --method {method} is not supported: choose eagle or medusa")
    target_dir, out_dir = Path(target_dir), Path(out_dir)
    if not (target_dir / MODEL_CONFIG_FILE).exists():
        raise FileNotFoundError(f"{target_dir} is not a converted model (no {MODEL_CONFIG_FILE}): "
                                "run convert_weight and gen_config first")
    if method == "medusa":
        from speccompile.training.medusa import check_medusa_options

        check_medusa_options(medusa_num_heads, medusa_num_layers, medusa_freeze_lm_head)
    require_torch()  # fail before hours of generation if torch is missing
    from speccompile.training import distill
    from speccompile.runtime.engine import Engine

    out_dir.mkdir(parents=True, exist_ok=True)
    work = Path(work_dir) if work_dir else out_dir / "work"
    data_dir = work / "data"
    answers = work / "answers"
    if method == "medusa" and (answers / "train" / "index.jsonl").exists():  # train-answers' data (EAGLE-3's)
        from speccompile.training.medusa import train_medusa

        report = train_medusa([], target_dir, out_dir, steps, batch=train_batch, num_heads=medusa_num_heads,
                              num_layers=medusa_num_layers, freeze_lm_head=medusa_freeze_lm_head,
                              draft_vocab=draft_vocab, progress=progress, checkpoint=work / "medusa-checkpoint.pt",
                              answers=answers)
        (out_dir / "train_report.json").write_text(json.dumps(report, indent=1))
        return report
    engine = Engine(target_dir, model_lib, max_num_sequence=gen_batch)
    rows = distill.generate_answers(engine, data_dir, num_prompts, max_tokens, gen_batch, progress)
    paths = distill.extract_features(engine.model, data_dir, rows, progress=progress)
    del engine
    if method == "medusa":
        from speccompile.training.medusa import train_medusa

        report = train_medusa(paths, target_dir, out_dir, steps, batch=train_batch, num_heads=medusa_num_heads,
                              num_layers=medusa_num_layers, freeze_lm_head=medusa_freeze_lm_head,
                              draft_vocab=draft_vocab, progress=progress, checkpoint=work / "medusa-checkpoint.pt")
    else:
        report = train_eagle(paths, target_dir, out_dir, steps, batch=train_batch, draft_vocab=draft_vocab,
                             progress=progress, checkpoint=work / "checkpoint.pt")
    report.update(conversations=len(rows), answer_tokens=int(sum(len(r["answer_ids"]) for r in rows)))
    (out_dir / "train_report.json").write_text(json.dumps(report, indent=1))
    return report
