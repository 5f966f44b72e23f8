"""``speccompile bench``: measured prefill/decode speed, against the machine's own roofline.

Benchmarks are not tests: this measures and writes JSON. The memory bandwidth is measured
in the same run with a two-thread TVM streaming-sum kernel, and decode is reported as a
share of the bandwidth roofline (weight bytes read per token / bandwidth).
"""
from __future__ import annotations

import itertools
import json
import os
import platform
import statistics
import time
from contextlib import closing
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

DEFAULT_PROMPTS = Path(__file__).resolve().parents[2] / "bench" / "mt_bench.jsonl"


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
            rows.append({"id": row.get("question_id", len(rows)), "category": row.get("category", "all"), "prompt": text,
                         "response_format": row.get("response_format"),  # structured output, when the set asks
                         "prediction": row.get("prediction")})  # Predicted Outputs (bench --one-shot), when it has one
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


def _aggregate(rows: list[dict], key_tokens: str, key_seconds: str) -> float:
    toks = sum(r[key_tokens] for r in rows)
    secs = sum(r[key_seconds] for r in rows)
    return toks / secs if secs else 0.0


def select_prompts(prompts: list[dict], categories: list[str] | None = None, per_category: int | None = None,
                   limit: int | None = None) -> list[dict]:
    """Only these categories, at most ``per_category`` of each, at most ``limit`` in all."""
    if categories:
        prompts = [p for p in prompts if p["category"] in categories]
    if per_category:
        seen: dict[str, int] = {}
        prompts = [p for p in prompts if seen.setdefault(p["category"], 0) < per_category
                   and not seen.__setitem__(p["category"], seen[p["category"]] + 1)]
    return prompts[:limit] if limit else prompts


