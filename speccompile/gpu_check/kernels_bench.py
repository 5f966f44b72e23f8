"""The q4 projection kernels alone on the device: time per token count, and bit identity of
every row with the same row projected alone, for each kernel variant on real model shapes;
then the attention kernels' V-sum variants (chunks, then their merge) at decode, verify and
prefill shapes, and greedy verification's argmax, timed and checked the same way.

Why: a forward's cost per row count (check.py ``forward_cost_vs_rows``) mixes the projections
with attention, norms and launches, and measures only the kernels a library was built with.
This times the portable kernels (kernels/gpu_matmul.py) and the tensor-core kernel
(kernels/gpu_matmul_mma.py) in its default and other shapes of work (warps per block, groups
loaded ahead) side by side in one process, so one GPU session can choose between them; and
it checks on the device what CPU tests cannot: that the tensor core gives a token the same
bits in any column of its tile (batch invariance, which greedy losslessness rests on).

Two halves: ``build`` here (TVM's compiler; nvcc embeds a fatbin for cuda) writes
``kernels-bench.so`` and ``kernels-bench.json`` into the payload; ``run`` where the check runs
(TVM's runtime alone), in a process of its own (``main``): a kernel that faults poisons its
CUDA context, and the check must go on. ``refusal`` says when the tensor-core kernel may not
stand for the default libraries (the check then measures the portable ones in their place).
The CPU tests build and run the portable variant on PoCL (tests/gpu_check/test_kernels_bench.py).
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

# projection shapes (n, k) per layer, and each model's layers (the layer total weighs them once each)
SHAPES = {
    "qwen15": {"qkv": (2048, 1536), "o": (1536, 1536), "gate_up": (17920, 1536), "down": (1536, 8960),
               "lm_head": (151936, 1536)},
    "smollm2": {"qkv": (960, 576), "o": (576, 576), "gate_up": (3072, 576), "down": (576, 1536)},
}
LAYERS = {"qwen15": 28, "smollm2": 30}
# variant -> kernel and its work split; "tc" is what --gpu-projections tensor-core builds
# (tc_w16: ptxas holds a 512-thread block to 64 registers and spills 48 bytes; it keeps 16 warps per
# block in flight on matrices of few feature tiles, Qwen2.5-1.5B's down and o projections: 96 blocks)
# ("dense_*": fp16 weights, as q0f16 builds them; no model of the check has them)
# ("portable_e": run e's portable kernel, one q4 word per lane and no k split; "portable_s1": 16-byte
# lane-chunks without the split; "portable": both, the split q4_split gives the shape; these two
# alternatives skip the lm_head.) The check gives the bench at most 90 s and it times in this order:
# the default tensor-core kernel first (refusal() reads it), the default portable one next.
VARIANTS = {"tc": {}, "portable": {}, "tc_w4": {"warps": 4}, "tc_w8": {"warps": 8}, "tc_w16": {"warps": 16},
            "tc_u1": {"unroll": 1}, "tc_u4": {"unroll": 4}, "portable_s1": {"split": 1},
            "portable_e": {"words": 1, "split": 1}, "dense_portable": {}, "dense_tc": {}}
ALTERNATIVES = ("portable_s1", "portable_e")  # layer projections only
# attention (kernels/attention_gpu.py) on each model's heads: (query heads, KV heads, head dim), and its
# V sums: "attn" the default (16-byte vectors issued ahead), "attn_rows" row by row (run e's kernel)
ATTENTION = {"qwen15": (12, 2, 128), "smollm2": (9, 3, 64)}
ATTENTION_VARIANTS = {"attn": {}, "attn_rows": {"v_sum": "rows"}}
CONTEXTS = (128, 2048, 8192)  # a decode token and 8 chained verify rows at each; and a 512-token prefill
VERIFY_ROWS = 8
PREFILL = 512
VOCABS = {"qwen15": 151936, "smollm2": 49152}  # greedy verification's argmax (kernels/verification.py)
ROWS = (1, 2, 4, 8, 16, 32, 64, 512)
ALONE = 64  # rows projected one at a time: the reference every M-row result must equal bit for bit
CHECKED_FEATURES = 512  # output features compared with float64 (the first and last 256)
FILE = "kernels-bench"


def _kernel(variant: str, n: int, k: int, dtype: str):
    from speccompile.kernels import gpu_matmul as portable
    from speccompile.kernels import gpu_matmul_mma as mma
    from speccompile.kernels.attention_gpu import max_vector_lanes

    split = VARIANTS[variant]  # the kernel's work split (warps, unroll; words, split); {} the default
    if variant.startswith("portable"):
        return portable.q4_gemv(n, k, dtype, max_lanes=max_vector_lanes(), **split)
    if variant == "dense_portable":
        return portable.dense_gemv(n, k, dtype, max_lanes=max_vector_lanes())
    if variant == "dense_tc":
        return mma.dense_mma(n, k, **split)
    return mma.q4_mma(n, k, **split)


def _dense(variant: str) -> bool:
    return variant.startswith("dense")


def build(out_dir: Path, device: str = "cuda", dtype: str = "float16", variants=None, shapes=None,
          attention=None, vocabs=None) -> Path:
    """Compile every (variant, model, projection), the attention variants on each model's heads
    and the greedy verification kernel for each vocabulary into one library; returns the
    listing's path."""
    import tvm

    from speccompile.compiler.targets import fatbin_packer, find_nvcc
    from speccompile.kernels.attention_gpu import SPLITS, attention_gpu, attention_merge_gpu
    from speccompile.kernels.rejection_gpu import accept_sampled_gpu
    from speccompile.kernels.sampling import sampling_probs_gpu
    from speccompile.kernels.verification import accept_greedy_gpu

    variants = list(VARIANTS if variants is None else variants)
    shapes = SHAPES if shapes is None else shapes
    attention = ATTENTION if attention is None else attention
    vocabs = VOCABS if vocabs is None else vocabs
    if device == "cuda":
        archs = ["sm_90"]
        target = tvm.target.Target({"kind": "cuda", "arch": archs[0], "host": {"kind": "llvm"}})
    else:
        archs, target = [], tvm.target.Target({"kind": device, "host": {"kind": "llvm"}})
    funcs, listing = {}, []
    with target:
        for variant in variants:
            for model, projs in shapes.items():
                for proj, (n, k) in projs.items():
                    if _dense(variant) and (proj == "lm_head" or model == "smollm2"):
                        continue  # dense: one model's layer is enough to compare the two kernels
                    if variant in ALTERNATIVES and proj == "lm_head":
                        continue
                    name = f"{variant}__{model}_{proj}"
                    funcs[name] = _kernel(variant, n, k, dtype).with_attr("global_symbol", name)
                    listing.append({"name": name, "variant": variant, "model": model, "proj": proj, "n": n, "k": k,
                                    **VARIANTS[variant]})
        attn = []
        for variant, opts in ATTENTION_VARIANTS.items():
            for model, (heads, kv_heads, dim) in attention.items():
                name = f"{variant}__{model}"
                funcs[name] = attention_gpu(1, heads, kv_heads, dim, dtype, **opts).with_attr("global_symbol", name)
                funcs[f"{name}__merge"] = attention_merge_gpu(heads, dim, dtype).with_attr("global_symbol",
                                                                                          f"{name}__merge")
                attn.append({"name": name, "merge": f"{name}__merge", "variant": variant, "model": model,
                             "heads": heads, "kv_heads": kv_heads, "head_dim": dim})
        accept = []
        for model, vocab in vocabs.items():
            funcs[f"accept__{model}"] = accept_greedy_gpu(vocab).with_attr("global_symbol", f"accept__{model}")
            accept.append({"name": f"accept__{model}", "model": model, "vocab": vocab})
            funcs[f"probs__{model}"] = sampling_probs_gpu(vocab).with_attr("global_symbol", f"probs__{model}")
            accept.append({"name": f"probs__{model}", "model": model, "vocab": vocab})
            funcs[f"sampled__{model}"] = accept_sampled_gpu(vocab).with_attr("global_symbol", f"sampled__{model}")
            accept.append({"name": f"sampled__{model}", "model": model, "vocab": vocab})
    ex = tvm.compile(tvm.IRModule(funcs), target=target)
    out_dir.mkdir(parents=True, exist_ok=True)
    lib, report = out_dir / f"{FILE}.so", {}
    nvcc = find_nvcc() if device == "cuda" else None
    if nvcc:
        ex.export_library(str(lib), fpack_imports=fatbin_packer(nvcc, archs, report))
    else:
        ex.export_library(str(lib))
    info = out_dir / f"{FILE}.json"
    info.write_text(json.dumps({"device": device, "dtype": dtype, "rows": list(ROWS), "layers": LAYERS,
                                "shapes": {model: list(projs) for model, projs in shapes.items()},
                                "functions": listing, "attention": attn, "contexts": list(CONTEXTS),
                                "verify_rows": VERIFY_ROWS, "prefill": PREFILL, "accept": accept,
                                "attention_splits": SPLITS}, indent=1))
    return info


