"""The ``speccompile`` command line: parses and validates arguments, then delegates."""
from __future__ import annotations

import json
from pathlib import Path

import click
from click.core import ParameterSource

from speccompile.cli.common import USER_ERRORS, fail, resolve_target, target_options
from speccompile.cli.train import train_answers_cmd, train_draft_cmd, train_heads_cmd, train_prompts_cmd
from speccompile.cli.options import config_options
from speccompile.runtime.options import EngineConfig, ModelConfigFields
from speccompile.runtime.sampling import SamplingParams
from speccompile.runtime.speculative import SpeculativeConfig
from speccompile.runtime.tvm_import import import_runtime_only

OVERRIDES_SYNTAX = 'key=value pairs separated by ";" or spaces (keys: README, speccompile/cli/overrides.py)'
OVERRIDES_HELP = f'MLC-LLM style engine settings, e.g. "max_num_sequence=6;prefill_chunk_size=512": {OVERRIDES_SYNTAX}'


def _typed() -> set[str]:
    """The current command's parameters the user gave (not left at their defaults)."""
    ctx = click.get_current_context()
    return {n for n in ctx.params if ctx.get_parameter_source(n) in (ParameterSource.COMMANDLINE,
                                                                      ParameterSource.ENVIRONMENT)}


def _model_overrides(command: str, text: str | None, params: dict) -> tuple[dict, dict]:
    """gen_config/convert_weight --overrides: (the options' values after the overrides, the
    head config fields to pass on)."""
    from speccompile.cli.overrides import MEDUSA_KEYS, merge_options, parse_overrides

    settings = merge_options(command, parse_overrides(text, command), params, _typed())
    head = {k: settings.pop(k) for k in MEDUSA_KEYS if k in settings}
    return {**params, **settings}, head


def _runtime_settings(command: str, text: str | None, mode: str | None, model_dir, model_lib, spec: dict,
                      sizes: dict) -> tuple[dict, dict, str | None]:
    """--overrides and --mode for serve/chat/generate/bench: (the Engine's config objects by
    argument name, settings by MLC-LLM key, the mode's summary line). Precedence:
    speccompile/cli/overrides.py."""
    from speccompile.cli.overrides import resolve_runtime, runtime_configs

    runtime_configs(spec, sizes)  # the flags' ranges, before --mode and --overrides join them
    ctx = click.get_current_context()
    settings, summary = resolve_runtime(command, text, mode, ctx.params, _typed(), model_dir, model_lib,
                                        spec.get("additional_models"))
    speculative, engine = runtime_configs(spec, settings)
    return {"speculative": speculative, "engine": engine}, settings, summary


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
              help="auto, llama, qwen2, qwen3, gemma3, phi3, or a draft head: eagle (EAGLE-1 or EAGLE-3, detected), medusa "
                   "(needs --target)")
@click.option("--target", type=click.Path(path_type=Path), default=None,
              help="eagle/medusa: the target model the head was trained for (HF folder or .gguf)")
@click.option("--overrides", default=None,
              help="medusa: medusa_num_heads=N;medusa_num_layers=M for a checkpoint whose config lacks them "
                   "(give gen_config the same)")
@click.option("--layout-from", "layout_from", type=click.Path(path_type=Path), default=None,
              help="a library compiled for this checkpoint's config: take the parameter list from its _metadata "
                   "instead of building the model, so that conversion needs no TVM compiler (target models only)")
def convert_weight_cmd(src: Path, quantization: str, output: Path, model_type: str, target: Path | None,
                       overrides: str | None, layout_from: Path | None) -> None:
    """Convert an HF folder or GGUF file (or an EAGLE/Medusa head) into quantized shards + tensor-cache.json."""
    from speccompile.compiler.convert_weight import convert_weight

    try:
        _, head = _model_overrides("convert_weight", overrides, {})
        path = convert_weight(src, quantization, output, model_type, target=target, config_overrides=head,
                              layout_from=layout_from)
    except USER_ERRORS as err:
        fail(err)
    click.echo(f"wrote {path}")


