"""The models ``make gpu-payload`` ships, converted and compiled here (speccompile/gpu_check/payload.py).

cuda (the GPU check): SmolLM2-135M-Instruct q4f16_1 from its GGUF with the committed EAGLE and
Medusa heads, and the Qwen2.5-1.5B / -0.5B shapes (configs only, weights made on the GPU
machine), every library compiled for sm_90 with the fatbin embedded -- each model twice, with
its default (tensor-core) projections and with the portable ones -- plus the projection
kernels alone (speccompile/gpu_check/kernels_bench.py). cpu (the dry run of
``make gpu-check DEVICE=cpu``): the same two kinds on tiny shapes, compiled for this CPU.

Work is cached under ``build/gpu-work/<device>-<key>/``: the key covers the compiler (as
``fetch.compiler_hash``) and the converter, so a rebuild after a code change redoes what it
must and nothing else. The random-weight models' folders hold ``speccompile-config.json`` and
a tokenizer made by gen_config from a config-only HF folder; a placeholder tensor stands in
for the weights gen_config does not read.
"""
from __future__ import annotations

import hashlib
import json
import shutil
import time
from pathlib import Path

from speccompile.gpu_check.payload import REPO, assemble, build_wheel, tvm_ffi_wheel

CUDA_ARCHS = ["sm_90"]  # H100 / H200 (shared/GPU.md: TVM targets the lowest arch it is given)
SMOLLM2 = "SmolLM2-135M-Instruct"
# Real models' shapes (shared/MODELS.md; Qwen2.5-1.5B and -0.5B, base and Coder alike), as HF config.json
QWEN_COMMON = dict(model_type="qwen2", architectures=["Qwen2ForCausalLM"], vocab_size=151936, rms_norm_eps=1e-6,
                   rope_theta=1000000.0, tie_word_embeddings=True, max_position_embeddings=32768,
                   bos_token_id=151643, eos_token_id=151645, hidden_act="silu")
SHAPES = {
    "Qwen2.5-1.5B": dict(QWEN_COMMON, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                         num_attention_heads=12, num_key_value_heads=2),
    "Qwen2.5-0.5B": dict(QWEN_COMMON, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                         num_attention_heads=14, num_key_value_heads=2),
}
CONTEXT = 4096  # the random-weight models' window: enough for the check, a small KV cache
TINY = {  # the dry run's models: models/config.py's tiny presets as HF configs
    "tiny-llama": dict(model_type="llama", architectures=["LlamaForCausalLM"], hidden_size=64, intermediate_size=128,
                       num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=272,
                       max_position_embeddings=512, tie_word_embeddings=True, rms_norm_eps=1e-5,
                       rope_theta=10000.0, bos_token_id=256, eos_token_id=257),
    "tiny-qwen2": dict(model_type="qwen2", architectures=["Qwen2ForCausalLM"], hidden_size=64, intermediate_size=128,
                       num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=272,
                       max_position_embeddings=512, tie_word_embeddings=False, rms_norm_eps=1e-5,
                       rope_theta=10000.0, bos_token_id=256, eos_token_id=257),
}
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def work_key() -> str:
    """The compiler's hash plus the converter's sources: what a cached model depends on."""
    from speccompile.compiler.fetch import compiler_hash

    h = hashlib.sha256(compiler_hash().encode())
    for name in ("convert_weight.py", "gen_config.py", "sources.py"):
        h.update((REPO / "speccompile" / "compiler" / name).read_bytes())
    return h.hexdigest()[:10]


