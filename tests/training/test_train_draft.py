"""train-draft end to end on the tiny target: self-distillation with our engine, features,
a few torch steps, the official layout, and back through convert_weight -> compile ->
lossless EAGLE / Medusa decoding. Also: resuming skips finished work, Medusa trains on the
EAGLE data, the heads learn on held-out conversations, and bad input is refused."""
from __future__ import annotations

import json

import numpy as np
import pytest

from test_eagle_medusa import NEW_TOKENS, PROMPTS, build_head, check_lossless

pytest.importorskip("torch")


@pytest.fixture(scope="module")
def trained(build_tiny, tmp_path_factory):
    from speccompile.training.eagle import run_train_draft

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
    assert tensors["d2t"].shape == (dv,) and tensors["d2t"].dtype == np.int64
    ids = np.arange(dv) + tensors["d2t"]  # the reduced vocabulary it trained on, as target ids
    assert np.all(np.diff(ids) > 0) and ids[-1] < 272
    # its projection is the target's rows (frozen in training): left out, read from --target
    from speccompile.compiler.sources import HeadSource

    assert "lm_head.weight" not in tensors
    emb = built.weights["model.embed_tokens.weight"]  # tiny-llama ties lm_head to it
    assert np.allclose(HeadSource("eagle", out, built.hf_dir).get("lm_head.weight"), emb[ids])
    assert report["steps"] == 6 and 0.0 <= report["recent_train_top1_true_features"] <= 1.0
    assert report["held_out_conversations"] == 0 and report["held_out"] is None  # too few to spare
    head = build_head("eagle", out, built.hf_dir, "q0f32", tmp_path / "eagle")
    eng = Engine(built.model_dir, built.lib)
    prompts = [eng.encode_prompt(p) for p in PROMPTS[:4]]
    expected = [eng.generate(ids, NEW_TOKENS, ignore_eos=True).token_ids for ids in prompts]
    stats = check_lossless(built.model_dir, built.lib, head, "eagle", prompts, expected, widths=(1, 2), ks=(2,))
    assert sum(s.draft_tokens for _, s in stats) > 0


def test_resume_continues_training_without_regenerating(trained):
    from speccompile.training.eagle import run_train_draft

    built, out, _ = trained
    conv = out / "work" / "data" / "conversations.jsonl"
    before = conv.read_text()
    stamp = (out / "work" / "data" / "feats_0000.npz").stat().st_mtime_ns
    report = run_train_draft("eagle", built.model_dir, built.lib, out, num_prompts=6, max_tokens=24, gen_batch=3,
                             steps=9, train_batch=2, draft_vocab=64, progress=False)
    assert report["steps"] == 9
    assert conv.read_text() == before and (out / "work" / "data" / "feats_0000.npz").stat().st_mtime_ns == stamp


def test_bad_input_is_refused_before_any_work(build_tiny, tmp_path):
    from speccompile.training.eagle import run_train_draft

    built = build_tiny("tiny-llama", "q0f32")
    with pytest.raises(FileNotFoundError, match="not a converted model"):
        run_train_draft("eagle", tmp_path, built.lib, tmp_path / "o")
    with pytest.raises(ValueError, match="choose eagle or medusa"):
        run_train_draft("hydra", built.model_dir, built.lib, tmp_path / "o")
    with pytest.raises(ValueError, match="--medusa-num-heads 0: .* >= 1"):
        run_train_draft("medusa", built.model_dir, built.lib, tmp_path / "o", medusa_num_heads=0)
    with pytest.raises(ValueError, match="nothing to train"):
        run_train_draft("medusa", built.model_dir, built.lib, tmp_path / "o", medusa_num_layers=0)
    assert not (tmp_path / "o").exists()


def test_checkpoints_are_chosen_on_held_out_conversations():
    from speccompile.training.common import split_held_out

    items = list(range(120))
    train, held = split_held_out(items)
    assert held == [0, 25, 50, 75, 100] and not set(train) & set(held) and len(train) + len(held) == 120
    assert split_held_out(items[:40]) == (items[:40], [])


# ------------------------------------------------------------------ Medusa
@pytest.fixture(scope="module")
def medusa_trained(build_tiny, tmp_path_factory):
    """Medusa heads trained on tiny-qwen2, whose greedy answers are varied but repetitive
    (tiny-llama's are one token repeated, which the untrained heads already predict): 50
    conversations, so two are held out."""
    from speccompile.training.eagle import run_train_draft

    built = build_tiny("tiny-qwen2", "q0f32")
    out = tmp_path_factory.mktemp("trained") / "medusa-head"
    report = run_train_draft("medusa", built.model_dir, built.lib, out, num_prompts=50, max_tokens=24, gen_batch=8,
                             steps=100, train_batch=4, draft_vocab=128, progress=False)
    return built, out, report


