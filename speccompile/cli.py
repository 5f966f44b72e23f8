"""The ``speccompile`` command line: parses and validates arguments, then delegates."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import click
from click.core import ParameterSource

from speccompile.runtime.contract import KV_PAGE_SIZE
from speccompile.runtime.speculative import MODES, SpeculativeConfig
from speccompile.runtime.tvm_import import import_runtime_only

USER_ERRORS = (ValueError, FileNotFoundError)
OVERRIDES_SYNTAX = 'key=value pairs separated by ";" or spaces (keys: README, speccompile/overrides.py)'
OVERRIDES_HELP = f'MLC-LLM style engine settings, e.g. "max_num_sequence=6;prefill_chunk_size=512": {OVERRIDES_SYNTAX}'


def _fail(err: Exception) -> None:
    click.echo(f"error: {err}", err=True)
    sys.exit(2)


def _typed() -> set[str]:
    """The current command's parameters the user gave (not left at their defaults)."""
    ctx = click.get_current_context()
    return {n for n in ctx.params if ctx.get_parameter_source(n) in (ParameterSource.COMMANDLINE,
                                                                      ParameterSource.ENVIRONMENT)}


def _model_overrides(command: str, text: str | None, params: dict) -> tuple[dict, dict]:
    """gen_config/convert_weight --overrides: (the options' values after the overrides, the
    head config fields to pass on)."""
    from speccompile.overrides import MEDUSA_KEYS, merge_options, parse_overrides

    settings = merge_options(command, parse_overrides(text, command), params, _typed())
    head = {k: settings.pop(k) for k in MEDUSA_KEYS if k in settings}
    return {**params, **settings}, head


def _runtime_settings(command: str, text: str | None, mode: str | None, model_dir, model_lib,
                      spec: dict) -> tuple[dict, dict, str | None]:
    """--overrides and --mode for serve/chat/generate/bench: (Engine arguments, settings by
    MLC-LLM key, the mode's summary line). Precedence: speccompile/overrides.py."""
    from speccompile.overrides import engine_kwargs, resolve_runtime

    ctx = click.get_current_context()
    settings, summary = resolve_runtime(command, text, mode, ctx.params, _typed(), model_dir, model_lib,
                                        spec.get("additional_models"))
    return {**spec, **engine_kwargs(settings)}, settings, summary


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """Ahead-of-time compiler and runtime for (speculative) LLM decoding on TVM."""
    from speccompile.runtime.threads import configure_threads

    configure_threads()  # every subcommand, before its first TVM kernel (runtime/threads.py)


@main.command("convert_weight")
@click.argument("src", type=click.Path(path_type=Path))
@click.option("--quantization", required=True, help="q0f32, q0f16, q4f32_1 or q4f16_1")
@click.option("-o", "--output", "output", required=True, type=click.Path(path_type=Path))
@click.option("--model-type", default="auto", show_default=True,
              help="auto, llama, qwen2, or a draft head: eagle (EAGLE-1 or EAGLE-3, detected), medusa "
                   "(needs --target)")
@click.option("--target", type=click.Path(path_type=Path), default=None,
              help="eagle/medusa: the target model the head was trained for (HF folder or .gguf)")
@click.option("--overrides", default=None,
              help="medusa: medusa_num_heads=N;medusa_num_layers=M for a checkpoint whose config lacks them "
                   "(give gen_config the same)")
def convert_weight_cmd(src: Path, quantization: str, output: Path, model_type: str, target: Path | None,
                       overrides: str | None) -> None:
    """Convert an HF folder or GGUF file (or an EAGLE/Medusa head) into quantized shards + tensor-cache.json."""
    from speccompile.convert_weight import convert_weight

    try:
        _, head = _model_overrides("convert_weight", overrides, {})
        path = convert_weight(src, quantization, output, model_type, target=target, config_overrides=head)
    except USER_ERRORS as err:
        _fail(err)
    click.echo(f"wrote {path}")


@main.command("gen_config")
@click.argument("src", type=click.Path(path_type=Path))
@click.option("--quantization", required=True)
@click.option("-o", "--output", "output", required=True, type=click.Path(path_type=Path))
@click.option("--conv-template", default="auto", show_default=True)
@click.option("--context-window-size", type=int, default=None)
@click.option("--prefill-chunk-size", type=int, default=None)
@click.option("--max-batch-size", type=int, default=8, show_default=True)
@click.option("--model-type", default="auto", show_default=True, help="as convert_weight (eagle, medusa: draft heads)")
@click.option("--target", type=click.Path(path_type=Path), default=None,
              help="eagle/medusa: the target model (HF folder or .gguf) that gives sizes and context window")
