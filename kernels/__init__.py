"""Every TensorIR kernel of the compiled libraries, in one place.

Projections (``cpu_matmul``, ``gpu_matmul``), attention over the paged KV cache
(``attention``, ``attention_gpu``), the fused norm and activation (``norm_gpu``,
``activation``), verification and sampling (``verification``, ``sampling``,
``rejection_gpu``) and the drafts' top-k (``draft_topk``). ``models/`` calls them from relax; ``passes/`` dispatches projections
to them. Each kernel reduces in a fixed order that does not depend on the row count, which
is what makes the library batch invariant and greedy speculation lossless.
"""
from __future__ import annotations

import functools


def kernel_cache(factory):
    """Memoize a kernel factory by its arguments and the target being built.

    Why: a model calls the same factory once per layer, and each call parses TVMScript again
    (SmolLM2's 30 layers made that 80-90% of a compile). Factories read the target they are
    built under (``building_for_cpu``, scratch scopes, vector widths), so the target is part
    of the key: a kernel made for the CPU is never handed to a GPU build in the same process.
    """
    made: dict = {}

    @functools.wraps(factory)
    def cached(*args, **kwargs):
        import tvm

        target = tvm.target.Target.current(allow_none=True)
        key = (None if target is None else str(target), args, tuple(sorted(kwargs.items())))
        if key not in made:
            made[key] = factory(*args, **kwargs)
        return made[key]

    return cached
