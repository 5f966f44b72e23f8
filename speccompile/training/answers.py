"""``speccompile train-answers``: the target's own greedy answers to the prompt set, with the
target's low/mid/high layer features of every token, captured while it generates.

Why this shape. An EAGLE-3 head learns to predict what *this* target says next from the
outputs of three of its layers, so its training data is the target's own greedy answers
(what lossless greedy verification accepts) and those layers' outputs at every token.
Both come out of one run of our batched engine: ``Engine.capture_features`` hands the
features of each token to a sink as the token is committed (the prompt at prefill, then
every decoded token), so there is no second pass over the text. Sequences are batched
continuously (a finished answer's slot is refilled at once), since answer lengths vary
tenfold and a static batch would wait for its longest member.

Splits: ``train`` and ``held_out`` answer train-prompts' two prompt sets; ``mt_bench``
answers the first turns of bench/mt_bench.jsonl for the *offline evaluation* only (top-1
and accepted length per category and depth) -- the training stage never reads it.

Layout, under ``WORK_DIR/answers/<split>/``:
- ``shard_NNNNN.npz``: a group of whole conversations. ``tokens`` int32 [T] (prompt then
  answer, conversations back to back), ``offsets`` int64 [C+1] (conversation c is
  ``tokens[offsets[c]:offsets[c+1]]``), ``prompt_lens`` int32 [C], ``features`` float16
  [T - C, 3 * hidden] (every token but each conversation's last, which the target never
  forwarded: conversation c's rows start at ``offsets[c] - c``), ``hidden`` float16
  [T - C, hidden] (the final-normed hidden states of the same tokens: what Medusa heads
  read), ``ids`` [C] (prompt ids);
- ``index.jsonl``: one line per shard, appended only after the shard was renamed into
  place; a rerun skips every id listed and deletes shards no line names (an interrupted
  write), so nothing done is redone and nothing half-written is read;
- ``WORK_DIR/answers/summary.json``: counts and throughput per split.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

from speccompile.training.store import (DataConflict, TokenShardWriter, load_tokens, missing_answers, read_index,
                                        save_answers, sync_prompts)

SPLITS = ("held_out", "mt_bench", "train")  # the order a run fills them: the small evaluation sets first
FEATURE_DTYPE = np.float16  # 9 KB a token for a 1536-wide target (fp32 would double the disk, not the accuracy)


def read_shards(split_dir: Path) -> list[Path]:
    """The complete shards of a split, in the order they were written."""
    return [Path(split_dir) / e["shard"] for e in read_index(split_dir)]


def npz_memmap(path: Path, key: str) -> np.ndarray:
    """A read-only memory map of one array of an uncompressed ``.npz`` (what ``np.savez``
    writes: each member a stored ``.npy``), so that training reads the features it batches
    from the page cache instead of holding every shard in memory (12 KB a token: a million
    answer tokens would fill this machine's RAM)."""
    import struct
    import zipfile

    with zipfile.ZipFile(path) as zf:
        info = zf.getinfo(key + ".npy")
    if info.compress_type != zipfile.ZIP_STORED:
        raise ValueError(f"{path}:{key} is compressed; only np.savez shards can be mapped")
    with open(path, "rb") as f:
        f.seek(info.header_offset)
        local = f.read(30)  # the member's local header: its name and extra field lengths at bytes 26..29
        if local[:4] != b"PK\x03\x04":
            raise ValueError(f"{path}: no local zip header for {key}")
        name_len, extra_len = struct.unpack("<HH", local[26:30])
        f.seek(info.header_offset + 30 + name_len + extra_len)
        version = np.lib.format.read_magic(f)
        shape, fortran, dtype = (np.lib.format.read_array_header_1_0(f) if version == (1, 0)
                                 else np.lib.format.read_array_header_2_0(f))
        offset = f.tell()
    if dtype.hasobject:
        raise ValueError(f"{path}:{key} holds Python objects")
    if not int(np.prod(shape)):
        return np.zeros(shape, dtype)
    return np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=shape, order="F" if fortran else "C")


