"""The one compilation pipeline: which passes run, in which order, per target.

llvm (CPU):
  1. DispatchCPUKernels: our TensorIR kernels for the model's tagged matmuls (q4 with
     int8 activations on CPUs with AVX-512 VNNI or AVX2);
  2. TVM's default CPU lowering (legalize, fuse, lower to the VM).
GPU (cuda, opencl, vulkan, metal):
  0. FuseGatedProjection: the MLP's q4 gate/up projection and its activation as one kernel;
  1. DispatchGPUKernels: batch-invariant GEMV (q4 on tensor cores where the build asks for
     them) and the thread-parallel greedy verifier;
  2. legalize and fuse the remaining graph ops;
  3. BindGPUThreads: the model's parallel-loop kernels (attention, RoPE, KV copy) on
     GPU threads;
  4. dlight rules for what is left (norms, activations, gathers), without the Matmul
     rule on metal, where it crashes inside tensorization;
  5. TVM's generic GPU lowering to the VM; on cuda, RewriteCUDAGraph right after the memory
     plan lifts every planned intermediate into one allocation made once per VM, so only an
     entry point's outputs are allocated per call (runtime/cuda_graph.py captures the forwards).

Both end in TVM's StaticPlanBlockMemory, which plans every buffer of an entry point at the
upper bounds speccompile/compiler/compile.py attaches to its symbolic sizes (passes/memory_plan.py:
buffers sized per token count would make a process grow with every new shape).

(The models use their own paged attention -- kernels/attention.py -- so the wheel's CPU
tree-attention argument-order bug in nn.llm.PagedKVCache does not reach us.)
"""
from __future__ import annotations

import tvm
from tvm import relax

from speccompile.passes.bind_gpu_threads import BindGPUThreads
from speccompile.passes.dispatch_cpu_kernels import DispatchCPUKernels
from speccompile.kernels.cpu_matmul_int8 import int8_dot_isa
from speccompile.passes.dispatch_gpu_kernels import DispatchGPUKernels
from speccompile.passes.fuse_gated_projection import FuseGatedProjection


def _dlight(kind: str) -> tvm.transform.Pass:
    from tvm.s_tir import dlight as dl

    rules = [] if kind == "metal" else [dl.gpu.Matmul()]
    rules += [dl.gpu.GEMV(), dl.gpu.LowBatchGEMV(), dl.gpu.Reduction(), dl.gpu.GeneralReduction(),
              dl.gpu.Fallback()]
    return dl.ApplyDefaultSchedule(*rules)


def _gpu_passes(target: tvm.target.Target, projections: str) -> list[tvm.transform.Pass]:
    from tvm.relax.backend.gpu_generic import pipeline as gpu

    return [
        FuseGatedProjection(projections),  # the MLP's activation in its q4 gate/up projection
        DispatchGPUKernels(projections),
        *gpu.library_dispatch_passes(target),
        relax.transform.LegalizeOps(),
        relax.transform.AnnotateTIROpPattern(),
        relax.transform.FoldConstant(),
        relax.transform.FuseOps(),
        relax.transform.FuseTIR(),
        BindGPUThreads(),
        _dlight(target.kind.name),
        *gpu.dataflow_lower_passes(target),
        *_finalize_passes(target),
    ]


def _finalize_passes(target: tvm.target.Target) -> list[tvm.transform.Pass]:
    """TVM's generic GPU finalization, with RewriteCUDAGraph after StaticPlanBlockMemory on cuda.

    Why: a captured CUDA graph replays the device addresses it was captured with. Planned
    intermediates otherwise come from the VM's pooled allocator on every call and go back
    to it on return, where a later call may take them and keep them (a draft head's hidden
    states); lifted (``vm.builtin.cuda_graph.get_cached_alloc``), they belong to the VM for
    its lifetime. The pass acts only where the PassContext sets
    ``relax.backend.use_cuda_graph`` (compile.py does for cuda)."""
    from tvm.relax.backend.gpu_generic import pipeline as gpu

    passes = list(gpu.finalize_passes(target))
    if target.kind.name == "cuda":
        at = next(i for i, p in enumerate(passes) if p.info.name == "StaticPlanBlockMemory")
        passes.insert(at + 1, relax.transform.RewriteCUDAGraph())
    return _named_symbols(passes)


def _cpu_passes(target: tvm.target.Target) -> list[tvm.transform.Pass]:
    """TVM's default CPU pipeline (relax/backend/cpu_generic), after our kernels."""
    from tvm.relax.backend.cpu_generic import pipeline as cpu

    return [DispatchCPUKernels(int8_dot_isa(target)), *cpu.library_dispatch_passes(target),
            *cpu.legalize_passes(target), *cpu.dataflow_lower_passes(target),
            *_named_symbols(cpu.finalize_passes(target))]


def _named_symbols(passes: list[tvm.transform.Pass]) -> list[tvm.transform.Pass]:
    at = next(i for i, p in enumerate(passes) if p.info.name == "AttachGlobalSymbol")
    return [*passes[:at], PrefixSystemLibSymbols(), *passes[at:]]


def PrefixSystemLibSymbols() -> tvm.transform.Pass:
    """A system library (``.tar``, ``system_lib_prefix`` set) names each kernel's symbol
    ``<prefix><name>`` up front.

    Why: TVM's AttachGlobalSymbol would otherwise rename the kernels' GlobalVars and rewrite
    every function to the new ones, and that rewrite fails on a kernel that views one of its
    parameters through a second buffer (``T.decl_buffer(data=w.data)``, as the tiled CPU
    kernels do): "Cannot treat type ir.Call as type ir.Expr". Named here, the symbol is
    already what that pass would give, so it renames nothing."""
    return tvm.transform.module_pass(_prefix_symbols, opt_level=0, name="speccompile.PrefixSystemLibSymbols")


def _prefix_symbols(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
    prefix = mod.attrs.get("system_lib_prefix") if mod.attrs is not None else None
    if not prefix:
        return mod
    updates = {}
    for gvar, func in mod.functions.items():
        if isinstance(func, tvm.tirx.PrimFunc) and (func.attrs is None or "global_symbol" not in func.attrs):
            updates[gvar] = func.with_attr("global_symbol", str(prefix) + gvar.name_hint)
    for gvar, func in updates.items():
        mod[gvar] = func
    return mod


def build_pipeline(target: tvm.target.Target, projections: str = "portable") -> tvm.transform.Pass:
    """``projections``: the GPU q4 projections' kernels ("portable" or "tensor-core"), as
    speccompile/compiler/compile.py resolved --gpu-projections."""
    kind = target.kind.name

    @tvm.transform.module_pass(opt_level=0, name="speccompile.pipeline")
    def _pipeline(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        with target:
            if kind == "llvm":
                passes = _cpu_passes(target)
            else:
                passes = _gpu_passes(target, projections)
            mod = tvm.transform.Sequential(passes)(mod)
        return mod

    return _pipeline
