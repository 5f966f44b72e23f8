"""training/store.py: the prompts and answer token ids kept in a data dir, and the features rebuilt
from them by prefill on a machine whose work dir is empty -- bit for bit the shards the
generating run wrote."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from speccompile.training import store as train_store
from speccompile.training.store import DataConflict, sync_prompts


def _lines(rows):
    return "".join(json.dumps(r) + "\n" for r in rows)


def test_prompt_files_follow_the_longer_side_and_refuse_two_sets(tmp_path):
    work, data = tmp_path / "work", tmp_path / "data"
    work.mkdir()
    rows = [{"id": f"t{i}", "prompt": f"question {i}"} for i in range(4)]
    (work / "settings.json").write_text(json.dumps({"seed": 0}))
    (work / "train.jsonl").write_text(_lines(rows[:3]))
    assert sync_prompts(work, data) == {"settings.json": "saved", "train.jsonl": "saved"}
    assert (data / "train.jsonl").read_text() == _lines(rows[:3])
    # the data dir ahead (another machine went on): the work dir catches up, a torn line ignored
    (data / "train.jsonl").write_text(_lines(rows))
    (work / "train.jsonl").write_text(_lines(rows[:2]) + '{"id": "t2", "pro')
    assert sync_prompts(work, data) == {"train.jsonl": "restored"}
    assert (work / "train.jsonl").read_text() == _lines(rows)
    assert sync_prompts(work, data) == {}
    # an empty work dir gets everything back
    shutil.rmtree(work)
    assert sync_prompts(work, data) == {"settings.json": "restored", "train.jsonl": "restored"}
    # two different prompt sets, or other settings, are refused by name
    (work / "train.jsonl").write_text(_lines(rows[:1] + [{"id": "t1", "prompt": "other"}]))
    with pytest.raises(DataConflict, match="differ beyond a common beginning"):
        sync_prompts(work, data)
    (work / "train.jsonl").write_text(_lines(rows))
    (work / "settings.json").write_text(json.dumps({"seed": 1}))
    with pytest.raises(DataConflict, match="other train-prompts settings"):
        sync_prompts(work, data)


def _shards(split_dir):
    from speccompile.training.answers import read_shards

    out = []
    for path in read_shards(split_dir):
        with np.load(path) as z:
            out.append((path.name, {k: z[k] for k in z.files}))
    return out


def test_answers_rebuilt_from_token_ids_equal_the_generated_shards(build_tiny, tmp_path):
    from speccompile.training.answers import run_train_answers

    built = build_tiny("tiny-qwen2", "q0f32")
    work, data = tmp_path / "work", tmp_path / "data"
    (work / "prompts").mkdir(parents=True)
    for split, texts in (("train", ["Tell me a story.", "Write a poem.", "Hello there.", "Sort a list.", "Go on."]),
                         ("held_out", ["What is two plus two?", "Name a color."])):
        rows = [{"id": f"{split[0]}{i}", "prompt": t} for i, t in enumerate(texts)]
        (work / "prompts" / f"{split}.jsonl").write_text(_lines(rows))

    def run(work_dir):
        return run_train_answers(built.model_dir, built.lib, work_dir, None, held_out=2, mt_bench=False,
                                 max_tokens=12, batch=3, shard_tokens=40, progress=False, data_dir=data)

    first = run(work)
    made = {s: _shards(work / "answers" / s) for s in ("train", "held_out")}
    assert len(made["train"]) >= 2 and first["runs"]["train"]["answered"] == 5
    for split, shards in made.items():  # the data dir holds every shard's token half, same index
        assert (data / "answers" / split / "index.jsonl").read_text() == \
            (work / "answers" / split / "index.jsonl").read_text()
        for name, arrays in shards:
            with np.load(data / "answers" / split / train_store.token_file(name)) as z:
                assert set(z.files) == set(train_store.TOKEN_KEYS)
                assert all(np.array_equal(z[k], arrays[k]) for k in z.files)
    assert (data / "prompts" / "train.jsonl").read_text() == (work / "prompts" / "train.jsonl").read_text()

    # a new machine: nothing but the data dir. The prompts come back, every shard is rebuilt by
    # prefill -- same names, same index lines, the same features bit for bit -- and nothing is
    # answered again
    fresh = tmp_path / "fresh"
    second = run(fresh)
    assert second["runs"]["train"]["answered"] == 0 and second["runs"]["held_out"]["answered"] == 0
    assert second["restored"]["train"]["rebuilt_shards"] == len(made["train"])
    for split, shards in made.items():
        again = _shards(fresh / "answers" / split)
        assert [n for n, _ in again] == [n for n, _ in shards]
        for (_, a), (_, b) in zip(again, shards):
            assert set(a) == set(b) and all(np.array_equal(a[k], b[k]) for k in a), split
        assert (fresh / "answers" / split / "index.jsonl").read_text() == \
            (work / "answers" / split / "index.jsonl").read_text()

    # a work dir behind the data dir rebuilds only what it lacks
    index = (fresh / "answers" / "train" / "index.jsonl").read_text().splitlines(keepends=True)
    last = json.loads(index[-1])["shard"]
    (fresh / "answers" / "train" / "index.jsonl").write_text("".join(index[:-1]))
    third = run(fresh)
    assert third["restored"]["train"]["rebuilt_shards"] == 1
    assert np.array_equal(dict(_shards(fresh / "answers" / "train"))[last]["features"],
                          dict(made["train"])[last]["features"])

    # a data dir whose answers are another set is refused before the engine loads
    other = (data / "answers" / "train" / "index.jsonl").read_text().replace('"t0"', '"t9"')
    (data / "answers" / "train" / "index.jsonl").write_text(other)
    with pytest.raises(DataConflict, match="other conversations"):
        run(work)


def test_shard_arrays_are_memory_mapped_as_saved(tmp_path):
    """Training maps the features of every shard instead of loading them (RAM would not hold a
    few million answer tokens): the map equals what np.load reads, for each array kind."""
    from speccompile.training.answers import npz_memmap

    rng = np.random.default_rng(0)
    arrays = {"features": rng.standard_normal((37, 12)).astype(np.float16), "tokens": np.arange(9, dtype=np.int32),
              "offsets": np.array([0, 4, 9], np.int64), "ids": np.array(["t1", "t22"]),
              "empty": np.zeros((0, 12), np.float16), "fortran": np.asfortranarray(rng.standard_normal((5, 3)))}
    with open(tmp_path / "s.npz", "wb") as f:
        np.savez(f, **arrays)
    for key, want in arrays.items():
        got = npz_memmap(tmp_path / "s.npz", key)
        assert got.dtype == want.dtype and got.shape == want.shape and np.array_equal(got, want), key
    with open(tmp_path / "c.npz", "wb") as f:
        np.savez_compressed(f, **arrays)
    with pytest.raises(ValueError, match="compressed"):
        npz_memmap(tmp_path / "c.npz", "features")


def _by_id(split_dir):
    from speccompile.training.answers import conversations, read_shards

    return {i: (t.copy(), p, np.asarray(f).copy()) for s in read_shards(split_dir) for i, t, p, f in conversations(s)}


def test_answers_without_features_go_to_the_data_dir_and_rebuild_as_if_captured(build_tiny, tmp_path):
    """--no-features adds answers to a data set without rebuilding the features of what it holds:
    token files only, in the data dir. The machine that trains rebuilds every shard, and each
    conversation then equals the one a capturing run made (same greedy answer, same features)."""
    from speccompile.training.answers import run_train_answers

    built = build_tiny("tiny-qwen2", "q0f32")
    texts = ["Tell me a story.", "Write a poem.", "Hello there.", "Sort a list.", "Go on.", "Count to five."]
    for d in ("captured", "work"):
        (tmp_path / d / "prompts").mkdir(parents=True)
        for split, items in (("train", texts), ("held_out", ["Name a color."])):
            rows = [{"id": f"{split[0]}{i}", "prompt": t} for i, t in enumerate(items)]
            (tmp_path / d / "prompts" / f"{split}.jsonl").write_text(_lines(rows))
    data = tmp_path / "data"

    def run(work_dir, n, features=True, data_dir=data):
        return run_train_answers(built.model_dir, built.lib, work_dir, n, held_out=1, mt_bench=False, max_tokens=12,
                                 batch=3, shard_tokens=40, progress=False, data_dir=data_dir, features=features)

    run(tmp_path / "captured", None, data_dir=None)  # the reference: every answer with its features
    run(tmp_path / "work", 2)  # two answers with features (mirrored into the data dir) ...
    work_index = (tmp_path / "work" / "answers" / "train" / "index.jsonl").read_text()
    report = run(tmp_path / "work", None, features=False)  # ... the other four as tokens only
    assert report["runs"]["train"]["answered"] == 4 and "restored" not in report
    assert (tmp_path / "work" / "answers" / "train" / "index.jsonl").read_text() == work_index  # untouched
    data_index = [json.loads(x) for x in (data / "answers" / "train" / "index.jsonl").read_text().splitlines()]
    assert sorted(i for e in data_index for i in e["ids"]) == [f"t{i}" for i in range(6)]
    assert not list((data / "answers" / "train").glob("shard_*"))  # no features were written anywhere
    assert run(tmp_path / "work", None, features=False)["runs"]["train"]["answered"] == 0  # all done
    # a machine with nothing but the data dir adds answers without features too (and counts the data dir's)
    (tmp_path / "bare" / "prompts").mkdir(parents=True)
    for split in ("train", "held_out"):
        shutil.copy(tmp_path / "work" / "prompts" / f"{split}.jsonl", tmp_path / "bare" / "prompts")
    bare = run(tmp_path / "bare", None, features=False)
    assert bare["runs"]["train"]["answered"] == 0 and bare["totals"]["train"]["conversations"] == 6
    with pytest.raises(ValueError, match="give --data-dir"):
        run(tmp_path / "work", None, features=False, data_dir=None)

    # the training machine: the work dir catches up by prefill, then holds what a capturing run holds
    again = run(tmp_path / "work", None)
    assert again["runs"]["train"]["answered"] == 0 and again["restored"]["train"]["rebuilt_shards"] >= 1
    got, ref = _by_id(tmp_path / "work" / "answers" / "train"), _by_id(tmp_path / "captured" / "answers" / "train")
    assert got.keys() == ref.keys()
    for i, (tokens, plen, feats) in ref.items():
        assert np.array_equal(got[i][0], tokens) and got[i][1] == plen and np.array_equal(got[i][2], feats), i


def test_a_prompt_set_upgraded_to_a_later_plan_is_carried_over_not_refused(tmp_path):
    work, data = tmp_path / "work", tmp_path / "data"
    work.mkdir()
    old = {"seed": 0, "magpie_share": 0.5, "plan_version": 1}
    (work / "settings.json").write_text(json.dumps(old))
    sync_prompts(work, data)
    new = {**old, "plan_version": 2, "wide_from": {"t": 12, "h": 3}}
    (work / "settings.json").write_text(json.dumps(new))
    assert sync_prompts(work, data) == {"settings.json": "saved"}
    assert json.loads((data / "settings.json").read_text()) == new
    (data / "settings.json").write_text(json.dumps(old))  # and the other way round
    (work / "settings.json").write_text(json.dumps(old))
    (data / "settings.json").write_text(json.dumps(new))
    assert sync_prompts(work, data) == {"settings.json": "restored"}
    (work / "settings.json").write_text(json.dumps({**new, "seed": 1, "plan_version": 3}))
    with pytest.raises(DataConflict, match="other train-prompts settings"):
        sync_prompts(work, data)  # a later plan, but other settings too