def byte_tokenizer(path: Path) -> None:
    """256 byte tokens (no merges) plus the chat specials: only token ids matter for speed."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True) for t in ("<|im_start|>", "<|im_end|>", "<|endoftext|>")])
    tok.save(str(path))


def config_folder(hf_config: dict, folder: Path) -> Path:
    """An HF folder with this config, a byte tokenizer, a chatml template and a placeholder
    for the weights (gen_config reads the config and tokenizer; the weights' files must exist)."""
    import numpy as np
    from safetensors.numpy import save_file

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(hf_config, indent=1))
    placeholder = {"model.embed_tokens.weight": np.zeros((1, 1), np.float16)}
    if not hf_config.get("tie_word_embeddings"):
        placeholder["lm_head.weight"] = np.zeros((1, 1), np.float16)
    save_file(placeholder, str(folder / "model.safetensors"))
    byte_tokenizer(folder / "tokenizer.json")
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": CHATML}))
    return folder


def _timed(times: dict, key: str, fn, *args, **kwargs):
    t0 = time.time()
    out = fn(*args, **kwargs)
    times[key] = round(time.time() - t0, 1)
    print(f"  {key}: {times[key]} s", flush=True)
    return out


def _compile(times: dict, key: str, model_dir: Path, lib: Path, device: str, projections: str = "auto") -> Path:
    from speccompile.compiler.compile import compile_model

    if not lib.exists():
        archs = CUDA_ARCHS if device == "cuda" else None
        _timed(times, f"compile {key}", compile_model, model_dir / "speccompile-config.json", device, lib,
               verbose=False, cuda_archs=archs, gpu_projections=projections)
    return lib


def _portable(times: dict, model: dict, device: str) -> dict:
    """The model's (or head's) library built with the portable projections too, beside its
    default (tensor cores on sm_90): the check measures both in one process (check.py
    ``alt_libs``), and runs the portable ones alone if the tensor-core kernel fails there."""
    if device == "cuda":
        lib = Path(model["lib"])
        model["alt_libs"] = {"portable": _compile(times, f"{model['name']} portable", Path(model["dir"]),
                                                  lib.with_name(lib.stem + "-portable.so"), device, "portable")}
    return model


def _config_only(times: dict, name: str, hf: dict, root: Path, quant: str, device: str, **gen) -> dict:
    """A random-weight model: its config folder (no weights) and its library."""
    from speccompile.compiler.gen_config import gen_config

    out = root / name.lower()
    if not (out / "speccompile-config.json").exists():
        hf_dir = config_folder(hf, root / f"{name.lower()}-hf")
        gen_config(hf_dir, quant, out, **gen)
        shutil.rmtree(hf_dir)
    lib = _compile(times, name, out, root / f"{name.lower()}.so", device)
    return {"name": name, "weights": "random", "seed": 0, "dir": out, "lib": lib}


def _converted(times: dict, name: str, src: Path, root: Path, quant: str, device: str, **gen) -> tuple[Path, Path]:
    from speccompile.compiler.convert_weight import convert_weight
    from speccompile.compiler.gen_config import gen_config

    out = root / name.lower()
    if not (out / "speccompile-config.json").exists():
        _timed(times, f"convert {name}", convert_weight, src, quant, out, progress=False)
        gen_config(src, quant, out, **gen)
    return out, _compile(times, name, out, root / f"{name.lower()}.so", device)


# SmolLM2's committed heads the payload carries (heads/SmolLM2-135M-Instruct-<kind>, where present),
# each with the --model-type / --speculative-mode it runs as (an EAGLE-3 head is converted as eagle)
SMOL_HEADS = {"eagle": "eagle", "medusa": "medusa", "eagle3": "eagle"}


def _head(times: dict, kind: str, folder: Path, target: Path, root: Path, quant: str, device: str) -> dict:
    from speccompile.compiler.convert_weight import convert_weight
    from speccompile.compiler.gen_config import gen_config

    mode = SMOL_HEADS[kind]
    out = root / f"{SMOLLM2.lower()}-{kind}"
    if not (out / "speccompile-config.json").exists():
        convert_weight(folder, quant, out, mode, progress=False, target=target)
        gen_config(folder, quant, out, target=target, model_type=mode)
    return _portable(times, {"name": f"{kind} head", "dir": out, "mode": mode,
                             "lib": _compile(times, f"{kind} head", out, root / f"{SMOLLM2.lower()}-{kind}.so", device)},
                     device)


