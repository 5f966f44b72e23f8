"""``speccompile bench --one-shot``: speculation as users meet it, one fresh process per run.

Users run ``generate``, ``chat`` and freshly started servers, not warm benchmark loops: a
policy that needs hundreds of steps to learn its costs never pays for them. Each prompt is
decoded by four fresh ``speccompile generate --json`` processes, plain / spec / spec / plain
(this kind of machine drifts 10-30% in speed within seconds; the mean of each pair cancels a
linear drift), and the four outputs must be token-identical at temperature 0. With sampling
options (``--temperature`` and the rest, a server's default for most models), every process
samples with them (and ``--seed``, if given): each answer is its own draw from the target's
distribution (tests/runtime check that distribution; here only speed is compared), so
answers are not compared and their lengths may differ: times are compared per decoded
token. Decode tok/s
is what each process reports for its own decode loop; a request's end-to-end seconds are its
prefill plus that decode (what a user waits for once the model is loaded: a draft model
prefills every prompt too), and ``request_speedup`` is quoted on them. Model loading and the
one-time cost profile are outside both and reported apart as process seconds. With
``llama_speculative``, llama.cpp's ``llama-speculative-simple`` -- a one-shot process too --
decodes each prompt, rendered with the same chat template, right after its quartet, in each
peer mode.

A prompt with a ``prediction`` (Predicted Outputs: ``bench/edit.jsonl``, code and documents to
change a little) is decoded by six processes: plain / spec+prediction / spec / spec /
spec+prediction / plain. Its ``speedup`` is the prediction's over plain decoding, and
``prediction_over_spec`` what the prediction adds to speculation without it, in the same run.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from speccompile.bench.llama_cpp import run_llama_prompt, summarize_llama_speculative
from speccompile.bench.runner import DEFAULT_PROMPTS, load_prompts, select_prompts
from speccompile.runtime.contract import read_model_config
from speccompile.runtime.metrics import accept_rate, mean_accepted_length
from speccompile.runtime.sampling import SamplingParams
from speccompile.runtime.speculative import SpeculativeConfig
from speccompile.runtime.tokenizer import render_messages


PLAIN = {"speculative_mode": "disable"}  # generate speculates unless told not to


def generate_process(model_dir: Path, model_lib: Path, prompt: str, max_tokens: int, spec: dict | None,
              overrides: str | None = None, response_format: dict | None = None, sampling: dict | None = None,
              prediction: str | None = None) -> dict:
    cmd = [sys.executable, "-m", "speccompile.cli", "generate", str(model_dir), "--model-lib", str(model_lib),
           "--prompt", prompt, "--max-tokens", str(max_tokens), "--json"]
    if prediction is not None:  # as a user would: the file being edited
        path = Path(tempfile.mkdtemp(prefix="speccompile-pred-")) / "prediction.txt"
        path.write_text(prediction)
        cmd += ["--prediction", str(path)]
    if response_format:  # as a user would: the response_format object in a file
        path = Path(tempfile.mkdtemp(prefix="speccompile-rf-")) / "response_format.json"
        path.write_text(json.dumps(response_format))
        cmd += ["--response-format", str(path)]
    if overrides:
        cmd += ["--overrides", overrides]
    defaults = vars(SamplingParams())
    for key, value in {**(spec or {}), **(sampling or {})}.items():
        if value is not None and not (key in defaults and value == defaults[key]):
            cmd += [f"--{key.replace('_', '-')}", str(value)]
    return run_json_process(cmd, "generate")


def run_json_process(cmd: list[str], what: str) -> dict:
    """One fresh process printing one JSON object last (``generate --json``, the C API's
    ``spc_generate --json``), started in ~ as a user would; its object plus the process's
    wall seconds (loading included) as ``process_seconds``."""
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=os.path.expanduser("~"))
    if done.returncode != 0:
        raise RuntimeError(f"{what} failed ({done.returncode}): {done.stderr.strip()[-800:]}")
    out = json.loads(done.stdout.strip().splitlines()[-1])
    out["process_seconds"] = time.perf_counter() - t0
    return out


def run_one_shot(model_dir: Path, model_lib: Path, spec: dict, prompts_file: Path | None = None,
                 max_tokens: int = 128, categories: list[str] | None = None, per_category: int | None = None,
                 limit: int | None = None, out_json: Path | None = None, quiet: bool = False,
                 overrides: str | None = None, repeat: int = 1, llama_speculative: dict | None = None,
                 sampling: dict | None = None) -> dict:
    """``repeat``: plain / spec / spec / plain quartets per prompt (one fresh process each run);
    a prompt's times are the means over all its plain and all its spec runs, its counts the
    sums over its spec runs. Fresh processes on this kind of machine swing ~10% apart, and a
    category holds few prompts: repeats are what make a category's number mean something.
    ``llama_speculative`` (binary, gguf, draft_gguf, draft_max, modes): llama.cpp's run of each
    prompt per mode and repeat (prompts under a response_format are not given to it: it would
    decode them without the schema). ``sampling``: SamplingParams' fields for every process
    (default: greedy)."""
    params = SamplingParams(**(sampling or {}))
    if not params.greedy and llama_speculative:
        raise ValueError("--llama-speculative runs llama.cpp greedily: leave out the sampling options")
    if not SpeculativeConfig(**spec).enabled:
        raise ValueError("--one-shot compares plain and speculative decoding: give a --speculative-mode")
    if repeat < 1:
        raise ValueError(f"--repeat must be >= 1, not {repeat}")
    prompts = select_prompts(load_prompts(prompts_file or DEFAULT_PROMPTS), categories, per_category, limit)
    rows = []
    counts = ("draft_tokens", "accepted_tokens", "verify_steps", "plain_steps", "draft_steps",
              "draft_seconds", "verify_seconds", "other_seconds")  # where a spec run's steps spent their time
    peers = llama_speculative["modes"] if llama_speculative else []
    config = read_model_config(model_dir) if peers else None
    for i, p in enumerate(prompts):
        plains, specs, llama = [], [], {}
        text = render_messages(config, [{"role": "user", "content": p["prompt"]}]) if peers else None
        pred, bare = p.get("prediction"), []  # bare: speculation without the prediction
        for _ in range(repeat):
            order = [(PLAIN, None), (spec, pred), (spec, None), (spec, None), (spec, pred), (PLAIN, None)] if pred \
                else [(PLAIN, None), (spec, None), (spec, None), (PLAIN, None)]
            out = [generate_process(model_dir, model_lib, p["prompt"], max_tokens, sp, overrides, p["response_format"],
                                    sampling, pr) for sp, pr in order]
            plains += [out[0], out[-1]]
            specs += [out[1], out[-2]]
            bare += out[2:4] if pred else []
            for mode in peers if not p["response_format"] else ():
                llama.setdefault(mode, []).append(run_llama_prompt(
                    llama_speculative["binary"], llama_speculative["gguf"], text, max_tokens, mode,
                    llama_speculative.get("draft_gguf"), llama_speculative.get("draft_max", 3)))
        runs = plains + specs + bare
        tokens = plains[0]["stats"]["decode_tokens"]
        # per decoded token (sampled answers differ in length), then for the plain answer's length;
        # a request: its prefill (the rest of request_seconds) plus that decode
        plain_s, spec_s = (tokens * statistics.fmean(1.0 / r["stats"]["decode_tokens_per_s"] for r in g)
                           for g in (plains, specs))
        plain_req, spec_req = (statistics.fmean(r["stats"]["request_seconds"] - r["stats"]["decode_tokens"]
                                                / r["stats"]["decode_tokens_per_s"] for r in g) + s
                               for g, s in ((plains, plain_s), (specs, spec_s)))
        total = {k: sum(r["stats"][k] for r in specs) for k in counts}
        emitted = sum(r["stats"]["mean_accepted_length"] * r["stats"]["verify_steps"] for r in specs)
        row = {"id": p["id"], "category": p["category"], "decode_tokens": tokens, "runs": len(runs),
               "plain_seconds": plain_s, "spec_seconds": spec_s,
               "plain_tokens_per_s": tokens / plain_s, "spec_tokens_per_s": tokens / spec_s,
               "speedup": plain_s / spec_s,
               # end to end (prefill + decode), what a user waits for: a draft model prefills too
               "plain_request_seconds": plain_req, "spec_request_seconds": spec_req,
               "request_speedup": plain_req / spec_req,
               # greedy: all four the same; sampled: not compared (each answer is its own draw)
               "identical_output": (all(r["token_ids"] == runs[0]["token_ids"] for r in runs) if params.greedy
                                    else None),
               "plain_process_seconds": statistics.fmean(r["process_seconds"] for r in plains),
               "spec_process_seconds": statistics.fmean(r["process_seconds"] for r in specs),
               "accept_rate": accept_rate(total["accepted_tokens"], total["draft_tokens"]),
               "mean_accepted_length": mean_accepted_length(emitted, total["verify_steps"]),
               **{k: v / len(specs) for k, v in total.items()}}  # per spec run
        if bare:  # Predicted Outputs: speculation without the prediction, and the prediction's usage
            row["spec_without_prediction_seconds"] = tokens * statistics.fmean(1.0 / r["stats"]["decode_tokens_per_s"]
                                                                               for r in bare)
            row["prediction_over_spec"] = row["spec_without_prediction_seconds"] / spec_s
            row["completion_tokens_details"] = specs[0].get("completion_tokens_details")
        for mode, lruns in llama.items():  # its means over the repeats, and ours over it
            lr = {k: statistics.fmean(r[k] for r in lruns) for k in lruns[0]}
            lr["tokens_per_s"] = lr["decode_tokens"] / lr["seconds"]
            lr["accept_rate"] = (sum(r["accepted_tokens"] for r in lruns) / sum(r["draft_tokens"] for r in lruns)
                                 if sum(r["draft_tokens"] for r in lruns) else 0.0)
            row.setdefault("llama_cpp_spec", {})[mode] = {
                **lr, "ours_over": row["spec_tokens_per_s"] / lr["tokens_per_s"],
                "ours_over_request": lr["request_seconds"] / row["spec_request_seconds"]}
        if all(r.get("cuda_graph") for r in runs):  # cuda: graphs captured per process, and their cost
            row["cuda_graph"] = {f"{name}_{k}": statistics.fmean(r["cuda_graph"][k] for r in g)
                                 for name, g in (("plain", plains), ("spec", specs))
                                 for k in ("captures", "capture_seconds", "replays")}
        failed = sorted({r["cuda_graph"]["failed"] for r in runs if (r.get("cuda_graph") or {}).get("failed")})
        if failed:  # a cuda run whose graphs were turned off: its speed is not the default's
            row["cuda_graph_failed"] = failed
        rows.append(row)
        if not quiet:
            print(f"[{i + 1}/{len(prompts)}] {p['category']:<13} plain {row['plain_tokens_per_s']:6.1f} | spec "
                  f"{row['spec_tokens_per_s']:6.1f} tok/s x{row['speedup']:.2f} (request {row['plain_request_seconds']:.2f}"
                  f" -> {row['spec_request_seconds']:.2f} s x{row['request_speedup']:.2f}) accept {row['accept_rate']:.2f} "
                  f"len {row['mean_accepted_length']:.2f} drafted in {row['verify_steps']:.0f}/"
                  f"{row['verify_steps'] + row['plain_steps']:.0f} steps"
                  f"{'' if row['identical_output'] is not False else '  OUTPUT DIFFERS'}"
                  f"{'' if not bare else ' | prediction x%.2f over spec without it' % row['prediction_over_spec']}"
                  f"{'  CUDA GRAPHS OFF: ' + '; '.join(failed) if failed else ''}"
                  + "".join(f" | llama.cpp {m} {v['tokens_per_s']:.1f} tok/s (ours x{v['ours_over']:.2f})"
                            for m, v in row.get("llama_cpp_spec", {}).items()), flush=True)
    by_cat: dict[str, list[dict]] = {}
    for r in rows:
        by_cat.setdefault(r["category"], []).append(r)

    def summarize(group: list[dict]) -> dict:
        plain = sum(r["decode_tokens"] for r in group) / sum(r["plain_seconds"] for r in group)
        spec_rate = sum(r["decode_tokens"] for r in group) / sum(r["spec_seconds"] for r in group)
        drafted = sum(r["draft_tokens"] for r in group)
        steps = sum(r["verify_steps"] for r in group)
        out = {"prompts": len(group), "plain_tokens_per_s": plain, "spec_tokens_per_s": spec_rate,
               "speedup": spec_rate / plain,
               "request_speedup": (sum(r["plain_request_seconds"] for r in group)
                                   / sum(r["spec_request_seconds"] for r in group)),
               "accept_rate": accept_rate(sum(r["accepted_tokens"] for r in group), drafted),
               "mean_accepted_length": mean_accepted_length(
                   sum(r["mean_accepted_length"] * r["verify_steps"] for r in group), steps),
               "identical_outputs": sum(bool(r["identical_output"]) for r in group),
               "verify_steps": steps, "draft_tokens": drafted}
        with_pred = [r for r in group if "prediction_over_spec" in r]
        if with_pred:  # what the predictions add over speculation without them
            out["prediction_over_spec"] = (sum(r["spec_without_prediction_seconds"] for r in with_pred)
                                           / sum(r["spec_seconds"] for r in with_pred))
        ran = [r for r in group if "llama_cpp_spec" in r]
        if ran:  # on the prompts llama.cpp decoded: its rate per mode, ours over it and over its best
            ours = sum(r["decode_tokens"] for r in ran) / sum(r["spec_seconds"] for r in ran)
            ours_req = sum(r["spec_request_seconds"] for r in ran)
            peer = {m: {**summarize_llama_speculative([r["llama_cpp_spec"][m] for r in ran], llama_speculative["binary"],
                                                      m, llama_speculative.get("draft_max", 3)),
                        "request_seconds": sum(r["llama_cpp_spec"][m]["request_seconds"] for r in ran)} for m in peers}
            for v in peer.values():
                v["ours_over"] = ours / v["spec_tokens_per_s"]
                v["ours_over_request"] = v["request_seconds"] / ours_req
            out["llama_cpp_spec"] = peer
            out["ours_over_best_llama_cpp"] = ours / max(v["spec_tokens_per_s"] for v in peer.values())
        return out

    categories_out = {c: summarize(g) for c, g in by_cat.items()}
    report = {"mode": "one-shot", "model_dir": str(model_dir), "model_lib": str(model_lib), "spec": spec,
              "sampling": {k: v for k, v in vars(params).items()  # the classic four, and any other set
                           if k in ("temperature", "top_p", "top_k", "seed") or v != vars(SamplingParams())[k]},
              "max_tokens": max_tokens, "repeat": repeat, "host": host_description(), "overall": summarize(rows),
              "mean_of_categories": statistics.fmean(c["speedup"] for c in categories_out.values()),
              "categories": categories_out, "prompts": rows}
    if not quiet:
        print(f"overall x{report['overall']['speedup']:.2f} (end to end x{report['overall']['request_speedup']:.2f}), "
              f"mean of categories x{report['mean_of_categories']:.2f}, "
              + ", ".join(f"{c} {v['speedup']:.2f}" for c, v in categories_out.items())
              + (f"; identical {report['overall']['identical_outputs']}/{len(rows)}" if params.greedy else
                 f"; sampled at temperature {params.temperature:g}, not compared")
              + ("; ours over llama.cpp's best x{:.2f}".format(report["overall"]["ours_over_best_llama_cpp"])
                 if "ours_over_best_llama_cpp" in report["overall"] else ""), flush=True)
    if out_json:
        Path(out_json).parent.mkdir(parents=True, exist_ok=True)
        Path(out_json).write_text(json.dumps(report, indent=1))
    return report


def host_description() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()}, {os.cpu_count()} CPUs"
    except OSError:
        pass
    return f"{os.cpu_count()} CPUs"