@click.option("--overrides", default=None,
              help="model config fields: context_window_size, prefill_chunk_size, max_batch_size; medusa heads: "
                   f"medusa_num_heads, medusa_num_layers: {OVERRIDES_SYNTAX}")
def gen_config_cmd(src, quantization, output, conv_template, context_window_size, prefill_chunk_size, max_batch_size,
                   model_type, target, overrides):
    """Write speccompile-config.json and the tokenizer files."""
    from speccompile.gen_config import gen_config

    try:
        fields = {"context_window_size": context_window_size, "prefill_chunk_size": prefill_chunk_size,
                  "max_batch_size": max_batch_size}
        fields, head = _model_overrides("gen_config", overrides, fields)
        path = gen_config(src, quantization, output, conv_template, fields["context_window_size"],
                          fields["prefill_chunk_size"], fields["max_batch_size"], target=target, model_type=model_type,
                          config_overrides=head)
    except USER_ERRORS as err:
        _fail(err)
    click.echo(f"wrote {path}")


@main.command("compile")
@click.argument("config", type=click.Path(path_type=Path))
@click.option("--device", default="llvm", show_default=True,
              help='llvm|cpu|cuda|opencl|android|metal|iphone|vulkan|auto, or a target string such as '
                   '"llvm -mcpu=znver3" (see speccompile/targets.py)')
@click.option("--mcpu", default=None,
              help="CPU to build for (--device llvm): any LLVM CPU name, e.g. x86-64-v3, znver3, skylake-avx512, "
                   "sapphirerapids; default: this machine's CPU. The library refuses to load on a CPU without "
                   "the features it implies")
@click.option("--host", default=None, help="host LLVM triple, e.g. aarch64-linux-gnu (cross builds produce a .tar)")
@click.option("--cuda-arch", "cuda_arch", default=None,
              help="comma-separated sm_XX list for the embedded fatbin (default sm_75,sm_80,sm_86,sm_89,sm_90)")
@click.option("-o", "--output", "output", required=True, type=click.Path(path_type=Path),
              help="LIB.so, or LIB.tar for metal/iphone/android and cross-compiled hosts")
@click.option("--dump-source", type=click.Path(path_type=Path), default=None,
              help="also write the generated GPU kernel source (CUDA, OpenCL C or Metal) to this file")
def compile_cmd(config: Path, device: str, mcpu: str | None, host: str | None, cuda_arch: str | None, output: Path,
                dump_source: Path | None) -> None:
    """Compile a model config into a library for a device."""
    from speccompile.compile import compile_model

    archs = [a.strip() for a in cuda_arch.split(",") if a.strip()] if cuda_arch else None
    try:
        compile_model(config, device, output, host=host, cuda_archs=archs, dump_source=dump_source, mcpu=mcpu)
    except USER_ERRORS as err:
        _fail(err)


def _target_options(command):
    """MODEL_DIR --model-lib, or --model NAME [--quantization]: the target of a data command
    (resolved by ``_target``)."""
    for option in reversed([
            click.argument("model_dir", type=click.Path(path_type=Path), required=False),
            click.option("--model-lib", type=click.Path(path_type=Path), default=None,
                         help="the target's compiled library"),
            click.option("--model", "model_name", default=None,
                         help="instead of MODEL_DIR --model-lib: a model of speccompile/fetch.py, prepared once and cached"),
            click.option("--quantization", default="q4f32_1", show_default=True, help="with --model")]):
        command = option(command)
    return command


def _target(model_dir, model_lib, model_name: str | None, quantization: str) -> tuple[Path, Path]:
    """MODEL_DIR and --model-lib as given, or those of --model NAME (prepared once and cached)."""
    if model_name:
        from speccompile.fetch import prepare

        model_dir, model_lib = prepare(model_name, quantization)
    if model_dir is None or model_lib is None:
        raise ValueError("give MODEL_DIR --model-lib LIB, or --model NAME")
    return model_dir, model_lib


