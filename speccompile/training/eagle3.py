"""Training an EAGLE-3 head with the training-time test, resumable (``train-draft --method eagle3``).

Why the training-time test (TTT). At draft time only the first depth sees a true target
feature; deeper rows are built from the head's *own* output at the parent row. A head
trained on true features alone falls apart after one step (DRAFT_TRAINING.md: chains
collapsed after the first draft). So every batch runs the head ``steps`` times: step 0 on
the fused target features, step k on step k-1's outputs shifted one position right --
exactly the rows a chain drafts -- and each step's loss trains the head to survive its
own errors.

Attention at step k, position r, mirrors the runtime's KV cache: the rows built from
true features at positions <= r - k (the committed context when row r - k was the last
true one), then the draft rows of steps 1..k on its own chain (step s at position
r - k + s). Positions keep their RoPE index, as the runtime's scratch rows do.

Labels are the target's own greedy tokens (train-answers generated greedily, which is
what lossless greedy verification accepts): row r predicts token r + 2. Only answer
tokens are scored; one outside the draft vocabulary (the ``draft_vocab`` most frequent
answer tokens) counts as a miss, as at draft time (hard labels do not train on it). The vocabulary
can change on a resumed run (``draft_vocab`` set), because the projection is frozen: the
trained layers do not depend on it. Measured on the step-600 head for Qwen2.5-Coder-1.5B
(held-out and MT-bench top-1 and chain length, misses counted so): 16,384, 24,576 and
32,768 tokens score the same to 4 decimals (held-out top-1 0.450, MT-bench 0.386) -- the
rarer half is never drafted right -- while the 32k projection was ~60% of a training
step's compute; so 16,384, the size Medusa's heads for the same target use. With
``soft_labels`` the loss is the
cross-entropy against the target's whole next-token distribution over the draft
vocabulary, softmax(lm_head(final hidden state at r + 1)), as EAGLE-3's reference training
does, instead of its argmax alone: the distribution carries more per token than its argmax
(on Qwen2.5-Coder-1.5B's answers the argmax holds 0.78 of the mass on average), and data is
what limits us here. It is not the default because, measured (Zen 5, same data, same seed),
it learned slower where we can afford to train: held-out top-1 0.125 / 0.217 at steps 50 /
100 against 0.159 / 0.260 with hard labels, at 1.5x the time a step (the extra projection
and a float32 softmax over the draft vocabulary). Accuracy is scored against the greedy
token. The projection is the target's own embedding/lm_head rows for that vocabulary,
frozen: the head ships without it (conversion reads it from the target), which keeps the
committed head small.

Resumable: ``state.pt`` (model, optimizer, epoch, the epoch's batch plan, progress) is
rewritten atomically every few minutes and after each evaluation; a rerun continues where
the last one stopped, and conversations train-answers added since join at the next epoch.
``curve.jsonl`` holds the held-out curve; ``best.pt`` the weights with the best held-out
chain length, which is what gets exported.
"""
from __future__ import annotations

import copy
import hashlib
import json
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from speccompile.training.answers import conversations, read_shards
from speccompile.training.settings import Eagle3Settings as Settings

IGNORE = -100  # a row that is not scored (prompt tokens, past the end)
OOV = -1  # an answer token outside the draft vocabulary: scored, never right, not trained on
DRAFT_VOCAB = 16384  # a new run's draft vocabulary (module doc)
EVAL_STEPS = 6  # depths scored on held-out data (training may run fewer TTT steps)


@dataclass
class Conv:
    """One conversation: tokens [L], the prompt's length, features [L-1, 3h] fp16 and, for
    soft labels, the target's final-normed hidden states [L-1, h] fp16."""

    id: str
    tokens: np.ndarray
    prompt_len: int
    feats: np.ndarray
    hidden: np.ndarray | None = None

    @property
    def rows(self) -> int:
        return len(self.tokens) - 1


def load_split(split_dir: Path, max_rows: int, hidden: bool = False) -> list[Conv]:
    """Every conversation of a split, cut to ``max_rows`` head rows (longer ones keep their
    start); with ``hidden``, their final hidden states too (memory maps, as the features)."""
    out = []
    for shard in read_shards(split_dir):
        hid = conversations(shard, hidden=True) if hidden else None
        for pid, toks, plen, feats in conversations(shard):
            h = next(hid)[3] if hid is not None else None
            if len(toks) - plen < 2:
                continue
            n = min(len(toks), max_rows + 1)
            out.append(Conv(pid, toks[:n], plen, feats[: n - 1], None if h is None else h[: n - 1]))
    return out


