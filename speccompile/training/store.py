"""What must outlast the machine: the light half of a draft head's training data, kept in a
folder that can be committed (``--data-dir``; ``make heads`` uses heads/data/<model dir name>/).

Why. The data costs hours of CPU (the target's greedy answers come at ~70-250 tok/s on two
cores), and the machine that made it can be handed to the next session with an empty cache:
that happened once and took the prompt set, 917 answered conversations and the first head
with it. The heavy half, the target's layer features (9 KB a token for a 1536-wide target),
is a pure function of the token ids -- our kernels are batch-invariant, so one prefill over a
finished conversation gives, bit for bit, the features its generation captured (tested, and
checked on Qwen2.5-Coder-1.5B) -- and rebuilding them by packed prefill is cheaper than generating
again: on a 2-core Zen 5, 303 tokens/s of whole conversations against ~205 (150 of them answer
tokens) for batch-32 generation, which also had to make the prompts first. So only the ids need
to last: ~2 bytes a token compressed.

Layout of a data dir:
- ``prompts/``: train-prompts' files (settings.json and the three append-only JSONL files);
- ``answers/<split>/index.jsonl`` + ``tokens_NNNNN.npz``: one file per answer shard of the work
  dir (same number, same index entry), holding its ``tokens``, ``offsets``, ``prompt_lens`` and
  ``ids`` (training/answers' names) without the features.

This module is files only: it imports nothing of the stages that use it (prompt_set,
answers), and the rebuild by prefill lives in answers beside the shard writer.

The rule both ways: a file (or an index) whose content is a prefix of the other's is behind and
is brought up to it; two that differ otherwise are refused by name, since one of them was made
with other settings and mixing them would silently train on two data sets.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np

PROMPT_FILES = ("settings.json", "train.jsonl", "held_out.jsonl", "rejected.jsonl")
TOKEN_KEYS = ("tokens", "offsets", "prompt_lens", "ids")


class DataConflict(ValueError):
    """The work dir and the data dir hold different data sets."""


def _copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(dst.name + ".tmp")
    shutil.copyfile(src, tmp)
    os.replace(tmp, dst)


def sync_prompts(work_prompts: Path, data_prompts: Path) -> dict[str, str]:
    """Bring each prompt file of either folder up to the other's; returns {file: what was done}."""
    done = {}
    for name in PROMPT_FILES:
        a, b = Path(work_prompts) / name, Path(data_prompts) / name
        if not a.exists() and not b.exists():
            continue
        if not b.exists():
            _copy(a, b)
            done[name] = "saved"
            continue
        if not a.exists():
            _copy(b, a)
            done[name] = "restored"
            continue
        x, y = a.read_bytes(), b.read_bytes()
        # an interrupted append leaves a torn last line: compare the complete lines only
        xc, yc = x[: x.rfind(b"\n") + 1], y[: y.rfind(b"\n") + 1]
        if name == "settings.json":
            sx, sy = json.loads(x), json.loads(y)
            if sx == sy:
                continue
            if _upgrade_of(sx, sy):
                _copy(a, b)
                done[name] = "saved"
            elif _upgrade_of(sy, sx):
                _copy(b, a)
                done[name] = "restored"
            else:
                raise DataConflict(f"{a} and {b} hold other train-prompts settings: choose another --work-dir or "
                                   "--data-dir")
        elif len(xc) > len(yc) and xc.startswith(yc):
            _copy(a, b)
            done[name] = "saved"
        elif len(yc) > len(xc) and yc.startswith(xc):
            _copy(b, a)
            done[name] = "restored"
        elif xc != yc:
            raise DataConflict(f"{a} and {b} differ beyond a common beginning (two different prompt sets): "
                               "choose another --work-dir or --data-dir")
    return done


def _upgrade_of(new: dict, old: dict) -> bool:
    """``new`` is ``old`` carried to a later slot plan (prompt_set.PromptSet upgrades a set in place:
    the same settings, a higher ``plan_version``, and what the new plan adds, such as ``wide_from``),
    or ``old`` with more focus stretches (``train-prompts --focus`` appends them)."""
    if new.get("plan_version", 1) > old.get("plan_version", 1):
        return all(new.get(k) == v for k, v in old.items() if k != "plan_version")
    was, now = old.get("focus", []), new.get("focus", [])
    return (len(now) > len(was) and now[: len(was)] == was and set(new) - set(old) <= {"focus"}
            and all(new.get(k) == v for k, v in old.items() if k != "focus"))


def read_index(split_dir: Path) -> list[dict]:
    """The index entries of a split's complete shards ({shard, ids, tokens, answer_tokens}), in
    the order they were written; a torn last line (an interrupted append) ends it."""
    index = Path(split_dir) / "index.jsonl"
    out = []
    for line in index.read_text().splitlines() if index.exists() else []:
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            break
        if not isinstance(entry, dict) or not {"shard", "ids"} <= entry.keys():
            break
        out.append(entry)
    return out


def _check_prefix(work: list[dict], data: list[dict], where: str) -> None:
    for w, d in zip(work, data):
        if w["shard"] != d["shard"] or w["ids"] != d["ids"]:
            raise DataConflict(f"{where}: the work dir's {w['shard']} and the data dir's {d['shard']} hold other "
                               "conversations (two different answer sets): choose another --work-dir or --data-dir")


def token_file(shard: str) -> str:
    return shard.replace("shard_", "tokens_")


