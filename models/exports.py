"""A model's ``get_spec`` built from the contract's entry-point table (runtime/contract.py).

Why: ``nn.Module.export_tvm`` compiles each method with the arguments of its Python
signature, whatever a hand-written spec dict lists, so the runtime's calling order was
only as right as someone's memory of each method. Here the spec is derived from the
contract's table and every method's signature is checked against it: a method whose
arguments differ from what the runtimes pass stops the compile, naming both. What was
exported is recorded in ``_metadata["entry_points"]`` (:func:`signatures`), which the
loaders check in turn.
"""
from __future__ import annotations

import inspect
from typing import Any

from tvm.relax.frontend import nn

from speccompile.runtime.contract import ENTRY_POINTS, FORWARD_META, PARAMS, entry_point_names


def forward_meta_specs() -> dict[str, nn.spec.Tensor]:
    """The per-forward token metadata tensors, by name."""
    return {name: nn.spec.Tensor(list(shape), dtype) for name, (shape, dtype) in FORWARD_META.items()}


def contract_spec(module: nn.Module, kind: str, tensors: dict[str, Any],
                  metadata: dict[str, Any] | None = None) -> dict[str, Any]:
    """``get_spec`` for ``module``: each entry point of ``kind`` -- optional ones where
    ``metadata`` (the config's extra ``_metadata``) says so, by the rule the loaders
    apply -- its arguments' specs taken by name from ``tensors`` (``"entry.arg"`` keys
    override ``"arg"`` for that entry point alone)."""
    spec: dict[str, Any] = {}
    for name in entry_point_names(kind, metadata or {}):
        args = ENTRY_POINTS[kind][name]
        inputs = tuple(a for a in args if a != PARAMS)
        takes = tuple(inspect.signature(getattr(module, name)).parameters)
        if takes != inputs:
            raise TypeError(f"{type(module).__name__}.{name} takes ({', '.join(takes)}) but runtime/contract.py "
                            f"says the runtimes pass ({', '.join(inputs)}): change one to match the other")
        mode = "packed" if PARAMS in args else "none"
        spec[name] = {**{a: tensors[f"{name}.{a}" if f"{name}.{a}" in tensors else a] for a in inputs},
                      "$": {"param_mode": mode, "effect_mode": "none"}}
    return spec


def signatures(spec: dict[str, Any]) -> dict[str, list[str]]:
    """Entry point -> argument names in calling order, as the compiled library takes them
    (call before ``export_tvm``, which consumes the specs' ``$`` entries)."""
    out = {}
    for name, entry in spec.items():
        packed = entry.get("$", {}).get("param_mode") == "packed"
        out[name] = [a for a in entry if a != "$"] + ([PARAMS] if packed else [])
    return out
