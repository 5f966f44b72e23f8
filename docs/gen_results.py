"""Write docs/results.md from the measurement files in bench/results/*.json.

Standard library only: `.venv/bin/python docs/gen_results.py` (or `make docs`). Every JSON file is
classified by its shape (one-shot `bench --one-shot`, in-process `bench`, `bench --endpoint --ab`,
`bench --soak`, the GPU check, the OpenAI client check, a hand-made microbenchmark with `what`/`host`,
a list of per-prompt rows); a file of any other shape, or one that fails to render, is listed under
"Other results" with its path. Files are grouped by host -- the GPU, or the CPU kind (znver3, znver4,
znver5, xeon, ...) read from the JSON where it records one (its host strings, then the compiled
library's `-mcpu` in `model_lib`), else from the file name -- and one table is written per
(host, kind). Date and commit come from the JSON where it records them, else from
`git log -1 -- FILE` (the commit that last changed the file; "uncommitted" when none).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
OUT = ROOT / "docs" / "results.md"

# CPU kinds recognised in host strings, library names and file names. The project's AVX2-only host
# is an AMD Zen 3 (its libraries say -mcpu znver3), which some file names call "avx2".
CPU_KINDS = ("znver5", "znver4", "znver3", "znver2", "znver1", "sapphirerapids", "icelake-server",
             "cascadelake", "skylake-avx512", "x86-64-v4", "x86-64-v3", "x86-64-v2", "apple-m1", "xeon")
FILE_ALIASES = {"avx2": "znver3"}
ZEN_WORDS = {"zen 5": "znver5", "zen 4": "znver4", "zen 3": "znver3"}
UNKNOWN_HOST = "host not recorded"

KIND_TITLES = {
    "gpu-check": "GPU check (`make gpu-check`)",
    "one-shot": "One-shot `generate`, fresh process per run (`bench --one-shot`)",
    "bench": "In-process `bench` (warm, plain and speculative side by side)",
    "served-ab": "Served A/B (`bench --endpoint --ab`)",
    "soak": "Soak (`bench --endpoint --soak`)",
    "openai-check": "OpenAI client check (`bench/openai_check.py`)",
    "per-prompt": "Per-prompt rows",
    "microbenchmark": "Microbenchmarks",
}
KIND_ORDER = list(KIND_TITLES)


# ------------------------------------------------------------------ formatting helpers
def num(x, digits=1, suffix=""):
    if isinstance(x, bool) or x is None:
        return "—" if x is None else str(x).lower()
    if isinstance(x, (int, float)):
        if isinstance(x, int):
            return f"{x:,}{suffix}"
        return f"{x:,.{digits}f}{suffix}"
    return cell(x)


def ratio(x):
    return num(x, 2, "x") if isinstance(x, (int, float)) and not isinstance(x, bool) else "—"


def cell(s) -> str:
    s = "—" if s is None or s == "" else str(s)
    return s.replace("|", "\\|").replace("\n", " ")


def code(s) -> str:
    return f"`{s}`"


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return out


def frac(a, b) -> str:
    if a is None and b is None:
        return "—"
    return f"{num(a, 0)}/{num(b, 0)}"


# ------------------------------------------------------------------ provenance
def git_commit_date(path: Path) -> tuple[str, str]:
    try:
        out = subprocess.run(["git", "log", "-1", "--format=%h,%cs", "--", str(path.relative_to(ROOT))],
                             cwd=ROOT, capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        out = ""
    if not out:
        return "uncommitted", "—"
    commit, _, date = out.partition(",")
    return commit, date


def provenance(path: Path, data) -> tuple[str, str]:
    """(commit, date): the JSON's own where it records them, else git's."""
    commit = date = None
    if isinstance(data, dict):
        if isinstance(data.get("commit"), str):
            commit = data["commit"][:7] + (" (dirty)" if data.get("working_tree_dirty") else "")
        if isinstance(data.get("date"), str):
            date = data["date"][:10]
    if commit is None or date is None:
        git_commit, git_date = git_commit_date(path)
        commit = commit or git_commit
        date = date or git_date
    if date == "—":  # not committed yet: a date in the file name, if any
        m = re.search(r"(20\d\d)(\d\d)(\d\d)", path.stem)
        if m:
            date = "-".join(m.groups())
    return commit, date


def cpu_kind_in(text: str) -> str | None:
    low = text.lower()
    for kind in CPU_KINDS:
        if re.search(rf"(?<![a-z0-9]){re.escape(kind)}(?![a-z0-9])", low):
            return kind
    for word, kind in ZEN_WORDS.items():
        if word in low:
            return kind
    return None


def host_of(path: Path, data) -> str:
    if isinstance(data, dict):
        device = data.get("device")
        if isinstance(device, str) and device and not device.startswith(("cpu", "llvm")):
            return device  # the GPU check records the GPU's name
        hosts = [data.get("host"), data.get("host_cpu"), (data.get("machine") or {}).get("processor")
                 if isinstance(data.get("machine"), dict) else None]
        for h in hosts:
            if isinstance(h, str) and cpu_kind_in(h):
                return cpu_kind_in(h)
        libs = [data.get("model_lib")]
        if isinstance(data.get("model"), dict):
            libs.append(data["model"].get("model_lib"))
        for lib in libs:
            if isinstance(lib, str):
                m = re.search(r"-(?:llvm|cpu)-([a-z0-9_.]+(?:-v\d)?)-[0-9a-f]{2,}", Path(lib).name)
                if m:
                    return m.group(1)
    stem = path.stem.lower()
    for token in re.split(r"[-_]", stem):
        if token in FILE_ALIASES:
            return FILE_ALIASES[token]
    kind = cpu_kind_in(stem.replace("_", "-"))
    if kind:
        return kind
    m = re.search(r"nvidia-([a-z0-9]+)", stem)
    if m:
        return f"NVIDIA {m.group(1).upper()}"
    return UNKNOWN_HOST


# ------------------------------------------------------------------ classification
def kind_of(data) -> str | None:
    if isinstance(data, list):
        if data and all(isinstance(r, dict) and "speedup" in r for r in data):
            return "per-prompt"
        return None
    if not isinstance(data, dict):
        return None
    if "models" in data and "device" in data and isinstance(data["models"], dict):
        return "gpu-check"
    if data.get("mode") == "one-shot" and isinstance(data.get("overall"), dict):
        return "one-shot"
    if isinstance(data.get("levels"), list) and "endpoint" in data:
        return "served-ab"
    if "endpoint" in data and isinstance(data.get("summary"), dict) and "memory" in data:
        return "soak"
    if isinstance(data.get("summary"), dict) and isinstance(data.get("settings"), dict) and "machine" in data:
        return "bench"
    if isinstance(data.get("checks"), dict) and "all_passed" in data:
        return "openai-check"
    if isinstance(data.get("what"), str) and "host" in data:
        return "microbenchmark"
    return None


def spec_label(spec: dict | None) -> str:
    if not isinstance(spec, dict):
        return "—"
    mode = spec.get("speculative_mode") or "—"
    extra = []
    if (spec.get("spec_tree_width") or 1) > 1:
        extra.append(f"tree width {spec['spec_tree_width']}")
    if spec.get("spec_draft_length"):
        extra.append(f"k={spec['spec_draft_length']}")
    drafter = spec.get("additional_models")
    if drafter:  # "DIR,LIB" or [[DIR, LIB]]: the drafter by its folder's name
        first = drafter.split(",")[0] if isinstance(drafter, str) else drafter[0][0]
        mode += f" + {Path(str(first)).name}"
    return mode + (f" ({', '.join(extra)})" if extra else "")


def model_name(data: dict) -> str:
    m = data.get("model")
    if isinstance(m, dict):
        m = m.get("model_dir") or m.get("model_lib")
    if not m:
        m = data.get("model_dir")
    return Path(str(m)).name if m else "—"


# ------------------------------------------------------------------ renderers: one row per file (or level)
def rows_one_shot(name, data, commit, date):
    o = data["overall"]
    cats = data.get("categories") or {}
    per_cat = ", ".join(f"{c} {v.get('speedup', 0):.2f}" for c, v in sorted(cats.items())
                        if isinstance(v, dict) and isinstance(v.get("speedup"), (int, float)))
    e2e = o.get("request_speedup")
    if e2e is None:
        prompts = data.get("prompts") or []
        plain = sum(p.get("plain_process_seconds") or 0 for p in prompts if isinstance(p, dict))
        spec = sum(p.get("spec_process_seconds") or 0 for p in prompts if isinstance(p, dict))
        e2e = plain / spec if plain and spec else None
    return [[code(name), date, commit, model_name(data), spec_label(data.get("spec")),
             num(o.get("prompts")) + (f" x{data['repeat']}" if data.get("repeat") else ""),
             num(o.get("plain_tokens_per_s")), num(o.get("spec_tokens_per_s")), ratio(o.get("speedup")),
             ratio(data.get("mean_of_categories")), ratio(e2e), per_cat or "—",
             f"{num(o.get('accept_rate'), 2)} / {num(o.get('mean_accepted_length'), 2)}",
             sampled_label(data.get("sampling")) or frac(o.get("identical_outputs"), o.get("prompts")),
             llama_one_shot(o)]]


def sampled_label(sampling) -> str | None:
    """A sampled run's settings in place of the identity count (its answers are separate draws)."""
    if not isinstance(sampling, dict) or not sampling.get("temperature"):
        return None
    return ("sampled: T " + ", ".join(f"{v:g}" if k == "temperature" else f"{k.replace('_', '-')} {v:g}"
                                      for k, v in sampling.items() if k != "seed" and v is not None)
            + " (not compared)")


