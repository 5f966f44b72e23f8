"""``speccompile compile``: model config -> one shared library with a ``_metadata`` function.

Compile-time facts (model type, quantization, parameter layout and its fingerprint,
target, TVM version, which q4 tensors the CPU kernels expect tiled) are baked into the
library; the runtime reads them back and refuses weights that do not match.

Memory: every buffer an entry point allocates is planned at compile time for the most
tokens one forward may take (``prefill_chunk_size``; passes/memory_plan.py says why), so a
process's memory does not grow with the shapes it runs. ``compile`` refuses a library in
which some allocation would still be sized at run time, and reports the planned bytes.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import tvm
from tvm import relax
from tvm.target import codegen

from speccompile import __version__
from speccompile.models import LlamaConfig, build_model, config_from_dict, get_quantization
from speccompile.models.exports import signatures
from speccompile.kernels.cpu_matmul import TILE, is_tiled_param
from speccompile.kernels.cpu_matmul_int8 import int8_dot_isa
from speccompile.passes.memory_plan import MemoryPlanRecorder, attach_upper_bounds
from speccompile.passes.pipeline import build_pipeline
from speccompile.runtime.contract import (KV_PAGE_SIZE, ContractError, model_config_path, read_model_config,
                                          symbolic_dim_bounds)
from speccompile.runtime.tensor_cache import layout_fingerprint
from speccompile.compiler.targets import (CompileError, TargetPlan, fatbin_packer, find_device_module, plan_target,
                                 required_cpu_features)

__all__ = ["CompileError", "compile_model", "read_config"]


def read_config(path: Path) -> dict[str, Any]:
    """A model directory's config (or the config file itself), with what compile needs."""
    try:
        conf = read_model_config(path)
    except ContractError as err:
        raise CompileError(str(err)) from None
    path = model_config_path(path)
    for key in ("model_config", "quantization", "model_type"):
        if key not in conf:
            raise CompileError(f"{path} lacks {key!r}; regenerate it with `speccompile gen_config`")
    return conf


GPU_PROJECTIONS = ("auto", "tensor-core", "portable")


def resolve_projections(choice: str, target: tvm.target.Target, quant_name: str) -> str | None:
    """--gpu-projections for this build: which kernels the GPU projections get (None on CPUs).

    ``tensor-core`` (kernels/gpu_matmul_mma.py) needs cuda with every fatbin arch sm_80+ (the
    target's arch is the list's lowest) and fp16 activations (q4f16_1, q0f16); ``auto`` takes it
    there and ``portable`` (kernels/gpu_matmul.py) everywhere else. Asked for where it cannot
    be built, it is refused before any work."""
    from speccompile.kernels.gpu_matmul_mma import supported

    if choice not in GPU_PROJECTIONS:
        raise CompileError(f"--gpu-projections {choice!r}: choose one of {', '.join(GPU_PROJECTIONS)}")
    if target.kind.name == "llvm":
        if choice == "tensor-core":
            raise CompileError("--gpu-projections tensor-core is for --device cuda; CPU builds have their own kernels")
        return None
    quant = get_quantization(quant_name)
    able = supported(target, quant.model_dtype)
    if choice == "tensor-core" and not able:
        why = (f"{quant_name} has {quant.model_dtype} activations; tensor cores take fp16 (use q4f16_1 or q0f16)"
               if quant.model_dtype != "float16"
               else f"--device {target.kind.name} {target.attrs.get('arch', '')} has no mma.sync m16n8k16 "
                    "(it needs cuda with every --cuda-arch sm_80 or newer, e.g. --cuda-arch sm_80,sm_86,sm_89,sm_90)")
        raise CompileError(f"--gpu-projections tensor-core: {why}")
    return "tensor-core" if able and choice != "portable" else "portable"


