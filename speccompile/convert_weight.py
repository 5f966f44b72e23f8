"""``speccompile convert_weight``: checkpoint -> quantized shards + tensor-cache.json.

The parameter list comes from the same nn.Module that is compiled, so names, shapes and
dtypes cannot drift between conversion and compilation. Tensors stream one logical
weight at a time (a 1.5B model never has two copies in memory).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from speccompile.models import build_model, get_quantization
from speccompile.models.llama import hf_source_map
from speccompile.models.quantization import quantize_q4
from speccompile.runtime.tensor_cache import TensorCacheWriter
from speccompile.sources import SourceError, open_source

SUFFIXES = (".q_weight", ".q_scale")


def logical_name(param: str) -> str:
    for s in SUFFIXES:
        if param.endswith(s):
            return param[: -len(s)] + ".weight"
    return param


def convert_weight(src: Path, quantization: str, out_dir: Path, model_type: str = "auto", progress: bool = True) -> Path:
    quant = get_quantization(quantization)  # validate before any long work
    source = open_source(Path(src))
    cfg = source.config
    if model_type not in ("auto", cfg.model_type):
        raise SourceError(f"--model-type {model_type} does not match the checkpoint ({cfg.model_type})")
    model = build_model(cfg, quant)
    params = [(n, p) for n, p in model.named_parameters()]
    smap = hf_source_map(cfg)
    available = set(source.names())
    missing = sorted({h for n, _ in params for h in smap[logical_name(n)] if h not in available})
    if missing:
        raise SourceError(f"{src} lacks tensor(s) the {cfg.model_type} model needs: {missing[:5]}")
    if quant.is_q4:
        bad = [n for n, p in params if n.endswith(".q_weight") and int(p.shape[1]) * 8 % 32]
        if bad:
            raise SourceError(f"q4 needs input dims divisible by 32; {bad[0]} is not")

    writer = TensorCacheWriter(out_dir, {"model_type": cfg.model_type, "quantization": quant.name,
                                         "source": str(Path(src).resolve())})
    cache: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    items = params
    if progress:
        from tqdm import tqdm

        items = tqdm(params, desc="convert_weight", unit="tensor")
    for name, p in items:
        logical = logical_name(name)
        expected = tuple(int(d) for d in p.shape)
        if name.endswith(SUFFIXES):
            if logical not in cache:
                w = _gather(source, smap[logical])
                cache.clear()  # keep at most one logical weight in memory
                cache[logical] = quantize_q4(w, quant.model_dtype)
                del w
            arr = cache[logical][0 if name.endswith(".q_weight") else 1]
        else:
            arr = _gather(source, smap[logical]).astype(p.dtype)
        if arr.shape != expected:
            raise SourceError(f"{name}: checkpoint gives shape {arr.shape}, the model expects {expected}")
        writer.add(name, arr)
    path = writer.finish()
    (Path(out_dir) / "model-config.json").write_text(json.dumps(cfg.to_dict(), indent=1))
    return path


def _gather(source, names: list[str]) -> np.ndarray:
    parts = [source.get(n) for n in names]
    return parts[0] if len(parts) == 1 else np.concatenate(parts, axis=0)