def llama_one_shot(o: dict) -> str:
    """llama.cpp's one-shot runs of the same prompts: its rate per mode, ours over its best."""
    peers = o.get("llama_cpp_spec")
    if not isinstance(peers, dict) or not peers:
        return "—"
    rates = "; ".join(f"{m} {num(v.get('spec_tokens_per_s'))} tok/s" for m, v in sorted(peers.items())
                      if isinstance(v, dict))
    return f"{rates}; ours over its best {ratio(o.get('ours_over_best_llama_cpp'))}"


HEAD_ONE_SHOT = ["file", "date", "commit", "model", "mode", "prompts", "plain tok/s", "spec tok/s",
                 "decode speedup", "mean of categories", "end-to-end", "per category", "accept / mean len",
                 "identical", "llama.cpp, same prompts"]


def rows_bench(name, data, commit, date):
    s, st = data["summary"], data["settings"]
    peers = []
    for mode, v in sorted((s.get("llama_cpp_speculative") or {}).items()):
        if isinstance(v, dict):
            peers.append(f"{mode} {num(v.get('spec_tokens_per_s'))} tok/s (accept {num(v.get('accept_rate'), 2)})")
    lc = s.get("llama_cpp")
    if isinstance(lc, dict):
        peers.append(f"llama-bench tg {num(lc.get('tg_tokens_per_s'))}, pp {num(lc.get('pp_tokens_per_s'))} tok/s")
    prompts = Path(str(st.get("prompts") or "")).name or "—"
    return [[code(name), date, commit, model_name(data), spec_label(st), f"{num(s.get('prompts'))} ({prompts})",
             num(st.get("max_tokens")), num(s.get("plain_tokens_per_s")), num(s.get("spec_tokens_per_s")),
             ratio(s.get("speedup")),
             f"{num(s.get('accept_rate'), 2)} / {num(s.get('mean_accepted_length'), 2)}"
             if "accept_rate" in s else "—",
             frac(s.get("identical_outputs"), s.get("prompts")) if "identical_outputs" in s else "—",
             "; ".join(peers) or "—"]]


