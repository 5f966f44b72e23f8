"""BindGPUThreads: run the model's hand-written ``T.parallel`` kernels on GPU threads.

The paged-attention, RoPE and KV-copy kernels (kernels/attention.py) are written once,
for any device, as a parallel loop over independent work items (a token, or a token and
head) whose body is serial. On a GPU each work item becomes one thread: the parallel loop
is split into ``blockIdx.x`` x ``threadIdx.x`` with a bound guard, and vectorized inner
loops become unrolled loops (GPU codegen has no 16-lane fp32 vectors). The arithmetic of
each work item is untouched, so rows are still reduced in the same fixed order in every
mode -- batch invariance, and with it greedy losslessness, carries over to the GPU.

TVM's dlight rules cannot schedule these functions (they have no blocks), which is why
this pass runs first and marks what it bound ``tir.is_scheduled``.
"""
from __future__ import annotations

import tvm
from tvm import tirx
from tvm.tirx import For, ForKind, IfThenElse, SeqStmt

THREADS = 64  # work items per thread block


def _thread_var(name: str, extent) -> tirx.IterVar:
    var = tirx.Var(name, "int64")
    dom = tvm.ir.Range.from_min_extent(tirx.const(0, "int64"), tirx.Cast("int64", extent))
    return tirx.IterVar(dom, var, 1, name)  # 1 = ThreadIndex


def _bind(loop: For) -> tirx.Stmt:
    """for t in parallel(n): body  ->  bx, tx thread loops; t = bx*THREADS + tx; if t < n: body."""
    dtype = str(loop.loop_var.ty)
    extent = tirx.Cast("int64", loop.extent)
    blocks = tirx.floordiv(extent + (THREADS - 1), THREADS)
    bx, tx = _thread_var("blockIdx.x", blocks), _thread_var("threadIdx.x", THREADS)
    index = tirx.Cast(dtype, bx.var * THREADS + tx.var)
    body = SeqStmt([tirx.Bind(loop.loop_var, index),
                    IfThenElse(loop.loop_var < loop.extent, _devectorize(loop.body), None)])
    inner = For(tx.var, tirx.const(0, "int64"), tirx.const(THREADS, "int64"), ForKind.THREAD_BINDING, body, thread_binding=tx)
    return For(bx.var, tirx.const(0, "int64"), blocks, ForKind.THREAD_BINDING, inner, thread_binding=bx)


def _rebuild(stmt: tirx.Stmt, fn) -> tirx.Stmt:
    """Apply ``fn`` to the children of a structural statement; leaves others alone."""
    if isinstance(stmt, SeqStmt):
        return SeqStmt([fn(s) for s in stmt.seq])
    if isinstance(stmt, For):
        return For(stmt.loop_var, stmt.min, stmt.extent, stmt.kind, fn(stmt.body),
                   thread_binding=stmt.thread_binding, annotations=stmt.annotations)
    if isinstance(stmt, IfThenElse):
        return IfThenElse(stmt.condition, fn(stmt.then_case),
                          None if stmt.else_case is None else fn(stmt.else_case))
    if isinstance(stmt, tirx.AttrStmt):
        return tirx.AttrStmt(stmt.node, stmt.attr_key, stmt.value, fn(stmt.body))
    return stmt


def _devectorize(stmt: tirx.Stmt) -> tirx.Stmt:
    if isinstance(stmt, For) and stmt.kind == ForKind.VECTORIZED:
        return For(stmt.loop_var, stmt.min, stmt.extent, ForKind.UNROLLED, _devectorize(stmt.body),
                   annotations=stmt.annotations)
    return _rebuild(stmt, _devectorize)


def _bind_parallel(stmt: tirx.Stmt) -> tirx.Stmt:
    if isinstance(stmt, For) and stmt.kind == ForKind.PARALLEL:
        return _bind(stmt)
    return _rebuild(stmt, _bind_parallel)


def _has_kind(stmt: tirx.Stmt, kind: ForKind) -> bool:
    found = []

    def visit(s):
        if isinstance(s, For) and s.kind == kind:
            found.append(s)
        return _rebuild(s, visit) if not found else s

    visit(stmt)
    return bool(found)


def bind_function(func: tirx.PrimFunc) -> tirx.PrimFunc | None:
    """The GPU version of a parallel-loop kernel, or None if it is not one."""
    if func.attrs is not None and "tirx.is_scheduled" in func.attrs:
        return None
    if not _has_kind(func.body, ForKind.PARALLEL) or _has_kind(func.body, ForKind.THREAD_BINDING):
        return None
    return func.with_body(_bind_parallel(func.body)).with_attr("tirx.is_scheduled", True)


@tvm.transform.module_pass(opt_level=0, name="BindGPUThreads")
class BindGPUThreads:
    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        updates = {}
        for gv, func in mod.functions.items():
            if isinstance(func, tirx.PrimFunc):
                new = bind_function(func)
                if new is not None:
                    updates[gv] = new
        for gv, func in updates.items():
            mod[gv] = func
        return mod