def prepare_cuda(work: Path, heads: Path = REPO / "heads") -> tuple[list[dict], dict]:
    from speccompile.compiler.fetch import fetch

    root = work / f"cuda-{work_key()}"
    root.mkdir(parents=True, exist_ok=True)
    times: dict = {}
    quant = "q4f16_1"
    gguf = fetch(SMOLLM2)
    smol_dir, smol_lib = _converted(times, SMOLLM2, gguf, root, quant, "cuda")
    smol = {"name": SMOLLM2, "weights": "real", "dir": smol_dir, "lib": smol_lib, "heads": {
        kind: _head(times, kind, heads / f"{SMOLLM2}-{kind}", gguf, root, quant, "cuda")
        for kind in SMOL_HEADS if (heads / f"{SMOLLM2}-{kind}").is_dir()}}
    qwen = [_config_only(times, name, hf, root, quant, "cuda", context_window_size=CONTEXT)
            for name, hf in SHAPES.items()]
    return [_portable(times, m, "cuda") for m in (smol, *qwen)], times


def prepare_cpu(work: Path) -> tuple[list[dict], dict]:
    """The dry run's models: tiny-llama with weights made and converted here ("real": they
    travel), tiny-qwen2 as a config only ("random": made where the check runs)."""
    from speccompile.gpu_check.torch_side import task_init

    root = work / f"cpu-{work_key()}"
    root.mkdir(parents=True, exist_ok=True)
    times: dict = {}
    quant = "q4f32_1"
    gen = dict(context_window_size=512, prefill_chunk_size=128)
    src = root / "tiny-llama-hf"
    if not (src / "config.json").exists():
        from speccompile.compiler.gen_config import gen_config

        cfg_dir = config_folder(TINY["tiny-llama"], root / "tiny-llama-cfg")
        gen_config(cfg_dir, quant, root / "tiny-llama-cfg-out", **gen)
        task_init(str(root / "tiny-llama-cfg-out"), str(src), seed=1, device="cpu")
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(cfg_dir / f, src / f)
    real_dir, real_lib = _converted(times, "tiny-llama", src, root, quant, "llvm", **gen)
    real = {"name": "tiny-llama", "weights": "real", "dir": real_dir, "lib": real_lib, "heads": {}}
    generic = root / "tiny-llama-x86-64-v2.so"  # an alternative build (the check's alt_libs path): no AVX2 kernels
    if not generic.exists():
        from speccompile.compiler.compile import compile_model

        _timed(times, "compile tiny-llama x86-64-v2", compile_model, real_dir / "speccompile-config.json", "llvm",
               generic, verbose=False, mcpu="x86-64-v2")
    real["alt_libs"] = {"x86-64-v2": generic}
    return [real, _config_only(times, "tiny-qwen2", TINY["tiny-qwen2"], root, quant, "llvm", **gen)], times


