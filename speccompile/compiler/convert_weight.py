"""``speccompile convert_weight``: checkpoint -> quantized shards + tensor-cache.json.

The parameter list comes from the same nn.Module that is compiled, so names, shapes and
dtypes cannot drift between conversion and compilation. Tensors stream one logical
weight at a time (a 1.5B model never has two copies in memory). Draft heads (``eagle``,
``medusa``) go through the same loop; their source is checked against ``--target`` and
every tensor's shape is checked before the first one is converted.

Where TVM's compiler is not installed (a GPU machine that carries TVM's runtime alone),
the parameter list comes from a compiled library's ``_metadata`` instead (``layout``,
``--layout-from LIB``): the compiler recorded it from that same nn.Module, so the
converted weights carry the library's layout fingerprint. Nothing here imports TVM.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from speccompile.models import HEAD_TYPES, MODELS, build_model, get_quantization, source_map
from speccompile.models.config import hf_weight_offset
from speccompile.models.quant_codec import quantize_q4
from speccompile.runtime.contract import baked_metadata
from speccompile.runtime.tensor_cache import TensorCacheWriter
from speccompile.compiler.sources import HeadSource, SourceError, detect_head, open_source

SUFFIXES = (".q_weight", ".q_scale")


def logical_name(param: str) -> str:
    for s in SUFFIXES:
        if param.endswith(s):
            return param[: -len(s)] + ".weight"
    return param


def open_any(src: Path, model_type: str = "auto", target: Path | None = None, config_overrides: dict | None = None):
    """The checkpoint as a source: a target model, or an eagle/eagle3/medusa head (needs ``target``);
    ``--model-type eagle`` reads EAGLE-1 and EAGLE-3 checkpoints alike (told apart by their tensors).
    ``config_overrides`` (``--overrides``: ``medusa_num_heads``/``medusa_num_layers``) replace
    the head's config.json fields; they mean nothing for another kind of checkpoint."""
    kinds = ("auto", *MODELS)
    if model_type not in kinds:
        raise SourceError(f"unknown --model-type {model_type!r}; choose one of {', '.join(kinds)}")
    head = model_type if model_type in HEAD_TYPES else (detect_head(Path(src)) if model_type == "auto" else None)
    if head == "eagle" and detect_head(Path(src)) == "eagle3":  # users ask for "eagle", whichever generation
        head = "eagle3"
    if config_overrides and head != "medusa":
        raise SourceError(f"--overrides {', '.join(config_overrides)} apply to Medusa heads (--model-type medusa); "
                          f"{src} is {'an ' + head + ' head' if head else 'not a draft head'}")
    if head:
        return HeadSource(head, Path(src), Path(target) if target else None, config_overrides)
    source = open_source(Path(src))
    if model_type not in ("auto", source.config.model_type):
        raise SourceError(f"--model-type {model_type} does not match the checkpoint ({source.config.model_type})")
    return source


def library_layout(lib: Path) -> dict:
    """A compiled library's ``_metadata`` (read from its bytes, no TVM), for ``layout_from``."""
    meta = baked_metadata(Path(lib)) if Path(lib).is_file() else None
    if meta is None or "params" not in meta:
        raise SourceError(f"{lib} is not a library built by `speccompile compile` (no _metadata with a parameter "
                          "list found in it)")
    return meta


