"""The one compilation pipeline: which passes run, in which order, per target.

Phases:
  1. fix-ups of upstream TVM (FixCPUTreeAttention on llvm);
  2. kernel dispatch: our TensorIR kernels for tagged matmuls (llvm), dlight rules (GPU);
  3. TVM's default lowering (legalize, fuse, lower to the VM).
"""
from __future__ import annotations

import tvm
from tvm import relax

from .dispatch_cpu_kernels import DispatchCPUKernels
from .fix_cpu_tree_attention import FixCPUTreeAttention


def build_pipeline(target: tvm.target.Target) -> tvm.transform.Pass:
    kind = target.kind.name

    @tvm.transform.module_pass(opt_level=0, name="speccompile.pipeline")
    def _pipeline(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        with target:
            passes = []
            if kind == "llvm":
                passes += [FixCPUTreeAttention(), DispatchCPUKernels()]
            passes += [relax.pipeline.get_default_pipeline(target)]
            mod = tvm.transform.Sequential(passes)(mod)
        return mod

    return _pipeline