def _sampling(temperature, top_p, top_k, seed):
    from speccompile.runtime.sampling import SamplingParams

    return SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k, seed=seed)


spec_options = [
    click.option("--speculative-mode", type=click.Choice(MODES), default="disable", show_default=True),
    click.option("--additional-models", default=None,
                 help="small_draft: DRAFT_DIR,DRAFT_LIB; eagle/medusa: HEAD_DIR,HEAD_LIB"),
    click.option("--spec-draft-length", type=int, default=0, show_default=True,
                 help="draft length k (chain length, or tree depth); 0 = adaptive"),
    click.option("--spec-tree-width", type=int, default=1, show_default=True,
                 help="eagle/medusa: candidates per tree level (top-k); 1 = chain"),
    click.option("--spec-tree-nodes", type=int, default=64, show_default=True,
                 help="eagle/medusa: most draft nodes verified per step (<= 256)"),
    click.option("--ngram-min", type=int, default=1, show_default=True),
    click.option("--ngram-max", type=int, default=4, show_default=True),
]
SPEC_KEYS = SpeculativeConfig.keys()


def with_spec(f):
    """Add the speculative options; the command receives them as one ``spec`` dict."""
    import functools

    @functools.wraps(f)
    def wrapper(*args, **kwargs):
        return f(*args, spec={k: kwargs.pop(k) for k in SPEC_KEYS}, **kwargs)

    for opt in reversed(spec_options):
        wrapper = opt(wrapper)
    return wrapper


sampling_options = [
    click.option("--temperature", type=float, default=0.0, show_default=True),
    click.option("--top-p", type=float, default=1.0, show_default=True),
    click.option("--top-k", type=int, default=0, show_default=True),
    click.option("--seed", type=int, default=None),
]


def with_sampling(f):
    for opt in reversed(sampling_options):
        f = opt(f)
    return f


@main.command("generate")
@click.argument("model_dir", type=click.Path(path_type=Path))
@click.option("--model-lib", required=True, type=click.Path(path_type=Path))
@click.option("--prompt", required=True)
@click.option("--max-tokens", type=int, default=128, show_default=True)
@with_sampling
@with_spec
@click.option("--raw", is_flag=True, help="skip the chat template")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object")
@click.option("--stop", multiple=True, help="stop string (repeatable)")
@click.option("--overrides", default=None, help=OVERRIDES_HELP)
@click.option("--device", default="auto", show_default=True,
              help="where to run: auto (the library's device), cpu, cuda, cuda:1, opencl, metal, vulkan, ...")
def generate_cmd(model_dir, model_lib, prompt, max_tokens, temperature, top_p, top_k, seed, spec, raw, as_json, stop,
                 overrides, device):
    """Generate a completion for one prompt (optionally with speculative decoding)."""
    import_runtime_only()  # a one-off process: TVM without its compiler (runtime/tvm_import.py)
    try:
        sampling = _sampling(temperature, top_p, top_k, seed)
        kwargs, _, _ = _runtime_settings("generate", overrides, None, model_dir, model_lib, spec)
        from speccompile.runtime.engine import Engine

        engine = Engine(model_dir, model_lib, device=device, **kwargs)
        ids = engine.encode_prompt(prompt, raw=raw)
        if as_json:
            res = engine.generate(ids, max_tokens, sampling, list(stop))
            click.echo(json.dumps(res.to_dict()))
            return
        res = None
        for delta, res in engine.generate_stream(ids, max_tokens, sampling, list(stop)):
            click.echo(delta, nl=False)
        click.echo()
    except USER_ERRORS as err:
        _fail(err)


@main.command("chat")
@click.argument("model_dir", type=click.Path(path_type=Path))
@click.option("--model-lib", required=True, type=click.Path(path_type=Path))
@click.option("--max-tokens", type=int, default=512, show_default=True)
@with_sampling
@with_spec
@click.option("--mode", type=click.Choice(["interactive"]), default="interactive", show_default=True,
              help="chat holds one conversation: MLC-LLM's interactive preset (one sequence, KV for one "
                   "context window); local and server are serve's")
@click.option("--overrides", default=None, help=OVERRIDES_HELP)
@click.option("--device", default="auto", show_default=True,
              help="where to run: auto (the library's device), cpu, cuda, cuda:1, opencl, metal, vulkan, ...")