HEAD_BENCH = ["file", "date", "commit", "model", "mode", "prompts", "max tokens", "plain tok/s", "spec tok/s",
              "speedup", "accept / mean len", "identical", "llama.cpp, same prompts"]


def rows_served(name, data, commit, date):
    st = data.get("settings") or {}
    rows = []
    for lvl in data["levels"]:
        if not isinstance(lvl, dict):
            continue
        plain = lvl.get("plain") if isinstance(lvl.get("plain"), dict) else {}
        rows.append([code(name), date, commit, cell(data.get("model")), num(lvl.get("concurrency")),
                     f"{num(lvl.get('requests'))} x {num(st.get('max_tokens'))}",
                     num(lvl.get("output_tokens_per_s")), num(plain.get("output_tokens_per_s")),
                     ratio(lvl.get("speedup")), num(lvl.get("acceptance_rate"), 2),
                     frac(lvl.get("identical"), lvl.get("compared")) if "compared" in lvl else "—",
                     num((lvl.get("errors") or 0) + (plain.get("errors") or 0))])
    return rows


HEAD_SERVED = ["file", "date", "commit", "model", "concurrency", "requests x max tokens", "spec tok/s",
               "plain tok/s", "speedup", "acceptance", "identical/compared", "errors"]


def rows_soak(name, data, commit, date):
    s, st = data["summary"], data.get("settings") or {}
    spec, plain = data.get("speculative") or {}, data.get("plain") or {}

    def p50(d, key):
        v = (d.get(key) or {}).get("p50")
        return num(v, 2) if v is not None else "—"
    return [[code(name), date, commit, cell(data.get("model")), num(st.get("minutes"), 0),
             num(s.get("requests")), num(s.get("errors")), frac(s.get("identical_pairs"), s.get("compared_pairs")),
             f"{num(s.get('rss_after_warm_up_mib'), 0)} -> {num(s.get('rss_end_mib'), 0)}",
             f"{p50(spec, 'ttft_s')} / {p50(plain, 'ttft_s')}", f"{p50(spec, 'itl_s')} / {p50(plain, 'itl_s')}",
             f"{p50(spec, 'request_s')} / {p50(plain, 'request_s')}"]]


