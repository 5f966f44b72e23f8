"""``speccompile compile``: model config -> one shared library with a ``_metadata`` function.

Compile-time facts (model type, quantization, parameter layout and its fingerprint,
target, TVM version, which q4 tensors the CPU kernels expect tiled) are baked into the
library; the runtime reads them back and refuses weights that do not match.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import tvm
from tvm import relax

from speccompile import __version__
from speccompile.models import LlamaConfig, build_model, get_quantization
from speccompile.passes.cpu_kernels import TILE, is_tiled_param
from speccompile.passes.pipeline import build_pipeline
from speccompile.runtime.tensor_cache import layout_fingerprint

SUPPORTED_DEVICES = ("llvm", "cpu", "auto")


class CompileError(ValueError):
    pass


def detect_target(device: str) -> tvm.target.Target:
    """Resolve --device to a TVM target; llvm gets the host CPU and its core count."""
    if device in ("llvm", "cpu", "auto"):
        cpu = tvm.target.codegen.llvm_get_system_cpu()
        cores = os.cpu_count() or 1
        return tvm.target.Target({"kind": "llvm", "mcpu": cpu, "num-cores": cores})
    raise CompileError(f"device {device!r} is not supported yet; supported here: llvm (host CPU)")


def read_config(path: Path) -> dict[str, Any]:
    path = Path(path)
    if path.is_dir():
        path = path / "speccompile-config.json"
    if not path.exists():
        raise CompileError(f"{path} not found: run `speccompile gen_config` first")
    conf = json.loads(path.read_text())
    for key in ("model_config", "quantization", "model_type"):
        if key not in conf:
            raise CompileError(f"{path} lacks {key!r}; regenerate it with `speccompile gen_config`")
    return conf


def build_metadata(cfg: LlamaConfig, quant_name: str, target: tvm.target.Target,
                   params: list[tuple[str, Any]], entry_points: list[str]) -> dict[str, Any]:
    """The compile-time facts the runtime reads back and checks (see module doc)."""
    entries = [(name, [int(d) for d in p.shape], str(p.dtype)) for name, p in params]
    tiled = []
    if target.kind.name == "llvm":
        tiled = [n for n, shape, _ in entries if is_tiled_param(n, shape)]
    return {
        "speccompile_version": __version__,
        "tvm_version": tvm.__version__,
        "model_type": cfg.model_type,
        "quantization": quant_name,
        "target": str(target.kind.name),
        "target_json": str(target),
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "num_hidden_layers": cfg.num_hidden_layers,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "context_window_size": cfg.context_window_size,
        "prefill_chunk_size": cfg.prefill_chunk_size,
        "entry_points": entry_points,
        "model_dtype": get_quantization(quant_name).model_dtype,
        "params": [{"name": n, "shape": s, "dtype": d} for n, s, d in entries],
        "layout_fingerprint": layout_fingerprint(entries),
        "tiled_params": tiled,  # stored tensors the runtime permutes into 16-row tiles at load
        "tile": TILE,
    }


def attach_metadata(mod: tvm.IRModule, metadata: dict) -> tvm.IRModule:
    bb = relax.BlockBuilder(mod)
    with bb.function("_metadata", params=[]):
        bb.emit_func_output(relax.expr.String(json.dumps(metadata)))
    return bb.get()


def compile_model(config_path: Path, device: str, output: Path, verbose: bool = True) -> dict:
    conf = read_config(Path(config_path))
    cfg = LlamaConfig.from_dict(conf["model_config"])
    quant = get_quantization(conf["quantization"])
    target = detect_target(device)
    output = Path(output)
    if output.suffix not in (".so", ".dylib", ".dll"):
        raise CompileError(f"output {output} should end in .so")
    output.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    with target:
        model = build_model(cfg, quant, target)
        spec = model.get_spec()
        mod, params = model.export_tvm(spec=spec)
    metadata = build_metadata(cfg, quant.name, target, params, list(spec))
    mod = attach_metadata(mod, metadata)
    ex = tvm.compile(mod, target=target, relax_pipeline=build_pipeline(target))
    tmp = output.with_name(output.name + ".tmp.so")
    ex.export_library(str(tmp))
    tmp.replace(output)
    if verbose:
        print(f"compiled {cfg.model_type} {quant.name} for {target.kind.name} "
              f"({target.attrs.get('mcpu', '')}) in {time.time() - t0:.1f}s -> {output}")
    return metadata
