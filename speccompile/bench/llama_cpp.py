"""llama.cpp, run beside our engine in the same bench run, for comparison only.

llama.cpp is never a dependency: the user points ``bench`` at binaries they built. Two
comparisons are made on the same machine, in the same run, on the same weights (the GGUF
files our models were converted from):

- ``llama-bench``: plain prefill / decode speed (pp64 / tg64), also at our mean decode
  context depth so that attention costs compare;
- ``llama-speculative-simple``: speculative decoding with a draft GGUF, or with n-gram
  lookup (``--spec-type ngram-simple``), greedy, on each of our bench prompts rendered with
  the same chat template, so that both engines decode the very same text. It is itself a
  one-shot process (load, prefill, decode), so ``bench --one-shot`` runs it beside each
  prompt's fresh ``generate`` processes.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
from pathlib import Path

from speccompile.runtime.metrics import accept_rate


def run_llama_bench(binary: Path, gguf: Path, threads: int | None = None, depth: int = 0) -> dict:
    """llama-bench (pp64 / tg64, all cores). With ``depth``, tg64 also runs after that many
    context tokens (``tg_tokens_per_s_at_depth``)."""
    threads = threads or os.cpu_count() or 1
    cmd = [str(binary), "-m", str(gguf), "-t", str(threads), "-p", "64", "-n", "64", "-o", "json"]
    if depth:
        cmd += ["-d", f"0,{depth}"]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise ValueError(f"llama-bench failed: {res.stderr[-500:]}")
    runs = json.loads(res.stdout)
    out = {"binary": str(binary), "gguf": str(gguf), "threads": threads, "depth": depth}
    for r in runs:
        key = "pp_tokens_per_s" if r.get("n_prompt", 0) > 0 else "tg_tokens_per_s"
        if r.get("n_depth", 0) > 0:
            key += "_at_depth"
        out[key] = float(r["avg_ts"])
    return out


_DECODED = re.compile(r"decoded\s+(\d+)\s+tokens in\s+([\d.]+)\s+seconds")
_ENCODED = re.compile(r"encoded\s+(\d+)\s+tokens in\s+([\d.]+)\s+seconds")
_COUNT = re.compile(r"\b(n_drafted|n_accept|n_predict)\s*=\s*(\d+)")


# our --speculative-mode -> llama-speculative-simple's --spec-type for the same idea
SPEC_TYPES = {"small_draft": "draft-simple", "ngram": "ngram-simple"}


def default_peers(mode: str, draft_gguf: Path | None) -> list[str]:
    """llama.cpp's modes to run beside ours when none are named: ours where llama.cpp has it;
    else (suffix drafting, the default, or a head) every mode it can run here -- n-gram
    lookup, and a draft model when its GGUF is given -- so ours meets llama.cpp's best."""
    if mode in SPEC_TYPES:
        return [mode]
    return ["ngram"] + (["small_draft"] if draft_gguf is not None else [])


def speculative_command(binary: Path, gguf: Path, prompt_file: Path, max_tokens: int, mode: str,
                        draft_gguf: Path | None, draft_max: int, threads: int) -> list[str]:
    """llama-speculative-simple, greedy (top-k 1), on a prompt file; ``mode`` is
    ``small_draft`` (with ``draft_gguf``) or ``ngram``."""
    cmd = [str(binary), "-m", str(gguf), "-f", str(prompt_file), "-n", str(max_tokens), "-t", str(threads),
           "-c", "4096", "--temp", "0", "--top-k", "1", "--spec-draft-n-max", str(draft_max)]
    if mode not in SPEC_TYPES:
        raise ValueError(f"no llama.cpp counterpart for --speculative-mode {mode}; it has {', '.join(SPEC_TYPES)}")
    cmd += ["--spec-type", SPEC_TYPES[mode]]
    if SPEC_TYPES[mode] == "draft-simple":
        if draft_gguf is None:
            raise ValueError(f"llama.cpp speculative comparison in {mode} mode needs --draft-gguf")
        cmd += ["-md", str(draft_gguf), "-td", str(threads)]
    return cmd


def run_llama_speculative(binary: Path, gguf: Path, prompts: list[str], max_tokens: int, mode: str,
                          draft_gguf: Path | None = None, draft_max: int = 3, threads: int | None = None) -> list[dict]:
    """One llama.cpp speculative run per (already chat-rendered) prompt: decode tokens/s as
    llama.cpp reports it, and its draft counts."""
    return [run_llama_prompt(binary, gguf, text, max_tokens, mode, draft_gguf, draft_max, threads)
            for text in prompts]


def run_llama_prompt(binary: Path, gguf: Path, text: str, max_tokens: int, mode: str,
                     draft_gguf: Path | None = None, draft_max: int = 3, threads: int | None = None) -> dict:
    """One llama-speculative-simple process on one rendered prompt: its decode tokens/s, its
    request seconds (prompt encoding + decode, as llama.cpp times them) and draft counts."""
    threads = threads or os.cpu_count() or 1
    with tempfile.TemporaryDirectory() as tmp:
        pf = Path(tmp) / "prompt.txt"
        pf.write_text(text)
        cmd = speculative_command(binary, gguf, pf, max_tokens, mode, draft_gguf, draft_max, threads)
        res = subprocess.run(cmd, capture_output=True, text=True)
    log = res.stdout + res.stderr
    m = _DECODED.search(log)
    if res.returncode != 0 or not m:
        raise ValueError(f"llama.cpp speculative run failed ({' '.join(cmd[:1])}): {log[-800:]}")
    counts = {k: int(v) for k, v in _COUNT.findall(log)}
    tokens, seconds = int(m.group(1)), float(m.group(2))
    enc = _ENCODED.search(log)
    drafted, accepted = counts.get("n_drafted", 0), counts.get("n_accept", 0)
    return {"decode_tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds,
            "request_seconds": seconds + (float(enc.group(2)) if enc else 0.0),
            "draft_tokens": drafted, "accepted_tokens": accepted,
            "accept_rate": accept_rate(accepted, drafted)}


def summarize_llama_speculative(rows: list[dict], binary: Path, mode: str, draft_max: int) -> dict:
    tokens = sum(r["decode_tokens"] for r in rows)
    drafted = sum(r["draft_tokens"] for r in rows)
    return {"binary": str(binary), "mode": mode, "draft_max": draft_max, "prompts": len(rows),
            "spec_tokens_per_s": tokens / sum(r["seconds"] for r in rows),
            "accept_rate": accept_rate(sum(r["accepted_tokens"] for r in rows), drafted)}