@main.command("gen_config")
@click.argument("src", type=click.Path(path_type=Path))
@click.option("--quantization", required=True)
@click.option("-o", "--output", "output", required=True, type=click.Path(path_type=Path))
@click.option("--conv-template", default="auto", show_default=True)
@config_options(ModelConfigFields, "fields", "gen_config")
@click.option("--model-type", default="auto", show_default=True, help="as convert_weight (eagle, medusa: draft heads)")
@click.option("--target", type=click.Path(path_type=Path), default=None,
              help="eagle/medusa: the target model (HF folder or .gguf) that gives sizes and context window")
@click.option("--overrides", default=None,
              help="model config fields: context_window_size, prefill_chunk_size, max_batch_size; medusa heads: "
                   f"medusa_num_heads, medusa_num_layers: {OVERRIDES_SYNTAX}")
def gen_config_cmd(src, quantization, output, conv_template, fields, model_type, target, overrides):
    """Write speccompile-config.json and the tokenizer files."""
    from speccompile.compiler.gen_config import gen_config

    try:
        fields, head = _model_overrides("gen_config", overrides, fields)
        ModelConfigFields(**fields, **head)
        path = gen_config(src, quantization, output, conv_template, fields["context_window_size"],
                          fields["prefill_chunk_size"], fields["max_batch_size"], target=target, model_type=model_type,
                          config_overrides=head)
    except USER_ERRORS as err:
        fail(err)
    click.echo(f"wrote {path}")


@main.command("compile")
@click.argument("config", type=click.Path(path_type=Path))
@click.option("--device", default="llvm", show_default=True,
              help='llvm|cpu|cuda|opencl|android|metal|iphone|vulkan|auto, or a target string such as '
                   '"llvm -mcpu=znver3" (see speccompile/compiler/targets.py)')
@click.option("--mcpu", default=None,
              help="CPU to build for (--device llvm): any LLVM CPU name, e.g. x86-64-v3, znver3, skylake-avx512, "
                   "sapphirerapids; default: this machine's CPU. The library refuses to load on a CPU without "
                   "the features it implies")
@click.option("--host", default=None,
              help="host LLVM triple to cross-build for, e.g. aarch64-linux-gnu (Raspberry Pi, Jetson), "
                   "aarch64-linux-android, arm64-apple-ios; a .so is linked by <triple>-g++ (or --cc), a .tar is not linked")
@click.option("--cc", default=None,
              help="the C++ compiler that links the .so (default for --host T: T-g++ on PATH), e.g. an NDK's "
                   "aarch64-linux-android24-clang++")
@click.option("--cuda-arch", "cuda_arch", default=None,
              help="comma-separated sm_XX list for the embedded fatbin (default sm_75,sm_80,sm_86,sm_89,sm_90)")
@click.option("-o", "--output", "output", required=True, type=click.Path(path_type=Path),
              help="LIB.so, or LIB.tar: a system library of objects the app links (metal/iphone/android, CPU too)")
@click.option("--dump-source", type=click.Path(path_type=Path), default=None,
              help="also write the generated GPU kernel source (CUDA, OpenCL C or Metal) to this file")
@click.option("--gpu-projections", default="auto", show_default=True,
              type=click.Choice(["auto", "tensor-core", "portable"]),
              help="GPU projections: tensor-core (mma.sync; cuda with every --cuda-arch sm_80+, fp16 activations: "
                   "q4f16_1, q0f16) or portable (any GPU); auto takes tensor-core where it can be built")
