"""Static memory planning of the entry points: upper bounds for their symbolic dimensions,
and a record of what TVM planned.

Why. The entry points take symbolic token counts (``n``, ``nl``, ``b`` ...:
runtime/contract.py's SYMBOLIC_DIM_BOUNDS). Without bounds, TVM's StaticPlanBlockMemory
can only share buffers of symbolically equal size, so every buffer a call allocates has a
size computed from its token count at run time. The relax VM's pooled allocator keeps
each freed buffer for reuse *by its exact size* (rounded to 4 KB) and never returns it,
so each new token count left a new set of buffers behind: memory grew with every new
prompt length or batch shape and never came back (SmolLM2 q0f32: 1.1 -> 1.4 GB over 55
prompt lengths). With ``tir_var_upper_bound`` the pass plans every intermediate at the
bound, and ``relax.memory_plan_dynamic_func_output`` does the same for the outputs (MLC-LLM
sets both): each call then allocates buffers of a few fixed sizes, which the pool reuses
for every shape. On CPU a buffer sized for the bound costs address space only: the pages
a smaller forward never touches are never made resident.

:func:`attach_upper_bounds` sets both attributes on every entry point (and refuses a
symbolic dimension the contract does not list); :class:`MemoryPlanRecorder` watches the
compile and records, per entry point, the bytes planned and any allocation whose size is
still symbolic -- which ``speccompile compile`` refuses, as it would bring the growth back.
"""
from __future__ import annotations

import tvm
from tvm import relax

from speccompile.runtime.contract import SYMBOLIC_DIM_BOUNDS, symbolic_dim_bounds

PLAN_OUTPUTS = "relax.memory_plan_dynamic_func_output"
UPPER_BOUND = "tir_var_upper_bound"


def signature_dims(func: relax.Function) -> list[str]:
    """Names of the symbolic dimensions in a relax function's signature."""
    return sorted({v.name for v in relax.analysis.tir_vars_in_type(func.ty)})


def attach_upper_bounds(mod: tvm.IRModule, prefill_chunk_size: int) -> tvm.IRModule:
    """Every relax function of ``mod`` (updated in place and returned) with
    ``tir_var_upper_bound`` for the bounded dimensions of its signature and
    ``relax.memory_plan_dynamic_func_output``."""
    bounds = symbolic_dim_bounds(prefill_chunk_size)
    for gv, func in list(mod.functions.items()):
        if not isinstance(func, relax.Function):
            continue
        dims = signature_dims(func)
        unknown = [d for d in dims if d not in SYMBOLIC_DIM_BOUNDS]
        if unknown:
            raise ValueError(f"entry point {gv.name_hint} has symbolic dimension(s) {', '.join(unknown)} that "
                             "runtime/contract.py's SYMBOLIC_DIM_BOUNDS does not list: give each a bound there "
                             "(or None if it shapes no buffer), or the library's memory grows with every new shape")
        func = func.with_attr(UPPER_BOUND, {d: tvm.tirx.IntImm("int64", bounds[d]) for d in dims if d in bounds})
        mod[gv] = func.with_attr(PLAN_OUTPUTS, True)
    return mod


def _int(expr) -> int | None:
    return int(expr.value) if isinstance(expr, tvm.tirx.IntImm) else None


def planned_allocations(mod: tvm.IRModule) -> dict[str, dict]:
    """Per relax function of a module right after StaticPlanBlockMemory: ``bytes``, the
    storage it allocates per call with a size fixed at compile time, and ``dynamic``, the
    allocations whose size still depends on a symbolic dimension (printed)."""
    alloc_storage = tvm.ir.Op.get("relax.memory.alloc_storage")
    alloc_tensor = tvm.ir.Op.get("relax.builtin.alloc_tensor")
    out: dict[str, dict] = {}
    for gv, func in mod.functions.items():
        if not isinstance(func, relax.Function):
            continue
        rec = {"bytes": 0, "dynamic": []}

        def visit(expr, rec=rec):
            if not isinstance(expr, relax.Call):
                return
            if expr.op.same_as(alloc_storage):
                size = _int(expr.args[0].values[0])
                if size is None:
                    rec["dynamic"].append(f"storage of {expr.args[0].values[0]} bytes")
                else:
                    rec["bytes"] += size
            elif expr.op.same_as(alloc_tensor):  # left unplanned by the pass
                dims = [_int(d) for d in expr.args[0].values]
                dtype = tvm.runtime.DataType(str(expr.args[1].value))
                if None in dims:
                    rec["dynamic"].append(f"tensor {list(expr.args[0].values)} {dtype}")
                else:
                    size = dtype.bits * dtype.lanes // 8
                    for d in dims:
                        size *= d
                    rec["bytes"] += size

        relax.analysis.post_order_visit(func.body, visit)
        out[gv.name_hint] = rec
    return out


@tvm.ir.instrument.pass_instrument
class MemoryPlanRecorder:
    """A pass instrument: ``plan`` holds :func:`planned_allocations` of the module as
    StaticPlanBlockMemory left it."""

    def __init__(self):
        self.plan: dict[str, dict] | None = None

    def run_after_pass(self, mod, info):
        if info.name == "StaticPlanBlockMemory":
            self.plan = planned_allocations(mod)
