"""FixCPUTreeAttention: swap the two tree-attention kernels the TVM 0.27 wheel passes
in the wrong order to ``vm.builtin.paged_attention_kv_cache_create`` on llvm.

The runtime expects the paged-KV tree kernel first and the ragged tree kernel
second (the GPU branch gets this right). With the wrong order, tree verification on
CPU fails with ``Expected 16 arguments when calling tree_attn_paged_kv_cpu``.
The pass is a no-op when the order is already right, so an upstream fix is safe.
"""
from __future__ import annotations

import tvm
from tvm import relax as rx
from tvm.relax.expr_functor import PyExprMutator, mutator



def _tree_kind(arg: rx.Expr) -> str | None:
    """'paged' / 'ragged' for the two tree-attention kernel slots, else None."""
    if isinstance(arg, rx.Tuple) and len(arg.fields) == 2 and isinstance(arg.fields[1], rx.GlobalVar):
        name = arg.fields[1].name_hint
        if "tree" in name:
            return "paged" if "paged_kv" in name else "ragged"
    return None


@mutator
class _Swapper(PyExprMutator):
    def __init__(self, mod):
        super().__init__(mod)
        self.swapped = 0

    def visit_call_(self, call: rx.Call) -> rx.Expr:  # pylint: disable=arguments-renamed
        call = super().visit_call_(call)
        if not (call.args and isinstance(call.args[0], rx.ExternFunc)
                and call.args[0].global_symbol == "vm.builtin.paged_attention_kv_cache_create"):
            return call
        kinds = [_tree_kind(a) for a in call.args]
        if "ragged" in kinds and "paged" in kinds and kinds.index("ragged") < kinds.index("paged"):
            i, j = kinds.index("ragged"), kinds.index("paged")
            args = list(call.args)
            args[i], args[j] = args[j], args[i]
            self.swapped += 1
            return rx.Call(call.op, args, call.attrs, call.ty_args)
        return call


@tvm.transform.module_pass(opt_level=0, name="FixCPUTreeAttention")
class FixCPUTreeAttention:
    """Module pass; records how many cache creations it fixed in ``self.swapped``."""

    def __init__(self):
        self.swapped = 0

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        swapper = _Swapper(mod)
        for gv, func in mod.functions.items():
            if isinstance(func, rx.Function):
                new = swapper.visit_expr(func)
                swapper.builder_.update_func(gv, new)
        self.swapped = swapper.swapped
        return swapper.builder_.get()