def chat_cmd(model_dir, model_lib, max_tokens, temperature, top_p, top_k, seed, spec, mode, overrides, device):
    """Interactive chat. Commands: /stats, /reset, /exit."""
    import_runtime_only()
    from speccompile.runtime.chat import ChatSession

    try:
        kwargs, _, _ = _runtime_settings("chat", overrides, mode, model_dir, model_lib, spec)
        from speccompile.runtime.engine import Engine

        engine = Engine(model_dir, model_lib, device=device, **kwargs)
        session = ChatSession(engine, _sampling(temperature, top_p, top_k, seed), max_tokens)
    except USER_ERRORS as err:
        _fail(err)
    click.echo("speccompile chat: /stats, /reset, /exit")
    while True:
        try:
            line = input(">>> ")
        except EOFError:
            break
        cmd = line.strip()
        if cmd in ("/exit", "/quit"):
            break
        if cmd == "/reset":
            session.reset()
            click.echo("(conversation reset)")
            continue
        if cmd == "/stats":
            click.echo(json.dumps(session.last_stats, indent=1))
            continue
        if not cmd:
            continue
        try:
            for delta in session.send(line):
                click.echo(delta, nl=False)
            click.echo()
        except USER_ERRORS as err:
            click.echo(f"error: {err}", err=True)


@main.command("serve")
@click.argument("model_dir", type=click.Path(path_type=Path))
@click.option("--model-lib", required=True, type=click.Path(path_type=Path))
@with_spec
@click.option("--host", default="127.0.0.1", show_default=True, help="interface to bind (loopback unless told)")
@click.option("--port", type=int, default=8000, show_default=True)
@click.option("--api-key", envvar="SPECCOMPILE_API_KEY", default=None,
              help="require 'Authorization: Bearer KEY' on /v1 (or set SPECCOMPILE_API_KEY)")
@click.option("--max-num-sequence", type=int, default=8, show_default=True, help="sequences decoded together")
@click.option("--max-total-tokens", type=int, default=None,
              help="KV cache capacity in tokens over all sequences (default: context window x sequences, <= 32768)")
@click.option("--prefill-tokens-per-step", type=int, default=256, show_default=True,
              help="prompt tokens prefilled between two decode steps while others decode")
@click.option("--max-queue", type=int, default=1024, show_default=True, help="waiting requests before 429")
@click.option("--served-model-name", default=None, help="model id clients send (default: MODEL_DIR's name)")
@click.option("--log-level", type=click.Choice(["critical", "error", "warning", "info", "debug"]), default="info",
              show_default=True)
@click.option("--mode", type=click.Choice(["local", "interactive", "server"]), default=None,
              help="MLC-LLM's presets for max_num_sequence / max_total_seq_length / prefill_chunk_size: "
                   "local (4 sequences, one context window of KV), interactive (1), server (the config's "
                   "max_batch_size, KV from available memory); options and --overrides win over them")
@click.option("--overrides", default=None, help=OVERRIDES_HELP)
@click.option("--device", default="auto", show_default=True,
              help="where to run: auto (the library's device), cpu, cuda, cuda:1, opencl, metal, vulkan, ...")
def serve_cmd(model_dir, model_lib, spec, host, port, api_key, max_num_sequence, max_total_tokens, prefill_tokens_per_step, max_queue,
              served_model_name, log_level, mode, overrides, device):
    """Serve an OpenAI-compatible API (/v1/chat/completions, /v1/completions, /v1/models,
    /health, /metrics) with continuous batching and speculative decoding."""
    import_runtime_only()
    try:
        if not 1 <= port <= 65535:
            raise ValueError("--port must be in 1..65535")
        if max_num_sequence < 1:
            raise ValueError("--max-num-sequence must be >= 1")
        if max_total_tokens is not None and max_total_tokens < KV_PAGE_SIZE:
            raise ValueError(f"--max-total-tokens must be >= {KV_PAGE_SIZE} (one KV page)")
        if prefill_tokens_per_step < 1 or max_queue < 1:
            raise ValueError("--prefill-tokens-per-step and --max-queue must be >= 1")
        kwargs, settings, summary = _runtime_settings("serve", overrides, mode, model_dir, model_lib, spec)
        chunk = settings.get("prefill_chunk_size")  # MLC-LLM's chunk is also what a step prefills
        if "prefill_tokens_per_step" not in _typed():
            prefill_tokens_per_step = chunk or prefill_tokens_per_step
        elif chunk is not None and prefill_tokens_per_step > chunk:
            raise ValueError(f"--prefill-tokens-per-step {prefill_tokens_per_step} exceeds prefill_chunk_size={chunk}, "
                             "the most tokens one forward takes")
        if summary:
            click.echo(f"speccompile serve {summary}, prefill_tokens_per_step={prefill_tokens_per_step}")
        from speccompile.runtime.engine import Engine

        engine = Engine(model_dir, model_lib, device=device, **kwargs)
    except USER_ERRORS as err:
        _fail(err)
    from speccompile.serve import run_server

    run_server(engine, host, port, api_key, settings["max_num_sequence"], prefill_tokens_per_step, max_queue,
               served_model_name, log_level)