def conversations(shard: Path, hidden: bool = False):
    """Yield (id, tokens [L], prompt_len, layer features [L-1, 3h] fp16) of one shard, or with
    ``hidden`` (id, tokens, prompt_len, final hidden states [L-1, h] fp16). The features are
    views of a memory map of the shard (read when used)."""
    with np.load(shard) as z:
        tokens, offsets, plens, ids = z["tokens"], z["offsets"], z["prompt_lens"], z["ids"]
    feats = npz_memmap(shard, "hidden" if hidden else "features")
    for c in range(len(plens)):
        a, b = int(offsets[c]), int(offsets[c + 1])
        yield str(ids[c]), tokens[a:b], int(plens[c]), feats[a - c: b - c - 1]


def split_prompts(work_dir: Path, split: str, mt_bench: Path) -> list[dict]:
    """[{id, prompt, category?}] of a split: train-prompts' accepted prompts, or MT-bench's first turns."""
    if split == "mt_bench":
        rows = [json.loads(x) for x in Path(mt_bench).read_text().splitlines() if x.strip()]
        return [{"id": f"mt{r['question_id']}", "prompt": r["turns"][0], "category": r.get("category", "")}
                for r in rows]
    from speccompile.training.prompt_set import read_prompts

    return read_prompts(Path(work_dir) / "prompts", split)


class ShardWriter(TokenShardWriter):
    """Collects finished conversations and writes them as shards of about ``shard_tokens``, with
    their features (uncompressed, so training can map them: ``npz_memmap``)."""

    features = True
    pattern = "shard_*.npz*"

    def file_of(self, shard: str) -> str:
        return shard

    def arrays(self) -> dict[str, np.ndarray]:
        return {**super().arrays(), "features": np.concatenate([r[3] for r in self.rows]),
                "hidden": np.concatenate([r[4] for r in self.rows])}

    def save(self, f, arrays: dict[str, np.ndarray]) -> None:
        np.savez(f, **arrays)


class FeatureBuffers:
    """The sink ``Engine.capture_features`` calls: layer features [m, 3h] and hidden states
    [m, h] of the tokens at positions position.. of a sequence, written into its buffers."""

    def __init__(self, hidden_size: int):
        self.h = hidden_size
        self.buf: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self.filled: dict[int, int] = {}

    def open(self, seq_id: int, capacity: int) -> None:
        self.buf[seq_id] = (np.zeros((capacity, 3 * self.h), FEATURE_DTYPE), np.zeros((capacity, self.h), FEATURE_DTYPE))
        self.filled[seq_id] = 0

    def __call__(self, seq_id: int, position: int, feats: np.ndarray, hidden: np.ndarray) -> None:
        if position != self.filled[seq_id]:
            raise RuntimeError(f"features of position {position} arrived, {self.filled[seq_id]} expected")
        layers, hid = self.buf[seq_id]
        layers[position: position + len(feats)] = feats
        hid[position: position + len(feats)] = hidden
        self.filled[seq_id] += len(feats)

    def close(self, seq_id: int, length: int) -> tuple[np.ndarray, np.ndarray]:
        """The features of a finished sequence of ``length`` tokens: all but its last token's.
        (An answer that ended at a stop token forwarded its last token too, but the stop token
        itself is not part of the history: its row, whose label it would be, is dropped.)"""
        feats, filled = self.buf.pop(seq_id), self.filled.pop(seq_id)
        if filled not in (length - 1, length):
            raise RuntimeError(f"a {length}-token conversation has features of {filled} tokens, {length - 1} expected")
        return feats[0][: length - 1], feats[1][: length - 1]


