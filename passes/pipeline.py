"""The one compilation pipeline: which passes run, in which order, per target.

Phases:
  1. kernel dispatch: our TensorIR kernels for the model's tagged matmuls (llvm);
  2. TVM's default lowering (legalize, fuse, lower to the VM).

(The models use their own paged attention -- models/attention.py -- so the wheel's CPU
tree-attention argument-order bug in nn.llm.PagedKVCache does not reach us.)
"""
from __future__ import annotations

import tvm
from tvm import relax

from .dispatch_cpu_kernels import DispatchCPUKernels


def build_pipeline(target: tvm.target.Target) -> tvm.transform.Pass:
    kind = target.kind.name

    @tvm.transform.module_pass(opt_level=0, name="speccompile.pipeline")
    def _pipeline(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        with target:
            passes = []
            if kind == "llvm":
                passes += [DispatchCPUKernels()]
            passes += [relax.pipeline.get_default_pipeline(target)]
            mod = tvm.transform.Sequential(passes)(mod)
        return mod

    return _pipeline