@main.command("bench")
@click.argument("model_dir", type=click.Path(path_type=Path), required=False)
@click.option("--model-lib", type=click.Path(path_type=Path))
@click.option("--model", "model_name", default=None, help="a known model to fetch/convert/compile (e.g. SmolLM2-135M-Instruct)")
@click.option("--quantization", default="q4f32_1", show_default=True, help="with --model")
@click.option("--prompts", type=click.Path(path_type=Path), default=None, help="JSONL (MT-bench format); default bench/mt_bench.jsonl")
@click.option("--max-tokens", type=int, default=128, show_default=True)
@click.option("--num-prompts", type=int, default=None)
@click.option("--json", "out_json", type=click.Path(path_type=Path), default=None)
@click.option("--category", "categories", multiple=True, help="only these prompt categories (repeatable)")
@click.option("--per-category", type=int, default=None, help="at most N prompts of each category")
@with_spec
@click.option("--endpoint", default=None, help="drive a running server at this URL instead of loading a model")
@click.option("--concurrency", default="1,4,8,16", show_default=True, help="with --endpoint: comma-separated levels")
@click.option("--api-key", envvar="SPECCOMPILE_API_KEY", default=None, help="with --endpoint")
@click.option("--compare", type=click.Path(path_type=Path), default=None,
              help="with --endpoint: an earlier report (e.g. speculation off) to print throughput ratios against")
@click.option("--ab", is_flag=True, default=False,
              help="with --endpoint on a speculative server: each level also runs half the prompts without "
                   "speculation (per-request opt-out), ABBA-interleaved, and reports the speedup")
@click.option("--llama-bench", "llama_bench", type=click.Path(path_type=Path), default=None,
              help="also run llama.cpp's llama-bench binary in the same run, on --gguf (or --model's GGUF)")
@click.option("--gguf", type=click.Path(path_type=Path), default=None,
              help="with --llama-bench / --llama-speculative: the target's GGUF file")
@click.option("--llama-speculative", "llama_spec", type=click.Path(path_type=Path), default=None,
              help="also run llama.cpp's llama-speculative-simple binary on the same prompts, in the same mode "
                   "(small_draft with --draft-gguf, or ngram)")
@click.option("--draft-gguf", type=click.Path(path_type=Path), default=None,
              help="with --llama-speculative in small_draft mode: the draft's GGUF file")
@click.option("--one-shot", is_flag=True, default=False,
              help="each run a fresh `generate` process (plain/spec/spec/plain per prompt), as users run it")
@click.option("--repeat", type=int, default=1, show_default=True,
              help="with --one-shot: plain/spec/spec/plain quartets per prompt (fresh processes swing ~10%%)")
@click.option("--llama-spec-mode", "llama_modes", multiple=True, type=click.Choice(["small_draft", "ngram"]),
              help="with --llama-speculative: llama.cpp's modes to run beside ours (repeatable; default: ours)")
@click.option("--llama-draft-max", type=int, default=3, show_default=True,
              help="with --llama-speculative: llama.cpp's --spec-draft-n-max (its default is 3)")