def compile_cmd(config: Path, device: str, mcpu: str | None, host: str | None, cc: str | None, cuda_arch: str | None,
                output: Path, dump_source: Path | None, gpu_projections: str) -> None:
    """Compile a model config into a library for a device."""
    from speccompile.compiler.compile import compile_model

    archs = [a.strip() for a in cuda_arch.split(",") if a.strip()] if cuda_arch else None
    try:
        compile_model(config, device, output, host=host, cuda_archs=archs, dump_source=dump_source, mcpu=mcpu,
                      gpu_projections=gpu_projections, cc=cc)
    except USER_ERRORS as err:
        fail(err)


def with_spec(command: str):
    """The speculative options (SpeculativeConfig's fields), received as one ``spec`` dict."""
    return config_options(SpeculativeConfig, "spec", command)


def with_engine(command: str):
    """The engine sizes that have flags (EngineConfig's), received as one ``sizes`` dict (they
    join --overrides and --mode in _runtime_settings)."""
    return config_options(EngineConfig, "sizes", command)


def with_sampling(command: str):
    """--temperature, --top-p, --top-k, --seed (SamplingParams' fields), received as ``sampling``."""
    return config_options(SamplingParams, "sampling", command)


def _response_format(value: str | None) -> dict | None:
    """--response-format, read and its schema checked before any model loads."""
    if value is None:
        return None
    from speccompile.runtime.grammar import compile_format, load_response_format

    fmt = load_response_format(value)
    compile_format(fmt)
    return fmt


@main.command("generate")
@click.argument("model_dir", type=click.Path(path_type=Path))
@click.option("--model-lib", required=True, type=click.Path(path_type=Path))
@click.option("--prompt", required=True)
@click.option("--max-tokens", type=int, default=128, show_default=True)
@with_sampling("generate")
@with_spec("generate")
@with_engine("generate")
@click.option("--raw", is_flag=True, help="skip the chat template")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object")
@click.option("--stop", multiple=True, help="stop string (repeatable)")
@click.option("--response-format", "response_format", default=None,
              help="structured output: 'json' (any JSON object) or a JSON schema file (or an OpenAI "
                   "response_format object in a file); every token obeys it, speculation included")
@click.option("--prediction", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="a file of text the answer is expected to repeat (Predicted Outputs: the file being edited); "
                   "the suffix index drafts from it, the output is the same without it")
@click.option("--overrides", default=None, help=OVERRIDES_HELP)
@click.option("--device", default="auto", show_default=True,
              help="where to run: auto (the library's device), cpu, cuda, cuda:1, opencl, metal, vulkan, ...")
def generate_cmd(model_dir, model_lib, prompt, max_tokens, sampling, spec, sizes, raw, as_json, stop, response_format,
                 prediction, overrides, device):
    """Generate a completion for one prompt (optionally with speculative decoding)."""
    import_runtime_only()  # a one-off process: TVM without its compiler (runtime/tvm_import.py)
    try:
        sampling = SamplingParams(**sampling)
        fmt = _response_format(response_format)
        kwargs, _, _ = _runtime_settings("generate", overrides, None, model_dir, model_lib, spec, sizes)
        from speccompile.runtime.engine import Engine

        text = prediction.read_text(encoding="utf-8", errors="replace") if prediction else None
        engine = Engine(model_dir, model_lib, device=device, **kwargs)
        ids = engine.encode_prompt(prompt, raw=raw)
        predicted = engine.tokenizer.encode(text, add_special_tokens=False).ids if text else None
        if as_json:
            res = engine.generate(ids, max_tokens, sampling, list(stop), response_format=fmt, prediction=predicted)
            graphs = engine.model.graphs  # cuda: whether the steps replayed CUDA graphs, and if not, why
            click.echo(json.dumps({**res.to_dict(), **({"cuda_graph": graphs.stats()} if graphs else {})}))
            return
        res = None
        for delta, res in engine.generate_stream(ids, max_tokens, sampling, list(stop), response_format=fmt,
                                                 prediction=predicted):
            click.echo(delta, nl=False)
        click.echo()
    except USER_ERRORS as err:
        fail(err)