def build_metadata(cfg: LlamaConfig, quant_name: str, plan: TargetPlan,
                   params: list[tuple[str, Any]], entry_points: dict[str, list[str]],
                   extra: dict[str, Any] | None = None, projections: str | None = None) -> dict[str, Any]:
    """The compile-time facts the runtime reads back and checks (see module doc; the keys
    the runtimes rely on are runtime/contract.py's METADATA_KEYS). ``speccompile_version``
    stays first: the runtime finds the JSON in a library's bytes by it."""
    target = plan.target
    entries = [(name, [int(d) for d in p.shape], str(p.dtype)) for name, p in params]
    isa = int8_dot_isa(target) if get_quantization(quant_name).is_q4 else None  # int8 q4 kernel, if any
    tiled = []
    if target.kind.name == "llvm":
        tiled = [n for n, shape, _ in entries if is_tiled_param(n, shape)]
    return {
        "speccompile_version": __version__,
        "tvm_version": tvm.__version__,
        "model_type": cfg.model_type,
        "quantization": quant_name,
        "target": str(target.kind.name),
        "device": plan.device,
        "target_json": str(target),
        "host": str(target.host) if target.host is not None else None,
        "cuda_archs": plan.cuda_archs,
        # CPU libraries: the CPU compiled for and the features its code may use (runtime/cpu.py
        # refuses the library on a CPU without them)
        "mcpu": str(target.attrs["mcpu"]) if target.kind.name == "llvm" and "mcpu" in target.attrs else None,
        "mtriple": (str(target.attrs.get("mtriple", "")) or codegen.llvm_get_system_triple())
        if target.kind.name == "llvm" else None,
        "cpu_features": required_cpu_features(target) if target.kind.name == "llvm" else [],
        "cuda_binary": plan.cuda_binary,
        # cuda: planned intermediates allocated once per VM (passes/pipeline.py _finalize_passes),
        # so a runtime may capture the forwards as CUDA graphs (runtime/cuda_graph.py)
        "cuda_graph": target.kind.name == "cuda",
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "num_hidden_layers": cfg.num_hidden_layers,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "context_window_size": cfg.context_window_size,
        "prefill_chunk_size": cfg.prefill_chunk_size,
        # the bounds the entry points' buffers were planned for (runtime/contract.py SYMBOLIC_DIM_BOUNDS)
        "symbolic_dim_bounds": symbolic_dim_bounds(cfg.prefill_chunk_size),
        "kv_page_size": KV_PAGE_SIZE,  # compiled into the attention kernel; the runtimes check it
        "entry_points": entry_points,  # name -> argument names in calling order (contract.ENTRY_POINTS)
        "model_dtype": get_quantization(quant_name).model_dtype,
        "params": [{"name": n, "shape": s, "dtype": d} for n, s, d in entries],
        "layout_fingerprint": layout_fingerprint(entries),
        "tiled_params": tiled,  # stored tensors the runtime permutes into 16-row tiles at load
        "tile": TILE,
        # q4 matmuls quantize activations to int8 per 32-group on AVX-512 VNNI and AVX2 CPUs
        # (numerics differ ~5e-3 from float activations; both ISAs give identical results)
        "q4_activations": "int8" if isa else "float",
        "q4_int8_isa": isa,
        # GPU libraries: the projections' kernels ("tensor-core" or "portable"; --gpu-projections)
        "gpu_projections": projections,
        # the model's own keys (draft heads: their kind, sizes, draft steps), else its config's
        **(extra if extra is not None else cfg.extra_metadata() if hasattr(cfg, "extra_metadata") else {}),
    }


def attach_metadata(mod: tvm.IRModule, metadata: dict) -> tvm.IRModule:
    bb = relax.BlockBuilder(mod)
    with bb.function("_metadata", params=[]):
        bb.emit_func_output(relax.expr.String(json.dumps(metadata)))
    return bb.get()


def check_memory_plan(plan: dict[str, dict] | None) -> dict[str, int]:
    """Entry point -> bytes of buffers it allocates per call, all sized at compile time;
    raises CompileError naming any allocation whose size would depend on a run-time shape
    (the pooled allocator would keep one per shape: passes/memory_plan.py)."""
    if plan is None:
        raise CompileError("the compile pipeline ran no StaticPlanBlockMemory: the library's memory would not be planned")
    dynamic = {name: rec["dynamic"] for name, rec in plan.items() if rec["dynamic"]}
    if dynamic:
        detail = "; ".join(f"{name}: {', '.join(d)}" for name, d in sorted(dynamic.items()))
        raise CompileError(f"buffers whose size depends on a symbolic dimension with no upper bound ({detail}); "
                           "bound it in runtime/contract.py's SYMBOLIC_DIM_BOUNDS")
    return {name: rec["bytes"] for name, rec in plan.items() if name != "_metadata"}


