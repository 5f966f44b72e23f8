"""The EAGLE-3 training loop (speccompile/training/eagle3.py): the training-time test computes,
for every row at once, exactly what the runtime computes when it drafts a chain; held-out
scores count a chain's accepted drafts; training resumes from disk and lowers the loss.

No model files: a random tiny head on random features (the real data path, train-answers'
shards, is exercised by test_train_answers.py)."""
from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from speccompile.training.eagle3_torch import build_eagle3_head  # noqa: E402
from speccompile.training.common import rope, rope_tables  # noqa: E402
from speccompile.training.eagle3 import IGNORE, OOV, Conv, Settings, Trainer, finish, planned_steps, score  # noqa: E402

H, NH, NKV, HD, V = 32, 4, 2, 8, 50


def tiny_trainer(seed=0, vocab=None):
    torch.manual_seed(seed)
    cfg = SimpleNamespace(hidden_size=H, intermediate_size=48, num_attention_heads=NH, num_key_value_heads=NKV,
                          head_dim=HD, rms_norm_eps=1e-6, rope_theta=10000.0, vocab_size=V)
    vocab = np.arange(V) if vocab is None else vocab
    model = build_eagle3_head(cfg, len(vocab), torch)
    rng = np.random.default_rng(seed)
    emb = rng.standard_normal((V, H)).astype(np.float32)
    lm = rng.standard_normal((V, H)).astype(np.float32)
    del model.lm_head
    return Trainer(torch, model, emb, lm, np.asarray(vocab), cfg, torch.float32), cfg