@click.option("--overrides", default=None, help=OVERRIDES_HELP + "; not with --endpoint")
def bench_cmd(model_dir, model_lib, model_name, quantization, prompts, max_tokens, num_prompts, out_json, categories,
              per_category, spec, endpoint, concurrency, api_key, compare, ab, llama_bench, gguf, llama_spec, draft_gguf,
              one_shot, repeat, llama_modes, llama_draft_max, overrides):
    """Measure decode tokens/s at batch 1 (plain, and side by side with speculation when a
    --speculative-mode is given) and the share of the bandwidth roofline. With --endpoint,
    drive a running server at several concurrency levels instead (throughput, TTFT/ITL
    percentiles); run it against a speculative and a plain server to compare them."""
    from speccompile.bench import run_bench, run_endpoint_bench

    if endpoint:
        try:
            if overrides:
                raise ValueError("--overrides configures a local engine; with --endpoint the server's settings apply "
                                 "(give them to `speccompile serve`)")
            levels = [int(c) for c in concurrency.split(",") if c.strip()]
            if not levels or min(levels) < 1:
                raise ValueError("--concurrency takes positive integers, e.g. 1,4,8,16")
            run_endpoint_bench(endpoint, levels, prompts, max_tokens, num_prompts, out_json, api_key,
                               compare=compare, categories=list(categories) or None, per_category=per_category,
                               ab=ab)
        except USER_ERRORS as err:
            _fail(err)
        return
    try:
        cli_spec = dict(spec)  # as typed: --one-shot hands it to each generate process
        spec, _, _ = _runtime_settings("bench", overrides, None, model_dir, model_lib, spec)
        model_dir, model_lib = _target(model_dir, model_lib, model_name, quantization)
        if model_name and (llama_bench or llama_spec) and gguf is None:
            from speccompile.fetch import fetch

            gguf = fetch(model_name, quiet=True)
        if repeat != 1 and not one_shot:
            raise ValueError("--repeat is for --one-shot runs (a warm bench already alternates plain and spec "
                             "per prompt)")
        if one_shot:
            from speccompile.bench_oneshot import run_one_shot

            run_one_shot(model_dir, model_lib, cli_spec, prompts, max_tokens, list(categories) or None, per_category,
                         num_prompts, out_json, overrides=overrides, repeat=repeat)
            return
        if llama_bench and (gguf is None or not Path(llama_bench).exists()):
            raise ValueError("--llama-bench needs an existing llama-bench binary and a --gguf model file")
        lspec = None
        if llama_spec:
            from speccompile.llama_cpp import SPEC_TYPES

            mode = spec.get("speculative_mode", "disable")
            peers = list(llama_modes) or [mode]
            if mode == "disable" or any(m not in SPEC_TYPES for m in peers):
                raise ValueError(f"--llama-speculative runs llama.cpp in the modes it has ({', '.join(SPEC_TYPES)}): "
                                 "ours in one of them, or --llama-spec-mode to name its peers of ours "
                                 "(e.g. --speculative-mode eagle --llama-spec-mode small_draft --llama-spec-mode ngram)")
            if gguf is None or not Path(llama_spec).exists():
                raise ValueError("--llama-speculative needs an existing llama-speculative-simple binary and --gguf")
            if "small_draft" in peers and (draft_gguf is None or not Path(draft_gguf).exists()):
                raise ValueError("llama.cpp's small_draft peer needs the draft's --draft-gguf file")
            lspec = {"binary": llama_spec, "gguf": gguf, "draft_gguf": draft_gguf, "draft_max": llama_draft_max,
                     "modes": peers}
        run_bench(model_dir, model_lib, prompts, max_tokens, num_prompts, out_json, spec=spec,
                  categories=list(categories) or None, per_category=per_category,
                  llama_bench=(llama_bench, gguf) if llama_bench else None, llama_speculative=lspec)
    except USER_ERRORS as err:
        _fail(err)


@main.command("train-draft")
@click.argument("target_dir", type=click.Path(path_type=Path))
@click.option("--method", type=click.Choice(["eagle", "eagle3", "medusa"]), required=True,
              help="eagle3 trains on WORK_DIR/answers (train-prompts, then train-answers make them)")
@click.option("--model-lib", type=click.Path(path_type=Path), default=None,
              help="the target's compiled library (eagle, medusa: they generate their data themselves)")
@click.option("-o", "--output", "output", required=True, type=click.Path(path_type=Path),
              help="folder for the head (official layout), its data and checkpoints")
@click.option("--num-prompts", type=int, default=600, show_default=True, help="self-distillation conversations")
@click.option("--max-tokens", type=int, default=384, show_default=True, help="answer length cap")
@click.option("--gen-batch", type=int, default=8, show_default=True, help="sequences generated together")
@click.option("--steps", type=int, default=3000, show_default=True, help="training steps (resumes from a checkpoint)")
@click.option("--train-batch", type=int, default=4, show_default=True, help="conversations per step")
@click.option("--draft-vocab", type=int, default=None,
              help="tokens in the draft vocabulary, counted from the target's answers [eagle, medusa: 16384; "
                   "eagle3: 16384, or a resumed run's own]")