def build_payload(device: str, out: Path, work: Path, tree_bytes: int, heads: Path = REPO / "heads") -> list[Path]:
    """Prepare the models (cached), the wheels, and the parts of the payload in ``out``;
    ``heads``: the folder holding SmolLM2's EAGLE and Medusa checkpoints."""
    from speccompile.gpu_check.payload import part_budget

    part_budget(tree_bytes)  # refuse before minutes of compiling, not after
    print(f"gpu payload for {device}: models", flush=True)
    models, times = prepare_cuda(work, heads) if device == "cuda" else prepare_cpu(work)
    wheels = [_timed(times, "speccompile wheel", build_wheel, work)]
    if device == "cuda":
        wheels.append(tvm_ffi_wheel(work))
    quant = "q4f16_1" if device == "cuda" else "q4f32_1"
    from speccompile.gpu_check.capi import CapiBuildError, build_capi

    extra = {"build_seconds": times}
    try:  # the C API the check runs beside the engine (issue 32: cuda through the C API)
        capi = _timed(times, "C API", build_capi, work)
    except CapiBuildError as err:
        capi, extra["capi_missing"] = None, str(err)
        print(f"  the payload goes without the C API: {err}", flush=True)
    files = {}
    if device == "cuda":  # the projection kernels alone, each variant (speccompile/gpu_check/kernels_bench.py)
        from speccompile.gpu_check import kernels_bench

        from speccompile import kernels

        sources = [kernels_bench.__file__, *sorted(str(f) for f in Path(kernels.__file__).parent.glob("*.py"))]
        key = hashlib.sha256(b"".join(Path(f).read_bytes() for f in sources)).hexdigest()[:8]  # bench and kernels
        bench = work / f"cuda-{work_key()}" / f"kernels-{key}"
        if not (bench / f"{kernels_bench.FILE}.so").exists():
            _timed(times, "kernel bench", kernels_bench.build, bench)
        files = {f"{kernels_bench.FILE}{ext}": bench / f"{kernels_bench.FILE}{ext}" for ext in (".so", ".json")}
    return assemble(out, work / f"{device}-tar", models, wheels, device, quant, tree_bytes, extra=extra, capi=capi,
                    files=files)


def main(argv: list[str] | None = None) -> int:
    """`make gpu-payload` (and the dry run's build): the payload's parts and the device-tool calls.
    Here, not in payload.py, whose GPU-side half imports nothing of this module."""
    import argparse
    import sys

    from speccompile.gpu_check.payload import PayloadError, device_commands, largest_tracked_folders, traveling_tree_bytes

    b = argparse.ArgumentParser(prog="python -m speccompile.gpu_check.models",
                                description="build the GPU-check payload here (needs the venv; nvcc for cuda)")
    b.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    b.add_argument("--out", type=Path, default=None, help="default build/gpu-payload (cpu: build/gpu-payload-cpu)")
    b.add_argument("--work", type=Path, default=REPO / "build" / "gpu-work", help="cache of converted/compiled models")
    b.add_argument("--heads", type=Path, default=REPO / "heads", help="where SmolLM2's EAGLE/Medusa checkpoints are")
    b.add_argument("--assume-tree-mib", type=float, default=None,
                   help="size the parts for a working tree of this many MiB (default: measure it now)")
    args = b.parse_args(argv)
    try:
        if args.assume_tree_mib is not None:
            tree = int(args.assume_tree_mib * 2**20)
        else:  # a dry run's payload travels nowhere
            tree = traveling_tree_bytes() if args.device == "cuda" else 0
        out = args.out or REPO / "build" / ("gpu-payload" if args.device == "cuda" else "gpu-payload-cpu")
        parts = build_payload(args.device, out, args.work, tree, args.heads)
        for p in parts:
            print(f"  {p.relative_to(REPO) if p.is_relative_to(REPO) else p}: "
                  f"{sum(f.stat().st_size for f in p.iterdir()) / 2**20:.1f} MiB")
        if args.device == "cuda" and not all(p.resolve().is_relative_to(REPO) for p in parts):
            print(f"the parts lie outside {REPO}: only paths inside the checkout can be carried to the GPU")
        elif args.device == "cuda":
            print("device-tool calls, back to back (the machine keeps /tmp about 30 s after a call):")
            for i, call in enumerate(device_commands(parts), 1):
                print(f"  {i}) {call}")
        return 0
    except PayloadError as err:
        print(f"error: {err}", file=sys.stderr)
        if "working tree" in str(err):
            print("largest tracked folders: " + ", ".join(f"{n} {b / 2**20:.1f} MiB" for n, b in largest_tracked_folders()),
                  file=sys.stderr)
        return 3


if __name__ == "__main__":
    raise SystemExit(main())
