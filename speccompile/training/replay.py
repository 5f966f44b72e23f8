"""Fine-tuning a shipped EAGLE-3 head on answers it has not seen, with a replay of some it has
(``train-heads --head-init <head folder> --head-replay-shards N``).

Why a replay. A head fine-tuned on new answers alone forgets what the old ones taught it: the
Qwen2.5-Coder-1.5B head, fine-tuned on 417 answers of the wide mix (summaries, passages,
translation) at peak lr 3e-4, gained 0.15-0.32 accepted tokens on those families and lost 0.23
on held-out code (3.18 -> 2.95). With the new answers plus 10 of the 221 old shards spread over
the data set, at peak lr 1e-4, it kept the gains and code stayed at 3.11. Training on every old
answer again instead is an epoch of 10,000 conversations: hours on two cores.

Why a work dir of its own. The pipeline's work dir mirrors the data dir shard for shard (its
restore rebuilds every missing shard, in order). A fine-tune needs the features of only the new
shards and the sampled old ones, so it assembles them into ``<work dir>-finetune``: its train
split numbers them from 0, ``answers/train/plan.json`` names the data-dir shard behind each. A
rerun resumes it, answers added to the data dir meanwhile extend it, and a different replay is
refused instead of mixing two. Its held-out and MT-bench splits are the data dir's own (restored as
usual), so checkpoints are scored as a new head's would be.

What a head has seen: the ``data_shards`` field of its ``train_report.json`` (every run of this
pipeline writes it): the count of the data dir's training shards it learned from, all of them or
a replayed sample; the shards from there on are new to it.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from speccompile.training.answers import ShardWriter, rebuild_shard
from speccompile.training.store import DataConflict, read_index

FINE_TUNE_LR = 1e-4  # peak lr of a fine-tune with replay (measured above); a new head trains at 3e-4


def seen_shards(head_dir: Path) -> int:
    """How many of the data dir's training shards the head at ``head_dir`` learned from."""
    report = Path(head_dir) / "train_report.json"
    seen = json.loads(report.read_text()).get("data_shards") if report.exists() else None
    if not isinstance(seen, int) or seen < 0:
        raise ValueError(f"{report} does not say which answers the head learned from (no data_shards): a replay "
                         "needs it to tell new answers from old; fine-tune without --head-replay-shards, or add "
                         "the count of the data dir's train shards it trained on")
    return seen


def fine_tune_plan(data_split: Path, seen: int, replay: int) -> list[dict]:
    """The data dir's index entries to fine-tune on: ``replay`` of the first ``seen`` shards,
    evenly spaced, then every shard from ``seen`` on."""
    entries = read_index(data_split)
    if seen > len(entries):
        raise DataConflict(f"the head learned from {seen} training shards, {data_split} holds {len(entries)}: "
                           "another data set (choose the head's own --data-dir)")
    new = entries[seen:]
    if not new:
        raise ValueError(f"every one of the {len(entries)} training shards in {data_split} is in the head already: "
                         "answer more prompts first (train-heads --answer-prompts, or train-answers)")
    replay = min(replay, seen)
    return [entries[int((i + 0.5) * seen / replay)] for i in range(replay)] + new


def plan_for(head_dir: Path, data_split: Path, work_split: Path, replay: int) -> tuple[int, list[dict]]:
    """(seen, plan) of a fine-tune: a work dir's own plan when it has one (a resumed run: its head
    folder may hold the exported result by now), else the head's ``data_shards``. Answers added to
    the data dir since extend the plan; a different replay is refused."""
    plan_file = Path(work_split) / "plan.json"
    if plan_file.exists():
        old = json.loads(plan_file.read_text())
        if old["replay"] != replay:
            raise DataConflict(f"{work_split} was assembled with {old['replay']} replayed shards, not {replay}: give "
                               f"--head-replay-shards {old['replay']}, or delete it to start over")
        seen = old["seen"]
    else:
        seen = seen_shards(head_dir)
    return seen, fine_tune_plan(data_split, seen, replay)


def assemble(engine, seen: int, replay: int, plan: list[dict], work_split: Path, data_split: Path, sink,
             progress: bool = True) -> dict:
    """Rebuild by prefill the features of the planned shards into ``work_split`` (shards
    numbered from 0, in plan order; the engine must be capturing into ``sink``). Resumable: the
    shards already there must be the plan's first ones."""
    from tqdm import tqdm

    work_split = Path(work_split)
    work_split.mkdir(parents=True, exist_ok=True)
    names = [e["shard"] for e in plan]
    plan_file = work_split / "plan.json"
    old = json.loads(plan_file.read_text())["shards"] if plan_file.exists() else []
    have = read_index(work_split)
    if old != names[:len(old)] or len(have) > len(plan) or any(h["ids"] != e["ids"] for h, e in zip(have, plan)):
        raise DataConflict(f"{work_split} holds other conversations than this plan names (other shards of "
                           f"{data_split}): delete it to assemble again")
    plan_file.write_text(json.dumps({"seen": seen, "replay": replay, "shards": names}))
    todo = plan[len(have):]
    writer, t0, tokens = ShardWriter(work_split, 1 << 62), time.perf_counter(), 0
    bar = tqdm(total=sum(e["tokens"] for e in plan), initial=sum(e["tokens"] for e in have),
               desc=f"features for the fine-tune (from {data_split})", unit="tok", disable=not progress,
               file=sys.stderr, mininterval=20)
    for entry in todo:
        rebuild_shard(engine, writer, data_split, entry, sink)
        tokens += entry["tokens"]
        bar.update(entry["tokens"])
    bar.close()
    dt = time.perf_counter() - t0
    return {"planned_shards": len(plan), "rebuilt_shards": len(todo), "tokens": tokens, "seconds": round(dt, 1),
            "tok_s": round(tokens / dt, 1) if dt > 0 else 0.0}