def _operands(dense: bool, n: int, k: int, dtype: str, rows: int, seed: int):
    """Random weights -- q4 (nibbles, signed scales) or dense -- and activations; returns (the
    kernel's weight operands, a function giving chosen features' weights in float64, x)."""
    rng = np.random.default_rng(seed)
    if dense:
        w = (rng.standard_normal((n, k)) * 0.02).astype(dtype)
        weights, rows_of = [w], lambda f: w[f].astype(np.float64)
    else:
        qw = rng.integers(0, 2**32, (n, k // 8), dtype=np.uint64).astype(np.uint32)
        qs = (rng.standard_normal((n, k // 32)) * 0.02).astype(dtype)

        def rows_of(f):
            nib = (qw[f, :, None] >> (np.arange(8, dtype=np.uint32) * 4)) & 15
            return (nib.reshape(len(f), -1).astype(np.float64) - 7) * np.repeat(qs[f].astype(np.float64), 32, axis=1)
        weights = [qw, qs]
    return weights, rows_of, rng.standard_normal((rows, k)).astype(dtype)


def _timer(lib, name: str, dev):
    """Seconds per call: TVM's C++ time evaluator (back-to-back launches, synchronised once per
    repeat), else a Python loop -- whose launch cost then bounds small kernels."""
    try:
        te = lib.time_evaluator(name, dev, number=20, repeat=5)
        return lambda *args: min(te(*args).results)
    except Exception:  # noqa: BLE001 - a runtime without the evaluator
        fn = lib[name]

        def loop(*args):
            best = float("inf")
            for _ in range(5):
                dev.sync()
                t0 = time.perf_counter()
                for _ in range(20):
                    fn(*args)
                dev.sync()
                best = min(best, (time.perf_counter() - t0) / 20)
            return best
        return loop


def run(info_path: Path, log=print, deadline: float | None = None) -> dict:
    """Time and check every listed kernel on the device the library was built for."""
    import tvm

    from speccompile.runtime.device_runtime import ensure_device_runtime

    info = json.loads(Path(info_path).read_text())
    ensure_device_runtime(info["device"])
    lib = tvm.runtime.load_module(str(Path(info_path).with_suffix(".so")))
    dev, dtype, rows = tvm.device(info["device"], 0), info["dtype"], [int(r) for r in info["rows"]]
    out: dict = {"device_kind": info["device"], "dtype": dtype, "rows": rows, "functions": {}, "skipped": []}
    out["attention"] = {}  # first: a few seconds, where the projections may meet the deadline
    for f in info.get("attention", []):
        if deadline is not None and time.monotonic() > deadline:
            out["skipped"].append(f["name"])
            continue
        out["attention"][f["name"]] = rec = time_attention(lib, f, info, dtype, dev)
        log(f"  {f['name']}: {rec['us']} us, invariant {rec['invariant']}, err {rec['max_abs_err']:.1e}")
    out["accept"] = {}
    for f in info.get("accept", []):
        if deadline is not None and time.monotonic() > deadline:
            out["skipped"].append(f["name"])
            continue
        timed = {"accept": time_accept, "probs": time_sampling, "sampled": time_sampled}[f["name"].split("__")[0]]
        out["accept"][f["name"]] = rec = timed(lib, f, int(info["verify_rows"]), dev)
        log(f"  {f['name']}: {rec['us']} us, correct {rec['correct']}")
    data: dict = {}  # (n, k) -> operands, shared by the variants
    for f in info["functions"]:
        if deadline is not None and time.monotonic() > deadline:
            out["skipped"].append(f["name"])
            continue
        n, k, dense = f["n"], f["k"], _dense(f["variant"])
        if (dense, n, k) not in data:
            data.clear()  # one shape's operands at a time (the lm_head's are 0.2 GB)
            weights, rows_of, x = _operands(dense, n, k, dtype, max(rows), seed=n * 7 + k)
            data[(dense, n, k)] = (rows_of, x, [tvm.runtime.tensor(a, dev) for a in weights],
                                   {m: tvm.runtime.tensor(x[:m], dev) for m in rows},
                                   [tvm.runtime.tensor(x[i:i + 1], dev) for i in range(min(ALONE, max(rows)))])
        rows_of, x, w_d, xs, singles = data[(dense, n, k)]
        fn = lib[f["name"]]
        ys = {m: tvm.runtime.empty((m, n), dtype, dev) for m in rows}
        alone = []
        for xi in singles:
            fn(xi, *w_d, ys[1])
            alone.append(ys[1].numpy()[0].copy())
        alone = np.stack(alone)
        rec = {**{key: f[key] for key in ("variant", "model", "proj", "n", "k")}, "us": {}, "mismatched_rows": {}}
        for m in rows:
            fn(xs[m], *w_d, ys[m])
            got = ys[m].numpy()[:len(alone)]
            bad = np.flatnonzero((got.view(np.uint16) != alone[:len(got)].view(np.uint16)).any(axis=1))
            if len(bad):
                rec["mismatched_rows"][str(m)] = bad[:8].tolist()
        timer = _timer(lib, f["name"], dev)
        for m in rows:
            rec["us"][str(m)] = round(1e6 * timer(xs[m], *w_d, ys[m]), 2)
        rec["vs_one_row"] = {m: round(t / rec["us"]["1"], 3) for m, t in rec["us"].items()}
        rec["invariant"] = not rec["mismatched_rows"]
        feats = np.unique(np.r_[np.arange(min(n, CHECKED_FEATURES // 2)), np.arange(max(0, n - CHECKED_FEATURES // 2), n)])
        w = rows_of(feats)
        ref = x[:8].astype(np.float64) @ w.T
        scale = np.abs(x[:8].astype(np.float64)) @ np.abs(w).T
        rec["max_err_vs_scale"] = float((np.abs(alone[:8, feats].astype(np.float64) - ref) / scale).max())
        out["functions"][f["name"]] = rec
        log(f"  {f['name']}: {rec['us']} us, x{rec['vs_one_row'].get('8')} at 8 rows, "
            f"invariant {rec['invariant']}, err/scale {rec['max_err_vs_scale']:.1e}")
    out["layers"] = layer_totals(out["functions"], info["layers"], info["shapes"])
    return out


def _attention_inputs(rng, tokens: list[tuple[int, int]], pages: int, heads: int, dim: int, dtype: str) -> dict:
    """The attention kernel's arguments but kv, numpy, for one sequence: its page table (pages
    0..pages-2 shuffled; the last page holds the extra slots) and per token (prefix rows, extra
    slots: a chain, the ancestors then the node)."""
    from speccompile.runtime.contract import KV_PAGE_SIZE as PAGE

    n, e = len(tokens), max(1, max(x for _, x in tokens))
    extra = np.zeros((n, e), np.int32)
    for t, (_, x) in enumerate(tokens):
        extra[t, :x] = pages * PAGE - 1 - np.arange(x)
    return dict(q=rng.standard_normal((n, heads, dim)).astype(dtype), pt=rng.permutation(pages - 1)[None, :]
                .astype(np.int32), seq=np.zeros(n, np.int32), prefix=np.array([p for p, _ in tokens], np.int32),
                extra=extra, extra_len=np.array([x for _, x in tokens], np.int32))


def time_attention(lib, f: dict, info: dict, dtype: str, dev) -> dict:
    """One attention variant on one model's heads, its chunks and their merge (two launches, as
    in a model; ``us_merge`` the merge's share): microseconds for a decode token and for
    ``verify_rows`` chained verify rows at each context, and for a ``prefill``-token prompt; each
    verify token's output (and a few prefill tokens') compared bit for bit with the token attended
    alone, and two tokens per case against float64."""
    import tvm

    from speccompile.runtime.contract import KV_PAGE_SIZE as PAGE

    heads, kv_heads, dim = f["heads"], f["kv_heads"], f["head_dim"]
    contexts, verify, prefill = [int(c) for c in info["contexts"]], int(info["verify_rows"]), int(info["prefill"])
    rng = np.random.default_rng(heads * dim)
    pages = -(-max(max(contexts), prefill) // PAGE) + 2  # the last page holds the verify rows' slots
    kv_np = (rng.standard_normal((1, 2, pages * PAGE, kv_heads, dim)) * 0.5).astype(dtype)
    kv, fn, timer = tvm.runtime.tensor(kv_np, dev), lib[f["name"]], _timer(lib, f["name"], dev)
    merge, merge_timer = lib[f["merge"]], _timer(lib, f["merge"], dev)
    cases = {f"decode_{c}": [(c, 0)] for c in contexts}
    cases.update({f"verify{verify}_{c}": [(c, i + 1) for i in range(verify)] for c in contexts})
    cases[f"prefill_{prefill}"] = [(i + 1, 0) for i in range(prefill)]
    rec: dict = {"us": {}, "us_merge": {}, "mismatched": {}, "max_abs_err": 0.0}
    for case, tokens in cases.items():
        a = _attention_inputs(rng, tokens, pages, heads, dim, dtype)

        def call(idx):
            d = {k: tvm.runtime.tensor(np.ascontiguousarray(v[idx]), dev) for k, v in a.items() if k != "pt"}
            out = tvm.runtime.empty((len(idx), heads, dim), dtype, dev)
            part = tvm.runtime.empty((len(idx), heads, info["attention_splits"], dim + 2), "float32", dev)
            args = (d["q"], kv, tvm.runtime.tensor(a["pt"], dev), d["seq"], d["prefix"], d["extra"], d["extra_len"],
                    0, out, part)
            merge_args = (out, part, d["prefix"], d["extra_len"])
            fn(*args)
            merge(*merge_args)
            return out.numpy(), args, merge_args

        every = list(range(len(tokens)))
        together, args, merge_args = call(every)
        us_merge = 1e6 * merge_timer(*merge_args)  # (it rewrites the same outputs: times are all it gives here)
        rec["us"][case] = round(1e6 * timer(*args) + us_merge, 2)
        rec["us_merge"][case] = round(us_merge, 2)
        if case.startswith("decode"):
            continue
        probe = every if len(every) <= verify else every[::64] + [every[-1]]  # prefill: a few tokens alone
        bad = [i for i in probe if not np.array_equal(call([i])[0][0].view(np.uint8), together[i].view(np.uint8))]
        if bad:
            rec["mismatched"][case] = bad[:8]
        for i in probe[:2]:  # float64 softmax attention over the token's rows
            prefix, x = tokens[i]
            rows = [int(a["pt"][0, r // PAGE]) * PAGE + r % PAGE for r in range(prefix)] + a["extra"][i, :x].tolist()
            for h in range(heads):
                k = kv_np[0, 0, rows, h // (heads // kv_heads)].astype(np.float64)
                v = kv_np[0, 1, rows, h // (heads // kv_heads)].astype(np.float64)
                s = k @ a["q"][i, h].astype(np.float64) / np.sqrt(dim)
                p = np.exp(s - s.max())
                err = np.abs(p @ v / p.sum() - together[i, h].astype(np.float64)).max()
                rec["max_abs_err"] = max(rec["max_abs_err"], float(err))
    rec["invariant"] = not rec["mismatched"]
    return rec


def time_accept(lib, f: dict, verify: int, dev) -> dict:
    """Greedy verification on random logits: microseconds for 1 and ``verify`` + 1 rows (one
    sequence per row, no drafts), and whether every bonus token is numpy's first maximum."""
    import tvm

    rng = np.random.default_rng(f["vocab"])
    rec: dict = {"us": {}, "correct": True}
    for n in (1, verify + 1):
        logits = rng.standard_normal((n, f["vocab"])).astype(np.float32)
        out = tvm.runtime.empty((n + 1, n + 2), "int32", dev)
        args = (tvm.runtime.tensor(logits, dev), tvm.runtime.tensor(np.zeros(n, np.int32), dev),
                tvm.runtime.tensor(np.full(n, -1, np.int32), dev),
                tvm.runtime.tensor(np.arange(n + 1, dtype=np.int32), dev), out)
        lib[f["name"]](*args)
        rec["correct"] = rec["correct"] and out.numpy()[:n, 1].tolist() == np.argmax(logits, axis=1).tolist()
        rec["us"][str(n)] = round(1e6 * _timer(lib, f["name"], dev)(*args), 2)
    return rec


def layer_totals(functions: dict, layers: dict, shapes: dict) -> dict:
    """Per (variant, model): one layer's projections summed (the lm_head apart), microseconds
    per token count and their ratio to one row: what a decode or verify forward pays for them.
    ``shapes``: each model's projections built (``complete``: all of them were timed)."""
    totals: dict = {}
    for rec in functions.values():
        if rec["proj"] == "lm_head":
            continue
        key = f"{rec['variant']}__{rec['model']}"
        t = totals.setdefault(key, {"variant": rec["variant"], "model": rec["model"], "us": {}, "complete": True})
        for m, us in rec["us"].items():
            t["us"][m] = round(t["us"].get(m, 0.0) + us, 2)
    for key, t in totals.items():
        want = [p for p in shapes.get(t["model"], []) if p != "lm_head"]
        got = [r["proj"] for r in functions.values() if f"{r['variant']}__{r['model']}" == key]
        t["complete"] = sorted(want) == sorted(p for p in got if p != "lm_head")
        t["vs_one_row"] = {m: round(v / t["us"]["1"], 3) for m, v in t["us"].items()}
        t["forward_ms"] = {m: round(v * layers.get(t["model"], 0) / 1e3, 3) for m, v in t["us"].items()}
    return totals


def refusal(out: dict | None, error: str | None = None) -> str | None:
    """Why the tensor-core libraries must not be measured as the default, or None: the bench
    failed (a fault, a timeout), or the default tensor-core kernel ("tc") gave a row other bits
    than the row alone, or results far from float64 (fp16 outputs: ~1e-3 of the scale)."""
    if error:
        return f"the kernel bench failed: {error[-300:]}"
    tc = [(name, r) for name, r in (out or {}).get("functions", {}).items() if r["variant"] == "tc"]
    if not tc:
        return "the kernel bench measured no tensor-core kernel"
    for name, r in tc:
        if not r["invariant"]:
            return f"{name}: rows differ from the same rows alone {r['mismatched_rows']}"
        if not r["max_err_vs_scale"] < 1e-2:
            return f"{name}: max error {r['max_err_vs_scale']:.3g} of the scale against float64"
    return None


def time_sampling(lib, f: dict, verify: int, dev) -> dict:
    """The sampling kernel (probabilities with temperature, top-k, top-p) on random logits:
    microseconds for 1 and ``verify`` + 1 rows at temperature 0.7 with top-p 0.9, top-k 40, and
    no cut, on rows of N(0, 9) logits; and top-p 0.9 and top-k 20 with top-p 0.8 on peaked rows
    (50 logits 12 higher, as a model's rows are); ``correct``: the rows sum to 1 and keep the
    argmax."""
    import tvm

    rng = np.random.default_rng(f["vocab"] + 1)
    rec: dict = {"us": {}, "correct": True}
    cuts = {"top_p": (0, 0.9, False), "top_k": (40, 1.0, False), "none": (0, 1.0, False),
            "top_p_peaked": (0, 0.9, True), "top_k_top_p_peaked": (20, 0.8, True)}
    for cut, (top_k, top_p, peaked) in cuts.items():
        for n in (1, verify + 1):
            logits = (rng.standard_normal((n, f["vocab"])) * (2.5 if peaked else 3)).astype(np.float32)
            if peaked:
                logits[:, :50] += 12
            out = tvm.runtime.empty((n, f["vocab"]), "float32", dev)
            args = (tvm.runtime.tensor(logits, dev), tvm.runtime.tensor(np.full(n, 0.7, np.float32), dev),
                    tvm.runtime.tensor(np.full(n, top_k, np.int32), dev),
                    tvm.runtime.tensor(np.full(n, top_p, np.float32), dev), out)
            lib[f["name"]](*args)
            p = out.numpy()
            rec["correct"] = rec["correct"] and bool(np.allclose(p.sum(axis=1), 1, atol=1e-4) and (
                p[np.arange(n), logits.argmax(axis=1)] > 0).all())
            rec["us"][f"{cut}_{n}"] = round(1e6 * _timer(lib, f["name"], dev)(*args), 2)
    return rec


def time_sampled(lib, f: dict, verify: int, dev) -> dict:
    """Rejection sampling (kernels/rejection_gpu.py) on one sequence: microseconds for a plain
    step (one row: the final draw alone) and for ``verify`` drafts whose first is rejected (the
    residual's passes, then the draw), with random target and draft distributions; ``correct``:
    the plain draw at u = 0.5 is the token whose CDF step holds 0.5."""
    import tvm

    rng = np.random.default_rng(f["vocab"] + 2)
    vocab, rec = f["vocab"], {"us": {}, "correct": True}

    def dist(rows):
        x = np.exp(rng.standard_normal((rows, vocab)) * 2).astype(np.float32)
        return x / x.sum(axis=1, keepdims=True)

    for case, k in (("plain", 0), (f"reject_{verify}", verify)):
        n = k + 1
        p, q = dist(n), dist(n)
        toks = rng.integers(0, vocab, n).astype(np.int32)
        uniforms = np.full(n + 1, 0.5, np.float32)
        uniforms[1:n] = 1.0  # every draft test fails: u < p / q is false where p < q
        q[1:, toks[1:]] = 1.0  # so q(x) >= 1 > p(x)
        out = tvm.runtime.empty((2, n + 2), "int32", dev)
        t = lambda a: tvm.runtime.tensor(np.ascontiguousarray(a), dev)
        args = (t(p), t(q), t(np.zeros(n, np.int32)), t(toks), t(np.arange(-1, n - 1, dtype=np.int32)),
                t(np.array([0, n], np.int32)), t(uniforms), out)
        lib[f["name"]](*args)
        if case == "plain":  # the token's CDF step holds 0.5, up to float32 sums
            cdf, tok = np.cumsum(p[0], dtype=np.float64), int(out.numpy()[0, 1])
            rec["correct"] = bool((tok == 0 or cdf[tok - 1] <= 0.5 + 1e-5) and cdf[tok] >= 0.5 - 1e-5)
        rec["us"][case] = round(1e6 * _timer(lib, f["name"], dev)(*args), 2)
    return rec


def main(argv: list[str] | None = None) -> int:
    """``python -m speccompile.gpu_check.kernels_bench INFO [--seconds S]``: run the bench, its
    log on stderr, the result as the last line of stdout."""
    import argparse
    import sys

    ap = argparse.ArgumentParser(prog="python -m speccompile.gpu_check.kernels_bench")
    ap.add_argument("info", type=Path)
    ap.add_argument("--seconds", type=float, default=None, help="skip the kernels left after this long")
    args = ap.parse_args(argv)
    from speccompile.runtime.tvm_import import import_runtime_only

    import_runtime_only()
    deadline = None if args.seconds is None else time.monotonic() + args.seconds
    out = run(args.info, log=lambda line: print(line, file=sys.stderr, flush=True), deadline=deadline)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