@main.command("chat")
@click.argument("model_dir", type=click.Path(path_type=Path))
@click.option("--model-lib", required=True, type=click.Path(path_type=Path))
@click.option("--max-tokens", type=int, default=512, show_default=True)
@with_sampling("chat")
@with_spec("chat")
@with_engine("chat")
@click.option("--mode", type=click.Choice(["interactive"]), default="interactive", show_default=True,
              help="chat holds one conversation: MLC-LLM's interactive preset (one sequence, KV for one "
                   "context window); local and server are serve's")
@click.option("--response-format", "response_format", default=None,
              help="structured output: 'json' (any JSON object) or a JSON schema file (or an OpenAI "
                   "response_format object in a file); every token obeys it, speculation included")
@click.option("--overrides", default=None, help=OVERRIDES_HELP)
@click.option("--device", default="auto", show_default=True,
              help="where to run: auto (the library's device), cpu, cuda, cuda:1, opencl, metal, vulkan, ...")
def chat_cmd(model_dir, model_lib, max_tokens, sampling, spec, sizes, mode, response_format, overrides, device):
    """Interactive chat. Commands: /stats, /reset, /exit."""
    import_runtime_only()
    from speccompile.runtime.chat import ChatSession

    try:
        fmt = _response_format(response_format)
        kwargs, _, _ = _runtime_settings("chat", overrides, mode, model_dir, model_lib, spec, sizes)
        from speccompile.runtime.engine import Engine

        engine = Engine(model_dir, model_lib, device=device, **kwargs)
        session = ChatSession(engine, SamplingParams(**sampling), max_tokens, fmt)
    except USER_ERRORS as err:
        fail(err)
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
@with_spec("serve")
@with_engine("serve")
@click.option("--host", default="127.0.0.1", show_default=True, help="interface to bind (loopback unless told)")
@click.option("--port", type=int, default=8000, show_default=True)
@click.option("--api-key", envvar="SPECCOMPILE_API_KEY", default=None,
              help="require 'Authorization: Bearer KEY' on /v1 (or set SPECCOMPILE_API_KEY)")
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
def serve_cmd(model_dir, model_lib, spec, sizes, host, port, api_key, prefill_tokens_per_step, max_queue,
              served_model_name, log_level, mode, overrides, device):
    """Serve an OpenAI-compatible API (/v1/chat/completions, /v1/completions, /v1/models,
    /health, /metrics) with continuous batching and speculative decoding."""
    import_runtime_only()
    try:
        if not 1 <= port <= 65535:
            raise ValueError("--port must be in 1..65535")
        if prefill_tokens_per_step < 1 or max_queue < 1:
            raise ValueError("--prefill-tokens-per-step and --max-queue must be >= 1")
        kwargs, settings, summary = _runtime_settings("serve", overrides, mode, model_dir, model_lib, spec, sizes)
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
        fail(err)
    from speccompile.serving.app import run_server

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
@with_sampling("bench")
@with_spec("bench")
@with_engine("bench")
@click.option("--endpoint", default=None, help="drive a running server at this URL instead of loading a model")
@click.option("--concurrency", default="1,4,8,16", show_default=True, help="with --endpoint: comma-separated levels")
@click.option("--api-key", envvar="SPECCOMPILE_API_KEY", default=None, help="with --endpoint")
@click.option("--compare", type=click.Path(path_type=Path), default=None,
              help="with --endpoint: an earlier report (e.g. speculation off) to print throughput ratios against")
@click.option("--ab", is_flag=True, default=False,
              help="with --endpoint on a speculative server: each level also runs half the prompts without "
                   "speculation (per-request opt-out), ABBA-interleaved, and reports the speedup")
@click.option("--soak", type=float, default=None, metavar="MINUTES",
              help="with --endpoint: MINUTES of mixed requests at 1-8 streams, with and without speculation; "
                   "reports errors, resident memory, TTFT/ITL percentiles and greedy spec = plain")