def plan_batches(convs: list[Conv], batch_rows: int, seed: int) -> list[list[int]]:
    """Batches of conversation indices, about ``batch_rows`` padded rows each: conversations
    of similar length together (little padding), batches in a seeded random order."""
    rng = np.random.default_rng(seed)
    order = sorted(range(len(convs)), key=lambda i: (convs[i].rows, rng.random()))
    batches, cur, longest = [], [], 0
    for i in order:
        n = convs[i].rows
        if cur and max(longest, n) * (len(cur) + 1) > batch_rows:
            batches.append(cur)
            cur, longest = [], 0
        cur.append(i)
        longest = max(longest, n)
    if cur:
        batches.append(cur)
    rng.shuffle(batches)
    return batches


class Trainer:
    """The head, the frozen target rows it reads, and the TTT forward."""

    def __init__(self, torch, model, emb: np.ndarray, head_rows: np.ndarray, vocab: np.ndarray, layer_cfg,
                 dtype):
        self.torch, self.model, self.cfg, self.dtype = torch, model, layer_cfg, dtype
        self.emb = torch.from_numpy(emb)  # [V, h] fp32, frozen (rows gathered per batch)
        self.lm = torch.from_numpy(np.ascontiguousarray(head_rows[vocab])).to(dtype)  # [Vd, h] frozen
        t2d = np.full(emb.shape[0], OOV, np.int64)
        t2d[vocab] = np.arange(vocab.size)
        self.t2d = t2d
        c = layer_cfg
        self.nh, self.nkv, self.hd = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        self.rope_theta = c.rope_theta

    def batch(self, convs: list[Conv]):
        """Padded tensors of a batch: feats [b, n, 3h], emb ids [b, n] (token r+1), labels
        [b, n] (draft id of token r+2; OOV for an answer token outside the draft vocabulary;
        IGNORE for prompt tokens and padding)."""
        torch = self.torch
        n = max(c.rows for c in convs)
        b, w = len(convs), convs[0].feats.shape[1]
        feats = np.zeros((b, n, w), np.float32)
        nxt = np.zeros((b, n), np.int64)
        labels = np.full((b, n), IGNORE, np.int64)
        for j, c in enumerate(convs):
            m = c.rows
            feats[j, :m] = c.feats
            nxt[j, :m] = c.tokens[1:]
            lab = self.t2d[c.tokens[2:]]  # row r predicts token r + 2: rows 0..m-2
            rows = np.arange(m - 1)
            lab[rows + 2 < c.prompt_len] = IGNORE  # score answer tokens only
            labels[j, : m - 1] = lab
        return torch.from_numpy(feats), torch.from_numpy(nxt), torch.from_numpy(labels)

    def next_hidden(self, convs: list[Conv]):
        """[b, n, h]: row r holds the target's final hidden state at position r + 1, whose
        lm_head distribution is the target's for token r + 2 (the row's label); zero past the end."""
        n = max(c.rows for c in convs)
        out = np.zeros((len(convs), n, convs[0].hidden.shape[1]), np.float32)
        for j, c in enumerate(convs):
            out[j, : c.rows - 1] = c.hidden[1: c.rows]
        return self.torch.from_numpy(out)

    def rope(self, n: int):
        from speccompile.training.common import rope_tables

        return rope_tables(n, self.hd, self.rope_theta, self.torch)

    def attend(self, layer, x, cos, sin, cache: list, k: int):
        """The midlayer's attention at TTT step k: x [b, n, 2h] -> [b, n, h]; appends this
        step's keys and values to ``cache`` (step 0's are the true-feature rows)."""
        from speccompile.training.common import rope

        torch, F = self.torch, self.torch.nn.functional
        a = layer.self_attn
        b, n, _ = x.shape
        nh, nkv, hd = self.nh, self.nkv, self.hd
        g = nh // nkv
        q = rope(a.q_proj(x).view(b, n, nh, hd).transpose(1, 2), cos, sin).reshape(b, nkv, g, n, hd)
        key = rope(a.k_proj(x).view(b, n, nkv, hd).transpose(1, 2), cos, sin)  # [b, nkv, n, hd]
        val = a.v_proj(x).view(b, n, nkv, hd).transpose(1, 2)
        cache.append((key, val))
        scale = 1.0 / math.sqrt(hd)
        k0, v0 = cache[0]
        s0 = torch.einsum("bkgnd,bkmd->bkgnm", q, k0) * scale  # [b, nkv, g, n, n]
        r = torch.arange(n)
        allowed = r[None, :] <= (r[:, None] - k)  # key position m <= r - k
        s0 = s0.masked_fill(~allowed, float("-inf"))
        diag_k, diag_v = [], []
        for s in range(1, k + 1):  # step s's row at position r - (k - s) on the same chain
            shift = k - s
            ks, vs = cache[s]
            diag_k.append(F.pad(ks, (0, 0, shift, 0))[:, :, :n])
            diag_v.append(F.pad(vs, (0, 0, shift, 0))[:, :, :n])
        if diag_k:
            dk, dv = torch.stack(diag_k, 3), torch.stack(diag_v, 3)  # [b, nkv, n, k, hd]
            sd = torch.einsum("bkgnd,bknsd->bkgns", q, dk) * scale  # [b, nkv, g, n, k]
            if k > 1:  # keys before position 0 do not exist
                valid = (r[:, None] - (k - torch.arange(1, k + 1))[None, :]) >= 0  # [n, k]
                sd = sd.masked_fill(~valid, float("-inf"))
            p = torch.softmax(torch.cat([s0, sd], -1).float(), -1).to(q.dtype)
            out = torch.einsum("bkgnm,bkmd->bkgnd", p[..., :n], v0) + torch.einsum("bkgns,bknsd->bkgnd", p[..., n:], dv)
        else:
            # row 0.. at step 0 always has its own key; rows before position k - 1 at step k > 0 are never scored
            p = torch.softmax(s0.float(), -1).to(q.dtype)
            out = torch.einsum("bkgnm,bkmd->bkgnd", p, v0)
        return a.o_proj(out.reshape(b, nh, n, hd).transpose(1, 2).reshape(b, n, nh * hd))

    def run(self, feats, nxt, labels, steps: int, weights: list[float] | None = None, keep: list | None = None,
            soft_from=None):
        """TTT forward of a batch: (weighted loss or None, per step (correct [b, n] bool, scored [b, n] bool));
        ``keep`` collects each step's logits of the scored rows (tests). ``soft_from`` ([b, n, h],
        ``next_hidden``) makes the loss the cross-entropy against the target's distributions."""
        torch, F = self.torch, self.torch.nn.functional
        m = self.model
        L = m.midlayer
        b, n, _ = feats.shape
        cos, sin = self.rope(n)
        with torch.autocast("cpu", dtype=self.dtype, enabled=self.dtype != torch.float32):
            emb = self.emb[nxt].to(self.dtype)  # [b, n, h]
            hid = m.fuse(feats.to(self.dtype))  # [b, n, h]
            cache, total, out = [], None, []
            answer, pos = labels != IGNORE, torch.arange(n)
            if soft_from is not None and weights is not None:
                with torch.no_grad():  # the target's distribution of each answer row's token: [rows, Vd]
                    target_p = torch.softmax(F.linear(soft_from[answer].to(self.dtype), self.lm).float(), -1)
            for k in range(steps):
                x = torch.cat([L.input_layernorm(emb), L.hidden_norm(hid)], -1)
                h1 = hid + self.attend(L, x, cos, sin, cache, k)
                o = h1 + L.mlp(L.post_attention_layernorm(h1))  # [b, n, h]
                # every answer row is scored (an OOV token is a miss, as at draft time); row r at
                # step k needs a true row at r - k
                scored = answer & (pos >= k)[None, :]
                logits = F.linear(m.norm(o)[scored], self.lm)  # [rows, Vd]
                target = labels[scored]
                if keep is not None:
                    keep.append(logits.detach())
                trainable = scored.any() if soft_from is not None else (target >= 0).any()  # hard: no OOV row
                if weights is not None and trainable:
                    if soft_from is not None:  # the scored rows are the answer ones at positions >= k
                        p = target_p[(pos >= k)[None, :].expand(b, n)[answer]]
                        loss = -(p * F.log_softmax(logits.float(), -1)).sum(-1).mean()
                    else:  # hard labels: only tokens the head can draft are trained on
                        loss = F.cross_entropy(logits.float(), target, ignore_index=OOV)
                    total = loss * weights[k] if total is None else total + loss * weights[k]
                correct = torch.zeros_like(scored)
                correct[scored] = logits.argmax(-1) == target
                out.append((correct, scored))
                hid = F.pad(o, (0, 0, 1, 0))[:, :n]  # step k+1 at r reads step k's output at r - 1
        return total, out