def answer_split(engine, split_dir: Path, prompts: list[dict], limit: int, max_tokens: int, batch: int,
                 shard_tokens: int, progress: bool = True, on_flush=None, writer=None) -> dict:
    """Answer (greedily) the first ``limit`` prompts not yet answered, ``batch`` sequences
    decoding together; returns this run's counts and throughput. ``on_flush`` is called after
    each shard is written (the data dir's copy). ``writer``: where the answers go (default a
    ShardWriter of ``split_dir``, with features; a store.TokenShardWriter keeps tokens only)."""
    from contextlib import nullcontext

    from tqdm import tqdm

    writer = writer or ShardWriter(split_dir, shard_tokens, on_flush)
    capture = writer.features
    done = writer.done_ids()
    wanted = prompts[:limit]
    todo = [p for p in wanted if p["id"] not in done]
    sink = FeatureBuffers(engine.model.hidden_size)
    bar = tqdm(total=len(wanted), initial=len(wanted) - len(todo), desc=f"answers {split_dir.name}", unit="prompt",
               disable=not progress, file=sys.stderr, mininterval=20)
    active, owner, made, t0 = [], {}, 0, time.perf_counter()
    queue = list(reversed(todo))
    with engine.capture_features(sink) if capture else nullcontext():
        while queue or active:
            while queue and len(active) < batch:
                row = queue.pop()
                ids = engine.encode_prompt(row["prompt"])
                seq = engine.new_sequence(ids, max_tokens)
                if capture:
                    sink.open(seq.seq_id, len(ids) + seq.budget + 1)
                engine.attach(seq)
                while seq.prefilling:
                    engine.prefill([seq], engine.model.prefill_chunk_size)
                active.append(seq)
                owner[seq.seq_id] = (row["id"], len(ids))
            running = [s for s in active if not s.done]
            if running:
                engine.step(running)
            for s in [s for s in active if s.done]:
                active.remove(s)
                engine.detach(s)
                pid, plen = owner.pop(s.seq_id)
                feats, hidden = sink.close(s.seq_id, len(s.history)) if capture else (None, None)
                writer.add(pid, list(s.history), plen, feats, hidden)
                made += len(s.history) - plen
                bar.update(1)
                bar.set_postfix(tok_s=f"{made / (time.perf_counter() - t0):.1f}", refresh=False)
    writer.flush()
    bar.close()
    dt = time.perf_counter() - t0
    return {"answered": len(todo), "answer_tokens": made, "seconds": round(dt, 1),
            "tok_s": round(made / dt, 1) if dt > 0 else 0.0}


def rebuild_features(engine, convs: list[list[int]], sink) -> list[tuple[np.ndarray, np.ndarray]]:
    """The (layer features [L-1, 3h], hidden [L-1, h]) of each finished conversation, from
    prefills of whole conversations packed into the library's chunk (the engine's feature sink
    must be ``sink``, a FeatureBuffers)."""
    pending = list(enumerate(convs))
    out: list = [None] * len(convs)
    chunk = engine.model.prefill_chunk_size
    while pending:
        batch, used = [], 0
        while pending and len(batch) < engine.max_num_sequence and (not batch or used + len(pending[0][1]) <= chunk):
            i, toks = pending.pop(0)
            seq = engine.new_sequence(list(toks), 1)
            sink.open(seq.seq_id, len(toks) + 2)
            engine.attach(seq)
            batch.append((i, seq, len(toks)))
            used += len(toks)
        try:
            while any(s.prefilling for _, s, _ in batch):
                engine.prefill([s for _, s, _ in batch if s.prefilling], chunk)
        finally:
            for _, s, _ in batch:
                engine.detach(s)
        for i, s, n in batch:
            out[i] = sink.close(s.seq_id, n)
    return out


def rebuild_shard(engine, writer: ShardWriter, data_split: Path, entry: dict, sink) -> None:
    """Write the data dir's shard ``entry`` as the writer's next shard, its features rebuilt."""
    z = load_tokens(data_split, entry)
    offs = z["offsets"]
    convs = [z["tokens"][offs[c]: offs[c + 1]].tolist() for c in range(len(z["prompt_lens"]))]
    feats = rebuild_features(engine, convs, sink)
    writer.rows = [(str(i), t, int(p), f, h) for i, t, p, (f, h) in zip(z["ids"], convs, z["prompt_lens"], feats)]
    writer.flush()


def restore_split(engine, work_split: Path, data_split: Path, sink, progress: bool = True) -> dict:
    """Rebuild the work dir's missing shards of one split from the data dir's token files (the
    engine must be capturing features into ``sink``); each shard gets its old name and index line."""
    from tqdm import tqdm

    todo = missing_answers(work_split, data_split)
    if not todo:
        return {"rebuilt_shards": 0}
    writer, t0, tokens = ShardWriter(work_split, 1 << 62), time.perf_counter(), 0
    bar = tqdm(total=sum(e["tokens"] for e in todo), desc=f"features {Path(work_split).name} (from {data_split})",
               unit="tok", disable=not progress, file=sys.stderr, mininterval=20)
    for entry in todo:
        if writer.next != int(entry["shard"][6:11]):
            raise DataConflict(f"{work_split}: shard {entry['shard']} would be written as shard_{writer.next:05d}")
        rebuild_shard(engine, writer, data_split, entry, sink)
        tokens += entry["tokens"]
        bar.update(entry["tokens"])
    bar.close()
    dt = time.perf_counter() - t0
    return {"rebuilt_shards": len(todo), "tokens": tokens, "seconds": round(dt, 1), "tok_s": round(tokens / dt, 1)}