def convert_weight(src: Path, quantization: str, out_dir: Path, model_type: str = "auto", progress: bool = True,
                   target: Path | None = None, config_overrides: dict | None = None,
                   layout_from: Path | None = None) -> Path:
    """``layout_from``: a library compiled for this checkpoint's config, whose recorded
    parameter list replaces building the model (no TVM compiler needed); targets only."""
    quant = get_quantization(quantization)  # validate before any long work
    source = open_any(Path(src), model_type, target, config_overrides)
    cfg = source.config
    if layout_from is None:
        params = [(n, tuple(int(d) for d in p.shape), str(p.dtype)) for n, p in build_model(cfg, quant).named_parameters()]
    else:
        params = _library_params(library_layout(layout_from), cfg, quant.name, layout_from)
    smap = source_map(cfg)
    available = set(source.names())
    missing = sorted({h for n, *_ in params for h in smap[logical_name(n)] if h not in available})
    if missing:
        raise SourceError(f"{src} lacks tensor(s) the {cfg.model_type} model needs: {missing[:5]}")
    if hasattr(source, "shape"):  # heads: every shape checked before the first tensor is converted
        _check_shapes(source, params, smap)
    if quant.is_q4:
        bad = [n for n, shape, _ in params if n.endswith(".q_weight") and shape[1] * 8 % 32]
        if bad:
            raise SourceError(f"q4 needs input dims divisible by 32; {bad[0]} is not")

    writer = TensorCacheWriter(out_dir, {"model_type": cfg.model_type, "quantization": quant.name,
                                         "source": str(Path(src).resolve())})
    cache: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    items = params
    if progress:
        from tqdm import tqdm

        items = tqdm(params, desc="convert_weight", unit="tensor")
    for name, expected, dtype in items:
        logical = logical_name(name)
        if name.endswith(SUFFIXES):
            if logical not in cache:
                w = _gather(source, smap[logical], _offset(source, cfg, logical))
                cache.clear()  # keep at most one logical weight in memory
                cache[logical] = quantize_q4(w, quant.model_dtype)
                del w
            arr = cache[logical][0 if name.endswith(".q_weight") else 1]
        else:
            arr = _gather(source, smap[logical], _offset(source, cfg, logical)).astype(dtype)
        if arr.shape != expected:
            raise SourceError(f"{name}: checkpoint gives shape {arr.shape}, the model expects {expected}")
        writer.add(name, arr)
    path = writer.finish()
    (Path(out_dir) / "model-config.json").write_text(json.dumps(cfg.to_dict(), indent=1))
    return path


def _library_params(meta: dict, cfg, quant_name: str, lib: Path) -> list[tuple[str, tuple[int, ...], str]]:
    """The library's parameters as (name, shape, dtype), after checking that it was built
    for this kind of model and quantization (its sizes are checked tensor by tensor)."""
    if cfg.model_type in HEAD_TYPES:
        raise SourceError("--layout-from converts target models; convert draft heads where TVM's compiler is "
                          "installed")
    if (meta.get("model_type"), meta.get("quantization")) != (cfg.model_type, quant_name):
        raise SourceError(f"{lib} was built for {meta.get('model_type')} {meta.get('quantization')}, not "
                          f"{cfg.model_type} {quant_name}")
    return [(p["name"], tuple(int(d) for d in p["shape"]), str(p["dtype"])) for p in meta["params"]]


def _offset(source, cfg, logical: str) -> float:
    """What to add to a tensor: Gemma's norms are stored less one by HF, as 1 + w by llama.cpp."""
    return 0.0 if getattr(source, "norms_shifted", False) else hf_weight_offset(cfg, logical)


def _gather(source, names: list[str], offset: float = 0.0) -> np.ndarray:
    parts = [source.get(n) for n in names]
    w = parts[0] if len(parts) == 1 else np.concatenate(parts, axis=0)
    return w if not offset else (w.astype(np.float32) + np.float32(offset))


def _check_shapes(source, params, smap) -> None:
    for name, shape, _ in params:
        if name.endswith(".q_scale"):
            continue
        shape = list(shape)
        if name.endswith(".q_weight"):
            shape[1] *= 8
        parts = [source.shape(h) for h in smap[logical_name(name)]]
        got = (sum(s[0] for s in parts), *parts[0][1:]) if parts and all(len(s) == len(parts[0]) for s in parts) else None
        if got != tuple(shape):
            raise SourceError(f"{', '.join(smap[logical_name(name)])} of shape {[list(s) for s in parts]} cannot form "
                              f"{logical_name(name)} {shape}: the checkpoint does not fit this target's sizes")