def test_medusa_heads_in_official_layout_convert_compile_and_decode_losslessly(medusa_trained, tmp_path):
    from safetensors.numpy import load_file

    from speccompile.runtime.engine import Engine

    built, out, report = medusa_trained
    assert json.loads((out / "config.json").read_text())["medusa_num_heads"] == 4
    assert json.loads((out / "config.json").read_text())["medusa_num_layers"] == 1
    tensors = load_file(str(out / "model.safetensors"))
    # frozen (the default): the heads share the target's lm_head rows of the draft vocabulary
    # they trained on, so only d2t is written and convert_weight reads the rows from --target
    assert set(tensors) == {f"medusa_head.{i}.0.linear.{s}" for i in range(4) for s in ("weight", "bias")} | {"d2t"}
    dv = json.loads((out / "config.json").read_text())["draft_vocab_size"]
    assert dv == report["draft_vocab"] == len(tensors["d2t"])
    ids = np.arange(dv) + tensors["d2t"]
    assert np.all(np.diff(ids) > 0) and ids[-1] < 272
    for i in range(4):
        assert np.abs(tensors[f"medusa_head.{i}.0.linear.weight"]).max() > 0  # trained away from zero
    assert report["steps"] == 100 and report["exported_step"] == 100 and report["conversations"] == 50
    head = build_head("medusa", out, built.hf_dir, "q0f32", tmp_path / "medusa")
    from speccompile.runtime.drafters.medusa import MedusaHeadsModel

    assert MedusaHeadsModel(*head).vocab_ids.tolist() == ids.tolist()
    eng = Engine(built.model_dir, built.lib)
    prompts = [eng.encode_prompt(p) for p in PROMPTS[:4]]
    expected = [eng.generate(ids, NEW_TOKENS, ignore_eos=True).token_ids for ids in prompts]
    stats = check_lossless(built.model_dir, built.lib, head, "medusa", prompts, expected, widths=(1, 2), ks=(3,))
    for width in (1, 2):
        assert sum(s.draft_tokens for w, s in stats if w == width) > 0
    assert sum(s.accepted_tokens for _, s in stats) > 0


def test_medusa_training_improves_held_out_top1_over_the_untrained_heads(medusa_trained):
    """Untrained heads are the base lm_head, which predicts t+1 where head 0 should give t+2:
    training must beat them on conversations it never saw."""
    _, _, report = medusa_trained
    before, after = report["held_out_untrained"], report["held_out"]
    assert report["held_out_conversations"] == 2 and before is not None and after is not None
    # ~40 held-out rows: one hit is 0.025 of top-1, so the strict checks are on the mean and the losses
    assert after["top1"][0] >= before["top1"][0], (before, after)
    assert after["mean_top1"] > before["mean_top1"], (before, after)
    assert all(a < b for a, b in zip(after["loss"], before["loss"])), (before, after)  # every head's held-out loss
    assert report["recent_train_top1"][0] > 0.1  # untrained: ~0.02 (held-out above)


def test_medusa_resume_continues_training_without_regenerating(medusa_trained):
    import torch

    from speccompile.training.eagle import run_train_draft

    built, out, first = medusa_trained
    data = out / "work" / "data"
    before = (data / "conversations.jsonl").read_text()
    stamp = (data / "feats_0000.npz").stat().st_mtime_ns
    log = torch.load(out / "work" / "medusa-checkpoint.pt", weights_only=False)["log"]
    report = run_train_draft("medusa", built.model_dir, built.lib, out, num_prompts=50, max_tokens=24, gen_batch=8,
                             steps=110, train_batch=4, draft_vocab=128, progress=False)
    assert report["steps"] == 110 and report["held_out_untrained"] == first["held_out_untrained"]
    assert (data / "conversations.jsonl").read_text() == before and (data / "feats_0000.npz").stat().st_mtime_ns == stamp
    resumed = torch.load(out / "work" / "medusa-checkpoint.pt", weights_only=False)["log"]
    assert len(resumed) == 110 and resumed[:100] == log  # continued from step 100, not restarted
    with pytest.raises(ValueError, match="use another --work-dir"):
        run_train_draft("medusa", built.model_dir, built.lib, out, num_prompts=50, max_tokens=24, gen_batch=8,
                        steps=120, train_batch=4, draft_vocab=128, progress=False, medusa_num_heads=3)


def test_medusa_cli_trains_on_the_eagle_data(trained, tmp_path):
    """--work-dir of an EAGLE run: Medusa reuses its conversations and features as they are."""
    from click.testing import CliRunner

    from speccompile.cli.main import main

    built, eagle_out, _ = trained
    work = eagle_out / "work"
    conv = (work / "data" / "conversations.jsonl").read_text()
    stamps = {p.name: p.stat().st_mtime_ns for p in [work / "checkpoint.pt", *(work / "data").glob("feats_*")]}
    out = tmp_path / "medusa"
    res = CliRunner().invoke(main, ["train-draft", str(built.model_dir), "--method", "medusa", "--model-lib",
                                    str(built.lib), "-o", str(out), "--work-dir", str(work), "--num-prompts", "6",
                                    "--max-tokens", "24", "--gen-batch", "3", "--steps", "4", "--train-batch", "2",
                                    "--medusa-num-heads", "2", "--medusa-num-layers", "2"])
    assert res.exit_code == 0, res.output
    assert (work / "data" / "conversations.jsonl").read_text() == conv  # (rewritten in place, same rows)
    assert stamps == {p.name: p.stat().st_mtime_ns for p in [work / "checkpoint.pt", *(work / "data").glob("feats_*")]}
    assert (work / "medusa-checkpoint.pt").exists()
    cfg = json.loads((out / "config.json").read_text())
    assert (cfg["medusa_num_heads"], cfg["medusa_num_layers"]) == (2, 2)
    assert json.loads((out / "train_report.json").read_text())["conversations"] == 6


