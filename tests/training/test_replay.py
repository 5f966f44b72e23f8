"""training/replay.py: fine-tuning a shipped head on the answers it has not seen plus a replay of
some it has, in a work dir of its own that holds the features of those shards only."""
from __future__ import annotations

import json

import numpy as np
import pytest

from speccompile.training.store import DataConflict


def _lines(rows):
    return "".join(json.dumps(r) + "\n" for r in rows)


def _index(split_dir, n):
    split_dir.mkdir(parents=True)
    rows = [{"shard": f"shard_{i:05d}.npz", "ids": [f"t{i}"], "tokens": 10, "answer_tokens": 5} for i in range(n)]
    (split_dir / "index.jsonl").write_text(_lines(rows))


def test_plan_replays_old_shards_evenly_and_takes_every_new_one(tmp_path):
    from speccompile.training.replay import fine_tune_plan, seen_shards

    _index(tmp_path / "train", 14)
    plan = [e["shard"] for e in fine_tune_plan(tmp_path / "train", seen=10, replay=3)]
    assert plan == ["shard_00001.npz", "shard_00005.npz", "shard_00008.npz"] + \
        [f"shard_{i:05d}.npz" for i in range(10, 14)]
    assert len(fine_tune_plan(tmp_path / "train", seen=10, replay=50)) == 14  # at most every old shard
    assert len(fine_tune_plan(tmp_path / "train", seen=10, replay=0)) == 4
    with pytest.raises(ValueError, match="answer more prompts"):
        fine_tune_plan(tmp_path / "train", seen=14, replay=2)
    with pytest.raises(DataConflict, match="another data set"):
        fine_tune_plan(tmp_path / "train", seen=20, replay=2)
    (tmp_path / "head").mkdir()
    (tmp_path / "head" / "train_report.json").write_text(json.dumps({"steps": 3}))
    with pytest.raises(ValueError, match="no data_shards"):
        seen_shards(tmp_path / "head")


def test_heads_settings_refuse_a_replay_without_a_head_to_fine_tune():
    from speccompile.training.settings import HeadsSettings

    with pytest.raises(ValueError, match="--head-init"):
        HeadsSettings(head_replay_shards=4, heads="eagle3")
    with pytest.raises(ValueError, match="--heads eagle3"):  # Medusa would read the work dir's shards
        HeadsSettings(head_replay_shards=4, head_init="heads/x")
    assert HeadsSettings(head_replay_shards=4, heads="eagle3", head_init="heads/x").head_replay_shards == 4