def run_bench(model_dir: Path, model_lib: Path, prompts_file: Path | None = None, max_tokens: int = 128,
              limit: int | None = None, out_json: Path | None = None, quiet: bool = False, spec: dict | None = None,
              categories: list[str] | None = None, per_category: int | None = None,
              llama_bench: tuple[Path, Path] | None = None, llama_speculative: dict | None = None) -> dict:
    """Plain decoding of every prompt, and -- with a speculative mode -- the same prompts with
    speculation, in the same process and the same build, greedy, batch 1, each prompt run
    plain / spec / spec / plain (the spec statistics are the first spec run's, its time the
    mean of both). ``llama_bench``
    (binary, gguf): llama.cpp's own benchmark runs right after, in the same run.
    ``llama_speculative`` (binary, gguf, draft_gguf, draft_max, modes): llama.cpp's speculative
    decoding of the same rendered prompts, also in the same run, in each of ``modes`` (its
    counterparts of our small_draft and ngram; default: the mode we run), so that a mode
    llama.cpp lacks (eagle, medusa) is compared against its best peers. ``spec``: the Engine's
    options (its config objects, or their fields by name)."""
    from speccompile.runtime.engine import Engine
    from speccompile.bench.llama_cpp import run_llama_bench, run_llama_speculative, summarize_llama_speculative

    spec = dict(spec or {"speculative_mode": "disable"})
    if "engine" not in spec:  # every run of a prompt prefills it, as a cold request does (the CLI's default too)
        spec.setdefault("prefix_cache_max_num_recycling_seqs", 0)
    prompts = select_prompts(load_prompts(prompts_file or DEFAULT_PROMPTS), categories, per_category, limit)
    engine = Engine(model_dir, model_lib, **spec)
    speculative = engine.spec.enabled
    bandwidth = measure_bandwidth()
    per_token = weight_bytes_per_token(engine.model.meta)
    roofline = bandwidth * 1e9 / per_token
    engine.warm_up()
    rows = []
    for i, p in enumerate(prompts):
        ids = engine.encode_prompt(p["prompt"])

        def plain_run():
            with engine.speculation_disabled():
                return engine.generate(ids, max_tokens=max_tokens, ignore_eos=True, response_format=p["response_format"])

        plain = plain_run()
        row = {"id": p["id"], "category": p["category"], "prompt_tokens": len(ids),
               "decode_tokens": plain.stats.decode_tokens, "plain_seconds": plain.stats.decode_seconds,
               "plain_tokens_per_s": plain.stats.to_dict()["decode_tokens_per_s"],
               "prefill_tokens_per_s": plain.stats.to_dict()["prefill_tokens_per_s"],
               **({"plain_grammar_ms_per_step": plain.stats.to_dict()["grammar_ms_per_step"]}
                  if plain.stats.grammar_steps else {})}
        if speculative:
            # plain, spec, spec, plain (ABBA): this kind of machine drifts 10-30% in speed
            # within seconds, and a plain-then-spec pair measured that drift as a speedup or
            # a slowdown; the mean of each pair cancels a linear drift
            sp, sp2 = (engine.generate(ids, max_tokens=max_tokens, ignore_eos=True, response_format=p["response_format"])
                       for _ in range(2))
            plain2 = plain_run()
            row["plain_seconds"] = (plain.stats.decode_seconds + plain2.stats.decode_seconds) / 2
            row["plain_tokens_per_s"] = row["decode_tokens"] / row["plain_seconds"]
        line = f"[{i + 1}/{len(prompts)}] {p['category']:<11} plain {row['plain_tokens_per_s']:6.1f} tok/s"
        if speculative:
            st = sp.stats.to_dict()
            spec_seconds = (sp.stats.decode_seconds + sp2.stats.decode_seconds) / 2
            spec_rate = sp.stats.decode_tokens / spec_seconds
            row.update({"spec_seconds": spec_seconds, "spec_tokens_per_s": spec_rate,
                        "speedup": spec_rate / row["plain_tokens_per_s"],
                        "identical_output": sp.token_ids == plain.token_ids == sp2.token_ids == plain2.token_ids,
                        **{k: st[k] for k in ("accept_rate", "mean_accepted_length", "per_position_accept_rate",
                                              "draft_tokens", "accepted_tokens", "verify_steps", "plain_steps",
                                              "draft_seconds", "verify_seconds")},
                        **{k: st[k] for k in ("grammar_ms_per_step",) if k in st}})
            line += (f" | spec {row['spec_tokens_per_s']:6.1f} tok/s x{row['speedup']:.2f} "
                     f"accept {row['accept_rate']:.2f} len {row['mean_accepted_length']:.2f}"
                     f"{'' if row['identical_output'] else ' OUTPUT DIFFERS'}")
        rows.append(row)
        if not quiet:
            print(line, flush=True)
    peers = llama_speculative.get("modes") or [engine.spec.speculative_mode] if llama_speculative and speculative else []
    for mode in peers:  # llama.cpp's speculative decoding of the same rendered prompts, per peer mode
        lrows = run_llama_speculative(
            llama_speculative["binary"], llama_speculative["gguf"],
            [engine.render([{"role": "user", "content": p["prompt"]}]) for p in prompts], max_tokens,
            mode, llama_speculative.get("draft_gguf"), llama_speculative.get("draft_max", 3))
        for row, lr in zip(rows, lrows):
            row.setdefault("llama_cpp_spec", {})[mode] = {**lr, "ours_over": row["spec_tokens_per_s"] / lr["tokens_per_s"]}
            if not quiet:
                print(f"llama.cpp {mode:<11} {row['category']:<11} spec {lr['tokens_per_s']:6.1f} tok/s accept "
                      f"{lr['accept_rate']:.2f} | ours {row['spec_tokens_per_s']:6.1f}", flush=True)
    by_cat: dict[str, list[dict]] = {}
    for r in rows:
        by_cat.setdefault(r["category"], []).append(r)

    def summarize(group: list[dict]) -> dict:
        out = {"prompts": len(group), "plain_tokens_per_s": _aggregate(group, "decode_tokens", "plain_seconds")}
        if speculative:
            out["spec_tokens_per_s"] = _aggregate(group, "decode_tokens", "spec_seconds")
            out["speedup"] = out["spec_tokens_per_s"] / out["plain_tokens_per_s"]
            drafted = sum(r["draft_tokens"] for r in group)
            out["accept_rate"] = sum(r["accepted_tokens"] for r in group) / drafted if drafted else 0.0
            steps = sum(r["verify_steps"] for r in group)
            out["mean_accepted_length"] = (sum(r["mean_accepted_length"] * r["verify_steps"] for r in group) / steps
                                           if steps else 0.0)
            out["identical_outputs"] = sum(r["identical_output"] for r in group)
            for mode in peers:  # llama.cpp's rate in each peer mode, and ours over it
                rate = (sum(r["llama_cpp_spec"][mode]["decode_tokens"] for r in group)
                        / sum(r["llama_cpp_spec"][mode]["seconds"] for r in group))
                out.setdefault("llama_cpp_spec", {})[mode] = {"spec_tokens_per_s": rate,
                                                              "ours_over": out["spec_tokens_per_s"] / rate}
        return out

    overall = summarize(rows)
    overall["roofline_tokens_per_s"] = roofline
    overall["plain_share_of_roofline"] = overall["plain_tokens_per_s"] / roofline
    overall["prefill_tokens_per_s_mean"] = statistics.fmean(r["prefill_tokens_per_s"] for r in rows)
    if llama_bench:
        # llama-bench's tg starts from an empty context, ours from each prompt; it also runs at
        # our mean decode context (prompt + half the new tokens) so attention costs compare.
        depth = round(statistics.fmean(r["prompt_tokens"] + r["decode_tokens"] / 2 for r in rows))
        lc = overall["llama_cpp"] = run_llama_bench(*llama_bench, depth=depth)
        lc["ours_over_llama_cpp_decode"] = overall["plain_tokens_per_s"] / lc["tg_tokens_per_s"]
        lc["ours_over_llama_cpp_decode_at_depth"] = overall["plain_tokens_per_s"] / lc["tg_tokens_per_s_at_depth"]
    if peers:
        overall["llama_cpp_speculative"] = {
            mode: summarize_llama_speculative([r["llama_cpp_spec"][mode] for r in rows], llama_speculative["binary"],
                                              mode, llama_speculative.get("draft_max", 3)) for mode in peers}
    report = {
        "machine": {"platform": platform.platform(), "processor": platform.processor(), "cpus": os.cpu_count(),
                    "measured_bandwidth_GBps": round(bandwidth, 2)},
        "model": {"model_dir": str(model_dir), "model_lib": str(model_lib), "model_type": engine.model.meta["model_type"],
                  "quantization": engine.model.meta["quantization"], "weight_bytes_per_token": per_token},
        "settings": {"max_tokens": max_tokens, "prompts": str(prompts_file or DEFAULT_PROMPTS), "num_prompts": len(rows),
                     "batch_size": 1, "greedy": True, **asdict(engine.spec), **asdict(engine.sizes)},
        "summary": overall,
        "per_category": {c: summarize(g) for c, g in by_cat.items()},
        "per_prompt": rows,
    }
    if out_json:
        out_json = Path(out_json)
        out_json.parent.mkdir(parents=True, exist_ok=True)
        out_json.write_text(json.dumps(report, indent=1))
        if speculative:
            report["chart"] = str(write_chart(report, out_json.with_suffix(".png")))
            out_json.write_text(json.dumps(report, indent=1))
    if not quiet:
        _print_summary(report, speculative, bandwidth, per_token)
    return report