HEAD_SOAK = ["file", "date", "commit", "model", "minutes", "requests", "errors", "identical pairs",
             "RSS MiB after warm-up -> end", "TTFT p50 s, spec / plain", "ITL p50 s, spec / plain",
             "request p50 s, spec / plain"]


def rows_gpu(name, data, commit, date):
    rows = []
    for model, m in sorted(data["models"].items()):
        if not isinstance(m, dict):
            continue
        cost = m.get("forward_cost_vs_rows") or {}
        peers = m.get("peers") or {}
        capi = m.get("capi") if isinstance(m.get("capi"), dict) else {}
        spec = m.get("speculative") if isinstance(m.get("speculative"), dict) else {}
        spec_s = ", ".join(
            f"{mode} {ratio(v.get('speedup'))} ({frac(*v['identical']) if isinstance(v.get('identical'), list) and len(v['identical']) == 2 else '—'} identical)"
            for mode, v in sorted(spec.items()) if isinstance(v, dict))
        portable = (m.get("alt_libs") or {}).get("portable") or {}
        alt_cost = portable.get("forward_cost_vs_rows") or {}
        rows.append([code(name), date, commit, model, f"{m.get('quantization', '—')}, {m.get('weights', '—')} weights",
                     gpu_projections(data, m), num(m.get("decode_tok_s")),
                     num((m.get("cuda_graph") or {}).get("decode_tok_s_no_graph")), features_step(m),
                     num(capi.get("tok_s")), num(m.get("prefill_tok_s"), 0),
                     " / ".join(ratio(cost.get(k)) for k in ("8", "16", "32")), num(m.get("host_ms_per_step"), 2),
                     f"{num(portable.get('decode_tok_s'))}; {' / '.join(ratio(alt_cost.get(k)) for k in ('8', '16', '32'))}"
                     if portable else "—", bench_layers(data, model),
                     f"{num(peers.get('hf_fp16_tok_s'))} / {num(peers.get('torch_compile_tok_s'))}",
                     spec_s or "—", num(m.get("logits_max_abs_diff_vs_torch"), 4)])
    return rows