def save_answers(work_split: Path, data_split: Path) -> int:
    """Write the token half of every work-dir shard the data dir lacks; returns how many."""
    work, data = read_index(work_split), read_index(data_split)
    _check_prefix(work, data, str(data_split))
    new = work[len(data):]
    if not new:
        return 0
    Path(data_split).mkdir(parents=True, exist_ok=True)
    for entry in new:
        with np.load(Path(work_split) / entry["shard"]) as z:
            arrays = {k: z[k] for k in TOKEN_KEYS}
        dst = Path(data_split) / token_file(entry["shard"])
        with open(dst.with_name(dst.name + ".tmp"), "wb") as f:
            np.savez_compressed(f, **arrays)
        os.replace(dst.with_name(dst.name + ".tmp"), dst)
        with open(Path(data_split) / "index.jsonl", "a") as f:
            f.write(json.dumps(entry) + "\n")
    return len(new)


def missing_answers(work_split: Path, data_split: Path) -> list[dict]:
    """The data dir's index entries the work dir lacks, in order (to rebuild)."""
    work, data = read_index(work_split), read_index(data_split)
    _check_prefix(work, data, str(work_split))
    return data[len(work):]


def load_tokens(data_split: Path, entry: dict) -> dict[str, np.ndarray]:
    with np.load(Path(data_split) / token_file(entry["shard"])) as z:
        out = {k: z[k] for k in TOKEN_KEYS}
    if list(map(str, out["ids"])) != list(entry["ids"]):
        raise DataConflict(f"{data_split}/{token_file(entry['shard'])} does not hold the conversations its index "
                           "line names (a partial copy?): delete the line and the file to regenerate them")
    return out


def answer_tokens(data_split: Path) -> np.ndarray:
    """Every answer token of a data dir's split (prompts left out), in order: what a draft
    vocabulary is counted from."""
    out = []
    for entry in read_index(data_split):
        z = load_tokens(data_split, entry)
        offs, plens = z["offsets"], z["prompt_lens"]
        out += [z["tokens"][offs[c] + plens[c]: offs[c + 1]] for c in range(len(plens))]
    return np.concatenate(out) if out else np.zeros(0, np.int32)


class TokenShardWriter:
    """Answers written straight into a data dir, without their features (``train-answers
    --no-features``): the token half of each shard under the name and index line the work dir's
    shard will get when it is rebuilt by prefill. Why: the features are a pure function of the
    tokens, so a machine can add answers to a data set without first rebuilding the features of
    everything already in it (hours for a few million tokens); the run that trains rebuilds them
    all at once. training/answers.ShardWriter is this writer with the features kept: the index,
    the resume rules and the atomic writes are the same."""

    features = False
    pattern = "tokens_*.npz*"  # the files of this writer's shards

    def __init__(self, split_dir: Path, shard_tokens: int, on_flush=None):
        self.dir, self.shard_tokens, self.on_flush = Path(split_dir), shard_tokens, on_flush
        self.dir.mkdir(parents=True, exist_ok=True)
        self.entries = read_index(self.dir)
        # what an interrupted run left, made whole: the torn line dropped, unnamed shard files deleted
        (self.dir / "index.jsonl").write_text("".join(json.dumps(e) + "\n" for e in self.entries))
        named = {self.file_of(e["shard"]) for e in self.entries}
        for p in self.dir.glob(self.pattern):
            if p.name not in named:
                p.unlink()
        self.next = len(self.entries)
        self.rows: list[tuple] = []  # (id, tokens, prompt length, layer features or None, hidden or None)

    def file_of(self, shard: str) -> str:
        return token_file(shard)

    def arrays(self) -> dict[str, np.ndarray]:
        lens = [len(r[1]) for r in self.rows]
        return {"tokens": np.concatenate([np.asarray(r[1], np.int32) for r in self.rows]),
                "offsets": np.concatenate([[0], np.cumsum(lens)]).astype(np.int64),
                "prompt_lens": np.asarray([r[2] for r in self.rows], np.int32),
                "ids": np.asarray([r[0] for r in self.rows])}

    def save(self, f, arrays: dict[str, np.ndarray]) -> None:
        np.savez_compressed(f, **arrays)

    def done_ids(self) -> set[str]:
        return {i for e in self.entries for i in e["ids"]}

    def add(self, pid: str, tokens: list[int], prompt_len: int, feats=None, hidden=None) -> None:
        self.rows.append((pid, tokens, prompt_len, feats, hidden))
        if sum(len(r[1]) for r in self.rows) >= self.shard_tokens:
            self.flush()

    def flush(self) -> None:
        if not self.rows:
            return
        name = f"shard_{self.next:05d}.npz"
        dst = self.dir / self.file_of(name)
        tmp = dst.with_name(dst.name + ".tmp")
        with open(tmp, "wb") as f:
            self.save(f, self.arrays())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, dst)
        lens = [len(r[1]) for r in self.rows]
        entry = {"shard": name, "ids": [r[0] for r in self.rows], "tokens": int(sum(lens)),
                 "answer_tokens": int(sum(n - r[2] for n, r in zip(lens, self.rows)))}
        with open(self.dir / "index.jsonl", "a") as f:
            f.write(json.dumps(entry) + "\n")
        self.entries.append(entry)
        self.next += 1
        self.rows = []
        if self.on_flush is not None:
            self.on_flush()