def _print_summary(report: dict, speculative: bool, bandwidth: float, per_token: int) -> None:
    s = report["summary"]
    print(f"\nplain decode {s['plain_tokens_per_s']:.1f} tok/s, prefill {s['prefill_tokens_per_s_mean']:.1f} tok/s; "
          f"bandwidth {bandwidth:.1f} GB/s, {per_token / 1e6:.1f} MB/token -> roofline "
          f"{s['roofline_tokens_per_s']:.1f} tok/s, plain at {100 * s['plain_share_of_roofline']:.0f}% of it")
    if "llama_cpp" in s:
        lc = s["llama_cpp"]
        print(f"llama.cpp (same run): decode {lc['tg_tokens_per_s']:.1f} tok/s, prefill {lc['pp_tokens_per_s']:.1f} "
              f"tok/s; ours / llama.cpp decode = {lc['ours_over_llama_cpp_decode']:.2f}")
        if "tg_tokens_per_s_at_depth" in lc:
            print(f"llama.cpp decode after {lc['depth']} context tokens (our mean decode context): "
                  f"{lc['tg_tokens_per_s_at_depth']:.1f} tok/s; ours / llama.cpp = "
                  f"{lc['ours_over_llama_cpp_decode_at_depth']:.2f}")
    if speculative:
        peers = list(s.get("llama_cpp_speculative", {}))
        print(f"{'category':<12} {'plain':>7} {'spec':>7} {'speedup':>8} {'accept':>7} {'len':>5}"
              + "".join(f" {'llama ' + m:>17} {'ours/it':>8}" for m in peers))
        for c, g in list(report["per_category"].items()) + [("overall", s)]:
            print(f"{c:<12} {g['plain_tokens_per_s']:7.1f} {g['spec_tokens_per_s']:7.1f} {g['speedup']:8.2f} "
                  f"{g['accept_rate']:7.2f} {g['mean_accepted_length']:5.2f}"
                  + "".join(f" {g['llama_cpp_spec'][m]['spec_tokens_per_s']:17.1f} {g['llama_cpp_spec'][m]['ours_over']:8.2f}"
                            for m in peers))
        for m, lc in s.get("llama_cpp_speculative", {}).items():
            print(f"llama.cpp speculative (same run, {m}, draft-max {lc['draft_max']}): accept {lc['accept_rate']:.2f}")


