"""Self-distillation data for draft heads: the target's own answers and its features.

Why self-distillation: a draft head is only useful if it predicts what *this* target
says, so the training text is the target's own greedy answers to instruction prompts
(``../shared/DRAFT_TRAINING.md``: chat data the target produced is worth far more per
token than generic text). The prompts are written in speccompile/training/prompts.py -- several
families of requests, never taken from the benchmark sets.

Two resumable stages, both on our compiled engine (no torch needed):

1. ``generate_answers``: batched greedy generation; one JSON line per conversation in
   ``conversations.jsonl`` (prompt ids, answer ids). Re-running skips what is there.
2. ``extract_features``: one chain forward per conversation (per chunk of a long one)
   returning the final-normed hidden state of every token (``Model.forward`` of "hidden"), stored as
   fp16 shards ``feats_NNNN.npz``
   with the token ids beside them. These are what EAGLE regresses and Medusa reads.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from speccompile.training.prompts import instruction_prompts

def _read_jsonl(path: Path) -> list[dict]:
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            break  # a line cut by an interrupted run: regenerate from there
    return rows


def generate_answers(engine, out_dir: Path, num_prompts: int, max_tokens: int, batch: int,
                     progress: bool = True) -> list[dict]:
    """Greedy answers of the target to the instruction prompts (resumable)."""
    from tqdm import tqdm

    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "conversations.jsonl"
    rows = _read_jsonl(path)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))  # drop a torn last line
    prompts = instruction_prompts(num_prompts)
    todo = prompts[len(rows):]
    bar = tqdm(total=len(prompts), initial=len(rows), desc="self-distill", unit="prompt", disable=not progress)
    with path.open("a") as f:
        for i in range(0, len(todo), batch):
            chunk = todo[i:i + batch]
            ids = [engine.encode_prompt(p) for p in chunk]
            for p, pid, res in zip(chunk, ids, engine.generate_batch(ids, max_tokens=max_tokens)):
                row = {"prompt": p, "prompt_ids": pid, "answer_ids": res.token_ids}
                f.write(json.dumps(row) + "\n")
                rows.append(row)
            f.flush()
            bar.update(len(chunk))
    bar.close()
    return rows


def _shard_holds(path: Path, members: list[dict]) -> bool:
    """A shard on disk is reused only if it holds exactly these conversations: a rerun with
    more prompts packs new conversations into the last shard, which must then be redone."""
    with np.load(path) as z:
        return (len(z["starts"]) == len(members)
                and len(z["tokens"]) == sum(len(r["prompt_ids"]) + len(r["answer_ids"]) for r in members))


def extract_features(model, out_dir: Path, rows: list[dict], shard_tokens: int = 65536,
                     progress: bool = True) -> list[Path]:
    """Final-normed hidden states of every token of every conversation, as fp16 shards
    (resumable per shard). Each shard holds ``tokens`` [n], ``feats`` [n, hidden] and
    ``starts``/``answer_start`` per conversation."""
    from tqdm import tqdm

    shards, cur, size = [], [], 0
    for i, r in enumerate(rows):  # conversations in order, ~shard_tokens tokens per shard
        cur.append(i)
        size += len(r["prompt_ids"]) + len(r["answer_ids"])
        if size >= shard_tokens or i == len(rows) - 1:
            shards.append(cur)
            cur, size = [], 0
    paths = []
    bar = tqdm(total=len(rows), desc="features", unit="conv", disable=not progress)
    for s, members in enumerate(shards):
        path = out_dir / f"feats_{s:04d}.npz"
        paths.append(path)
        if path.exists() and _shard_holds(path, [rows[j] for j in members]):
            bar.update(len(members))
            continue
        toks, feats, starts, ans = [], [], [], []
        kv = model.create_kv_cache(max(len(rows[j]["prompt_ids"]) + len(rows[j]["answer_ids"]) for j in members) + 16)
        for j in members:
            seq = rows[j]["prompt_ids"] + rows[j]["answer_ids"]
            kv.add_sequence(0)
            # in forwards of at most the library's chunk (its buffers are planned for that many
            # tokens); a chain's hidden states do not depend on how it is cut
            step = model.max_forward_tokens
            hidden = np.concatenate([model.forward(kv, [0], [seq[a:a + step]], outputs="hidden").numpy()
                                     for a in range(0, len(seq), step)])
            kv.remove_sequence(0)
            starts.append(sum(len(t) for t in toks))
            ans.append(len(rows[j]["prompt_ids"]))
            toks.append(np.asarray(seq, np.int32))
            feats.append(hidden.astype(np.float16))
            bar.update(1)
        tmp = path.with_suffix(".tmp.npz")
        np.savez(tmp, tokens=np.concatenate(toks), feats=np.concatenate(feats),
                 starts=np.asarray(starts, np.int64), answer_start=np.asarray(ans, np.int64))
        tmp.rename(path)
    bar.close()
    return paths
