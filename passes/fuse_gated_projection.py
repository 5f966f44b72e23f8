"""FuseGatedProjection: the MLP's gate/up projection and its activation as one GPU kernel.

Why: a GPU decode step pays per kernel (a launch, and on devices without CUDA graphs the
host's dispatch of it: OpenCL and Vulkan on phones and boards, the C API everywhere), and
the MLP ran two where one does: the q4 projection wrote [n, 2 * inter] values that the
activation kernel (kernels/activation.py's ``swiglu``) read straight back. Both q4 kernels
have an epilogue that holds both halves of an output pair (``kernels/gpu_matmul.py``'s
``q4_gemv(gated=act)``: a warp's two rows; ``kernels/gpu_matmul_mma.py``'s ``q4_mma(gated=act)``:
a lane's fragments), so this pass rewrites

    gu = call_tir(q4_matmul, (x, qw, qs))      # tagged "q4_matmul", [n, 2 * inter]
    y  = call_tir(swiglu, (gu, gu))            # "speccompile.act" set, [n, inter]

into ``y = call_tir(gated, (x, qw, qs))`` wherever ``gu`` has no other use. The fused kernel
rounds each half to the model's dtype before the activation, as the activation kernel read
them, so a forward's bits do not change (tests/kernels/test_gpu_kernels.py holds the two
forms equal bit for bit on PoCL).

It runs for GPU builds (the projections kind --gpu-projections resolved chooses the kernel);
dense gate/up weights (q0f16, q0f32) and the CPU kernels keep their own activation kernel.
"""
from __future__ import annotations

import tvm
from tvm import relax, tirx

from speccompile.kernels import gpu_matmul as K
from speccompile.kernels import gpu_matmul_mma as MMA
from speccompile.kernels.activation import ACT_ATTR
from speccompile.kernels.attention_gpu import max_vector_lanes
from speccompile.passes.tagged_kernels import KERNEL_ATTR, OPAQUE, kernel_tag, param_dtype, param_shape

GATED_TAG = "q4_matmul_gated"


def _callee(mod: tvm.IRModule, call: relax.Call) -> tuple[relax.GlobalVar, tirx.PrimFunc] | None:
    """(GlobalVar, PrimFunc) of a ``call_tir`` to a PrimFunc of ``mod``, else None."""
    if not isinstance(call, relax.Call) or call.op != tvm.ir.Op.get("relax.call_tir"):
        return None
    gv = call.args[0]
    func = mod[gv] if isinstance(gv, relax.GlobalVar) and gv in mod.functions else None
    return (gv, func) if isinstance(func, tirx.PrimFunc) else None


def _uses(func: relax.Function) -> dict:
    """How many times each variable is read in ``func``."""
    counts: dict = {}

    @relax.expr_functor.visitor
    class _Count(relax.PyExprVisitor):
        def visit_var_(self, var):
            counts[var] = counts.get(var, 0) + 1

        def visit_dataflow_var_(self, var):
            counts[var] = counts.get(var, 0) + 1

    _Count().visit_expr(func)
    return counts


@relax.expr_functor.mutator
class _Fuse(relax.PyExprMutator):
    """Rewrites each (q4 projection, activation) pair of every relax function of ``mod``."""

    def __init__(self, mod: tvm.IRModule, projections: str):
        super().__init__(mod)
        self.mod_, self.uses, self.projections = mod, {}, projections
        self.kernels: dict = {}  # (n, k, dtype, act) -> GlobalVar of the fused kernel
        self.replaced: set = set()  # GlobalVars of the kernels the fused ones replaced
        self.fused = 0  # pairs rewritten

    def transform(self) -> tvm.IRModule:
        for gv, func in self.mod_.functions.items():
            if isinstance(func, relax.Function):
                self.uses, before = _uses(func), self.fused
                new = self.visit_expr(func)
                if self.fused > before:
                    self.builder_.update_func(gv, relax.analysis.remove_all_unused(new))
        mod = self.builder_.get()
        called = _called(mod)
        for gv in self.replaced - called:  # the projection and activation kernels nothing calls now
            mod = _without(mod, gv)
        return mod

    def visit_call_(self, call):
        call = super().visit_call_(call)
        act_call = _callee(self.mod_, call)
        if act_call is None or act_call[1].attrs is None or ACT_ATTR not in act_call[1].attrs:
            return call
        gu = call.args[1].fields[0]
        if any(not a.same_as(gu) for a in call.args[1].fields) or self.uses.get(gu, 0) != len(call.args[1].fields):
            return call  # the activation's input is read elsewhere too: keep both kernels
        bound = self.lookup_binding(gu)
        proj = _callee(self.mod_, bound) if bound is not None else None
        if proj is None or kernel_tag(proj[1]) != "q4_matmul":
            return call
        n, kw = param_shape(proj[1], 1)
        dtype, act = param_dtype(proj[1], 2), str(act_call[1].attrs[ACT_ATTR])
        key = (n, kw * 8, dtype, act)
        if key not in self.kernels:
            kernel = (MMA.q4_mma(n, kw * 8, gated=act) if self.projections == "tensor-core" and dtype == "float16" else
                      K.q4_gemv(n, kw * 8, dtype, max_lanes=max_vector_lanes(), gated=act))
            self.kernels[key] = self.builder_.add_func(
                kernel.with_attr(KERNEL_ATTR, GATED_TAG).with_attr("op_pattern", OPAQUE), f"q4_matmul_{act}")
        self.replaced.update({proj[0], act_call[0]})
        self.fused += 1
        return relax.call_tir(self.kernels[key], bound.args[1], call.ty_args[0])


def _called(mod: tvm.IRModule) -> set:
    """GlobalVars that some relax function of ``mod`` refers to."""
    seen: set = set()

    @relax.expr_functor.visitor
    class _Refs(relax.PyExprVisitor):
        def visit_global_var_(self, gv):
            seen.add(gv)

    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            _Refs().visit_expr(func)
    return seen


def _without(mod: tvm.IRModule, gv: relax.GlobalVar) -> tvm.IRModule:
    funcs = {g: f for g, f in mod.functions.items() if not g.same_as(gv)}
    return tvm.IRModule(funcs, attrs=mod.attrs, global_infos=mod.global_infos)


@tvm.transform.module_pass(opt_level=0, name="FuseGatedProjection")
class FuseGatedProjection:
    def __init__(self, projections: str = "portable"):
        self.projections = projections  # "portable" | "tensor-core", as DispatchGPUKernels

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        return _Fuse(mod, self.projections).transform()