def test_medusa_with_trained_vocabulary_projection(trained, tmp_path):
    """--no-medusa-freeze-lm-head: each head's own vocabulary Linear starts as the target's
    lm_head and is trained (on draft-vocabulary rows); the layout still converts."""
    from safetensors.numpy import load_file

    from speccompile.compiler.convert_weight import convert_weight
    from speccompile.training.medusa import train_medusa

    built, eagle_out, _ = trained
    paths = sorted((eagle_out / "work" / "data").glob("feats_*.npz"))
    report = train_medusa(paths, built.model_dir, tmp_path / "m", 5, batch=2, num_heads=2, num_layers=0,
                          freeze_lm_head=False, progress=False, checkpoint=tmp_path / "ck.pt")
    assert report["steps"] == 5 and not report["freeze_lm_head"]
    tensors = load_file(str(tmp_path / "m" / "model.safetensors"))
    assert set(tensors) == {"medusa_head.0.0.weight", "medusa_head.1.0.weight"}
    emb = built.weights["model.embed_tokens.weight"]  # tiny-llama ties lm_head to it
    assert not np.allclose(tensors["medusa_head.0.0.weight"], emb, atol=1e-3)
    convert_weight(tmp_path / "m", "q0f32", tmp_path / "conv", "medusa", progress=False, target=built.hf_dir)
    assert json.loads((tmp_path / "conv" / "model-config.json").read_text())["num_layers"] == 0


def test_medusa_rows_match_the_runtime_offsets():
    """The label of head k for the feature at position i is the token the runtime scores
    head k's draft against: a stub head that always drafts our training label is always
    right in MedusaProposer's own bookkeeping (runtime/drafters/medusa.py), and rows start at the
    last prompt token, the first feature the runtime drafts from."""
    from speccompile.runtime.adaptive import AcceptanceModel, Policy
    from speccompile.runtime.costs import CostModel, CostTable
    from speccompile.runtime.drafters.medusa import MedusaProposer
    from speccompile.training.medusa import medusa_rows

    k_heads, a = 3, 4
    toks = np.asarray([5, 6, 7, 8, 11, 12, 13, 14, 15, 16, 17], np.int64)
    feats = np.arange(len(toks), dtype=np.float32)[:, None] * np.ones((1, 2), np.float32)  # feature = position
    rf, labels = medusa_rows([(toks, feats, a)], k_heads)
    assert rf[:, 0].tolist() == list(range(a - 1, len(toks) - 2))
    assert labels[0].tolist() == toks[a + 1:].tolist() and labels[2, -2:].tolist() == [-1, -1]
    assert (labels[labels >= 0] >= 11).all()  # answer tokens only

    class Stub:
        num_heads, vocab_ids = k_heads, None  # full vocabulary

        def forward(self, f):
            out = np.zeros((k_heads, len(f), 32), np.float32)
            for b, pos in enumerate(f[:, 0].astype(int)):
                row = int(pos) - (a - 1)
                for k in range(k_heads):
                    if labels[k, row] >= 0:
                        out[k, b, labels[k, row]] = 1.0
            return out

    prop = MedusaProposer(Stub())
    fixed = Policy(CostModel(CostTable({1: 1.0}), CostTable({1: 0.0})), AcceptanceModel(), fixed_k=k_heads)
    tries0, hits0 = prop.tries.copy(), prop.hits[:, 0].copy()
    prop.add_sequence(0, list(toks[:a]))
    for length in range(a, len(toks) - 1):  # history = committed tokens + the pending one
        prop.observe_hidden(0, 0, feats[:length])  # features of positions 0..length-1
        prop.propose([0], [list(toks[:length + 1])], [k_heads], None, None, fixed.plan(1))
    prop.on_commit(0, list(toks))
    assert (prop.tries - tries0).tolist() == [6, 5, 4]
    assert np.allclose(prop.hits[:, 0] - hits0, prop.tries - tries0)


def test_a_feature_shard_is_redone_when_its_conversations_changed(trained):
    """Rerunning with more prompts packs new conversations into the last shard: a shard on
    disk is reused only if it holds exactly the conversations it should."""
    from speccompile.training import distill
    from speccompile.runtime.model import Model

    built, out, _ = trained
    rows = [json.loads(line) for line in (out / "work" / "data" / "conversations.jsonl").read_text().splitlines()]
    model = Model(built.model_dir, built.lib)
    data = out / "work" / "redo"
    data.mkdir()
    [shard] = distill.extract_features(model, data, rows[:-1], progress=False)
    before = np.load(shard)["starts"].size
    [shard] = distill.extract_features(model, data, rows, progress=False)
    assert before == len(rows) - 1 and np.load(shard)["starts"].size == len(rows)