def score(per_step: list, sums: dict | None = None) -> dict:
    """Accumulate held-out counts from one batch's TTT correctness: hits and rows per depth
    (top-1 at depth d given the shallower drafts right) and, for a chain of len(per_step)
    drafts from every scored start row, the drafts accepted (a depth whose row is past the
    answer counts as rejected)."""
    cs = [(c & s).numpy() for c, s in per_step]
    ss = [s.numpy() for _, s in per_step]
    sums = sums or {"hits": [0] * len(cs), "rows": [0] * len(cs), "accepted": 0, "starts": 0}
    b, n = cs[0].shape
    alive = ss[0].copy()
    accepted = np.zeros((b, n), np.int64)
    for d, c in enumerate(cs):
        sums["hits"][d] += int(c.sum())
        sums["rows"][d] += int(ss[d].sum())
        at = np.zeros((b, n), bool)
        at[:, : n - d] = c[:, d:]  # depth d + 1 from start r is step d at row r + d
        alive &= at
        accepted += alive
    sums["accepted"] += int(accepted[ss[0]].sum())
    sums["starts"] += int(ss[0].sum())
    return sums


def finish(sums: dict) -> dict:
    top1 = [h / r if r else 0.0 for h, r in zip(sums["hits"], sums["rows"])]
    return {"top1": [round(x, 4) for x in top1], "rows": sums["rows"][0],
            "accept_len": round(1 + sums["accepted"] / max(sums["starts"], 1), 4)}


