"""``speccompile bench --capi SPC_GENERATE``: the C runtime that apps embed against the Python
runtime, A/B in one run, as users run each: one fresh process per run.

Per prompt, ``speccompile generate --json`` and the C API's example ``spc_generate --json``
(the same flags, the same JSON) run python / C / C / python in the same speculative mode (the
host drifts 10-30% in speed within seconds; the mean of each pair cancels a linear drift).
At temperature 0 the four must be token-identical. Reported per prompt and overall: decode
tok/s, a step's seconds (decode seconds over target forwards: the forward plus the host work
around it, which is what the two runtimes differ in, the kernels being the same library), a
request's end-to-end seconds (prefill + decode) and the process's (load included).
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path

from speccompile.bench.oneshot import generate_process, host_description, run_json_process
from speccompile.bench.runner import DEFAULT_PROMPTS, load_prompts, select_prompts
from speccompile.runtime.metrics import accept_rate



def _generate_c(exe: Path, model_dir: Path, model_lib: Path, prompt: str, max_tokens: int, spec: dict) -> dict:
    cmd = [str(exe), str(model_dir), "--model-lib", str(model_lib), "--prompt", prompt,
           "--max-tokens", str(max_tokens), "--json"]
    for key in ("speculative_mode", "spec_draft_length", "spec_tree_width", "spec_tree_nodes", "ngram_min", "ngram_max",
                "additional_models"):
        value = spec.get(key)
        if isinstance(value, (list, tuple)):  # [(DIR, LIB)] as the Python API takes it
            value = ",".join(map(str, value[0])) if value else None
        if value is not None:
            cmd += [f"--{key.replace('_', '-')}", str(value)]
    return run_json_process(cmd, "spc_generate")


def _step_seconds(run: dict) -> float:
    s = run["stats"]
    steps = s["verify_steps"] + s["plain_steps"]
    return s["decode_seconds"] / steps if steps else 0.0


def run_capi_ab(exe: Path, model_dir: Path, model_lib: Path, spec: dict, prompts_file: Path | None = None,
                max_tokens: int = 128, categories: list[str] | None = None, per_category: int | None = None,
                limit: int | None = None, out_json: Path | None = None, quiet: bool = False) -> dict:
    """``spec``: the command line's speculative settings (``speculative_mode`` and the rest), for
    both runtimes: every mode, a fixed or the adaptive draft length (both runtimes read the cost
    profile this host keeps for the libraries, so they start from the same costs)."""
    mode = spec.get("speculative_mode") or "suffix"
    if not Path(exe).exists():
        raise ValueError(f"{exe} does not exist: build it with `make capi` (build/capi/spc_generate)")
    exe, model_dir, model_lib = (Path(p).resolve() for p in (exe, model_dir, model_lib))  # the runs start in ~
    spec = {"speculative_mode": mode, **{k: v for k, v in spec.items() if k != "speculative_mode"}}
    py_spec = {k: v for k, v in spec.items() if v is not None}
    prompts = select_prompts(load_prompts(prompts_file or DEFAULT_PROMPTS), categories, per_category, limit)
    rows = []
    for i, p in enumerate(prompts):
        runs = {"python": [], "c": []}
        for name in ("python", "c", "c", "python"):
            if name == "python":
                runs[name].append(generate_process(model_dir, model_lib, p["prompt"], max_tokens, py_spec))
            else:
                runs[name].append(_generate_c(exe, model_dir, model_lib, p["prompt"], max_tokens, spec))
        every = runs["python"] + runs["c"]
        row = {"id": p["id"], "category": p["category"], "decode_tokens": every[0]["stats"]["decode_tokens"],
               "identical_output": all(r["token_ids"] == every[0]["token_ids"] and r["text"] == every[0]["text"]
                                       for r in every)}
        for name, group in runs.items():
            row[f"{name}_tokens_per_s"] = statistics.fmean(r["stats"]["decode_tokens_per_s"] for r in group)
            row[f"{name}_step_seconds"] = statistics.fmean(_step_seconds(r) for r in group)
            row[f"{name}_request_seconds"] = statistics.fmean(r["stats"]["request_seconds"] for r in group)
            row[f"{name}_process_seconds"] = statistics.fmean(r["process_seconds"] for r in group)
            row[f"{name}_accept_rate"] = accept_rate(sum(r["stats"]["accepted_tokens"] for r in group),
                                                     sum(r["stats"]["draft_tokens"] for r in group))
        row["c_over_python"] = row["c_tokens_per_s"] / row["python_tokens_per_s"]
        rows.append(row)
        if not quiet:
            print(f"[{i + 1}/{len(prompts)}] {p['category']:<13} python {row['python_tokens_per_s']:6.1f} | C "
                  f"{row['c_tokens_per_s']:6.1f} tok/s x{row['c_over_python']:.2f}; step "
                  f"{1e3 * row['python_step_seconds']:.1f} | {1e3 * row['c_step_seconds']:.1f} ms; request "
                  f"{row['python_request_seconds']:.2f} | {row['c_request_seconds']:.2f} s; process "
                  f"{row['python_process_seconds']:.2f} | {row['c_process_seconds']:.2f} s"
                  f"{'' if row['identical_output'] else '  OUTPUT DIFFERS'}", flush=True)

    def total(name: str, key: str) -> float:
        return sum(r[key.format(name)] for r in rows)

    tokens = sum(r["decode_tokens"] for r in rows)
    overall = {}
    for name in ("python", "c"):
        decode = sum(r["decode_tokens"] / r[f"{name}_tokens_per_s"] for r in rows)
        overall[f"{name}_tokens_per_s"] = tokens / decode
        overall[f"{name}_step_seconds"] = statistics.fmean(r[f"{name}_step_seconds"] for r in rows)
        overall[f"{name}_request_seconds"] = total(name, "{}_request_seconds")
        overall[f"{name}_process_seconds"] = total(name, "{}_process_seconds")
    overall["c_over_python"] = overall["c_tokens_per_s"] / overall["python_tokens_per_s"]
    overall["identical_outputs"] = sum(r["identical_output"] for r in rows)
    report = {"what": f"the C runtime (spc_generate) against the Python one (speccompile generate), A/B: fresh "
                      f"processes, python/C/C/python per prompt, --speculative-mode {mode}",
              "mode": "capi-ab", "model_dir": str(model_dir), "model_lib": str(model_lib), "spc_generate": str(exe),
              "spec": spec, "max_tokens": max_tokens, "host": host_description(), "overall": overall, "prompts": rows}
    if not quiet:
        print(f"C over Python: decode x{overall['c_over_python']:.3f} ({overall['python_tokens_per_s']:.1f} -> "
              f"{overall['c_tokens_per_s']:.1f} tok/s), step {1e3 * overall['python_step_seconds']:.2f} -> "
              f"{1e3 * overall['c_step_seconds']:.2f} ms, requests {overall['python_request_seconds']:.2f} -> "
              f"{overall['c_request_seconds']:.2f} s, processes {overall['python_process_seconds']:.2f} -> "
              f"{overall['c_process_seconds']:.2f} s; identical {overall['identical_outputs']}/{len(rows)}",
              flush=True)
    if out_json:
        Path(out_json).parent.mkdir(parents=True, exist_ok=True)
        Path(out_json).write_text(json.dumps(report, indent=1))
    return report
