"""``make gpu-check``: issue 32's figures for every model of the payload, on the GPU it runs on.

Why one prepared command. GPU time comes in short leases (shared/GPU.md: 15 minutes with the
machine's start, one command at most 10), so everything is measured by one process in a fixed
order, each measurement with few repetitions, against a time budget: what would not fit is
skipped with the reason, and the JSON is rewritten after every step, so a command stopped at
its limit still brings back what it measured. Run as a CPU dry run (``make gpu-check
DEVICE=cpu``) it takes the same path on tiny models, so the code is tested where no GPU is.

Per model (the payload's models.json): logits against torch on the same weights, plain decode
tok/s at batch 1, the bandwidth roofline, the cost of 1..32-row forwards, prefill tok/s of a
512-token prompt, host time per decode step, and the HF transformers peers; for models with
real weights the one-shot plain / spec / spec / plain runs of ``bench --one-shot``
(speccompile/bench/oneshot.py, fresh ``generate`` processes) for suffix (the default), ngram and each head shipped,
and the payload's C API against the engine's greedy tokens (speccompile/gpu_check/capi.py).
What each figure means is written into the JSON (``definitions``). TVM runs in this process
(runtime alone: the payload has no compiler); torch runs in a worker (speccompile/gpu_check/torch_side.py).
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from speccompile.gpu_check.definitions import DEFINITIONS
from speccompile.gpu_check.graphs import features_step
from speccompile.gpu_check.machine import StepClock, cpu_name, gpu_identity, slug
from speccompile.gpu_check.torch_side import TorchWorker

ROWS = (1, 2, 4, 8, 16, 32)
LOGITS_TEXT = ("The quick brown fox jumps over the lazy dog. Speculative decoding drafts tokens cheaply and "
               "verifies them with the target model in one forward pass, so the output never changes.")
DECODE_PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."
SPEC_PROMPTS = [  # a few kinds, none from bench/ (the heads were tuned on MT-bench-like data)
    ("code", "Write a Python function merge_intervals(intervals) that merges overlapping intervals, with a "
             "docstring and a short example of its use."),
    ("extraction", "From the text below, list every person and the city they live in, one per line as "
                   "'name: city'.\n\nAnna Berg moved to Oslo in 2019, while her brother Lars stayed in Bergen. "
                   "Their friend Maria Lopez lives in Madrid and visits Anna every summer. Tom Reed, Maria's "
                   "colleague, is based in Dublin."),
    ("writing", "Write a friendly two-paragraph email inviting the team to a Friday lunch to celebrate the end "
                "of the project."),
]


class Check:
    def __init__(self, args):
        self.args, self.t0 = args, time.monotonic()
        self.payload = args.payload.resolve()
        self.info = json.loads((self.payload / "payload.json").read_text())
        self.device = args.device or ("cpu" if self.info["device"] == "cpu" else "cuda")
        self.quick = args.quick
        self.work = Path(tempfile.mkdtemp(prefix="spc-gpu-check-", dir=args.work))
        os.environ["SPECCOMPILE_CACHE"] = str(self.work / "cache")  # cost profiles measured here, as a new user
        name, driver = gpu_identity(self.device)
        args.out.mkdir(parents=True, exist_ok=True)
        stem = f"gpu-check-{slug(name)}-{time.strftime('%Y%m%d')}"
        self.path, self.chart = args.out / f"{stem}.json", args.out / f"{stem}.png"
        self.log_file = (args.out / f"{stem}.log").open("w")
        self.result = {"device": name, "driver": driver, "commit": self.info.get("commit"),
                       "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "models": {},
                       "status": "running", "working_tree_dirty": self.info.get("dirty"),
                       "payload_built": self.info.get("built"), "host_cpu": f"{cpu_name()}, {os.cpu_count()} CPUs",
                       "python": platform.python_version(), "budget_s": args.budget_s, "copy_bandwidth_gb_s": None,
                       "definitions": DEFINITIONS, "errors": {}}
        self.worker = None
        self.refused: str | None = None  # why the tensor-core libraries stand down (kernels), if they do
        self.prompt_ids: dict[str, list[int]] = {}  # model -> the decode prompt's token ids (the peers reuse them)

    # ------------------------------------------------------------------ plumbing
    def left(self) -> float:
        return self.args.budget_s - (time.monotonic() - self.t0)

    def log(self, msg: str) -> None:
        line = f"[{time.monotonic() - self.t0:6.1f}s] {msg}"
        print(line, flush=True)
        self.log_file.write(line + "\n")
        self.log_file.flush()

    def save(self) -> None:
        self.result["elapsed_s"] = round(time.monotonic() - self.t0, 1)
        if self.worker is not None and self.worker.versions:
            self.result["torch"] = {k: v for k, v in self.worker.versions.items() if k != "ok"}
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.result, indent=1))
        tmp.replace(self.path)

    def step(self, rec: dict, key: str, fn, *args):
        """Run one measurement; a failure is recorded (with its reason) and the check goes on."""
        t0 = time.monotonic()
        try:
            return fn(*args)
        except Exception as err:  # noqa: BLE001 - one broken measurement must not lose the others
            rec.setdefault("errors", {})[key] = f"{type(err).__name__}: {err}"[-1500:]
            self.log(f"  {key} FAILED: {err}")
            return None
        finally:
            rec.setdefault("timings", {})[f"{key}_s"] = round(time.monotonic() - t0, 2)
            self.save()

    def skip(self, rec: dict, key: str, reason: str) -> None:
        rec.setdefault("skipped", {})[key] = reason
        self.log(f"  {key} skipped: {reason}")

    def torch(self) -> TorchWorker:
        if self.worker is None:
            self.worker = TorchWorker(self.device)
        return self.worker

    # -------------------------------------------------------------------- the run
    def run(self) -> int:
        self.log(f"gpu-check on {self.result['device']} (driver {self.result['driver']}), payload of "
                 f"{self.result['payload_built']} (commit {self.result['commit']}), budget {self.args.budget_s:.0f} s")
        from speccompile.runtime.tvm_import import import_runtime_only

        import_runtime_only()  # the payload carries TVM's runtime alone
        self.worker = TorchWorker(self.device)  # imports torch while the first model loads
        models = [m for m in self.info["models"] if not self.args.models or m["name"] in self.args.models]
        dirs = {}
        errors = True
        try:
            self.kernels()
            for m in models:
                self.log(f"{m['name']} ({m['weights']} weights)")
                dirs[m["name"]] = self.measure_model(m)
                self.write_chart()
            for m in models:
                if m["weights"] == "real":
                    self.speculative(m, dirs[m["name"]])
            for m in models:
                self.torch_compile(m, dirs[m["name"]])
        finally:
            if self.worker is not None:
                self.worker.close()
            errors = bool(self.result["errors"]) or any(r.get("errors") for r in self.result["models"].values())
            self.result["status"] = ("complete" if not errors else "complete with errors") if len(dirs) == len(models) \
                else "interrupted"
            self.save()
            self.write_chart()
            self.summary()
            shutil.rmtree(self.work, ignore_errors=True)
        return 0 if not errors else 1

    def measure_model(self, m: dict) -> Path | None:
        """Everything but the one-shot runs and torch.compile; returns the model folder used."""
        q = self.info["quantization"]
        rec = self.result["models"][m["name"]] = {
            "weights": m["weights"], "quantization": q, "decode_tok_s": None, "roofline_tok_s": None,
            "prefill_tok_s": None, "host_ms_per_step": None, "forward_cost_vs_rows": None,
            "logits_max_abs_diff_vs_torch": None, "peers": {"hf_fp16_tok_s": None, "torch_compile_tok_s": None}}
        if m["weights"] == "real":
            rec["speculative"] = {}
        lib = self.lib_of(m)
        rec["library"] = str(lib.relative_to(self.payload))
        model_dir = self.payload / m["dir"]
        if m["weights"] == "random":
            model_dir = self.step(rec, "random_weights", self.random_weights, m, rec)
            if model_dir is None:
                return None
        from speccompile.runtime.engine import Engine

        engine = self.step(rec, "load", lambda: Engine(model_dir, lib, max_num_sequence=1))
        if engine is None:
            return None
        tokens = self.measure_engine(engine, rec)
        self.alt_libs(m, model_dir, rec, rec.pop("greedy_ids", None))
        self.kernel_profile(model_dir, lib, rec, m)
        if m["weights"] == "real":
            self.capi(engine, model_dir, lib, rec)
        prompt = self.prompt_ids[m["name"]] = engine.encode_prompt(DECODE_PROMPT)
        del engine
        gc.collect()
        if tokens is not None:
            self.step(rec, "torch_reference", self.reference, model_dir, tokens, prompt, rec)
        return model_dir

    def kernels(self) -> None:
        """The projection kernels alone, each variant the payload's bench carries (kernels_bench.py),
        then its attention variants and the greedy argmax, in a process of its own; if the default
        tensor-core kernel faults, or gives a row other bits than the row alone, the models are
        measured with their portable libraries instead."""
        from speccompile.gpu_check import kernels_bench

        info = self.payload / f"{kernels_bench.FILE}.json"
        if not info.exists():
            return self.skip(self.result, "kernels", "the payload carries no kernel bench")
        seconds = min(90.0, max(0.0, self.left() - 240))
        self.log(f"kernels alone: projections, attention, argmax (kernels_bench, at most {seconds:.0f} s)")

        def run():
            done = subprocess.run([sys.executable, "-m", "speccompile.gpu_check.kernels_bench", str(info),
                                   "--seconds", str(seconds)], capture_output=True, text=True, timeout=seconds + 120)
            for line in done.stderr.strip().splitlines()[-80:]:
                self.log(line)
            if done.returncode != 0:
                raise RuntimeError(f"exit {done.returncode}: {done.stderr.strip()[-1200:]}")
            return json.loads(done.stdout.strip().splitlines()[-1])

        out = self.step(self.result, "kernels", run)
        if out:
            self.result["kernels"] = out
            for key, t in out["layers"].items():
                self.log(f"  layer {key}: {t['us']} us, x{t['vs_one_row'].get('8')} at 8 rows, "
                         f"x{t['vs_one_row'].get('16')} at 16")
        self.refused = kernels_bench.refusal(out, self.result.get("errors", {}).get("kernels"))
        self.result["tensor_core_refused"] = self.refused
        if self.refused:
            self.log(f"  tensor-core libraries not measured as the default: {self.refused}")
        self.save()

    def lib_of(self, m: dict) -> Path:
        """The library a model (or a head: the same keys) is measured with: its default, or its
        portable build where the kernel bench refused the tensor-core kernel."""
        if self.refused and "portable" in (m.get("alt_libs") or {}):
            return self.payload / m["alt_libs"]["portable"]
        return self.payload / m["lib"]

    def alt_libs(self, m: dict, model_dir: Path, rec: dict, greedy: list[int] | None) -> None:
        """The same model built another way (models.json ``alt_libs``), measured as the default was."""
        from speccompile.runtime.engine import Engine

        for name, lib in (m.get("alt_libs") or {}).items():
            if self.payload / lib == self.lib_of(m):
                continue  # measured as the default already
            if self.left() < 60:
                return self.skip(rec, f"alt_libs.{name}", f"{self.left():.0f} s of the check's budget left")
            sub = rec.setdefault("alt_libs", {})[name] = {"lib": lib, "decode_tok_s": None}
            engine = self.step(sub, "load", lambda: Engine(model_dir, self.payload / lib, max_num_sequence=1))
            if engine is None:
                continue
            self.step(sub, "decode", self.decode, engine, StepClock(engine.model), sub)
            self.step(sub, "forward_cost_vs_rows", self.rows, engine.model, engine.kv, sub)
            self.step(sub, "prefill", self.prefill, engine.model, engine.kv, sub)
            if greedy is not None and sub.get("greedy_ids") is not None:
                sub["greedy_ids_equal"] = sub["greedy_ids"] == greedy
            sub.pop("greedy_ids", None)
            self.log(f"  {name} library: decode {sub['decode_tok_s']} tok/s, prefill {sub.get('prefill_tok_s')}, "
                     f"rows {sub.get('forward_cost_vs_rows')}, same greedy tokens {sub.get('greedy_ids_equal')}")
            del engine
            gc.collect()

    def capi(self, engine, model_dir: Path, lib: Path, rec: dict) -> None:
        """The C API the payload carries against the engine's greedy tokens (speccompile/gpu_check/capi.py)."""
        rec["capi"] = {"identical": None, "tok_s": None, "error": None}
        if not self.info.get("capi"):
            return self.skip(rec, "capi", self.info.get("capi_missing") or "the payload carries no C API")
        if self.left() < 60:
            return self.skip(rec, "capi", f"{self.left():.0f} s of the check's budget left")
        from speccompile.gpu_check.capi import check_capi

        out = self.step(rec, "capi", check_capi, engine, self.payload, self.info["capi"], model_dir, lib,
                        [DECODE_PROMPT, SPEC_PROMPTS[1][1]], 32, self.work)
        if out is None:
            rec["capi"]["error"] = rec["errors"]["capi"]
            return
        rec["capi"] = out
        if out["error"]:
            rec.setdefault("errors", {})["capi"] = out["error"]
        self.log(f"  C API: identical {out['identical'][0]}/{out['identical'][1]}, {out['tok_s']} tok/s plain, "
                 f"{out['ngram_tok_s']} with ngram (engine {out['python_tok_s']}); "
                 + (f"error {out['error'][:300]}" if out["error"] else
                    f"runtime {out.get('libraries', {}).get('libtvm_runtime.so')}"))
        self.save()

    def kernel_profile(self, model_dir: Path, lib: Path, rec: dict, m: dict | None = None) -> None:
        """Per-kernel device time of decode, 8/32-row and 512-token forwards (speccompile/gpu_check/profile.py),
        in a process of its own: CUPTI through torch.profiler, TVM's kernels included; with the model's
        first head, that head engine's steps that draft nothing."""
        if self.device == "cpu":
            return self.skip(rec, "kernel_profile", "CUPTI profiles CUDA devices only")
        if self.left() < 60:
            return self.skip(rec, "kernel_profile", f"{self.left():.0f} s of the check's budget left")
        heads = list(((m or {}).get("heads") or {}).items())
        head = None if not heads else {"mode": heads[0][1].get("mode", heads[0][0]),
                                       "dir": str(self.payload / heads[0][1]["dir"]), "lib": str(self.lib_of(heads[0][1]))}
        task = json.dumps({"model_dir": str(model_dir), "lib": str(lib), "prefill_tokens": 512,
                           "prompt": DECODE_PROMPT, "head": head})

        def run():
            done = subprocess.run([sys.executable, "-m", "speccompile.gpu_check.profile", task], capture_output=True,
                                  text=True, timeout=min(120, self.left() - 20))
            if done.returncode != 0:
                raise RuntimeError(f"exit {done.returncode}: {done.stderr.strip()[-1200:]}")
            rec["kernel_profile"] = json.loads(done.stdout.strip().splitlines()[-1])
            step = rec["kernel_profile"].get("engine_step_ctx128")
            if step:
                rec["host_ms_per_step"] = round(step["wall_ms"] - step["device_busy_ms"], 3)
            for phase, p in rec["kernel_profile"].items():
                top = ", ".join(f"{t['kernel'][:40]} {t['share']}" for t in p["top"][:3])
                self.log(f"  profile {phase}: wall {p['wall_ms']} ms, device {p['device_busy_ms']} ms, "
                         f"{p['launches']} launches; top {top}")

        self.step(rec, "kernel_profile", run)

    def random_weights(self, m: dict, rec: dict) -> Path:
        """A transformers random init, converted here by our converter to the library's layout."""
        from speccompile.compiler.convert_weight import convert_weight

        hf, out = self.work / f"{slug(m['name'])}-hf", self.work / slug(m["name"])
        init = self.torch().call("init", 600, model_dir=str(self.payload / m["dir"]), out=str(hf), seed=m.get("seed", 0))
        t0 = time.monotonic()
        convert_weight(hf, self.info["quantization"], out, progress=False, layout_from=self.payload / m["lib"])
        rec["random_init"] = {"params": init["params"], "init_seconds": round(init["seconds"], 1),
                              "convert_seconds": round(time.monotonic() - t0, 1), "seed": m.get("seed", 0)}
        for f in (self.payload / m["dir"]).iterdir():
            shutil.copy(f, out / f.name)
        shutil.rmtree(hf)
        self.log(f"  random weights: {init['params'] / 1e6:.1f}M parameters, init {init['seconds']:.0f} s, "
                 f"our conversion {rec['random_init']['convert_seconds']:.0f} s")
        return out

    def measure_engine(self, engine, rec: dict) -> list[int] | None:
        """The TVM-side figures; returns the token ids whose logits were kept (None: failed)."""
        from speccompile.bench.runner import weight_bytes_per_token

        model, kv = engine.model, engine.kv
        clock = StepClock(model)
        rec["weight_bytes_per_token"] = weight_bytes_per_token(model.meta)
        tokens = self.step(rec, "logits_ours", self.logits_ours, engine)
        self.step(rec, "decode", self.decode, engine, clock, rec)
        self.step(rec, "decode_sampled", self.decode_sampled, engine, rec)
        if model.graphs is not None and model.feature_layers:
            self.step(rec, "features_step", self.graph_features_step, model, kv, rec)
        self.step(rec, "forward_cost_vs_rows", self.rows, model, kv, rec)
        self.step(rec, "prefill", self.prefill, model, kv, rec)
        if self.result["copy_bandwidth_gb_s"] is None:
            nbytes = (64 << 20) if self.quick else (256 << 20) if self.device == "cpu" else (1 << 30)
            bw = self.step(self.result, "bandwidth", lambda: self.torch().call("bandwidth", 300, nbytes=nbytes))
            if bw:
                self.result["copy_bandwidth_gb_s"] = round(bw["copy_gb_s"], 2)
        if self.result["copy_bandwidth_gb_s"]:
            rec["roofline_tok_s"] = round(self.result["copy_bandwidth_gb_s"] * 1e9 / rec["weight_bytes_per_token"], 1)
            if rec["decode_tok_s"]:
                rec["roofline_share"] = round(rec["decode_tok_s"] / rec["roofline_tok_s"], 3)
        self.log(f"  decode {rec['decode_tok_s']} tok/s (sampled {rec.get('decode_tok_s_sampled')}; roofline "
                 f"{rec['roofline_tok_s']}), prefill {rec['prefill_tok_s']} tok/s, host {rec['host_ms_per_step']} ms/step, rows {rec['forward_cost_vs_rows']}"
                 + (f", cuda graph {rec['cuda_graph']}" if "cuda_graph" in rec else ""))
        return tokens

    def logits_ours(self, engine) -> list[int]:
        """Our logits over a prefill, one decode step and an 8-token forward (10 rows)."""
        ids = engine.tokenizer.encode(LOGITS_TEXT, add_special_tokens=False).ids
        ids = (ids * (33 // max(len(ids), 1) + 1))[:33]
        model, kv, sid = engine.model, engine.kv, -7
        kv.add_sequence(sid)
        try:
            out = [model.prefill(kv, [sid], [ids[:24]]), model.decode(kv, [sid], [ids[24]]),
                   model.forward(kv, [sid], [ids[25:33]])]
        finally:
            kv.remove_sequence(sid)
        np.save(self.work / "ours.npy", np.concatenate(out).astype(np.float32))
        return ids

    def decode(self, engine, clock: StepClock, rec: dict) -> None:
        """Plain decode, runs alternating with and without CUDA graphs where the library has them
        (the first of each warms up and is not counted); the default (graphs on) is decode_tok_s."""
        n = 32 if self.quick else 128
        ids = engine.encode_prompt(DECODE_PROMPT)
        graphs = engine.model.graphs
        modes = [True, False] if graphs is not None else [False]
        runs, tokens = {m: [] for m in modes}, {}
        for i in range(2 if self.quick else 4):
            for mode in modes:
                if graphs is not None:
                    graphs.enabled = mode
                seq = engine.new_sequence(ids, n, ignore_eos=True)
                engine.attach(seq)
                try:
                    while seq.prefilling:
                        engine.prefill([seq], engine.model.prefill_chunk_size)
                    clock.reset()
                    steps, t0 = 0, time.perf_counter()
                    while not seq.done:
                        engine.step([seq])
                        steps += 1
                    wall = time.perf_counter() - t0
                finally:
                    engine.detach(seq)
                tokens.setdefault(mode, seq.result.token_ids)
                if i:
                    runs[mode].append({"tok_s": steps / wall, "wall_ms_per_step": 1e3 * wall / steps,
                                       "vm_call_ms_per_step": 1e3 * clock.vm / steps,
                                       "device_wait_ms_per_step": 1e3 * clock.wait / steps,
                                       "engine_decode_tok_s": seq.result.stats.to_dict()["decode_tokens_per_s"]})
        if graphs is not None:
            graphs.enabled = True
            on = graphs.stats()
            rec["cuda_graph"] = {**on, "identical_to_no_graph": tokens[True] == tokens[False],
                                 "decode_runs_tok_s_no_graph": [round(r["tok_s"], 1) for r in runs[False]],
                                 "decode_tok_s_no_graph": round(sorted(r["tok_s"] for r in runs[False])[
                                     len(runs[False]) // 2], 1)}
            if on["failed"]:
                rec.setdefault("errors", {})["cuda_graph"] = f"capturing stopped: {on['failed']}"
        rec["greedy_ids"] = tokens[modes[0]]  # compared with an alternative library's (alt_libs), then dropped
        mine = runs[modes[0]]
        mid = sorted(mine, key=lambda r: r["tok_s"])[len(mine) // 2]
        rec["decode_tok_s"] = round(mid["tok_s"], 1)
        rec["host_ms_per_step"] = round(mid["wall_ms_per_step"] - mid["device_wait_ms_per_step"], 3)
        rec["decode_tokens"] = n
        rec.setdefault("timings", {}).update({k: round(v, 3) for k, v in mid.items() if k != "tok_s"})
        rec["decode_runs_tok_s"] = [round(r["tok_s"], 1) for r in mine]

    def decode_sampled(self, engine, rec: dict) -> None:
        """Plain decoding at temperature 0.7, top-p 0.9: every step runs the sampling and the
        rejection-sampling kernels instead of the greedy argmax (the second of two runs counts)."""
        from speccompile.runtime.sampling import SamplingParams

        ids, n = engine.encode_prompt(DECODE_PROMPT), 32 if self.quick else 128
        for seed in (0, 1):
            res = engine.generate(ids, n, SamplingParams(temperature=0.7, top_p=0.9, seed=seed), ignore_eos=True)
        rec["decode_tok_s_sampled"] = round(res.stats.to_dict()["decode_tokens_per_s"], 1)

    def graph_features_step(self, model, kv, rec: dict) -> None:
        rec["features_step"] = f = features_step(model, kv, 8 if self.quick else 48)
        self.log(f"  EAGLE-3 step forward: graph {f['graph_ms']} ms, calls {f['calls_ms']} ms, "
                 f"identical {f['identical_to_no_graph']}")

    def rows(self, model, kv, rec: dict) -> None:
        from speccompile.runtime.costs import measure_target

        rows = [r for r in ROWS if r <= model.max_forward_tokens]
        seconds = measure_target(model, kv, rows, "")
        rec["forward_cost_vs_rows"] = {str(r): round(seconds[r] / seconds[1], 3) for r in rows}
        rec["forward_ms_vs_rows"] = {str(r): round(1e3 * seconds[r], 3) for r in rows}

    def prefill(self, model, kv, rec: dict) -> None:
        n = min(64 if self.quick else 512, model.context_window_size - 16)
        ids = np.random.default_rng(0).integers(0, min(model.vocab_size, 32000), n).tolist()
        sid = -9

        def once() -> float:
            kv.add_sequence(sid)
            try:
                t0 = time.perf_counter()
                model.prefill(kv, [sid], [ids])
                return time.perf_counter() - t0
            finally:
                kv.remove_sequence(sid)

        once()
        best = min(once() for _ in range(3))
        rec["prefill_tok_s"] = round(n / best, 1)
        rec["prefill_prompt_tokens"] = n

    def reference(self, model_dir: Path, tokens: list[int], prompt: list[int], rec: dict) -> None:
        n = 16 if self.quick else 128
        ref = self.torch().call("reference", 900, model_dir=str(model_dir), tokens=tokens, rows=10,
                                logits_out=str(self.work / "ref.npy"), prompt=prompt, generate=n)
        ours, theirs = np.load(self.work / "ours.npy"), np.load(self.work / "ref.npy")
        half = np.load(self.work / "ref-fp16.npy")
        rec["logits_max_abs_diff_vs_torch"] = round(float(np.abs(ours - theirs).max()), 5)
        rec["logits"] = {"rows": 10, "argmax_agree": int((ours.argmax(-1) == theirs.argmax(-1)).sum()),
                         "max_abs_logit": round(ref["max_abs_logit"], 3),
                         "max_abs_diff_vs_torch_fp16": round(float(np.abs(ours - half).max()), 5),
                         "torch_fp16_vs_fp32_max_abs_diff": round(ref["fp16_vs_fp32_max_abs_diff"], 5)}
        rec["peers"]["hf_fp16_tok_s"] = round(ref["hf_fp16"]["tok_s"], 1)
        rec["peers_detail"] = {"hf_fp16": ref["hf_fp16"], "generated_tokens": n}
        self.log(f"  logits vs torch: max abs diff {rec['logits_max_abs_diff_vs_torch']} (argmax "
                 f"{rec['logits']['argmax_agree']}/10, torch fp16 itself {rec['logits']['torch_fp16_vs_fp32_max_abs_diff']}); "
                 f"HF fp16 generate {rec['peers']['hf_fp16_tok_s']} tok/s")

    def speculative(self, m: dict, model_dir: Path | None) -> None:
        """bench --one-shot per mode: suffix (the runtime's default), the same with CUDA graphs off in
        both its plain and spec processes (``suffix_no_graph``: whether graphs pay in processes
        this short), ngram, then each head the payload ships."""
        from speccompile.bench.oneshot import run_one_shot

        rec = self.result["models"][m["name"]]
        if model_dir is None:
            return self.skip(rec, "speculative", "the model did not load")
        prompts = self.work / "prompts.jsonl"
        count = 1 if self.quick else self.args.prompts
        prompts.write_text("".join(json.dumps({"question_id": i, "category": c, "prompt": p}) + "\n"
                                   for i, (c, p) in enumerate(SPEC_PROMPTS[:count])))
        modes = [("suffix", None), ("suffix_no_graph", None), ("ngram", None)] + list(m.get("heads", {}).items())
        modes = [(k, h) for k, h in modes if (not self.args.modes or k in self.args.modes)
                 and (k != "suffix_no_graph" or self.device == "cuda")]
        per_mode = None
        for mode, head in modes:
            if per_mode is not None and self.left() < per_mode * 1.2:
                self.skip(rec, f"speculative.{mode}", f"{self.left():.0f} s of the budget left; a mode took {per_mode:.0f} s")
                continue
            spec = {"speculative_mode": head.get("mode", mode) if head else mode.removesuffix("_no_graph")}  # EAGLE-3 runs as eagle
            if head:
                spec["additional_models"] = f"{self.payload / head['dir']},{self.lib_of(head)}"
            self.log(f"{m['name']}: one-shot {mode} on {count} prompt(s)")
            t0 = time.monotonic()
            overrides = "cuda_graph=off" if mode.endswith("_no_graph") else None
            report = self.step(rec, f"speculative.{mode}", lambda: run_one_shot(
                model_dir, self.lib_of(m), spec, prompts, 16 if self.quick else 128, overrides=overrides))
            per_mode = time.monotonic() - t0
            if report:
                o = report["overall"]
                rec["speculative"][mode] = {
                    "speedup": round(o["speedup"], 3), "acceptance": round(o["accept_rate"], 3),
                    "mean_accepted_length": round(o["mean_accepted_length"], 3),
                    "verify_steps": o["verify_steps"], "draft_tokens": o["draft_tokens"],
                    "identical": [o["identical_outputs"], o["prompts"]],
                    "plain_tok_s": round(o["plain_tokens_per_s"], 1), "spec_tok_s": round(o["spec_tokens_per_s"], 1),
                    "per_prompt": [{k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()
                                    if k in ("category", "speedup", "accept_rate", "mean_accepted_length",
                                             "identical_output", "plain_tokens_per_s", "spec_tokens_per_s",
                                             "verify_steps", "plain_steps", "cuda_graph_failed", "cuda_graph",
                                             "draft_seconds", "verify_seconds", "other_seconds",
                                             "plain_seconds", "spec_seconds")}
                                   for r in report["prompts"]]}
                self.save()

    def torch_compile(self, m: dict, model_dir: Path | None) -> None:
        """transformers' static-cache generate under torch.compile, if it finishes in time."""
        rec = self.result["models"][m["name"]]
        cap = self.args.torch_compile_timeout
        if model_dir is None or m["name"] not in self.prompt_ids or cap <= 0:
            return self.skip(rec, "torch_compile", "not asked for" if cap <= 0 else "the model did not load")
        if self.left() < min(cap, 60) + 15:
            return self.skip(rec, "torch_compile", f"{self.left():.0f} s of the check's budget left")
        timeout = min(cap, self.left() - 10)
        self.log(f"{m['name']}: torch.compile peer (at most {timeout:.0f} s)")
        task = {"model_dir": str(model_dir), "prompt": self.prompt_ids[m["name"]], "tokens": 16 if self.quick else 128,
                "device": self.device}
        t0 = time.monotonic()
        # a session of its own: on timeout its compile workers go with it
        proc = subprocess.Popen([sys.executable, "-m", "speccompile.gpu_check.torch_side", "compile", json.dumps(task)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            return self.skip(rec, "torch_compile", f"did not compile and run within {timeout:.0f} s")
        finally:
            rec.setdefault("timings", {})["torch_compile_s"] = round(time.monotonic() - t0, 1)
        if proc.returncode != 0:
            rec.setdefault("errors", {})["torch_compile"] = stderr.strip()[-1500:]
            self.log(f"  torch.compile FAILED: {stderr.strip()[-300:]}")
        else:
            res = json.loads(stdout.strip().splitlines()[-1])
            rec["peers"]["torch_compile_tok_s"] = round(res["tok_s"], 1)
            rec.setdefault("peers_detail", {})["torch_compile"] = res
            self.log(f"  torch.compile {res['tok_s']:.1f} tok/s (compile + first run {res['compile_and_first_run_seconds']:.0f} s)")
        self.save()

    # ------------------------------------------------------------------ reporting
    def summary(self) -> None:
        self.log(f"wrote {self.path} ({self.result['status']}, {self.result['elapsed_s']} s)")
        for name, r in self.result["models"].items():
            self.log(f"  {name}: decode {r['decode_tok_s']} / roofline {r['roofline_tok_s']} tok/s, prefill "
                     f"{r['prefill_tok_s']}, host {r['host_ms_per_step']} ms, logits diff "
                     f"{r['logits_max_abs_diff_vs_torch']}, peers {r['peers']}, rows {r['forward_cost_vs_rows']}")
            if r.get("capi", {}).get("identical"):
                self.log(f"    C API: identical {r['capi']['identical'][0]}/{r['capi']['identical'][1]}, "
                         f"{r['capi']['tok_s']} tok/s")
            for mode, s in r.get("speculative", {}).items():
                self.log(f"    {mode}: x{s['speedup']} accept {s['acceptance']} len {s['mean_accepted_length']} "
                         f"identical {s['identical'][0]}/{s['identical'][1]}")

    def write_chart(self) -> None:
        try:
            from speccompile.gpu_check.chart import write_chart

            write_chart(self.result, self.chart)
        except Exception as err:  # noqa: BLE001 - the chart is a convenience; the JSON is the result
            self.log(f"chart not written: {err}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m speccompile.gpu_check.check", description=__doc__.split("\n")[0])
    ap.add_argument("--payload", type=Path, required=True, help="the installed payload (speccompile.gpu_check.payload run makes it)")
    ap.add_argument("--out", type=Path, required=True, help="folder for the JSON, the PNG and the log")
    ap.add_argument("--device", choices=("cuda", "cpu"), default=None, help="default: the payload's")
    ap.add_argument("--budget-s", type=float, default=None, help="time budget (default: 440 on cuda, 900 on cpu)")
    ap.add_argument("--models", type=lambda s: [x for x in s.split(",") if x], default=None)
    ap.add_argument("--modes", type=lambda s: [x for x in s.split(",") if x], default=None,
                    help="speculative modes to run (default: suffix, ngram and every head shipped)")
    ap.add_argument("--prompts", type=int, default=3, help="one-shot prompts per mode (at most 3)")
    ap.add_argument("--torch-compile-timeout", type=float, default=180.0, help="0 skips the torch.compile peer")
    ap.add_argument("--quick", action="store_true", help="short runs (tests): 32 decode tokens, 64-token prefill, ...")
    ap.add_argument("--work", default=None, help="scratch folder parent (default: the system's temp)")
    args = ap.parse_args(argv)
    if args.budget_s is None:
        args.budget_s = 900.0 if json.loads((args.payload / "payload.json").read_text())["device"] == "cpu" else 440.0
    return Check(args).run()


if __name__ == "__main__":
    sys.exit(main())
