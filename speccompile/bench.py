"""``speccompile bench``: measured prefill/decode speed, against the machine's own roofline.

Benchmarks are not tests: this measures and writes JSON. The memory bandwidth is measured
in the same run with a two-thread TVM streaming-sum kernel, and decode is reported as a
share of the bandwidth roofline (weight bytes read per token / bandwidth).
"""
from __future__ import annotations

import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

DEFAULT_PROMPTS = Path(__file__).resolve().parent.parent / "bench" / "mt_bench.jsonl"


def load_prompts(path: Path, limit: int | None = None) -> list[dict[str, Any]]:
    path = Path(path)
    if not path.exists():
        raise ValueError(f"prompt file {path} not found")
    rows = []
    for line in path.read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            text = row["turns"][0] if "turns" in row else row.get("prompt")
            if text is None:
                raise ValueError(f"{path}: each line needs 'turns' or 'prompt'")
            rows.append({"id": row.get("question_id", len(rows)), "category": row.get("category", "all"), "prompt": text})
    return rows[:limit] if limit else rows


def measure_bandwidth(num_bytes: int = 512 << 20, threads: int | None = None) -> float:
    """GB/s of a parallel streaming read (sum of a float32 array much larger than L3)."""
    import tvm
    from tvm.script import tirx as T

    n = num_bytes // 4
    lanes, parts = 16, 64
    chunk = n // parts

    @T.prim_func
    def stream_sum(a: T.Buffer((n,), "float32"), out: T.Buffer((parts, lanes), "float32")):
        T.func_attr({"global_symbol": "main", "tir.noalias": True})
        for p in T.parallel(parts):
            for l in T.vectorized(lanes):
                out[p, l] = T.float32(0)
            for i in range(chunk // lanes):
                for l in T.vectorized(lanes):
                    out[p, l] = out[p, l] + a[p * chunk + i * lanes + l]

    target = tvm.target.Target({"kind": "llvm", "mcpu": tvm.target.codegen.llvm_get_system_cpu(),
                                "num-cores": threads or os.cpu_count() or 1})
    lib = tvm.compile(tvm.IRModule({"main": stream_sum}), target=target)
    dev = tvm.cpu()
    a = tvm.runtime.tensor(np.ones(n, np.float32), dev)
    out = tvm.runtime.empty((parts, lanes), "float32", dev)
    lib["main"](a, out)
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        lib["main"](a, out)
        best = min(best, time.perf_counter() - t)
    return n * 4 / best / 1e9


def weight_bytes_per_token(meta: dict) -> int:
    """Bytes of parameters a decode step reads: all weights, except an untied embedding
    table (only one row of it is gathered)."""
    names = {p["name"] for p in meta["params"]}
    tied = not any(n.startswith("lm_head.") for n in names)
    total = 0
    for p in meta["params"]:
        if p["name"].startswith("embed_tokens.") and not tied:
            continue
        total += int(np.prod(p["shape"])) * np.dtype(p["dtype"]).itemsize
    return total


def run_bench(model_dir: Path, model_lib: Path, prompts_file: Path | None = None, max_tokens: int = 128,
              limit: int | None = None, out_json: Path | None = None, quiet: bool = False) -> dict:
    from speccompile.runtime.engine import Engine

    prompts = load_prompts(prompts_file or DEFAULT_PROMPTS, limit)
    engine = Engine(model_dir, model_lib)
    bandwidth = measure_bandwidth()
    per_token = weight_bytes_per_token(engine.model.meta)
    roofline = bandwidth * 1e9 / per_token
    engine.generate(engine.encode_prompt("warm up"), max_tokens=8)
    rows = []
    for i, p in enumerate(prompts):
        ids = engine.encode_prompt(p["prompt"])
        res = engine.generate(ids, max_tokens=max_tokens, ignore_eos=True)
        s = res.stats.to_dict()
        rows.append({"id": p["id"], "category": p["category"], **s})
        if not quiet:
            print(f"[{i + 1}/{len(prompts)}] {p['category']:<12} prefill {s['prefill_tokens']:4d} tok "
                  f"{s['prefill_tokens_per_s']:7.1f} tok/s | decode {s['decode_tokens']:4d} tok "
                  f"{s['decode_tokens_per_s']:6.1f} tok/s")
    decode = [r["decode_tokens_per_s"] for r in rows]
    prefill = [r["prefill_tokens_per_s"] for r in rows]
    cats = {}
    for r in rows:
        cats.setdefault(r["category"], []).append(r["decode_tokens_per_s"])
    report = {
        "machine": {"platform": platform.platform(), "processor": platform.processor(), "cpus": os.cpu_count(),
                    "measured_bandwidth_GBps": round(bandwidth, 2)},
        "model": {"model_dir": str(model_dir), "model_lib": str(model_lib), "model_type": engine.model.meta["model_type"],
                  "quantization": engine.model.meta["quantization"], "weight_bytes_per_token": per_token},
        "settings": {"max_tokens": max_tokens, "prompts": str(prompts_file or DEFAULT_PROMPTS), "num_prompts": len(rows),
                     "batch_size": 1, "greedy": True},
        "summary": {
            "decode_tokens_per_s_mean": statistics.fmean(decode),
            "decode_tokens_per_s_median": statistics.median(decode),
            "prefill_tokens_per_s_mean": statistics.fmean(prefill),
            "roofline_tokens_per_s": roofline,
            "decode_share_of_roofline": statistics.fmean(decode) / roofline,
        },
        "per_category_decode_tokens_per_s": {c: statistics.fmean(v) for c, v in cats.items()},
        "per_prompt": rows,
    }
    if out_json:
        Path(out_json).parent.mkdir(parents=True, exist_ok=True)
        Path(out_json).write_text(json.dumps(report, indent=1))
    if not quiet:
        s = report["summary"]
        print(f"\ndecode {s['decode_tokens_per_s_mean']:.1f} tok/s (median {s['decode_tokens_per_s_median']:.1f}), "
              f"prefill {s['prefill_tokens_per_s_mean']:.1f} tok/s; bandwidth {bandwidth:.1f} GB/s, "
              f"{per_token / 1e6:.1f} MB/token -> roofline {roofline:.1f} tok/s, "
              f"{100 * s['decode_share_of_roofline']:.0f}% of it")
    return report