def features_step(m) -> str:
    """An EAGLE-3 step's verify forward, ms replayed from a CUDA graph / called (checks before
    it was measured: —)."""
    f = m.get("features_step")
    if not isinstance(f, dict):
        return "—"
    same = "" if f.get("identical_to_no_graph") else " (bits DIFFER)"
    return f"{num(f.get('graph_ms'), 3)} / {num(f.get('calls_ms'), 3)}{same}"


BENCH_MODELS = {"SmolLM2-135M-Instruct": "smollm2", "Qwen2.5-1.5B": "qwen15"}  # check model -> kernel bench shapes


def gpu_projections(data, m) -> str:
    """Which projection kernels the model's figures come from: checks before the kernel bench
    existed ran the portable kernels only."""
    if "kernels" not in data and "tensor_core_refused" not in data:
        return "portable"
    if data.get("tensor_core_refused"):
        return "portable (tensor cores refused)"
    return "portable" if str(m.get("library", "")).endswith("-portable.so") else "tensor-core"


def bench_layers(data, model) -> str:
    """The kernel bench's layer of projections alone, 8 / 16 rows against 1, tensor-core / portable."""
    layers = (data.get("kernels") or {}).get("layers") or {}
    key = BENCH_MODELS.get(model)
    tc, port = layers.get(f"tc__{key}"), layers.get(f"portable__{key}")
    if not tc or not port:
        return "—"
    return " ; ".join(f"{v}: {ratio(t['vs_one_row'].get('8'))} / {ratio(t['vs_one_row'].get('16'))}"
                      for v, t in (("tc", tc), ("portable", port)))


HEAD_GPU = ["file", "date", "commit", "model", "weights", "projections", "decode tok/s (Python)",
            "same, without CUDA graphs", "EAGLE-3 step forward ms, graph / calls", "decode tok/s (C API)",
            "prefill tok/s", "forward cost 8 / 16 / 32 rows vs 1", "host ms/step",
            "portable build: decode tok/s; 8 / 16 / 32 rows vs 1", "one layer's projections alone, 8 / 16 rows vs 1",
            "transformers fp16 / torch.compile tok/s", "speculative (SmolLM2)", "max logit diff vs torch"]


def rows_openai(name, data, commit, date):
    checks = data["checks"]
    passed = []
    for check, v in sorted(checks.items()):
        flags = {k: b for k, b in v.items() if isinstance(b, bool)} if isinstance(v, dict) else {}
        ok = all(flags.values()) if flags else None
        passed.append(f"{check}: {'pass' if ok else ('—' if ok is None else 'FAIL')}")
    return [[code(name), date, commit, cell(data.get("model")), "; ".join(passed), str(data["all_passed"]).lower()]]


HEAD_OPENAI = ["file", "date", "commit", "model", "checks", "all passed"]


def rows_per_prompt(name, data, commit, date):
    speedups = [r["speedup"] for r in data if isinstance(r.get("speedup"), (int, float))]
    mean = sum(speedups) / len(speedups) if speedups else None
    identical = sum(1 for r in data if r.get("identical") is True or r.get("identical_output") is True)
    cats = ", ".join(f"{r.get('category', '?')} {r['speedup']:.2f}" for r in data
                     if isinstance(r.get("speedup"), (int, float)))
    verify = sum(r.get("verify_steps") or 0 for r in data)
    return [[code(name), date, commit, num(len(data)), ratio(mean), cats, num(verify), frac(identical, len(data))]]


HEAD_PER_PROMPT = ["file", "date", "commit", "prompts", "mean speedup", "per prompt", "verify steps", "identical"]


def short(x) -> str:
    """A figure with at most 3 decimals and no trailing zeros after the point (10 stays 10)."""
    text = num(x, 3)
    return text.rstrip("0").rstrip(".") if "." in text else text