def evaluate(trainer: "Trainer", convs: list[Conv], batch_rows: int, steps: int = EVAL_STEPS,
             groups: dict[str, str] | None = None) -> dict:
    """Held-out scores (``finish``) overall and, with ``groups`` (conversation id -> name,
    e.g. MT-bench categories), per group."""
    torch = trainer.torch
    trainer.model.eval()
    by: dict[str, dict | None] = {"all": None}
    with torch.no_grad():
        for idx in plan_batches(convs, batch_rows, seed=0):
            part = [convs[i] for i in idx]
            _, per_step = trainer.run(*trainer.batch(part), steps=steps)
            by["all"] = score(per_step, by["all"])
            if groups:
                for j, c in enumerate(part):
                    one = [(cc[j: j + 1], ss[j: j + 1]) for cc, ss in per_step]
                    name = groups.get(c.id, "other")
                    by[name] = score(one, by.get(name))
    trainer.model.train()
    return {k: finish(v) for k, v in by.items() if v is not None}


def offline_scores(trainer: "Trainer", answers: Path, settings: "Settings") -> dict:
    """The exported checkpoint's scores on data it was not chosen on: MT-bench first turns
    per category (never trained on), and the held-out set split into code, other, and each grounded
    family of the wide mix (doc_summary, doc_rag, doc_translate, doc_extract)."""
    from speccompile.training.prompt_set import REPO

    out = {}
    mt = load_split(answers / "mt_bench", settings.max_rows)
    if mt:
        bench = [json.loads(x) for x in (REPO / "bench" / "mt_bench.jsonl").read_text().splitlines() if x.strip()]
        cats = {f"mt{r['question_id']}": r.get("category", "other") for r in bench}
        out["mt_bench"] = evaluate(trainer, mt, settings.batch_rows, groups=cats)
    held = load_split(answers / "held_out", settings.max_rows)
    kinds = {}
    prompts = answers.parent / "prompts" / "held_out.jsonl"
    if prompts.exists():
        for line in prompts.read_text().splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                break
            # grounded requests (summaries, answers from passages, translations, extraction) by family
            kinds[row["id"]] = row["family"] if row.get("source") == "grounded" else "code" if row.get("code") else \
                "other"
    if held:
        out["held_out"] = evaluate(trainer, held, settings.batch_rows, groups=kinds)
    return out