def reference_chain(tr: Trainer, feats: np.ndarray, tokens: np.ndarray, t: int, depth: int) -> list[np.ndarray]:
    """Draft logits of a chain whose last true row is t, computed row by row as the runtime
    does: rows 0..t from true features (causal), then one row per depth at positions t+1..,
    each reading the previous depth's output and attending to rows 0..t plus the chain."""
    m, L = tr.model, tr.model.midlayer
    a = L.self_attn
    cos, sin = rope_tables(len(tokens) + depth, HD, 10000.0, torch)

    def row(pos, hid, tok):
        emb = tr.emb[int(tok)][None, None]
        x = torch.cat([L.input_layernorm(emb), L.hidden_norm(hid[None, None])], -1)
        c, s = cos[:, :, pos:pos + 1], sin[:, :, pos:pos + 1]
        q = rope(a.q_proj(x).view(1, 1, NH, HD).transpose(1, 2), c, s)[0, :, 0]  # [NH, HD]
        k = rope(a.k_proj(x).view(1, 1, NKV, HD).transpose(1, 2), c, s)[0, :, 0]  # [NKV, HD]
        v = a.v_proj(x).view(NKV, HD)
        return x, q, k, v

    keys, vals = [], []

    def attend(x, q, hid):
        K, Vv = torch.stack(keys, 1), torch.stack(vals, 1)  # [NKV, m, HD]
        K, Vv = K.repeat_interleave(NH // NKV, 0), Vv.repeat_interleave(NH // NKV, 0)
        p = torch.softmax((q[:, None] * K).sum(-1) / math.sqrt(HD), -1)  # [NH, m]
        o = a.o_proj((p[..., None] * Vv).sum(1).reshape(1, NH * HD))[0]
        h1 = hid + o
        return h1 + L.mlp(L.post_attention_layernorm(h1))

    fused = m.fuse(torch.from_numpy(feats))
    out = None
    with torch.no_grad():
        for r in range(t + 1):  # true rows: row r reads (feature r, token r + 1)
            x, q, k, v = row(r, fused[r], tokens[r + 1])
            keys.append(k)
            vals.append(v)
            out = attend(x, q, fused[r])
        logits = [torch.from_numpy(tr.lm.numpy().astype(np.float32)) @ m.norm(out)]
        for d in range(1, depth):  # depth d + 1: position t + d, token t + d + 1, the previous output
            x, q, k, v = row(t + d, out, tokens[t + d + 1])
            keys.append(k)
            vals.append(v)
            out = attend(x, q, out)
            logits.append(torch.from_numpy(tr.lm.numpy().astype(np.float32)) @ m.norm(out))
    return [x.numpy() for x in logits]


def test_ttt_rows_are_the_runtime_chain():
    """TTT step k at row r == depth k + 1 of a chain whose last true row is r - k."""
    tr, _ = tiny_trainer()
    rng = np.random.default_rng(1)
    n_tok, steps = 12, 4
    tokens = rng.integers(0, V, n_tok)
    feats = rng.standard_normal((n_tok - 1, 3 * H)).astype(np.float32)
    conv = Conv("c", tokens, 1, feats)
    f, nxt, lab = tr.batch([conv])
    captured = []
    with torch.no_grad():
        tr.run(f, nxt, torch.zeros_like(lab), steps=steps, keep=captured)  # label 0 everywhere: all scored
    for t in (0, 3, 6):
        ref = reference_chain(tr, feats, tokens, t, steps)
        for k in range(steps):
            got = captured[k].numpy()  # step k scores rows k.. in order: row t + k is entry t
            np.testing.assert_allclose(got[t], ref[k], rtol=2e-4, atol=2e-4)


def test_labels_score_answer_tokens_in_the_draft_vocabulary():
    tr, _ = tiny_trainer(vocab=np.arange(0, V, 2))  # even ids only
    tokens = np.array([1, 3, 5, 8, 10, 11, 12])
    conv = Conv("c", tokens, 4, np.zeros((6, 3 * H), np.float32))
    _, nxt, lab = tr.batch([conv])
    assert nxt[0].tolist() == tokens[1:].tolist()
    # row r predicts token r + 2 (draft id = id // 2); prompt tokens (0..3) and the last row are not scored,
    # an answer token outside the draft vocabulary (odd) is scored as a miss
    assert lab[0].tolist() == [IGNORE, IGNORE, 10 // 2, OOV, 12 // 2, IGNORE]
    f = torch.zeros((1, conv.rows, 3 * H))
    loss, per_step = tr.run(f, nxt, lab, steps=2, weights=[1.0, 0.8])
    assert torch.isfinite(loss)  # OOV rows are not trained on
    assert per_step[0][1][0].tolist() == [False, False, True, True, True, False]  # ... but scored
    assert not per_step[0][0][0, 3]  # and never right
    only_oov = lab.clone()
    only_oov[0, 2], only_oov[0, 4] = OOV, OOV
    assert tr.run(f, nxt, only_oov, steps=1, weights=[1.0])[0] is None  # nothing to train on: no step


def test_chain_score_counts_leading_hits():
    c = lambda rows: torch.tensor([rows], dtype=torch.bool)  # noqa: E731
    scored = c([1, 1, 1, 1])
    per_step = [(c([1, 1, 0, 1]), scored), (c([0, 1, 1, 0]), scored)]
    res = finish(score(per_step))
    # start 0: depth1 hit (row0), depth2 = step1 row1 hit -> 2; start 1: hit, step1 row2 hit -> 2;
    # start 2: miss -> 0; start 3: hit, depth 2 past the end -> 1
    assert res["accept_len"] == pytest.approx(1 + (2 + 2 + 0 + 1) / 4)
    assert res["top1"] == [0.75, 0.5]


def test_training_lowers_the_loss():
    """The loss falls on data with a
    learnable rule (next-next token = feature argmax)."""
    from speccompile.training.eagle3 import plan_batches

    tr, _ = tiny_trainer()
    rng = np.random.default_rng(0)
    convs = []
    for i in range(16):
        toks = rng.integers(0, V, 20)
        feats = np.zeros((19, 3 * H), np.float32)
        feats[np.arange(19), np.minimum(toks[2:].tolist() + [0], [3 * H - 1] * 19)[:19] % (3 * H)] = 5.0
        convs.append(Conv(str(i), toks, 1, feats))
    opt = torch.optim.AdamW(tr.model.parameters(), lr=3e-3)
    first = last = None
    for epoch in range(30):
        for idx in plan_batches(convs, 80, epoch):
            loss, _ = tr.run(*tr.batch([convs[i] for i in idx]), steps=2, weights=[1.0, 0.8])
            opt.zero_grad()
            loss.backward()
            opt.step()
            first = first if first is not None else loss.item()
            last = loss.item()
    assert last < 0.5 * first


def test_soft_labels_are_the_targets_next_distribution():
    """With soft labels, row r's loss is the cross-entropy against softmax(lm(hidden[r + 1]))
    over the draft vocabulary (the target's distribution of token r + 2), at every TTT step,
    and a target distribution that is one-hot on the label gives back the hard loss."""
    vocab = np.arange(0, V, 2)
    tr, _ = tiny_trainer(vocab=vocab)
    rng = np.random.default_rng(3)
    tokens = rng.integers(0, V, 14)
    tokens[tokens % 2 == 1] -= 1  # every token in the draft vocabulary: every answer row labelled
    feats = rng.standard_normal((13, 3 * H)).astype(np.float32)
    hidden = rng.standard_normal((13, H)).astype(np.float32)
    conv = Conv("c", tokens, 3, feats, hidden)
    f, nxt, lab = tr.batch([conv])
    lm = tr.lm.numpy().astype(np.float64)
    for steps, weights in ((1, [1.0]), (3, [1.0, 0.8, 0.64])):
        kept = []
        with torch.no_grad():
            loss, _ = tr.run(f, nxt, lab, steps=steps, weights=weights, keep=kept,
                             soft_from=tr.next_hidden([conv]))
        want = 0.0
        for k in range(steps):
            rows = [r for r in range(conv.rows) if lab[0, r] != IGNORE and r >= k]
            logits = kept[k].numpy().astype(np.float64)  # [rows, Vd], the scored rows in order
            logp = logits - logits.max(-1, keepdims=True)
            logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
            t = hidden[[r + 1 for r in rows]].astype(np.float64) @ lm.T
            p = np.exp(t - t.max(-1, keepdims=True))
            p /= p.sum(-1, keepdims=True)
            want += weights[k] * float(-(p * logp).sum(-1).mean())
        assert loss.item() == pytest.approx(want, rel=1e-4)
    # one-hot targets: hidden[r + 1] far along the label's lm row (orthogonalised against the others)
    q, _ = np.linalg.qr(rng.standard_normal((H, H)))  # 25 draft rows, orthonormal in 32 dimensions
    tr.lm = torch.from_numpy(np.ascontiguousarray(q[: len(vocab)], np.float32))
    sharp = np.zeros_like(hidden)
    sharp[1:] = 200.0 * tr.lm.numpy()[tokens[2:] // 2]
    conv = Conv("c", tokens, 3, feats, sharp)
    with torch.no_grad():
        soft, _ = tr.run(f, nxt, lab, steps=2, weights=[1.0, 0.8], soft_from=tr.next_hidden([conv]))
        hard, _ = tr.run(f, nxt, lab, steps=2, weights=[1.0, 0.8])
    assert soft.item() == pytest.approx(hard.item(), rel=1e-3)


def test_a_new_head_starts_as_the_target_layer_above_the_high_feature(build_tiny):
    """init_from_target_layer: fc passes the high feature through, the attention's hidden half,
    o_proj and the norms are the target layer's, its embedding half is zero (so the start does
    not depend on the token), and the MLP holds the target neurons of largest |up| * |down|."""
    import copy

    from speccompile.training.eagle3_torch import init_from_target_layer
    from speccompile.training.common import target_config

    built = build_tiny("tiny-qwen2", "q0f32")
    tcfg = target_config(built.model_dir)
    cfg = copy.deepcopy(tcfg)
    cfg.num_hidden_layers, cfg.intermediate_size = 1, tcfg.intermediate_size // 2
    torch.manual_seed(0)
    model = build_eagle3_head(cfg, 16, torch)
    layer, h = tcfg.num_hidden_layers - 1, tcfg.hidden_size
    init_from_target_layer(model, built.model_dir, layer, 2, torch)
    w = {k: np.asarray(v, np.float32) for k, v in built.weights.items()}
    p, a, mlp = f"model.layers.{layer}.", model.midlayer.self_attn, model.midlayer.mlp

    def same(t, ref):
        np.testing.assert_allclose(t.detach().numpy(), ref, rtol=0, atol=1e-6)

    same(model.fc.weight, np.concatenate([np.zeros((h, 2 * h)), np.eye(h)], 1))
    for name in ("q_proj", "k_proj", "v_proj"):
        lin = getattr(a, name)
        same(lin.weight[:, :h], np.zeros((lin.weight.shape[0], h)))
        same(lin.weight[:, h:], w[p + f"self_attn.{name}.weight"])
    same(a.o_proj.weight, w[p + "self_attn.o_proj.weight"])
    keep = np.sort(np.argsort(-np.linalg.norm(w[p + "mlp.down_proj.weight"], axis=0)
                              * np.linalg.norm(w[p + "mlp.up_proj.weight"], axis=1))[: cfg.intermediate_size])
    same(mlp.gate_proj.weight, w[p + "mlp.gate_proj.weight"][keep])
    same(mlp.up_proj.weight, w[p + "mlp.up_proj.weight"][keep])
    same(mlp.down_proj.weight, w[p + "mlp.down_proj.weight"][:, keep])
    same(model.midlayer.hidden_norm.weight, w[p + "input_layernorm.weight"])
    same(model.midlayer.post_attention_layernorm.weight, w[p + "post_attention_layernorm.weight"])
    feats = torch.randn(1, 5, 3 * h)
    cos, sin = rope_tables(5, tcfg.head_dim, tcfg.rope_theta, torch)
    with torch.no_grad():
        outs = [model(torch.randn(1, 5, h), model.fuse(feats), cos, sin) for _ in range(2)]
    torch.testing.assert_close(outs[0], outs[1])


def test_planned_steps_span_the_run_as_it_stands():
    """The schedule's length: unchanged data gives epochs x steps per epoch however the run was
    interrupted; data that grew between epochs lengthens only the epochs still to come."""
    fresh = {"step": 0, "epoch": 0, "plan": None, "batch": 0}
    assert planned_steps(fresh, 100, 3) == 300
    mid = {"step": 140, "epoch": 1, "plan": [[0]] * 100, "batch": 40}  # resumed inside epoch 2
    assert planned_steps(mid, 100, 3) == 300
    boundary = {"step": 200, "epoch": 2, "plan": None, "batch": 0}
    assert planned_steps(boundary, 100, 3) == 300
    assert planned_steps(boundary, 170, 3) == 370  # two epochs of 100 steps done, one of 170 to come
    assert planned_steps(boundary, 170, 2) == 200  # nothing left: the run ends where it is
    grown_mid = {"step": 250, "epoch": 2, "plan": [[0]] * 170, "batch": 50}
    assert planned_steps(grown_mid, 170, 4) == 250 + 120 + 170
    # a time box: the schedule ends (and anneals) at max_steps, never before the steps taken
    assert planned_steps(grown_mid, 170, 4, max_steps=300) == 300
    assert planned_steps(grown_mid, 170, 4, max_steps=200) == 250
    assert planned_steps(grown_mid, 170, 4, max_steps=10_000) == 250 + 120 + 170
    with pytest.raises(ValueError, match="--head-max-steps"):
        Settings(max_steps=0)