def write_chart(report: dict, path: Path) -> Path:
    """A PNG bar chart of speedup per category (1.0 = plain decoding)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cats = list(report["per_category"]) + ["overall"]
    vals = [report["per_category"][c]["speedup"] for c in cats[:-1]] + [report["summary"]["speedup"]]
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.bar(cats, vals, color=["#4c72b0" if v >= 1 else "#c44e52" for v in vals])
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_ylabel("speedup over plain decoding")
    mode = report["settings"].get("speculative_mode")
    ax.set_title(f"{mode}: {report['model']['model_type']} {report['model']['quantization']}, greedy, batch 1")
    for i, v in enumerate(vals):
        ax.text(i, v, f"{v:.2f}", ha="center", va="bottom", fontsize=8)
    plt.setp(ax.get_xticklabels(), rotation=30, ha="right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


# ------------------------------------------------------------ a running server
def percentiles(values: list[float]) -> dict:
    if not values:
        return {"p50": None, "p90": None, "p99": None, "mean": None}
    arr = np.asarray(values)
    return {"p50": float(np.percentile(arr, 50)), "p90": float(np.percentile(arr, 90)),
            "p99": float(np.percentile(arr, 99)), "mean": float(arr.mean())}


def stream_one(client, url: str, body: dict) -> dict:
    """One streamed chat completion: its text, and the times of its first and every later
    content chunk."""
    t0 = time.perf_counter()
    chunk_times, usage, finish, text = [], None, None, []
    with client.stream("POST", url, json=body) as r:
        if r.status_code != 200:
            return {"error": f"HTTP {r.status_code}: {r.read().decode(errors='replace')[:200]}"}
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            msg = json.loads(line[6:])
            if "error" in msg:
                return {"error": msg["error"].get("message")}
            if msg.get("usage"):
                usage = msg["usage"]
            for ch in msg.get("choices", []):
                if ch["delta"].get("content"):
                    chunk_times.append(time.perf_counter())
                    text.append(ch["delta"]["content"])
                finish = ch.get("finish_reason") or finish
    end = time.perf_counter()
    tokens = usage["completion_tokens"] if usage else len(chunk_times)
    out = {"tokens": tokens, "seconds": end - t0, "finish_reason": finish, "text": "".join(text),
           "ttft": chunk_times[0] - t0 if chunk_times else None,
           "chunk_gaps": [b - a for a, b in itertools.pairwise(chunk_times)],
           # prompt tokens the server did not prefill (its prefix cache: this prompt ran before)
           "cached_tokens": ((usage or {}).get("prompt_tokens_details") or {}).get("cached_tokens") or 0}
    if chunk_times and tokens > 1:
        out["tpot"] = (chunk_times[-1] - chunk_times[0]) / (tokens - 1)
    return out


def scrape_metrics(client, base: str) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    r = client.get(base + "/metrics")
    if r.status_code != 200:
        return {}
    return {s.name: s.value for fam in text_string_to_metric_families(r.text) for s in fam.samples if not s.labels}


def _level_stats(rows: list[dict], wall: float) -> dict:
    ok = [r for r in rows if "error" not in r]
    tokens = sum(r["tokens"] for r in ok)
    return {"requests": len(rows), "errors": len(rows) - len(ok), "seconds": wall,
            "output_tokens": tokens, "output_tokens_per_s": tokens / wall, "requests_per_s": len(ok) / wall,
            "cached_prompt_tokens": sum(r.get("cached_tokens", 0) for r in ok),
            "ttft_s": percentiles([r["ttft"] for r in ok if r["ttft"] is not None]),
            "itl_s": percentiles([g for r in ok for g in r["chunk_gaps"]]),
            "tpot_s": percentiles([r["tpot"] for r in ok if "tpot" in r])}


def connect(endpoint: str, api_key: str | None, model: str | None, timeout: float):
    """(the server's base URL, an open HTTP client for it -- the caller closes it -- the model
    id to send: ``model`` or the first it lists), or a ValueError saying why the server cannot
    be used."""
    import httpx

    base = endpoint.rstrip("/").removesuffix("/v1")
    client = httpx.Client(headers={"Authorization": f"Bearer {api_key}"} if api_key else {}, timeout=timeout)
    try:
        listed = client.get(base + "/v1/models")
    except httpx.TransportError as err:
        client.close()
        raise ValueError(f"cannot reach {base}: {err}") from err
    if listed.status_code != 200:
        client.close()
        raise ValueError(f"{base}/v1/models answered HTTP {listed.status_code}: {listed.text[:200]}")
    return base, client, model or listed.json()["data"][0]["id"]


def run_endpoint_bench(endpoint: str, concurrency: list[int], prompts_file: Path | None = None, max_tokens: int = 128,
                       limit: int | None = None, out_json: Path | None = None, api_key: str | None = None,
                       model: str | None = None, compare: Path | None = None, quiet: bool = False,
                       categories: list[str] | None = None, per_category: int | None = None, ab: bool = False) -> dict:
    """Drive a running ``speccompile serve`` (or any OpenAI-compatible server) with the prompt
    set at each concurrency level: greedy, ``ignore_eos`` so every request generates
    ``max_tokens``. Reports output tokens/s, requests/s and percentiles of TTFT, of the gap
    between streamed chunks (ITL; one chunk per engine step, which may carry several
    tokens under speculation) and of per-request time per output token (TPOT). With the
    server's /metrics, the draft/accepted token counts of each level are included.

    Speculation on vs off: with ``ab``, in the same speculative server -- each level runs
    half the prompts without speculation (the ``speculative: false`` request extension),
    both halves with it, then the other half without (ABBA), so that the machine's speed
    drifting between runs (30% within minutes on this 2-core machine) does not decide the
    ratio. Or run it against a server started with ``--speculative-mode disable`` and pass
    that report as ``compare`` to the run against the speculative one."""
    from concurrent.futures import ThreadPoolExecutor

    prompts = select_prompts(load_prompts(prompts_file or DEFAULT_PROMPTS), categories, per_category, limit)
    base, client, model = connect(endpoint, api_key, model, timeout=600)
    with closing(client):  # already open: httpx refuses a second __enter__
        url = base + "/v1/chat/completions"

        def body(p: dict, speculative: bool = True) -> dict:
            return {"model": model, "messages": [{"role": "user", "content": p["prompt"]}], "max_tokens": max_tokens,
                    "temperature": 0, "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True},
                    **({} if speculative else {"speculative": False}),
                    # Predicted Outputs: the speculative side gets the prompt set's prediction
                    **({"prediction": {"type": "content", "content": p["prediction"]}}
                       if p.get("prediction") and speculative else {}),
                    **({"response_format": p["response_format"]} if p.get("response_format") else {})}

        def run_pass(batch: list[dict], c: int, speculative: bool = True) -> tuple[list[dict], float]:
            t0 = time.perf_counter()
            with ThreadPoolExecutor(c) as pool:
                rows = list(pool.map(lambda p: stream_one(client, url, body(p, speculative)), batch))
            for p, r in zip(batch, rows):
                r.update(id=p["id"], category=p["category"], speculative=speculative)
            return rows, time.perf_counter() - t0

        stream_one(client, url, {**body(prompts[0]), "max_tokens": 8})  # warm up
        levels = []
        for c in concurrency:
            before = scrape_metrics(client, base)
            if ab:  # ABBA: the halves of the set, plain/spec/spec/plain, cancel a linear drift
                halves = (prompts[0::2], prompts[1::2])
                runs = [(halves[0], False), (halves[0], True), (halves[1], True), (halves[1], False)]
                done = [(spec_on, *run_pass(batch, c, spec_on)) for batch, spec_on in runs]
                rows = [r for spec_on, rs, _ in done if spec_on for r in rs]
                wall = sum(w for spec_on, _, w in done if spec_on)
                plain_rows = [r for spec_on, rs, _ in done if not spec_on for r in rs]
                plain = _level_stats(plain_rows, sum(w for spec_on, _, w in done if not spec_on))
            else:
                rows, wall = run_pass(prompts, c)
            after = scrape_metrics(client, base)
            level = {"concurrency": c, **_level_stats(rows, wall),
                     "per_request": [{k: r.get(k) for k in ("id", "category", "speculative", "tokens", "seconds", "ttft",
                                                            "tpot", "cached_tokens", "error")}
                                     for r in (rows + plain_rows if ab else rows)]}
            if ab:
                level["plain"] = plain
                level["speedup"] = level["output_tokens_per_s"] / max(plain["output_tokens_per_s"], 1e-9)
                # greedy: every prompt ran both ways, and must read the same
                pairs = list(zip(rows, plain_rows))  # both in the order halves[0] + halves[1]
                level["identical"] = sum("error" not in a and "error" not in b and a["text"] == b["text"]
                                         for a, b in pairs)
                level["compared"] = len(pairs)
            drafted = after.get("speccompile_draft_tokens_total", 0) - before.get("speccompile_draft_tokens_total", 0)
            if before:
                accepted = (after.get("speccompile_accepted_tokens_total", 0)
                            - before.get("speccompile_accepted_tokens_total", 0))
                level.update({"draft_tokens": drafted, "accepted_tokens": accepted,
                              "acceptance_rate": accepted / drafted if drafted else 0.0,
                              "preemptions": after.get("speccompile_preemptions_total", 0)
                              - before.get("speccompile_preemptions_total", 0)})
            levels.append(level)
            if not quiet:
                print(f"concurrency {c:3d}: {level['output_tokens_per_s']:7.1f} tok/s, "
                      f"TTFT p50 {level['ttft_s']['p50'] or 0:.3f}s p99 {level['ttft_s']['p99'] or 0:.3f}s, "
                      f"ITL p50 {level['itl_s']['p50'] or 0:.4f}s p99 {level['itl_s']['p99'] or 0:.4f}s"
                      + (f", {level['errors']} errors" if level["errors"] else "")
                      + (f", {level['cached_prompt_tokens']} prompt tokens from the server's prefix cache (start it "
                         "with --prefix-cache-max-num-recycling-seqs 0 to prefill every prompt)"
                         if level["cached_prompt_tokens"] else "")
                      + (f" | plain {level['plain']['output_tokens_per_s']:7.1f} tok/s -> x{level['speedup']:.2f}, "
                         f"accept {level.get('acceptance_rate', 0):.2f}, identical {level['identical']}/"
                         f"{level['compared']}" if ab else ""), flush=True)
    report = {"endpoint": base, "model": model, "settings": {"max_tokens": max_tokens, "num_prompts": len(prompts),
              "prompts": str(prompts_file or DEFAULT_PROMPTS), "greedy": True, "ignore_eos": True, "ab": ab},
              "levels": levels}
    if compare:
        other = {lv["concurrency"]: lv for lv in json.loads(Path(compare).read_text())["levels"]}
        report["compared_with"] = str(compare)
        for lv in levels:
            if lv["concurrency"] in other and other[lv["concurrency"]]["output_tokens_per_s"]:
                lv["throughput_ratio"] = lv["output_tokens_per_s"] / other[lv["concurrency"]]["output_tokens_per_s"]
                if not quiet:
                    print(f"concurrency {lv['concurrency']:3d}: x{lv['throughput_ratio']:.2f} vs {compare}")
    if out_json:
        Path(out_json).parent.mkdir(parents=True, exist_ok=True)
        Path(out_json).write_text(json.dumps(report, indent=1))
    return report