def flatten(obj, prefix="") -> list[tuple[str, str]]:
    """Numeric leaves of a microbenchmark as (path, value) rows; lists of numbers joined."""
    out: list[tuple[str, str]] = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += flatten(v, f"{prefix}/{k}" if prefix else str(k))
    elif isinstance(obj, list):
        if obj and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in obj):
            out.append((prefix, ", ".join(short(x) for x in obj)))
        elif obj and all(isinstance(x, dict) for x in obj):
            keys = [k for k in obj[0] if all(isinstance(x.get(k), (int, float)) for x in obj)]
            if keys and len(keys) == len(obj[0]):
                for k in keys:
                    out.append((f"{prefix}/{k}", ", ".join(short(x[k]) for x in obj)))
            else:
                for i, x in enumerate(obj):
                    out += flatten(x, f"{prefix}[{i}]")
        else:
            for i, x in enumerate(obj):
                out += flatten(x, f"{prefix}[{i}]")
    elif isinstance(obj, (int, float)) and not isinstance(obj, bool):
        out.append((prefix, short(obj)))
    return out


def render_micro(name, data, commit, date) -> list[str]:
    lines = [f"#### {code(name)}", "", f"{date}, commit {commit}. {cell(data['what'])}", ""]
    for key in ("host", "conditions", "units"):
        if isinstance(data.get(key), str):
            lines.append(f"- {key}: {cell(data[key])}")
    lines.append("")
    leaves = flatten({k: v for k, v in data.items() if k not in ("what", "host", "note", "conditions", "units")})
    # Repeated runs (a list of like records) become columns: one row per figure, one column per run.
    pivot: dict[str, dict[int, str]] = {}
    runs = 0
    for path, value in leaves:
        m = re.fullmatch(r"(.*?)\[(\d+)\](.*)", path)
        key, col = (m.group(1) + m.group(3), int(m.group(2))) if m else (path, -1)
        pivot.setdefault(key, {})[col] = value
        runs = max(runs, col + 1)
    if 0 < runs <= 8:
        header = ["figure"] + [f"run {i + 1}" for i in range(runs)]
        rows = [[code(k)] + ([cols[-1]] + [""] * (runs - 1) if -1 in cols else [cols.get(i, "") for i in range(runs)])
                for k, cols in pivot.items()]
    else:
        header, rows = ["figure", "value"], [[code(p), v] for p, v in leaves]
    shown = rows[:60]
    lines += table(header, shown)
    if len(rows) > len(shown):
        lines.append(f"\n({len(rows) - len(shown)} more figures in the file.)")
    if isinstance(data.get("note"), str):
        lines += ["", f"Note recorded with it: {cell(data['note'])}"]
    lines.append("")
    return lines


RENDERERS = {
    "gpu-check": (rows_gpu, HEAD_GPU),
    "one-shot": (rows_one_shot, HEAD_ONE_SHOT),
    "bench": (rows_bench, HEAD_BENCH),
    "served-ab": (rows_served, HEAD_SERVED),
    "soak": (rows_soak, HEAD_SOAK),
    "openai-check": (rows_openai, HEAD_OPENAI),
    "per-prompt": (rows_per_prompt, HEAD_PER_PROMPT),
}


def host_order(host: str) -> tuple:
    if host == UNKNOWN_HOST:
        return (3, host)
    if host.lower().startswith(("nvidia", "amd radeon", "apple", "intel arc")):
        return (0, host)
    return (1, [-ord(c) for c in host])  # znver5 before znver4 before znver3