@click.option("--work-dir", type=click.Path(path_type=Path), default=None,
              help="data and checkpoints (default OUTPUT/work); reuse it to resume, or to train "
                   "another method on the same data")
@click.option("--medusa-num-heads", type=int, default=4, show_default=True,
              help="medusa: heads (head k, from 0, predicts token t+k+2 from the feature at t)")
@click.option("--medusa-num-layers", type=int, default=1, show_default=True,
              help="medusa: residual blocks per head")
@click.option("--medusa-freeze-lm-head/--no-medusa-freeze-lm-head", default=True, show_default=True,
              help="medusa: keep every head's vocabulary projection equal to the target's lm_head "
                   "(cheap on a CPU); --no-... trains one per head (vocab x hidden floats each, plus Adam state)")
@click.option("--epochs", type=int, default=8, show_default=True, help="eagle3: passes over the training answers")
@click.option("--ttt-steps", type=int, default=4, show_default=True,
              help="eagle3: training-time test steps (the head trained on its own fed-back outputs)")
@click.option("--eval-every", type=int, default=50, show_default=True,
              help="eagle3: optimizer steps between held-out evaluations (the curve; the best one is exported)")
@click.option("--intermediate-size", type=int, default=2816, show_default=True,
              help="eagle3: the head layer's MLP width (sets its size: 2816 is 57 MB of fp16 for a 1536-wide target)")
@click.option("--soft-labels/--hard-labels", default=False, show_default=True,
              help="eagle3: train on the target's next-token distributions (from the answers' final hidden "
                   "states) or on its greedy tokens alone (learned faster here: train_eagle3.py)")
@click.option("--export-only", is_flag=True, default=False,
              help="eagle3: export the best checkpoint so far and stop (safe beside a running training)")
def train_draft_cmd(target_dir, method, model_lib, output, num_prompts, max_tokens, gen_batch, steps, train_batch,
                    draft_vocab, work_dir, medusa_num_heads, medusa_num_layers, medusa_freeze_lm_head, epochs,
                    ttt_steps, eval_every, intermediate_size, soft_labels, export_only):
    """Train a draft head for TARGET_DIR by self-distillation (resumable; needs torch)."""
    from speccompile.train_draft import run_train_draft

    try:
        if method == "eagle3":
            from speccompile.train_eagle3 import Settings, train_eagle3

            if work_dir is None:
                raise ValueError("--method eagle3 trains on WORK_DIR/answers: give --work-dir (train-answers' "
                                 "--work-dir)")
            report = train_eagle3(target_dir, work_dir, output,
                                  Settings(intermediate_size=intermediate_size, draft_vocab=draft_vocab,
                                           steps=ttt_steps, epochs=epochs, eval_every=eval_every,
                                           soft_labels=soft_labels), export_only=export_only)
            click.echo(json.dumps(report, indent=1))
            click.echo(f"wrote {output}/config.json and model.safetensors; next: speccompile convert_weight {output} "
                       "--model-type eagle --target <the target's HF folder or GGUF> ...")
            return
        shared = method == "medusa" and work_dir and (Path(work_dir) / "answers" / "train" / "index.jsonl").exists()
        if model_lib is None and not shared:
            raise ValueError(f"--method {method} generates its data: give --model-lib (or, for medusa, --work-dir "
                             "holding train-answers' data)")
        report = run_train_draft(method, target_dir, model_lib, output, num_prompts, max_tokens, gen_batch, steps,
                                 train_batch, draft_vocab or 16384, work_dir=work_dir, medusa_num_heads=medusa_num_heads,
                                 medusa_num_layers=medusa_num_layers, medusa_freeze_lm_head=medusa_freeze_lm_head)
    except USER_ERRORS as err:
        _fail(err)
    click.echo(json.dumps(report, indent=1))
    click.echo(f"wrote {output}/config.json and model.safetensors; next: speccompile convert_weight {output} "
               f"--model-type {method} --target <the target's HF folder or GGUF> ...")