def planned_steps(done: dict, per_epoch: int, epochs: int, max_steps: int | None = None) -> int:
    """The run's length as it stands, which the learning-rate schedule spans: steps taken,
    the rest of the current epoch's plan, and the epochs still to come at today's
    ``per_epoch``. A run resumed after its data grew (or with other ``epochs``) then anneals
    to the schedule's floor at its new end; counting its past epochs at today's size
    instead ended epoch 3 of the Qwen head (6,000 -> 10,000 conversations) at a quarter of
    the peak rate. ``max_steps`` caps it: a run that must end by a given hour (a session's
    remaining time) anneals by then instead of stopping at a mid-schedule rate."""
    current = done["plan"] is not None
    left = len(done["plan"]) - done["batch"] if current else 0
    planned = done["step"] + left + max(0, epochs - done["epoch"] - current) * per_epoch
    return planned if max_steps is None else max(done["step"], min(planned, max_steps))


def _atomic_save(torch, obj, path: Path) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def train_eagle3(target_dir: Path, work_dir: Path, out_dir: Path, settings: Settings, progress: bool = True,
                 export_only: bool = False, record: dict | None = None, vocab_from: np.ndarray | None = None) -> dict:
    """Train (or resume) the head on WORK_DIR/answers, export the best held-out checkpoint
    to ``out_dir`` in the published EAGLE-3 layout; returns the report. ``export_only``
    exports the best checkpoint so far and writes nothing in the run's folder, so it can run
    beside a training process (to measure a head while the curve still rises). ``record``:
    fields for the report, such as ``data_shards`` (how many of a data dir's training shards
    the answers cover, which a later fine-tune with replay reads: training/replay.py).
    ``vocab_from``: the answer tokens a new draft vocabulary is counted from (default the train
    split's; a fine-tune on a sample of the data counts over all of it)."""
    from speccompile.training.eagle3_torch import (build_eagle3_head, export_eagle3, init_from_target_layer,
                                                   load_exported_head)
    from speccompile.models.config import feature_layers
    from speccompile.training.common import (bf16_pays, draft_vocabulary, release_free_memory, require_torch,
                               target_config, target_embedding_and_head, target_weight)

    torch = require_torch()
    from tqdm import tqdm

    start = None  # an exported head to fine-tune: its config
    if settings.init not in ("target", "random"):
        head_dir = Path(settings.init)
        if not (head_dir / "model.safetensors").exists() or not (head_dir / "config.json").exists():
            raise ValueError(f"--init {settings.init!r}: a new head starts from 'target' (the target's layer above the "
                             "high feature), 'random', or an exported head's folder (config.json, model.safetensors)")
        start = json.loads((head_dir / "config.json").read_text())

    work_dir, out_dir = Path(work_dir), Path(out_dir)
    ans = work_dir / "answers"
    train = load_split(ans / "train", settings.max_rows, hidden=settings.soft_labels)
    held = load_split(ans / "held_out", settings.max_rows)
    if not train or not held:
        raise FileNotFoundError(f"{ans} holds no train or held_out answers: run `speccompile train-answers` first")
    tcfg = target_config(Path(target_dir))
    width = train[0].feats.shape[1]
    if width != 3 * tcfg.hidden_size:
        raise ValueError(f"the captured features are {width} wide, this target needs {3 * tcfg.hidden_size}: "
                         "the answers were made with another model")
    run_dir = work_dir / "eagle3"
    run_dir.mkdir(parents=True, exist_ok=True)
    state_path = run_dir / "state.pt"
    state = torch.load(state_path, weights_only=False) if state_path.exists() else None
    vocab = np.asarray(state["vocab"]) if state is not None else None
    size = settings.draft_vocab or (vocab.size if vocab is not None else DRAFT_VOCAB)
    if state is not None:
        settings = Settings(**{**settings.__dict__, "intermediate_size": state["settings"]["intermediate_size"],
                               "draft_vocab": size})
    elif start is not None:  # the head's own shape and draft vocabulary (unless another size is asked for)
        size = settings.draft_vocab or start["draft_vocab_size"]
        settings = Settings(**{**settings.__dict__, "intermediate_size": start["intermediate_size"],
                               "draft_vocab": size})
    layer_cfg = copy.deepcopy(tcfg)
    layer_cfg.num_hidden_layers, layer_cfg.tie_word_embeddings = 1, False
    layer_cfg.intermediate_size = settings.intermediate_size
    emb, head_rows = target_embedding_and_head(Path(target_dir), tcfg)
    torch.manual_seed(settings.seed)
    model = build_eagle3_head(layer_cfg, size, torch)
    if state is None and start is not None:
        vocab = load_exported_head(model, Path(settings.init), torch)
    recount = state is None and start is not None and settings.recount_vocab
    if vocab is None or vocab.size != size or recount:  # a new run, a new size, or asked: counted from the answers
        if vocab_from is None:
            vocab_from = np.concatenate([c.tokens[c.prompt_len:] for c in train])
        old = vocab
        vocab = draft_vocabulary(np.asarray(vocab_from, np.int64), size, tcfg.vocab_size)
        if old is not None and progress:
            print(f"draft vocabulary {old.size} -> {size} tokens ({np.setdiff1d(vocab, old).size} new), counted from "
                  f"{len(vocab_from)} answer tokens; the trained layers carry over (the projection is the target's "
                  "frozen rows)", file=sys.stderr)
    del model.lm_head  # the target's rows, frozen (Trainer.lm)
    if state is None and start is None:  # the frozen rows expect the target's final norm: start the head's norm there
        model.norm.weight.data[:] = torch.from_numpy(target_weight(Path(target_dir), "norm"))
        if settings.init == "target":
            high = feature_layers(tcfg.num_hidden_layers)[-1]
            init_from_target_layer(model, Path(target_dir), min(high + 1, tcfg.num_hidden_layers - 1), 2, torch)
    dtype = torch.bfloat16 if bf16_pays(torch) else torch.float32
    trainer = Trainer(torch, model, emb, head_rows, vocab, layer_cfg, dtype)
    opt = torch.optim.AdamW(model.parameters(), lr=settings.lr, betas=(0.9, 0.95), weight_decay=0.0)
    done = {"epoch": 0, "batch": 0, "step": 0, "tokens": 0, "plan": None, "best": None, "seconds": 0.0}
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        done = state["progress"]
    curve_path = run_dir / "curve.jsonl"

    def schedule(step: int, total: int) -> float:
        warm = min(settings.warmup, max(1, total // 20))  # at most 5% of the run
        if step < warm:
            return (step + 1) / warm
        t = min(1.0, (step - warm) / max(1, total - warm))
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t))

    def save():
        _atomic_save(torch, {"model": model.state_dict(), "optimizer": opt.state_dict(), "progress": done,
                             "settings": settings.__dict__, "vocab": vocab}, state_path)

    # what a held-out score depends on besides the weights: the conversations, the draft
    # vocabulary and how it is scored (answer tokens outside the vocabulary count as misses)
    held_key = hashlib.sha1((" ".join(sorted(c.id for c in held)) + f" vocab={hashlib.sha1(vocab.tobytes()).hexdigest()}"
                             " oov=miss").encode()).hexdigest()[:12]

    timing = {"eval_s": 0.0, "since": 0.0}  # the last held-out point's cost, training time since

    def held_out_point():
        t0 = time.perf_counter()
        res = evaluate(trainer, held, settings.batch_rows)["all"]
        timing.update(eval_s=time.perf_counter() - t0, since=0.0)
        point = {"step": done["step"], "epoch": done["epoch"], "tokens": done["tokens"], "held_out": held_key,
                 "draft_vocab": int(vocab.size), **res}
        with open(curve_path, "a") as f:
            f.write(json.dumps(point) + "\n")
        if done["best"] is None or res["accept_len"] > done["best"]["accept_len"]:
            done["best"] = point
            _atomic_save(torch, {"model": model.state_dict(), "vocab": vocab, "point": point}, run_dir / "best.pt")
        save()
        return point

    def export_best() -> dict:
        best = torch.load(run_dir / "best.pt", weights_only=False)
        model.load_state_dict(best["model"])
        offline = offline_scores(trainer, ans, settings)
        final = build_eagle3_head(layer_cfg, int(vocab.size), torch)
        final.load_state_dict({**best["model"], "lm_head.weight": trainer.lm.float()})
        export_eagle3(final, layer_cfg, out_dir, torch, vocab, feature_layers(tcfg.num_hidden_layers))
        report = {"best": best["point"], "steps": done["step"], "epochs": done["epoch"], "tokens": done["tokens"],
                  "train_conversations": len(train), "held_out_conversations": len(held),
                  "train_answer_tokens": int(sum(c.rows + 1 - c.prompt_len for c in train)),
                  "dtype": str(dtype).replace("torch.", ""), "settings": settings.__dict__,
                  "seconds": round(done["seconds"], 1), "offline": offline}
        report.update(record or {})
        (out_dir / "train_report.json").write_text(json.dumps(report, indent=1))
        return report

    if export_only:
        if not (run_dir / "best.pt").exists():
            raise FileNotFoundError(f"{run_dir / 'best.pt'} does not exist yet: train first (the first held-out "
                                    "point writes it)")
        return export_best()
    by_id = {c.id: i for i, c in enumerate(train)}
    per_epoch = len(plan_batches(train, settings.batch_rows, 0))
    total_steps = planned_steps(done, per_epoch, settings.epochs, settings.max_steps)
    weights = [0.8 ** k for k in range(settings.ttt_steps)]
    bar = tqdm(total=total_steps, initial=min(done["step"], total_steps), desc="eagle3 ttt", unit="step",
               disable=not progress, file=sys.stderr, mininterval=10)
    last_save, loss_ema, t_start = time.perf_counter(), None, time.perf_counter() - done["seconds"]
    if done["step"] == 0 and not curve_path.exists():
        held_out_point()
    elif done["best"] is not None and done["best"].get("held_out") != held_key:
        # the held-out set grew since the best point was scored (train-answers ran again), or the
        # vocabulary or the scoring changed: scores do not compare, so score the best checkpoint again
        current = copy.deepcopy(model.state_dict())
        model.load_state_dict(torch.load(run_dir / "best.pt", weights_only=False)["model"])
        res = evaluate(trainer, held, settings.batch_rows)["all"]
        done["best"] = {**done["best"], "held_out": held_key, **res}
        _atomic_save(torch, {"model": model.state_dict(), "vocab": vocab, "point": done["best"]}, run_dir / "best.pt")
        model.load_state_dict(current)
        bar.write(f"held-out set or scoring changed ({len(held)} conversations): best checkpoint (step {done['best']['step']}) "
                  f"rescored: top1 {res['top1']} accept_len {res['accept_len']}")
        held_out_point()
    while done["epoch"] < settings.epochs and done["step"] < total_steps:
        if done["plan"] is None:  # this epoch's batches, by id: stable across resumes
            done["plan"] = [[train[i].id for i in b] for b in plan_batches(train, settings.batch_rows,
                                                                             settings.seed + done["epoch"])]
            done["batch"] = 0
        plan = done["plan"]
        while done["batch"] < len(plan) and done["step"] < total_steps:
            part = [train[by_id[x]] for x in plan[done["batch"]] if x in by_id]
            for g in opt.param_groups:
                g["lr"] = settings.lr * schedule(done["step"], total_steps)
            t_step = time.perf_counter()
            loss, per_step = trainer.run(*trainer.batch(part), steps=settings.ttt_steps, weights=weights,
                                         soft_from=trainer.next_hidden(part) if settings.soft_labels else None)
            if loss is not None:
                opt.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
                loss_ema = loss.item() if loss_ema is None else 0.95 * loss_ema + 0.05 * loss.item()
            timing["since"] += time.perf_counter() - t_step
            done["batch"] += 1
            done["step"] += 1
            if done["step"] % 20 == 0:
                release_free_memory()
            done["tokens"] += int(sum(c.rows for c in part))
            done["seconds"] = time.perf_counter() - t_start
            acc = finish(score(per_step))["top1"]
            bar.update(1)
            bar.set_postfix(loss=f"{loss_ema or 0:.3f}", top1=f"{acc[0]:.2f}/{acc[-1]:.2f}",
                            best=f"{(done['best'] or {}).get('accept_len', 0):.3f}", refresh=False)
            # scoring 200 held-out conversations costs ~25 training steps (Qwen2.5-Coder-1.5B, 16k
            # vocabulary): at every 50 steps it took a third of the run, so points wait until
            # the training since pays for them
            if done["step"] % settings.eval_every == 0 and \
                    timing["since"] * settings.eval_share >= timing["eval_s"] * (1.0 - settings.eval_share):
                point = held_out_point()
                bar.write(f"held-out at step {point['step']}: top1 {point['top1']} accept_len {point['accept_len']}")
                last_save = time.perf_counter()
            elif time.perf_counter() - last_save > settings.save_every_s:
                save()
                last_save = time.perf_counter()
        if done["batch"] >= len(plan):
            done["epoch"] += 1
            done["plan"] = None
        save()
    bar.close()
    if done["best"] is None or done["best"]["step"] != done["step"]:
        held_out_point()
    return export_best()