INTRO = """\
# Measured results

*Generated by `docs/gen_results.py` from `bench/results/*.json` -- do not edit by hand; rerun
`make docs` after adding a result file.*

Each table holds the runs of one kind on one host; every row names its JSON file (under
`bench/results/`), the date and the commit (recorded in the file, or the commit that last changed
it). Numbers from different rows ran at different times: on the 2-core CPU hosts the machine's pace
drifts 10-30% within minutes, so compare the ratios inside a row (plain and speculative runs are
interleaved within every run), not absolute tok/s across rows.

How the kinds are measured:

- **One-shot `generate`** (`bench --one-shot`): one fresh `speccompile generate --json` process per
  run, greedy, plain / spec / spec / plain per prompt (`x2`: `--repeat 2` such quartets), default
  adaptive settings, mostly on `bench/prompts.jsonl` (12 prompts: code, summarization, qa, math, rag,
  translation; none from MT-bench). *Decode speedup* weights prompts by tokens, *mean of categories*
  averages the categories' speedups, *end-to-end* compares whole requests or processes (loading and
  prefill included). Loading and the one-time cost profile are outside the decode figures.
- **In-process `bench`**: plain and speculative decoding of the same prompts in one warm process
  (MT-bench first turns unless noted), with llama.cpp's own runs of the same rendered prompts where
  `--llama-bench` / `--llama-speculative` were given.
- **Served A/B** (`bench --endpoint --ab`): one speculative server; at each concurrency level half the
  requests carry `"speculative": false`, interleaved plain / spec / spec / plain; greedy,
  `ignore_eos`; *identical/compared* counts prompts whose text matched both ways.
- **Soak** (`bench --endpoint --soak`): mixed requests for the given minutes, 1 to 8 streams.
- **GPU check** (`make gpu-check`): batch 1; the definition of every figure is in the JSON's
  `definitions`. *Projections* names the kernels the row's figures come from; the *portable build*
  is the same model compiled with `--gpu-projections portable`, measured in the same process; the
  *layer alone* column is the kernel bench's one layer of projections (tensor-core ; portable).
"""


def main() -> int:
    groups: dict[tuple[str, str], list[tuple[str, list]]] = {}
    micro: dict[str, list[list[str]]] = {}
    other: list[tuple[str, str]] = []
    files = sorted(RESULTS.glob("*.json"))
    for path in files:
        rel = path.relative_to(ROOT).as_posix()
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            other.append((rel, f"unreadable: {type(e).__name__}"))
            continue
        kind = kind_of(data)
        if kind is None:
            other.append((rel, "shape not recognised"))
            continue
        host = host_of(path, data)
        commit, date = provenance(path, data)
        try:
            if kind == "microbenchmark":
                micro.setdefault(host, []).append(render_micro(rel, data, commit, date))
                groups.setdefault((host, kind), [])
            else:
                rows = RENDERERS[kind][0](rel, data, commit, date)
                if not rows:
                    other.append((rel, f"{kind}, no rows to render"))
                    continue
                groups.setdefault((host, kind), []).append((date, rows))
        except Exception as e:  # a file of a known kind but an unexpected shape: list it, keep going
            other.append((rel, f"{kind}, not rendered: {type(e).__name__}: {e}"))

    lines = [INTRO]
    hosts = sorted({h for h, _ in groups}, key=host_order)
    lines.append("Hosts: " + ", ".join(f"[{h}](#{anchor(h)})" for h in hosts) +
                 (", [other results](#other-results)" if other else "") + ".\n")
    for host in hosts:
        lines += [f"## {host}", ""]
        for kind in KIND_ORDER:
            if (host, kind) not in groups:
                continue
            lines += [f"### {KIND_TITLES[kind]} -- {host}", ""]
            if kind == "microbenchmark":
                for block in micro.get(host, []):
                    lines += block
                continue
            entries = sorted(groups[(host, kind)], key=lambda e: (e[0], e[1][0][0] if e[1] else ""))
            rows = [row for _, rs in entries for row in rs]
            lines += table(RENDERERS[kind][1], rows) + [""]
    lines += ["## Other results", ""]
    if other:
        lines.append("Files in `bench/results/` whose shape this page does not render:")
        lines.append("")
        lines += [f"- {code(rel)} ({why})" for rel, why in other]
    else:
        lines.append("None: every file in `bench/results/` is rendered above.")
    lines.append("")
    OUT.write_text("\n".join(lines))
    n_rendered = len(files) - len(other)
    print(f"wrote {OUT.relative_to(ROOT)}: {len(files)} files, {n_rendered} rendered in "
          f"{len(groups)} tables over {len(hosts)} hosts, {len(other)} under 'Other results'")
    return 0


def anchor(title: str) -> str:
    """The id MkDocs' toc extension gives a heading (lower case, punctuation dropped, spaces to '-')."""
    s = re.sub(r"[^\w\s-]", "", title.strip().lower())
    return re.sub(r"[-\s]+", "-", s).strip("-")


if __name__ == "__main__":
    sys.exit(main())
