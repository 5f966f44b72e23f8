"""train-draft end to end on the tiny target: self-distillation with our engine, features,
a few torch steps, the official layout, and back through convert_weight -> compile ->
lossless EAGLE decoding. Also: resuming skips finished work, and bad input is refused."""
from __future__ import annotations

import json

import numpy as np
import pytest

from test_eagle_medusa import NEW_TOKENS, PROMPTS, build_head, check_lossless

pytest.importorskip("torch")


@pytest.fixture(scope="module")
def trained(build_tiny, tmp_path_factory):
    from speccompile.train_draft import run_train_draft

    built = build_tiny("tiny-llama", "q0f32")
    out = tmp_path_factory.mktemp("trained") / "eagle-head"
    report = run_train_draft("eagle", built.model_dir, built.lib, out, num_prompts=6, max_tokens=24, gen_batch=3,
                             steps=6, train_batch=2, draft_vocab=64, progress=False)
    return built, out, report


def test_self_distillation_data_is_the_targets_greedy_output(trained):
    from speccompile.runtime.engine import Engine

    built, out, report = trained
    rows = [json.loads(line) for line in (out / "work" / "data" / "conversations.jsonl").read_text().splitlines()]
    assert len(rows) == 6 == report["conversations"]
    eng = Engine(built.model_dir, built.lib)
    for r in rows[:2]:  # batched generation = the target's own greedy answer
        assert eng.generate(r["prompt_ids"], 24).token_ids == r["answer_ids"]
    z = np.load(out / "work" / "data" / "feats_0000.npz")
    n = sum(len(r["prompt_ids"]) + len(r["answer_ids"]) for r in rows)
    assert z["tokens"].shape == (n,) and z["feats"].shape == (n, 64) and z["feats"].dtype == np.float16
    # the stored features are the target's: its lm_head on them gives the answers (fp16
    # rounding may flip a rare near-tie of the random tiny model)
    first = rows[0]
    a, m = len(first["prompt_ids"]), len(first["answer_ids"])
    feats = np.ascontiguousarray(z["feats"][a - 1:a + m - 1].astype(np.float32))
    agree = np.mean(np.argmax(eng.model.get_logits(feats).numpy(), -1) == np.asarray(first["answer_ids"]))
    assert agree >= 0.9, agree


def test_head_in_official_layout_converts_compiles_and_decodes_losslessly(trained, tmp_path):
    from safetensors.numpy import load_file

    from speccompile.runtime.engine import Engine

    built, out, report = trained
    names = set(load_file(str(out / "model.safetensors")))
    assert {"fc.weight", "fc.bias", "layers.0.self_attn.q_proj.weight", "layers.0.mlp.down_proj.weight",
            "layers.0.post_attention_layernorm.weight"} <= names
    assert "layers.0.input_layernorm.weight" not in names  # EAGLE-1: layer 0 reads fc directly
    tensors = load_file(str(out / "model.safetensors"))
    dv = json.loads((out / "config.json").read_text())["draft_vocab_size"]
    assert tensors["lm_head.weight"].shape == (dv, 64) and tensors["d2t"].dtype == np.int64
    ids = np.arange(dv) + tensors["d2t"]  # the reduced vocabulary it trained on, as target ids
    assert np.all(np.diff(ids) > 0) and ids[-1] < 272
    assert report["steps"] == 6 and 0.0 <= report["recent_train_top1_true_features"] <= 1.0
    assert report["held_out_conversations"] == 0 and report["held_out"] is None  # too few to spare
    head = build_head("eagle", out, built.hf_dir, "q0f32", tmp_path / "eagle")
    eng = Engine(built.model_dir, built.lib)
    prompts = [eng.encode_prompt(p) for p in PROMPTS[:4]]
    expected = [eng.generate(ids, NEW_TOKENS, ignore_eos=True).token_ids for ids in prompts]
    stats = check_lossless(built.model_dir, built.lib, head, "eagle", prompts, expected, widths=(1, 2), ks=(2,))
    assert sum(s.draft_tokens for _, s in stats) > 0


def test_resume_continues_training_without_regenerating(trained):
    from speccompile.train_draft import run_train_draft

    built, out, _ = trained
    conv = out / "work" / "data" / "conversations.jsonl"
    before = conv.read_text()
    stamp = (out / "work" / "data" / "feats_0000.npz").stat().st_mtime_ns
    report = run_train_draft("eagle", built.model_dir, built.lib, out, num_prompts=6, max_tokens=24, gen_batch=3,
                             steps=9, train_batch=2, draft_vocab=64, progress=False)
    assert report["steps"] == 9
    assert conv.read_text() == before and (out / "work" / "data" / "feats_0000.npz").stat().st_mtime_ns == stamp


def test_bad_input_is_refused_before_any_work(build_tiny, tmp_path):
    from speccompile.train_draft import run_train_draft

    built = build_tiny("tiny-llama", "q0f32")
    with pytest.raises(FileNotFoundError, match="not a converted model"):
        run_train_draft("eagle", tmp_path, built.lib, tmp_path / "o")
    with pytest.raises(ValueError, match="only eagle"):
        run_train_draft("medusa", built.model_dir, built.lib, tmp_path / "o")


def test_checkpoints_are_chosen_on_held_out_conversations():
    from speccompile.train_draft import split_held_out

    items = list(range(120))
    train, held = split_held_out(items)
    assert held == [0, 25, 50, 75, 100] and not set(train) & set(held) and len(train) + len(held) == 120
    assert split_held_out(items[:40]) == (items[:40], [])