def test_fine_tune_with_replay_rebuilds_only_its_shards_and_records_what_the_head_saw(build_tiny, tmp_path):
    pytest.importorskip("torch")
    from speccompile.training.answers import conversations, read_shards, run_train_answers
    from speccompile.training.eagle3 import Settings, train_eagle3
    from speccompile.training.heads import fine_tune_with_replay
    from speccompile.training.replay import FINE_TUNE_LR
    from speccompile.training.store import read_index

    built = build_tiny("tiny-qwen2", "q0f32")
    work, data = tmp_path / "work", tmp_path / "data"
    (work / "prompts").mkdir(parents=True)
    texts = ["Tell me a story.", "Write a poem.", "Hello there.", "Sort a list.", "Go on.", "Count to five."]
    prompts = {"train": [{"id": f"t{i}", "prompt": t} for i, t in enumerate(texts)],
               "held_out": [{"id": "h0", "prompt": "Name a color."}, {"id": "h1", "prompt": "Add one and two."}]}
    for split, rows in prompts.items():
        (work / "prompts" / f"{split}.jsonl").write_text(_lines(rows))

    def answers(n, features=True):
        return run_train_answers(built.model_dir, built.lib, work, n, held_out=2, mt_bench=False, max_tokens=12,
                                 batch=3, shard_tokens=40, progress=False, data_dir=data, features=features)

    answers(None)  # the head's data: every shard with features, mirrored into the data dir
    old = read_index(work / "answers" / "train")
    assert len(old) >= 3
    small = Settings(intermediate_size=32, draft_vocab=64, ttt_steps=2, epochs=1, batch_rows=32, eval_every=2,
                     eval_share=1.0, warmup=1)
    head = tmp_path / "head"
    first = train_eagle3(built.model_dir, work, head, small, progress=False, record={"data_shards": len(old)})
    assert json.loads((head / "train_report.json").read_text())["data_shards"] == len(old) == first["data_shards"]

    # new answers arrive in the data dir (tokens only), then the head is fine-tuned with one old shard replayed
    more = [{"id": f"t{i}", "prompt": t} for i, t in enumerate(["Name three fruits.", "Say hi twice."], start=6)]
    with open(work / "prompts" / "train.jsonl", "a") as f:
        f.write(_lines(more))
    answers(None, features=False)
    data_index = read_index(data / "answers" / "train")
    new = data_index[len(old):]
    assert new and sorted(i for e in new for i in e["ids"]) == ["t6", "t7"]

    tuned = fine_tune_with_replay(built.model_dir, built.lib, work, data, tmp_path / "tuned",
                                  Settings(**{**small.__dict__, "draft_vocab": None, "init": str(head)}), replay=1)
    ft = tmp_path / "work-finetune"
    plan = json.loads((ft / "answers" / "train" / "plan.json").read_text())
    picked = old[int(0.5 * len(old))]
    assert plan == {"seen": len(old), "replay": 1, "shards": [picked["shard"]] + [e["shard"] for e in new]}
    got = {i: np.asarray(f).copy() for s in read_shards(ft / "answers" / "train") for i, _, _, f in conversations(s)}
    assert sorted(got) == sorted(picked["ids"] + [i for e in new for i in e["ids"]])
    ref = {i: np.asarray(f) for s in read_shards(work / "answers" / "train") for i, _, _, f in conversations(s)}
    assert all(np.array_equal(got[i], ref[i]) for i in picked["ids"])  # the replayed features, bit for bit
    assert read_index(ft / "answers" / "held_out") == read_index(work / "answers" / "held_out")
    assert tuned["data_shards"] == len(data_index) and tuned["settings"]["lr"] == FINE_TUNE_LR
    assert tuned["settings"]["init"] == str(head) and tuned["train_conversations"] == len(got)
    assert tuned["fine_tune_data"]["rebuilt"]["train"]["rebuilt_shards"] == 1 + len(new)
    assert json.loads((tmp_path / "tuned" / "train_report.json").read_text())["fine_tune_data"] == \
        tuned["fine_tune_data"]

    # a rerun resumes: nothing rebuilt, the run continued rather than restarted; another replay is refused
    again = fine_tune_with_replay(built.model_dir, built.lib, work, data, tmp_path / "tuned",
                                  Settings(**{**small.__dict__, "draft_vocab": None, "init": str(head)}), replay=1)
    assert again["fine_tune_data"]["rebuilt"]["train"]["rebuilt_shards"] == 0
    assert again["steps"] == tuned["steps"]
    with pytest.raises(DataConflict, match="--head-replay-shards 1"):
        fine_tune_with_replay(built.model_dir, built.lib, work, data, tmp_path / "tuned",
                              Settings(**{**small.__dict__, "init": str(head)}), replay=2)
    # answers added since extend the plan: only their shard is rebuilt, the old ones are kept as they are
    with open(work / "prompts" / "train.jsonl", "a") as f:
        f.write(_lines([{"id": "t8", "prompt": "List two colors."}]))
    answers(None, features=False)
    grown = fine_tune_with_replay(built.model_dir, built.lib, work, data, tmp_path / "tuned",
                                  Settings(**{**small.__dict__, "draft_vocab": None, "init": str(head)}), replay=1)
    added = read_index(data / "answers" / "train")[len(data_index):]
    assert added and grown["fine_tune_data"]["rebuilt"]["train"]["rebuilt_shards"] == len(added)
    assert grown["fine_tune_data"]["shards"] == plan["shards"] + [e["shard"] for e in added]
    assert grown["data_shards"] == len(data_index) + len(added)

    # --recount-vocab: the fine-tune's draft vocabulary is counted again from every answer of the data dir
    # (not the sample's alone, nor kept as the head's), and the first held-out point scores the head under it
    import shutil

    from safetensors.numpy import load_file

    from speccompile.training.common import draft_vocabulary
    from speccompile.training.store import answer_tokens

    recount = tmp_path / "recount"
    for d in ("answers", "prompts"):
        shutil.copytree(ft / d, recount / d)
    every = answer_tokens(data / "answers" / "train")
    assert len(every) == sum(e["answer_tokens"] for e in read_index(data / "answers" / "train"))
    recounted = train_eagle3(built.model_dir, recount, tmp_path / "recounted", Settings(**{
        **small.__dict__, "draft_vocab": None, "init": str(head), "recount_vocab": True}), progress=False,
        vocab_from=every)

    def vocab_of(folder):
        d2t = load_file(str(folder / "model.safetensors"))["d2t"]
        return d2t + np.arange(d2t.size)

    size = json.loads((head / "config.json").read_text())["vocab_size"]
    assert np.array_equal(vocab_of(tmp_path / "recounted"), draft_vocabulary(every.astype(np.int64), 64, size))
    assert not np.array_equal(vocab_of(tmp_path / "recounted"), vocab_of(head))  # the new answers' tokens counted
    assert np.array_equal(vocab_of(tmp_path / "tuned"), vocab_of(head))  # kept without the flag
    assert recounted["settings"]["recount_vocab"]