@main.command("train-prompts")
@_target_options
@click.option("--work-dir", type=click.Path(path_type=Path), default=None,
              help="prompts go to WORK_DIR/prompts (default $SPECCOMPILE_CACHE/train/<model dir name>-eagle3)")
@click.option("--data-dir", type=click.Path(path_type=Path), default=None,
              help="also keep the prompts and the answers' token ids here (a folder to commit; features are rebuilt "
                   "from them by prefill on a machine whose work dir is empty); make heads uses heads/data/<model>")
@click.option("--num-prompts", type=int, default=20000, show_default=True, help="training prompts to reach")
@click.option("--held-out", type=int, default=500, show_default=True, help="held-out prompts (other styles) to reach")
@click.option("--magpie-share", type=float, default=0.5, show_default=True,
              help="share of slots whose user turn the target samples itself (the rest are written families)")
@click.option("--batch", type=int, default=8, show_default=True, help="Magpie sequences decoded together")
@click.option("--max-new-tokens", type=int, default=512, show_default=True,
              help="longest sampled user turn (longer ones are dropped as truncated)")
@click.option("--temperature", type=float, default=1.0, show_default=True)
@click.option("--top-p", type=float, default=0.95, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True, help="decides every slot; fixed for a work dir")
@click.option("--exclude", "exclude", multiple=True, type=click.Path(path_type=Path),
              help="benchmark JSONL files (MT-bench format) never to overlap; default bench/mt_bench.jsonl and "
                   "bench/prompts.jsonl")
def train_prompts_cmd(model_dir, model_lib, model_name, quantization, work_dir, data_dir, num_prompts, held_out,
                      magpie_share, batch, max_new_tokens, temperature, top_p, seed, exclude):
    """Build the prompt set a draft head trains on: written families plus Magpie user turns
    sampled from the target, filtered (duplicates, degenerate samples, benchmark overlap),
    with a held-out set of other styles. Resumable: rerun the same command to continue."""
    from speccompile.train_prompts import Settings, run_train_prompts

    try:
        settings = Settings(seed=seed, magpie_share=magpie_share, temperature=temperature, top_p=top_p,
                            max_new_tokens=max_new_tokens)
        settings.check()
        model_dir, model_lib = _target(model_dir, model_lib, model_name, quantization)
        report = run_train_prompts(model_dir, model_lib, work_dir, num_prompts, held_out, settings, batch,
                                   list(exclude) or None, data_dir=data_dir)
    except USER_ERRORS as err:
        _fail(err)
    click.echo(json.dumps(report, indent=1))


@main.command("train-answers")
@_target_options
@click.option("--work-dir", type=click.Path(path_type=Path), default=None,
              help="reads WORK_DIR/prompts, writes WORK_DIR/answers (default as train-prompts)")
@click.option("--data-dir", type=click.Path(path_type=Path), default=None,
              help="also keep the prompts and the answers' token ids here (a folder to commit; features are rebuilt "
                   "from them by prefill on a machine whose work dir is empty); make heads uses heads/data/<model>")
@click.option("--num-prompts", type=int, default=None, help="training prompts to answer (default: all there are)")
@click.option("--held-out", type=int, default=200, show_default=True, help="held-out prompts to answer")
@click.option("--mt-bench/--no-mt-bench", default=True, show_default=True,
              help="also answer MT-bench first turns (offline evaluation only, never trained on)")
@click.option("--max-tokens", type=int, default=768, show_default=True, help="longest answer")
@click.option("--batch", type=int, default=8, show_default=True, help="sequences decoded together")
def train_answers_cmd(model_dir, model_lib, model_name, quantization, work_dir, data_dir, num_prompts, held_out,
                      mt_bench, max_tokens, batch):
    """The target's greedy answers to the prompt set, with its low/mid/high layer features
    captured while it generates (an EAGLE-3 head's training data). Resumable: rerun the
    same command to continue; raise --num-prompts as train-prompts makes more."""
    from speccompile.train_answers import run_train_answers

    try:
        model_dir, model_lib = _target(model_dir, model_lib, model_name, quantization)
        report = run_train_answers(model_dir, model_lib, work_dir, num_prompts, held_out, mt_bench, max_tokens, batch,
                                   data_dir=data_dir)
    except USER_ERRORS as err:
        _fail(err)
    click.echo(json.dumps(report, indent=1))

if __name__ == "__main__":
    main()