def summarize(answers_dir: Path) -> dict:
    out = {}
    for split in SPLITS:
        rows = read_index(answers_dir / split)
        if rows:
            out[split] = {"conversations": sum(len(r["ids"]) for r in rows), "shards": len(rows),
                          "tokens": sum(r["tokens"] for r in rows),
                          "answer_tokens": sum(r["answer_tokens"] for r in rows)}
    return out


def run_train_answers(model_dir: Path, model_lib: Path, work_dir: Path | None, num_prompts: int | None,
                      held_out: int, mt_bench: bool, max_tokens: int, batch: int, shard_tokens: int = 16384,
                      bench_file: Path | None = None, progress: bool = True, data_dir: Path | None = None,
                      features: bool = True) -> dict:
    """The stage: held-out answers first (checkpoint selection needs them), MT-bench first turns
    (offline evaluation), then the training answers. With ``data_dir`` (speccompile/training/store.py)
    the prompts and the answers' tokens are kept there too, and shards the work dir lacks are
    rebuilt from it by prefill before anything new is answered. ``features=False`` (needs
    ``data_dir``): new answers go to the data dir as tokens only, and nothing is rebuilt; the
    training run rebuilds every shard's features from the data dir."""
    from speccompile.runtime.engine import Engine

    from speccompile.training.prompt_set import REPO, default_work_dir

    work_dir = Path(work_dir or default_work_dir(model_dir))
    bench_file = Path(bench_file or REPO / "bench" / "mt_bench.jsonl")
    if data_dir is not None:
        sync_prompts(work_dir / "prompts", Path(data_dir) / "prompts")
        for split in SPLITS:  # check both sides agree before any long work
            missing_answers(work_dir / "answers" / split, Path(data_dir) / "answers" / split)
    if not (work_dir / "prompts" / "train.jsonl").exists():
        raise FileNotFoundError(f"{work_dir / 'prompts'} holds no prompt set: run `speccompile train-prompts` first")
    if max_tokens < 1 or batch < 1:
        raise ValueError("--max-tokens and --batch must be positive")
    if not features and data_dir is None:
        raise ValueError("--no-features writes the answers' tokens to the data dir: give --data-dir")
    plan = [("held_out", held_out), ("mt_bench", 10**9 if mt_bench else 0), ("train", num_prompts or 10**9)]
    prompts = {split: split_prompts(work_dir, split, bench_file) for split, n in plan if n}
    longest = max(len(p["prompt"]) for rows in prompts.values() for p in rows)  # characters >= tokens
    engine = Engine(model_dir, model_lib, max_num_sequence=batch,
                    max_total_seq_length=batch * (min(longest, 4096) + max_tokens + 64))
    report = {"runs": {}}
    for split, n in plan:
        if not n:
            continue
        split_dir, mirror, writer = work_dir / "answers" / split, None, None
        if not features:
            data_split = Path(data_dir) / "answers" / split
            save_answers(split_dir, data_split)  # what the work dir has beyond the data dir, first
            writer = TokenShardWriter(data_split, shard_tokens)
        elif data_dir is not None:
            data_split = Path(data_dir) / "answers" / split
            sink = FeatureBuffers(engine.model.hidden_size)
            with engine.capture_features(sink):
                report.setdefault("restored", {})[split] = restore_split(engine, split_dir, data_split,
                                                                                    sink, progress)
            save_answers(split_dir, data_split)
            mirror = lambda s=split_dir, d=data_split: save_answers(s, d)  # noqa: E731
        report["runs"][split] = answer_split(engine, split_dir, prompts[split], n, max_tokens, batch, shard_tokens,
                                             progress, mirror, writer)
    # without features the answers went to the data dir alone (a fresh work dir may hold none)
    report["totals"] = summarize(work_dir / "answers" if features else Path(data_dir) / "answers")
    (work_dir / "answers").mkdir(parents=True, exist_ok=True)
    (work_dir / "answers" / "summary.json").write_text(json.dumps(report, indent=1))
    return report