@click.option("--llama-bench", "llama_bench", type=click.Path(path_type=Path), default=None,
              help="also run llama.cpp's llama-bench binary in the same run, on --gguf (or --model's GGUF)")
@click.option("--gguf", type=click.Path(path_type=Path), default=None,
              help="with --llama-bench / --llama-speculative: the target's GGUF file")
@click.option("--llama-speculative", "llama_spec", type=click.Path(path_type=Path), default=None,
              help="also run llama.cpp's llama-speculative-simple binary on the same prompts (with --one-shot: "
                   "one process per prompt beside ours), in its peer modes (--llama-spec-mode)")
@click.option("--draft-gguf", type=click.Path(path_type=Path), default=None,
              help="with --llama-speculative in small_draft mode: the draft's GGUF file")
@click.option("--one-shot", is_flag=True, default=False,
              help="each run a fresh `generate` process (plain/spec/spec/plain per prompt), as users run it")
@click.option("--capi", "capi_exe", type=click.Path(path_type=Path), default=None, metavar="SPC_GENERATE",
              help="A/B the C runtime against the Python one: per prompt, fresh `speccompile generate` and "
                   "SPC_GENERATE (the C API's example, e.g. build/capi/spc_generate) processes, python/C/C/python, in "
                   "the same speculative settings (any --speculative-mode, --additional-models, a fixed or the "
                   "adaptive --spec-draft-length)")
@click.option("--repeat", type=int, default=1, show_default=True,
              help="with --one-shot: plain/spec/spec/plain quartets per prompt (fresh processes swing ~10%%)")
@click.option("--llama-spec-mode", "llama_modes", multiple=True, type=click.Choice(["small_draft", "ngram"]),
              help="with --llama-speculative: llama.cpp's modes to run beside ours (repeatable; default: ours where "
                   "llama.cpp has it, else ngram, and small_draft given --draft-gguf)")
@click.option("--llama-draft-max", type=int, default=3, show_default=True,
              help="with --llama-speculative: llama.cpp's --spec-draft-n-max (its default is 3)")
