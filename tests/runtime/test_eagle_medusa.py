"""EAGLE and Medusa end to end: official checkpoint layouts -> convert -> gen_config ->
compile -> greedy speculative decoding that is token-identical to plain decoding.

Heads are built here in the tensor names SafeAILab and FasterDecoding publish. On the tiny
random target the heads are noisy "repeat" heads (EAGLE: fc mostly passes the feature on
and every layer adds zero; Medusa: near-identity blocks and the target's lm_head), so
drafts are partly accepted -- full and partial acceptance, tree branches other than the
top-1, and the catch-up on accepted tokens are all exercised. On SmolLM2 the EAGLE head is
the one `make heads` trained (committed in heads/), the Medusa head random.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from reference import PROMPTS
from speccompile.models.config import PRESETS
from speccompile.runtime.contract import ENTRY_POINTS, entry_point_names

NEW_TOKENS = 24


# ------------------------------------------------------------ official layouts
def _save(folder: Path, tensors: dict, fmt: str, bin_name: str = "pytorch_model.bin") -> None:
    folder.mkdir(parents=True, exist_ok=True)
    if fmt == "safetensors":
        from safetensors.numpy import save_file

        save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, str(folder / "model.safetensors"))
    else:
        import torch

        torch.save({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in tensors.items()}, folder / bin_name)


def make_eagle_checkpoint(folder: Path, t: dict, layers: int = 1, seed: int = 0, fmt: str = "bin",
                          repeat: float | None = None, hidden: int | None = None, vocab: int | None = None,
                          draft_vocab: tuple | None = None) -> None:
    """SafeAILab EAGLE-1 layout: config.json (a Llama config) + fc.*, layers.N.*;
    layer 0 has no input_layernorm. ``repeat=noise``: the head returns its input feature
    plus ``noise`` times a random projection of the token embedding. ``draft_vocab=(ids,
    rows)``: an EAGLE-3 style reduced vocabulary, lm_head.weight = rows and d2t = ids - arange."""
    rng = np.random.default_rng(seed)
    h, inter = hidden or t["hidden_size"], t["intermediate_size"]
    nh, nkv, v = t["num_attention_heads"], t["num_key_value_heads"], vocab or t["vocab_size"]
    hd = h // nh
    r = lambda *s: (rng.standard_normal(s) / np.sqrt(s[-1])).astype(np.float32)
    repeat_fc = None if repeat is None else np.concatenate([repeat * r(h, h), np.eye(h)], 1).astype(np.float32)
    w = {"fc.weight": r(h, 2 * h) if repeat is None else repeat_fc,
         "fc.bias": 0.1 * r(h) if repeat is None else np.zeros(h, np.float32),
         "embed_tokens.weight": r(v, h)}  # some releases ship it; it is ignored
    for i in range(layers):
        p = f"layers.{i}."
        w.update({p + "self_attn.q_proj.weight": r(nh * hd, h), p + "self_attn.k_proj.weight": r(nkv * hd, h),
                  p + "self_attn.v_proj.weight": r(nkv * hd, h), p + "mlp.gate_proj.weight": r(inter, h),
                  p + "mlp.up_proj.weight": r(inter, h),
                  p + "self_attn.o_proj.weight": r(h, nh * hd) if repeat is None else np.zeros((h, nh * hd), np.float32),
                  p + "mlp.down_proj.weight": r(h, inter) if repeat is None else np.zeros((h, inter), np.float32),
                  p + "post_attention_layernorm.weight": np.ones(h, np.float32)})
        if i:
            w[p + "input_layernorm.weight"] = np.ones(h, np.float32)
    extra = {}
    if draft_vocab is not None:
        ids, rows = draft_vocab
        w["lm_head.weight"] = np.asarray(rows, np.float32)
        w["d2t"] = np.asarray(ids, np.int64) - np.arange(len(ids))
        extra["draft_vocab_size"] = len(ids)
    _save(folder, w, fmt)
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": h, "intermediate_size": inter,
        "num_hidden_layers": layers, "num_attention_heads": nh, "num_key_value_heads": nkv, "vocab_size": v,
        "rms_norm_eps": 1e-5, "rope_theta": t.get("rope_theta", 10000.0), "max_position_embeddings": 2048,
        "bias": True, **extra}))


def make_medusa_checkpoint(folder: Path, h: int, v: int, heads: int = 3, layers: int = 1, seed: int = 0,
                           fmt: str = "safetensors", lm_head: np.ndarray | None = None, noise: float = 0.0,
                           bare_keys: bool = False, draft_vocab: tuple | None = None) -> None:
    """FasterDecoding layout: medusa_head.I.J.linear.{weight,bias} and medusa_head.I.{layers}.weight;
    config.json has only medusa_num_heads / medusa_num_layers. ``lm_head``: blocks that add
    ``noise`` times SiLU of a random projection, then this output matrix (a head that
    mostly repeats the target's own prediction). ``draft_vocab=(ids, rows)``: the heads share
    one reduced vocabulary instead, ``d2t`` = ids - arange and ``lm_head.weight`` = rows (left
    out when rows is None: the converter takes the target's)."""
    rng = np.random.default_rng(seed)
    w = {}
    for i in range(heads):
        for j in range(layers):
            w[f"medusa_head.{i}.{j}.linear.weight"] = (noise * rng.standard_normal((h, h)) if lm_head is not None
                                                       else rng.standard_normal((h, h)) / np.sqrt(h)).astype(np.float16)
            w[f"medusa_head.{i}.{j}.linear.bias"] = np.zeros(h, np.float16)
        if draft_vocab is None:
            w[f"medusa_head.{i}.{layers}.weight"] = (lm_head if lm_head is not None else
                                                      rng.standard_normal((v, h)) / np.sqrt(h)).astype(np.float16)
    if draft_vocab is not None:
        ids, rows = draft_vocab
        w["d2t"] = np.asarray(ids, np.int64) - np.arange(len(ids))
        if rows is not None:
            w["lm_head.weight"] = np.asarray(rows, np.float16)
    if bare_keys:  # medusa_lm_head.pt holds the ModuleList's own state dict
        w = {k[len("medusa_head."):]: a for k, a in w.items()}
    _save(folder, w, fmt, bin_name="medusa_lm_head.pt" if bare_keys else "pytorch_model.bin")
    (folder / "config.json").write_text(json.dumps({"medusa_num_heads": heads, "medusa_num_layers": layers,
                                                    "base_model_name_or_path": "target"}))


def build_head(kind: str, ckpt: Path, target_src: Path, quant: str, out: Path, device: str = "llvm") -> tuple[str, str]:
    from speccompile.compiler.compile import compile_model
    from speccompile.compiler.convert_weight import convert_weight
    from speccompile.compiler.gen_config import gen_config

    convert_weight(ckpt, quant, out, kind, progress=False, target=target_src)
    gen_config(ckpt, quant, out, target=target_src, model_type=kind)
    lib = out.with_suffix(".so")
    meta = compile_model(out / "speccompile-config.json", device, lib, verbose=False)
    assert meta["model_type"] == kind
    # exactly the contract's entry points of a head of this kind, with its argument orders
    assert meta["entry_points"] == {n: list(ENTRY_POINTS[kind][n]) for n in entry_point_names(kind, meta)}
    return str(out), str(lib)


def check_lossless(model_dir, lib, head, mode: str, prompts, expected, widths=(1, 3), ks=(3,), nodes=16,
                   batches=(1, 4), new_tokens: int = NEW_TOKENS) -> list:
    """Every width/k: batch 1 and batch 4 outputs equal plain greedy; returns the stats seen."""
    from speccompile.runtime.engine import Engine

    stats = []
    for width in widths:
        eng = Engine(model_dir, lib, speculative_mode=mode, additional_models=[head], spec_tree_width=width,
                     spec_tree_nodes=nodes if width > 1 else 64)
        for k in ks:
            eng.set_draft_length(k)
            if 1 in batches:
                for i, ids in enumerate(prompts):
                    res = eng.generate(ids, new_tokens, ignore_eos=True)
                    assert res.token_ids == expected[i], f"{mode} width={width} k={k} prompt {i}"
                    stats.append((width, res.stats.spec))
            if 4 in batches:
                for start in range(0, len(prompts), 4):
                    results = eng.generate_batch(prompts[start:start + 4], new_tokens, ignore_eos=True)
                    assert [r.token_ids for r in results] == expected[start:start + 4], \
                        f"{mode} width={width} k={k} batch at {start}"
                    stats += [(width, r.stats.spec) for r in results]
    return stats


# ------------------------------------------------------------------ tiny target
@pytest.fixture(scope="module")
def tiny(build_tiny, tmp_path_factory):
    from speccompile.runtime.engine import Engine

    built = build_tiny("tiny-llama", "q0f32")
    root = tmp_path_factory.mktemp("tinyheads")
    t = PRESETS["tiny-llama"]
    make_eagle_checkpoint(root / "eagle-hf", t, layers=2, repeat=0.5)
    make_medusa_checkpoint(root / "medusa-hf", t["hidden_size"], t["vocab_size"], heads=3,
                           lm_head=built.weights["model.embed_tokens.weight"], noise=0.2)
    eagle = build_head("eagle", root / "eagle-hf", built.hf_dir, "q0f32", root / "eagle")
    medusa = build_head("medusa", root / "medusa-hf", built.hf_dir, "q0f32", root / "medusa")
    eng = Engine(built.model_dir, built.lib)
    prompts = [eng.encode_prompt(p) for p in PROMPTS]
    expected = [eng.generate(ids, NEW_TOKENS, ignore_eos=True).token_ids for ids in prompts]
    return built, eagle, medusa, prompts, expected, root


@pytest.mark.parametrize("mode", ["eagle", "medusa"])
def test_tiny_target_lossless_chain_and_tree_with_accepted_drafts(tiny, mode):
    built, eagle, medusa, prompts, expected, _ = tiny
    if mode == "eagle":  # a full-vocabulary head drafts with the target's lm_head: separate calls
        from speccompile.runtime.engine import Engine

        eng = Engine(built.model_dir, built.lib, speculative_mode=mode, additional_models=[eagle])
        assert "no draft_step (a full-vocabulary head" in eng.proposer.separate_calls
    stats = check_lossless(built.model_dir, built.lib, eagle if mode == "eagle" else medusa, mode, prompts,
                           expected, ks=(1, 3))
    for width in (1, 3):
        seen = [s for w, s in stats if w == width]
        assert sum(s.draft_tokens for s in seen) > 0 and sum(s.draft_steps for s in seen) > 0
        accepted, drafted = sum(s.accepted_tokens for s in seen), sum(s.draft_tokens for s in seen)
        assert 0 < accepted < drafted, f"{mode} width {width}: {accepted} of {drafted} drafts accepted"
        assert all(len(s.per_position_accept_rate) >= 1 for s in seen if s.verify_steps)
    tree = [s.to_dict()["mean_tree_size"] for w, s in stats if w == 3 and s.verify_steps]
    assert max(tree) > 3  # trees verify more nodes than their depth
    mean_len = {w: sum(s.emitted_in_verify for v, s in stats if v == w) / sum(s.verify_steps for v, s in stats if v == w)
                for w in (1, 3)}
    assert mean_len[3] > mean_len[1], mean_len  # other branches than the top-1 get accepted


def test_tiny_target_sampling_and_adaptive_run(tiny):
    from speccompile.runtime.engine import Engine
    from speccompile.runtime.sampling import SamplingParams

    built, eagle, medusa, prompts, expected, _ = tiny
    for mode, head in (("eagle", eagle), ("medusa", medusa)):
        eng = Engine(built.model_dir, built.lib, speculative_mode=mode, additional_models=[head], spec_tree_width=2)
        res = eng.generate(prompts[2], NEW_TOKENS, ignore_eos=True)  # adaptive k
        assert res.token_ids == expected[2]
        sp = SamplingParams(temperature=0.8, top_p=0.9, seed=5)
        # a fixed length, set afresh before each run: an adaptive one follows measured times, and a
        # tree's shape the calibration the first run learned, and the random draws follow both
        eng.set_draft_length(3)
        a = eng.generate(prompts[1], 16, sp, ignore_eos=True)
        eng.set_draft_length(3)
        b = eng.generate(prompts[1], 16, sp, ignore_eos=True)
        assert a.token_ids == b.token_ids and len(a.token_ids) == 16 and max(a.token_ids) < 272


def test_tiny_heads_merged_with_the_suffix_index_are_lossless(tiny):
    """--speculative-mode suffix with a head (runtime/drafters/merged.py): one tree per step from both,
    batch 1 and 4, chains and trees, fixed and adaptive k; both sources' drafts get accepted;
    sampling runs and reproduces."""
    from speccompile.runtime.engine import Engine
    from speccompile.runtime.sampling import SamplingParams

    built, eagle, medusa, prompts, expected, _ = tiny
    for head in (eagle, medusa):
        for width in (1, 3):
            eng = Engine(built.model_dir, built.lib, speculative_mode="suffix", additional_models=[head],
                         spec_tree_width=width)
            assert type(eng.proposer).__name__ == "MergedProposer"
            for k in (3, 0):
                eng.set_draft_length(k)
                assert [r.token_ids for r in eng.generate_batch(prompts[:4], NEW_TOKENS, ignore_eos=True)] \
                    == expected[:4], (head, width, k)
                for i in (4, 5):
                    assert eng.generate(prompts[i], NEW_TOKENS, ignore_eos=True).token_ids == expected[i]
                if k:  # (an adaptive run's policy starts afresh)
                    hits = eng.policy.acceptance.hits.sum(axis=1)
                    assert (hits > 0).all(), (head, width, hits)  # the index's nodes and the head's
    eng.set_draft_length(3)
    sp = SamplingParams(temperature=0.8, top_p=0.9, seed=5)
    a = eng.generate(prompts[1], 16, sp, ignore_eos=True)
    eng.set_draft_length(3)
    assert eng.generate(prompts[1], 16, sp, ignore_eos=True).token_ids == a.token_ids


@pytest.mark.parametrize("cut", [None, 5])
@pytest.mark.parametrize("mode, which, width", [("eagle", 1, 1), ("eagle", 1, 3), ("medusa", 2, 2), ("suffix", 1, 1)])
def test_a_next_turn_continues_from_the_kept_head_state(tiny, mode, which, width, cut):
    """The prefix cache (runtime/prefix_cache.py) keeps a finished sequence's head state with
    its KV: a next turn that resends the conversation (or, ``cut``, only the answer's first
    tokens: an edited turn) prefills only what is new, and drafts exactly what an engine that
    prefilled the whole prompt drafts (a fixed k: the same drafts, accepted alike), with the
    output of plain decoding."""
    from speccompile.runtime.engine import Engine

    built, eagle, medusa, prompts, _, _ = tiny
    head = (eagle, medusa)[which - 1]
    eng = Engine(built.model_dir, built.lib, speculative_mode=mode, additional_models=[head], spec_tree_width=width)
    eng.set_draft_length(3)
    first = eng.generate(prompts[0], NEW_TOKENS, ignore_eos=True)
    answer = first.token_ids[:cut] if cut else first.token_ids
    turn = prompts[0] + answer + prompts[1][-6:]
    second = eng.generate(turn, NEW_TOKENS, ignore_eos=True)
    shared = len(prompts[0]) + (cut or NEW_TOKENS - 1)
    # an EAGLE head's row j is built from token j + 1: one whose rows ran past the cut keeps one fewer
    assert second.stats.cached_prompt_tokens in (shared, shared - 1)
    fresh = Engine(built.model_dir, built.lib, speculative_mode=mode, additional_models=[head],
                   spec_tree_width=width, prefix_cache_max_num_recycling_seqs=0)
    fresh.set_draft_length(3)
    alone = fresh.generate(turn, NEW_TOKENS, ignore_eos=True)
    plain = Engine(built.model_dir, built.lib, prefix_cache_max_num_recycling_seqs=0)
    assert second.token_ids == alone.token_ids == plain.generate(turn, NEW_TOKENS, ignore_eos=True).token_ids
    drafted = [(r.stats.spec.draft_tokens, r.stats.spec.accepted_tokens, r.stats.spec.position_proposed,
                r.stats.spec.position_accepted) for r in (second, alone)]
    assert drafted[0] == drafted[1] and drafted[0][0] > 0, drafted


def test_eagle_catch_up_longer_than_one_head_call(tiny):
    """The head catches up on every prompt token's features at the first propose; when they
    exceed what one call of the head takes (its buffers are planned for prefill_chunk_size
    rows), the catch-up runs as consecutive forwards over the same rows: the same drafts."""
    from speccompile.runtime.engine import Engine

    built, eagle, _, prompts, expected, _ = tiny
    runs = []
    for limit in (None, 5):  # 5: every prompt's catch-up takes several head forwards
        eng = Engine(built.model_dir, built.lib, speculative_mode="eagle", additional_models=[eagle],
                     spec_tree_width=1)
        if limit:
            eng.proposer.head.max_forward_tokens = limit
        eng.set_draft_length(3)
        results = eng.generate_batch(prompts[:2], NEW_TOKENS, ignore_eos=True)
        spec = [r.stats.spec for r in results]
        runs.append(([r.token_ids for r in results], eng.proposer.forwards,
                     [(s.draft_tokens, s.accepted_tokens, s.position_proposed, s.position_accepted) for s in spec]))
    assert runs[0][0] == runs[1][0] == expected[:2]
    assert runs[0][2] == runs[1][2] and runs[0][2][0][0] > 0  # the same drafts, accepted alike
    assert runs[1][1] > runs[0][1]  # in more head forwards


@pytest.mark.parametrize("width", [1, 2])
def test_draft_tree_rows_compute_what_their_paths_compute_as_chains(tiny, width):
    """Every row an EAGLE head drafts in a step equals its path appended as chain rows
    (tests/draft_rows.py), bit for bit, with a random EAGLE-1 head whose attention and MLP add
    to the feature (the fixture's "repeat" heads add zero, so attention is not exercised there)."""
    from draft_rows import check_draft_rows
    from speccompile.runtime.engine import Engine

    built, _, _, prompts, _, root = tiny
    if not (root / "eagle-attn.so").exists():
        make_eagle_checkpoint(root / "eagle-attn-hf", PRESETS["tiny-llama"], layers=1, seed=5)
        build_head("eagle", root / "eagle-attn-hf", built.hf_dir, "q0f32", root / "eagle-attn")
    eng = Engine(built.model_dir, built.lib, speculative_mode="eagle", spec_draft_length=3, spec_tree_width=width,
                 spec_tree_nodes=16, additional_models=[(str(root / "eagle-attn"), str(root / "eagle-attn.so"))])
    real_catch_up = eng.proposer.head.catch_up

    def chain_row(kv, sid, token, feature):  # an EAGLE-1 row: fc(embedding, feature), as a catch-up builds it
        return real_catch_up(eng.model, kv, kv.plan_chain([sid], [1]), np.array([token], np.int32),
                             feature[None].astype(np.float32), np.array([0]), 1)[0]

    assert check_draft_rows(eng, prompts[0], 4, chain_row, exact=True) >= 4 * 2 * width


def test_cli_generate_with_eagle(tiny):
    from click.testing import CliRunner

    from speccompile.cli.main import main

    built, eagle, medusa, prompts, expected, _ = tiny
    res = CliRunner().invoke(main, ["generate", str(built.model_dir), "--model-lib", str(built.lib), "--prompt",
                                    PROMPTS[2], "--max-tokens", "12", "--json", "--speculative-mode", "eagle",
                                    "--additional-models", ",".join(eagle), "--spec-draft-length", "3",
                                    "--spec-tree-width", "2", "--spec-tree-nodes", "8"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert data["stats"]["draft_tokens"] > 0 and "per_position_accept_rate" in data["stats"]
    # no mode given: the default, the suffix index merged with the head (runtime/drafters/merged.py)
    res = CliRunner().invoke(main, ["generate", str(built.model_dir), "--model-lib", str(built.lib), "--prompt",
                                    PROMPTS[2], "--max-tokens", "12", "--json", "--additional-models", ",".join(eagle),
                                    "--spec-draft-length", "3"])
    assert res.exit_code == 0, res.output
    merged = json.loads(res.output)
    assert merged["stats"]["draft_tokens"] > 0 and merged["token_ids"] == data["token_ids"]


@pytest.mark.parametrize("fmt", ["safetensors", "bin"])
def test_tiny_eagle_with_reduced_draft_vocabulary(tiny, fmt):
    """An EAGLE-3 style head drafting from a quarter of the vocabulary plus the tokens the
    target emits: drafts are mapped back to target ids through d2t, get accepted, and the
    output is still the target's own, chain and tree."""
    from speccompile.runtime.drafters.eagle import EagleHeadModel

    built, _, _, prompts, expected, root = tiny
    t = PRESETS["tiny-llama"]
    used = {tok for e in expected for tok in e}
    ids = np.array(sorted(used | set(range(0, t["vocab_size"], 4))))
    rows = built.weights["model.embed_tokens.weight"][ids]  # tied: these are the lm_head rows
    make_eagle_checkpoint(root / f"eagle3-{fmt}", t, layers=1, repeat=0.5, draft_vocab=(ids, rows), fmt=fmt)
    head = build_head("eagle", root / f"eagle3-{fmt}", built.hf_dir, "q0f32", root / f"eagle3-{fmt}-out")
    model = EagleHeadModel(*head)
    assert model.vocab_ids.tolist() == ids.tolist()
    if fmt == "safetensors":
        check_draft_entry_points(built, model, root / f"eagle3-{fmt}", ids)
    stats = check_lossless(built.model_dir, built.lib, head, "eagle", prompts, expected, widths=(1, 3))
    assert sum(s.accepted_tokens for _, s in stats) > 0


def check_draft_entry_points(built, head, ckpt: Path, ids: np.ndarray) -> None:
    """draft_catch_up and draft_step of an EAGLE-1 head against numpy. The "repeat" head's
    layer adds zero (o_proj and down_proj are zero), so a row's output is fc(concat(target
    embedding, feature)) and its logits that times the draft rows."""
    from safetensors.numpy import load_file

    from speccompile.runtime.drafters.eagle import ScratchRows, top_tokens
    from speccompile.runtime.model import Model

    w = load_file(str(ckpt / "model.safetensors"))
    target = Model(built.model_dir, built.lib)
    assert head.bind(target, 3) is None and head.top_k == 8
    emb = built.weights["model.embed_tokens.weight"]
    rng = np.random.default_rng(3)
    tokens, feats = np.array([5, 17, 200, 33, 9]), rng.standard_normal((5, emb.shape[1])).astype(np.float32)
    ref = lambda tok, f: np.concatenate([emb[tok], f], -1) @ w["fc.weight"].T + w["fc.bias"]

    def check(out, top, logp, want):
        np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)
        for row, got_i, got_lp in zip(want @ w["lm_head.weight"].T, top, logp):
            order, lp = top_tokens(row, 8)
            assert got_i.tolist() == ids[order].tolist()
            np.testing.assert_allclose(got_lp, lp, rtol=1e-4, atol=1e-4)

    kv = head.create_kv_cache(64)
    kv.add_sequence(0)
    last = np.array([1, 4])
    out, top, logp = head.catch_up(target, kv, kv.plan_chain([0], [5]), tokens, feats, last, 8)
    check(out.numpy(), top, logp, ref(tokens, feats)[last])
    batch, _ = ScratchRows(kv, [0]).plan(np.zeros(3, np.int64), np.full(3, -1))
    out2, top2, logp2 = head.step(target, kv, batch, np.array([7, 8, 9]), out, np.array([1, 0, 1]), 8)
    check(out2.numpy(), top2, logp2, ref(np.array([7, 8, 9]), out.numpy()[[1, 0, 1]]))


@pytest.mark.parametrize("rows", ["in_checkpoint", "from_target"])
def test_tiny_medusa_sharing_a_reduced_draft_vocabulary(tiny, rows):
    """Heads that share one reduced vocabulary (d2t, with lm_head.weight in the checkpoint or
    read from --target): one projection for every head, drafts mapped back to target ids,
    accepted, and the output still the target's own, chain and tree."""
    from speccompile.runtime.drafters.medusa import MedusaHeadsModel
    from speccompile.compiler.sources import HeadSource

    built, _, _, prompts, expected, root = tiny
    t = PRESETS["tiny-llama"]
    emb = built.weights["model.embed_tokens.weight"]  # tied: these are the lm_head rows
    ids = np.array(sorted({tok for e in expected for tok in e} | set(range(0, t["vocab_size"], 4))))
    ckpt = root / f"medusa-dv-{rows}"
    make_medusa_checkpoint(ckpt, t["hidden_size"], t["vocab_size"], heads=3, lm_head=emb, noise=0.2,
                           draft_vocab=(ids, emb[ids] if rows == "in_checkpoint" else None))
    src = HeadSource("medusa", ckpt, built.hf_dir)
    assert src.config.draft_vocab_size == len(ids) and src.config.num_layers == 1
    assert np.allclose(src.get("lm_head.weight"), emb[ids], atol=1e-2)
    head = build_head("medusa", ckpt, built.hf_dir, "q0f32", root / f"medusa-dv-{rows}-out")
    heads = MedusaHeadsModel(*head)
    assert heads.vocab_ids.tolist() == ids.tolist()
    assert heads.forward(np.zeros((2, t["hidden_size"]), np.float32)).shape == (3, 2, len(ids))
    stats = check_lossless(built.model_dir, built.lib, head, "medusa", prompts, expected, widths=(1, 3))
    assert sum(s.accepted_tokens for _, s in stats) > 0


def test_conversion_rejects_heads_of_another_target(tiny, tmp_path):
    from speccompile.compiler.convert_weight import convert_weight
    from speccompile.compiler.gen_config import gen_config
    from speccompile.compiler.sources import SourceError

    built, *_ = tiny
    t = PRESETS["tiny-llama"]
    make_eagle_checkpoint(tmp_path / "e32", t, hidden=32)
    with pytest.raises(SourceError, match="hidden_size 32 but the target has 64"):
        convert_weight(tmp_path / "e32", "q0f32", tmp_path / "o1", "eagle", progress=False, target=built.hf_dir)
    make_eagle_checkpoint(tmp_path / "ev", t, vocab=300)
    with pytest.raises(SourceError, match="vocab_size 300 but the target has 272"):
        gen_config(tmp_path / "ev", "q0f32", tmp_path / "o2", target=built.hf_dir, model_type="eagle")
    make_eagle_checkpoint(tmp_path / "ed", t, draft_vocab=(np.arange(8), np.zeros((8, 32), np.float32)))
    with pytest.raises(SourceError, match=r"lm_head.weight is \[8, 32\]"):
        convert_weight(tmp_path / "ed", "q0f32", tmp_path / "o6", "eagle", progress=False, target=built.hf_dir)
    make_medusa_checkpoint(tmp_path / "mv", 64, 300)
    with pytest.raises(SourceError, match="predict 300 tokens .* vocabulary has 272"):
        convert_weight(tmp_path / "mv", "q0f32", tmp_path / "o3", "medusa", progress=False, target=built.hf_dir)
    make_medusa_checkpoint(tmp_path / "md", 64, 272, draft_vocab=(np.array([1, 1, 2]), None))
    with pytest.raises(SourceError, match="d2t maps its draft vocabulary .* twice onto one token"):
        convert_weight(tmp_path / "md", "q0f32", tmp_path / "o7", "medusa", progress=False, target=built.hf_dir)
    make_medusa_checkpoint(tmp_path / "mb", 64, 272, draft_vocab=(np.arange(8), None))
    from safetensors.numpy import load_file, save_file

    both = load_file(str(tmp_path / "mb" / "model.safetensors"))
    both["medusa_head.0.1.weight"] = np.zeros((272, 64), np.float16)
    save_file(both, str(tmp_path / "mb" / "model.safetensors"))
    with pytest.raises(SourceError, match="keep one or the other"):
        convert_weight(tmp_path / "mb", "q0f32", tmp_path / "o8", "medusa", progress=False, target=built.hf_dir)
    make_medusa_checkpoint(tmp_path / "mh", 32, 272, fmt="bin", bare_keys=True)  # medusa_lm_head.pt
    with pytest.raises(SourceError, match="hidden size 32 .* target has 64"):
        convert_weight(tmp_path / "mh", "q0f32", tmp_path / "o4", progress=False, target=built.hf_dir)
    with pytest.raises(SourceError, match="needs its target model"):
        convert_weight(tmp_path / "mv", "q0f32", tmp_path / "o5", "medusa", progress=False)
    assert not (tmp_path / "o1").exists() and not (tmp_path / "o3").exists()


@pytest.mark.real_model
def test_runtime_rejects_wrong_head(tiny, smollm2_q4):
    from speccompile.runtime.engine import Engine, GenerationError

    built, eagle, medusa, *_ = tiny
    with pytest.raises(GenerationError, match="needs a eagle head"):
        Engine(built.model_dir, built.lib, speculative_mode="eagle", additional_models=[medusa])
    with pytest.raises(GenerationError, match="needs its Medusa heads: --additional-models HEAD_DIR,HEAD_LIB"):
        Engine(built.model_dir, built.lib, speculative_mode="medusa")
    with pytest.raises(GenerationError, match="apply to --speculative-mode suffix or eagle or medusa"):
        Engine(built.model_dir, built.lib, speculative_mode="ngram", spec_tree_width=2)
    model_dir, lib = smollm2_q4
    with pytest.raises(GenerationError, match="hidden_size 64 but the target has 576"):
        Engine(model_dir, lib, speculative_mode="eagle", additional_models=[eagle])


# --------------------------------------------------------------------- SmolLM2
# k = 2 chain acceptance of the committed heads on these prompts: eagle 0.113, medusa 0.058;
# random heads ~0
RATE_FLOOR = {"eagle": 0.06, "medusa": 0.03}


@pytest.mark.real_model
def _paths(tokens: list[int], parents: list[int]) -> list[tuple[int, ...]]:
    """A draft tree as the sorted token paths from its roots to each node: the nodes drafted,
    whatever order the tree lists them in (siblings under different parents are listed by a
    calibrated score, which what an engine learned earlier may reorder)."""
    paths: list[tuple[int, ...]] = []
    for tok, parent in zip(tokens, parents):
        paths.append((paths[parent] if parent >= 0 else ()) + (tok,))
    return sorted(paths)


def _recorded(eng) -> list:
    """The drafts ``eng``'s proposer returns from now on, per step: the token paths of each
    sequence's tree (:func:`_paths`)."""
    seen, inner = [], eng.proposer.propose

    def propose(*args, **kwargs):
        out = inner(*args, **kwargs)
        seen.append([_paths(list(d.tokens), list(d.parent_list())) for d in out])
        return out

    eng.proposer.propose = propose
    return seen


def test_smollm2_eagle_and_medusa_are_lossless(smollm2_q4, smollm2_heads):
    """SmolLM2-135M q4f32_1 (its GGUF is the --target) with the project's trained EAGLE and
    Medusa heads (``make heads``, committed in heads/; their draft-vocabulary rows come from
    the GGUF at conversion)."""
    from speccompile.runtime.engine import Engine

    model_dir, lib = smollm2_q4
    eagle, medusa = smollm2_heads
    eng = Engine(model_dir, lib)
    prompts = [eng.encode_prompt(p) for p in PROMPTS[:4]]  # the tiny heads above take all eight (CI time)
    expected = [eng.generate(ids, NEW_TOKENS, ignore_eos=True).token_ids for ids in prompts]
    for mode, head in (("eagle", eagle), ("medusa", medusa)):
        # batch 4 (the tiny heads above run batch 1 and 4, and SmolLM2's heads batch 1 on OpenCL)
        stats = check_lossless(model_dir, lib, head, mode, prompts, expected, widths=(1, 2), ks=(2,), nodes=6,
                               batches=(4,))
        drafted = sum(s.draft_tokens for _, s in stats)
        assert drafted > 0
        # trained heads, not random ones: a real share of their drafts is accepted
        chains = [s for w, s in stats if w == 1]
        rate = sum(s.accepted_tokens for s in chains) / sum(s.draft_tokens for s in chains)
        assert rate > RATE_FLOOR[mode], (mode, rate)  # random heads: ~0
    # a next turn over a kept sequence (runtime/prefix_cache.py) drafts, node for node, what an
    # engine that prefilled the whole prompt drafts: the trained head's attention reads every
    # row it kept, so a row built from a token past the turn's cut would show
    for cut in (None, 5):
        drafts = []
        for recycling in (None, 0):
            spec = Engine(model_dir, lib, speculative_mode="eagle", additional_models=[eagle], spec_tree_width=2,
                          spec_tree_nodes=6, spec_draft_length=2, prefix_cache_max_num_recycling_seqs=recycling)
            answer = spec.generate(prompts[0], NEW_TOKENS, ignore_eos=True).token_ids[:cut]
            turn = prompts[0] + answer + prompts[1][-6:]
            if recycling == 0:  # a fresh engine: its head sees the whole turn as a new prompt
                spec = Engine(model_dir, lib, speculative_mode="eagle", additional_models=[eagle],
                              spec_tree_width=2, spec_tree_nodes=6, spec_draft_length=2,
                              prefix_cache_max_num_recycling_seqs=0)
            drafts.append(_recorded(spec))
            res = spec.generate(turn, NEW_TOKENS, ignore_eos=True)
            assert (res.stats.cached_prompt_tokens > len(prompts[0])) == (recycling is None)
            assert res.token_ids == eng.generate(turn, NEW_TOKENS, ignore_eos=True).token_ids
        assert drafts[0] == drafts[1] and any(drafts[0]), cut
    # under a JSON schema (runtime/grammar.py): tree nodes the grammar forbids are dropped, every
    # row is masked, and the answer is still the target's own, greedy, under the same schema
    fmt = {"type": "json_schema", "json_schema": {"name": "item", "schema": {
        "type": "object", "additionalProperties": False, "required": ["name", "tags"],
        "properties": {"name": {"type": "string", "maxLength": 24},
                       "tags": {"type": "array", "items": {"type": "string", "maxLength": 10}, "maxItems": 3}}}}}
    want = [eng.generate(ids, NEW_TOKENS, response_format=fmt).token_ids for ids in prompts[:4]]
    for mode, head in (("eagle", eagle), ("medusa", medusa)):
        spec = Engine(model_dir, lib, speculative_mode=mode, additional_models=[head], spec_tree_width=2,
                      spec_tree_nodes=6, spec_draft_length=2)
        got = [spec.generate(ids, NEW_TOKENS, response_format=fmt) for ids in prompts[:4]]
        assert [r.token_ids for r in got] == want, mode
        assert sum(r.stats.spec.draft_tokens for r in got) > 0
        assert [r.token_ids for r in spec.generate_batch(prompts[:4], NEW_TOKENS, response_format=fmt)] == want
