"""`bench --endpoint URL --soak MINUTES`: a long run of mixed requests against one server.

What a server meets in use and a short bench does not: concurrency that rises and falls
(1 to 8 streams, changing every ``segment`` seconds), requests of every length, with and
without speculation (the ``speculative: false`` request extension), streamed and not. It
reports what an operator asks after an afternoon of that: did any request fail, did resident
memory stay flat after warm-up (the server's ``process_resident_memory_bytes``, sampled),
the p50/p99 of TTFT and inter-token latency with and without speculation, and whether
greedy outputs with speculation equal those without (each prompt and length is asked both
ways). Progress and an ETA are printed as it runs; the report is written at the end.
"""
from __future__ import annotations

import json
import random
import threading
import time
from contextlib import closing
from pathlib import Path

from speccompile.bench.runner import percentiles, scrape_metrics, stream_one, connect

LEVELS = (1, 2, 4, 8, 6, 3, 5, 7)  # streams per segment, cycled: every level 1..8, up and down
LENGTHS = (16, 32, 64, 96, 128)  # max_tokens drawn per request
WARM_UP_SHARE = 0.2  # resident memory is judged flat against its level after this share of the run


def run_soak(endpoint: str, prompts: list[dict], minutes: float, out_json: Path | None = None,
             api_key: str | None = None, model: str | None = None, segment: float = 60.0, seed: int = 0,
             quiet: bool = False) -> dict:
    """Drive ``endpoint`` for ``minutes`` (see module doc); returns the report."""
    if minutes <= 0:
        raise ValueError("--soak takes a positive number of minutes")
    base, client, model = connect(endpoint, api_key, model, timeout=900)
    with closing(client):  # already open: httpx refuses a second __enter__
        if "process_resident_memory_bytes" not in scrape_metrics(client, base):
            raise ValueError(f"{base}/metrics exports no process_resident_memory_bytes: the soak needs the "
                             "server's resident memory (speccompile serve exports it)")
        rows, memory, lock, rng = [], [], threading.Lock(), random.Random(seed)
        t0 = time.perf_counter()
        end = t0 + 60.0 * minutes

        def level() -> int:
            return LEVELS[int((time.perf_counter() - t0) // segment) % len(LEVELS)]

        def worker(slot: int) -> None:
            while time.perf_counter() < end:
                if slot >= level():
                    time.sleep(0.2)
                    continue
                with lock:
                    i, tokens = rng.randrange(len(prompts)), rng.choice(LENGTHS)
                    speculative, stream = rng.random() < 0.5, rng.random() < 0.9
                row = _request(client, base, model, prompts[i]["prompt"], tokens, speculative, stream)
                row.update(prompt=i, max_tokens=tokens, speculative=speculative, stream=stream,
                           started=time.perf_counter() - t0, streams=level())
                with lock:
                    rows.append(row)

        threads = [threading.Thread(target=worker, args=(slot,), daemon=True) for slot in range(max(LEVELS))]
        for t in threads:
            t.start()
        last_print = 0.0
        while any(t.is_alive() for t in threads):
            now = time.perf_counter() - t0
            rss = scrape_metrics(client, base).get("process_resident_memory_bytes")
            memory.append((now, rss))
            if not quiet and now - last_print >= 30:
                last_print = now
                with lock:
                    done, errors = len(rows), sum("error" in r for r in rows)
                left = max(0.0, 60.0 * minutes - now)
                print(f"soak {now / 60:5.1f}/{minutes:g} min (ETA {left / 60:.1f} min): {level()} streams, "
                      f"{done} requests, {errors} errors, RSS {rss / 2**20 if rss else 0:.0f} MiB", flush=True)
            time.sleep(10)
        memory.append((time.perf_counter() - t0, scrape_metrics(client, base).get("process_resident_memory_bytes")))
    report = soak_report(rows, memory, minutes, segment, model, base)
    if out_json:
        Path(out_json).parent.mkdir(parents=True, exist_ok=True)
        Path(out_json).write_text(json.dumps(report, indent=1))
    if not quiet:
        s = report["summary"]
        print(f"soak: {s['requests']} requests, {s['errors']} errors, RSS after warm-up "
              f"{s['rss_after_warm_up_mib']:.0f} MiB -> end {s['rss_end_mib']:.0f} MiB "
              f"(max {s['rss_max_after_warm_up_mib']:.0f}), greedy spec = plain on "
              f"{s['identical_pairs']}/{s['compared_pairs']} pairs")
        for side in ("speculative", "plain"):
            r = report[side]
            print(f"  {side:11s}: TTFT p50 {r['ttft_s']['p50'] or 0:.2f}s p99 {r['ttft_s']['p99'] or 0:.2f}s, "
                  f"ITL p50 {r['itl_s']['p50'] or 0:.3f}s p99 {r['itl_s']['p99'] or 0:.3f}s, "
                  f"{r['output_tokens']} tokens in {r['requests']} requests")
    return report


def _request(client, base: str, model: str, prompt: str, max_tokens: int, speculative: bool, stream: bool) -> dict:
    """One chat completion, greedy; streamed ones are timed per chunk (bench.stream_one)."""
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0, **({} if speculative else {"speculative": False})}
    url = base + "/v1/chat/completions"
    try:
        if stream:
            return stream_one(client, url, {**body, "stream": True, "stream_options": {"include_usage": True}})
        t0 = time.perf_counter()
        r = client.post(url, json=body)
        if r.status_code != 200:
            return {"error": f"HTTP {r.status_code}: {r.text[:200]}"}
        out = r.json()
        return {"tokens": out["usage"]["completion_tokens"], "seconds": time.perf_counter() - t0,
                "text": out["choices"][0]["message"]["content"], "finish_reason": out["choices"][0]["finish_reason"],
                "ttft": None, "chunk_gaps": []}
    except Exception as err:  # noqa: BLE001 -- a soak counts every failure, of any kind, and goes on
        return {"error": f"{type(err).__name__}: {err}"}


def soak_report(rows: list[dict], memory: list[tuple[float, float | None]], minutes: float, segment: float,
                model: str, base: str) -> dict:
    """The figures of a soak (see module doc) from its requests and memory samples."""
    ok = [r for r in rows if "error" not in r]
    sides = {}
    for name, on in (("speculative", True), ("plain", False)):
        side = [r for r in ok if r["speculative"] == on]
        sides[name] = {"requests": len(side), "output_tokens": sum(r["tokens"] for r in side),
                       "ttft_s": percentiles([r["ttft"] for r in side if r.get("ttft") is not None]),
                       "itl_s": percentiles([g for r in side for g in r["chunk_gaps"]]),
                       "request_s": percentiles([r["seconds"] for r in side])}
    texts: dict[tuple, dict[bool, str]] = {}
    for r in ok:  # a request cut by its length is the prefix of a longer one: compare equal lengths only
        texts.setdefault((r["prompt"], r["max_tokens"]), {})[r["speculative"]] = r["text"]
    pairs = [t for t in texts.values() if len(t) == 2]
    samples = [(t, m) for t, m in memory if m is not None]
    warm = [m for t, m in samples if t >= WARM_UP_SHARE * 60.0 * minutes]
    mib = 2.0 ** 20
    summary = {"requests": len(rows), "errors": len(rows) - len(ok),
               "error_messages": sorted({r["error"] for r in rows if "error" in r})[:10],
               "compared_pairs": len(pairs), "identical_pairs": sum(t[True] == t[False] for t in pairs),
               "rss_start_mib": samples[0][1] / mib if samples else None,
               "rss_after_warm_up_mib": warm[0] / mib if warm else None,
               "rss_max_after_warm_up_mib": max(warm) / mib if warm else None,
               "rss_end_mib": samples[-1][1] / mib if samples else None}
    return {"endpoint": base, "model": model,
            "settings": {"minutes": minutes, "segment_s": segment, "levels": list(LEVELS), "lengths": list(LENGTHS),
                         "greedy": True, "warm_up_share": WARM_UP_SHARE},
            "summary": summary, **sides, "memory": [{"t": t, "rss_mib": m / mib} for t, m in samples],
            "requests": [{k: v for k, v in r.items() if k not in ("text", "chunk_gaps")} for r in rows]}