@click.option("--overrides", default=None, help=OVERRIDES_HELP + "; not with --endpoint")
def bench_cmd(model_dir, model_lib, model_name, quantization, prompts, max_tokens, num_prompts, out_json, categories,
              per_category, sampling, spec, sizes, endpoint, concurrency, api_key, compare, ab, soak, llama_bench, gguf, llama_spec, draft_gguf,
              one_shot, capi_exe, repeat, llama_modes, llama_draft_max, overrides):
    """Measure decode tokens/s at batch 1 (plain and speculative side by side: the default
    suffix drafting, or --speculative-mode; disable measures plain alone) and the share of
    the bandwidth roofline. With --endpoint,
    drive a running server at several concurrency levels instead (throughput, TTFT/ITL
    percentiles); run it against a speculative and a plain server to compare them."""
    from speccompile.bench.runner import run_bench, run_endpoint_bench

    if SamplingParams(**sampling) != SamplingParams() and not one_shot:
        fail(ValueError("--temperature, --top-p, --top-k and --seed are for --one-shot runs (a warm bench and "
                        "--endpoint decode greedily, so plain and speculative outputs can be compared)"))
    if endpoint:
        try:
            if overrides:
                raise ValueError("--overrides configures a local engine; with --endpoint the server's settings apply "
                                 "(give them to `speccompile serve`)")
            if soak is not None:
                from speccompile.bench.runner import DEFAULT_PROMPTS, load_prompts, select_prompts
                from speccompile.bench.soak import run_soak

                run_soak(endpoint, select_prompts(load_prompts(prompts or DEFAULT_PROMPTS), list(categories) or None,
                                                  per_category, num_prompts), soak, out_json, api_key)
                return
            levels = [int(c) for c in concurrency.split(",") if c.strip()]
            if not levels or min(levels) < 1:
                raise ValueError("--concurrency takes positive integers, e.g. 1,4,8,16")
            run_endpoint_bench(endpoint, levels, prompts, max_tokens, num_prompts, out_json, api_key,
                               compare=compare, categories=list(categories) or None, per_category=per_category,
                               ab=ab)
        except USER_ERRORS as err:
            fail(err)
        return
    try:
        if soak is not None:
            raise ValueError("--soak drives a running server: give its --endpoint")
        cli_spec = dict(spec)  # --one-shot hands it to each generate process
        spec, _, _ = _runtime_settings("bench", overrides, None, model_dir, model_lib, spec, sizes)
        model_dir, model_lib = resolve_target(model_dir, model_lib, model_name, quantization)
        if model_name and (llama_bench or llama_spec) and gguf is None:
            from speccompile.compiler.fetch import fetch

            gguf = fetch(model_name, quiet=True)
        if repeat != 1 and not one_shot:
            raise ValueError("--repeat is for --one-shot runs (a warm bench already alternates plain and spec "
                             "per prompt)")
        lspec = None
        if llama_spec:
            from speccompile.bench.llama_cpp import SPEC_TYPES, default_peers

            mode = spec["speculative"].speculative_mode
            peers = list(llama_modes) or default_peers(mode, draft_gguf)
            if mode == "disable" or any(m not in SPEC_TYPES for m in peers):
                raise ValueError(f"--llama-speculative runs llama.cpp in the modes it has ({', '.join(SPEC_TYPES)}) "
                                 "beside a speculative mode of ours (e.g. --speculative-mode eagle "
                                 "--llama-spec-mode small_draft --llama-spec-mode ngram)")
            if gguf is None or not Path(llama_spec).exists():
                raise ValueError("--llama-speculative needs an existing llama-speculative-simple binary and --gguf")
            if "small_draft" in peers and (draft_gguf is None or not Path(draft_gguf).exists()):
                raise ValueError("llama.cpp's small_draft peer needs the draft's --draft-gguf file")
            lspec = {"binary": llama_spec, "gguf": gguf, "draft_gguf": draft_gguf, "draft_max": llama_draft_max,
                     "modes": peers}
        if capi_exe:
            from speccompile.bench.capi import run_capi_ab

            if one_shot or llama_bench or llama_spec or overrides or SamplingParams(**sampling) != SamplingParams():
                raise ValueError("--capi runs its own one-shot A/B, greedily with each runtime's defaults: leave out "
                                 "--one-shot, --llama-*, --overrides and the sampling options")
            run_capi_ab(capi_exe, model_dir, model_lib, cli_spec, prompts, max_tokens, list(categories) or None,
                        per_category, num_prompts, out_json)
            return
        if one_shot:
            from speccompile.bench.oneshot import run_one_shot

            if llama_bench:
                raise ValueError("--llama-bench is for a warm bench; --one-shot takes --llama-speculative")
            run_one_shot(model_dir, model_lib, cli_spec, prompts, max_tokens, list(categories) or None, per_category,
                         num_prompts, out_json, overrides=overrides, repeat=repeat, llama_speculative=lspec,
                         sampling=sampling)
            return
        if llama_bench and (gguf is None or not Path(llama_bench).exists()):
            raise ValueError("--llama-bench needs an existing llama-bench binary and a --gguf model file")
        run_bench(model_dir, model_lib, prompts, max_tokens, num_prompts, out_json, spec=spec,
                  categories=list(categories) or None, per_category=per_category,
                  llama_bench=(llama_bench, gguf) if llama_bench else None, llama_speculative=lspec)
    except USER_ERRORS as err:
        fail(err)


for _command in (train_draft_cmd, train_prompts_cmd, train_answers_cmd, train_heads_cmd):
    main.add_command(_command)

if __name__ == "__main__":
    main()