def compile_model(config_path: Path, device: str, output: Path, verbose: bool = True,
                  host: str | None = None, cuda_archs: list[str] | None = None,
                  dump_source: Path | None = None, mcpu: str | None = None, gpu_projections: str = "auto",
                  cc: str | None = None) -> dict:
    """Build the library; returns its metadata plus a ``build`` report (time, size, kernels)."""
    conf = read_config(Path(config_path))
    cfg = config_from_dict(conf["model_type"], conf["model_config"])  # a target or a draft head
    quant = get_quantization(conf["quantization"])
    output = Path(output)
    plan = plan_target(device, output, host, cuda_archs, mcpu, cc)
    target = plan.target
    projections = resolve_projections(gpu_projections, target, quant.name)
    output.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    with target:
        model = build_model(cfg, quant, target)
        spec = model.get_spec()
        exported = signatures(spec)  # before export_tvm, which consumes the specs
        mod, params = model.export_tvm(spec=spec)
    extra = model.extra_metadata() if hasattr(model, "extra_metadata") else None
    metadata = build_metadata(cfg, quant.name, plan, params, exported, extra, projections)
    if plan.output_format == "tar":  # statically linked into an app: a system library, found by prefix
        metadata["system_lib_prefix"] = "".join(c if c.isalnum() else "_" for c in output.stem) + "_"
    mod = attach_metadata(mod, metadata)
    if plan.output_format == "tar":
        mod = mod.with_attr("system_lib_prefix", metadata["system_lib_prefix"])
    mod = attach_upper_bounds(mod, cfg.prefill_chunk_size)
    recorder = MemoryPlanRecorder()
    ctx = tvm.transform.PassContext.current()
    with tvm.transform.PassContext(opt_level=ctx.opt_level, required_pass=ctx.required_pass,
                                   disabled_pass=ctx.disabled_pass, instruments=[*ctx.instruments, recorder],
                                   config={**dict(ctx.config), "relax.backend.use_cuda_graph": target.kind.name == "cuda"}):
        ex = tvm.compile(mod, target=target, relax_pipeline=build_pipeline(target, projections or "portable"))
    report: dict[str, Any] = {"memory_plan": check_memory_plan(recorder.plan)}
    tmp = output.with_name(output.stem + ".tmp" + output.suffix)
    export: dict[str, Any] = {}
    if plan.nvcc:
        export["fpack_imports"] = fatbin_packer(plan.nvcc, plan.cuda_archs, report)
    if plan.cc:  # a cross build's .so, linked by the triple's compiler
        from tvm.support import cc as tvm_cc

        export["fcompile"] = tvm_cc.cross_compiler(plan.cc)
    ex.export_library(str(tmp), **export)
    tmp.replace(output)
    device_mod = find_device_module(ex.mod)
    if dump_source is not None and device_mod is not None:
        Path(dump_source).write_text(device_mod.inspect_source())
    report.update(seconds=round(time.time() - t0, 1), bytes=output.stat().st_size,
                  kernel_source_bytes=len(device_mod.inspect_source()) if device_mod is not None else 0)
    if verbose:
        where = ", ".join(plan.cuda_archs)
        if projections is not None:
            where += f", projections: {projections}"
        if target.kind.name == "llvm":
            where = metadata["mcpu"] or "generic"
            if quant.is_q4:
                isa = metadata["q4_int8_isa"]
                where += f", q4 kernels: {'int8 activations on ' + isa if isa else 'float activations'}"
        if plan.cc:
            where += f", {metadata['mtriple']}, linked by {Path(plan.cc).name}"
        print(f"compiled {cfg.model_type} {quant.name} for {plan.device} ({target.kind.name} {where}) "
              f"in {report['seconds']}s -> {output} ({report['bytes'] / 1e6:.1f} MB)")
        mem = report["memory_plan"]
        print(f"  buffers planned for {cfg.prefill_chunk_size}-token forwards: at most "
              f"{max(mem.values()) / 1e6:.1f} MB per call ({max(mem, key=mem.get)})")
        if plan.cuda_binary == "fatbin":
            print(f"  CUDA kernels compiled ahead of time by {plan.nvcc}: fatbin for {', '.join(plan.cuda_archs)} "
                  f"+ PTX ({report['fatbin_bytes'] / 1e3:.0f} kB); the device needs no compiler")
        elif plan.cuda_binary == "source":
            print("  nvcc not found: the library carries CUDA source, compiled when it is loaded "
                  "(the device needs NVRTC); install the CUDA toolkit to embed a fatbin instead")
    return {**metadata, "build": report}
