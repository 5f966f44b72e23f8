"""MLC-LLM's ``--overrides`` and ``--mode``, so that its documented command lines work here.

MLC-LLM users pass engine settings as ``--overrides "max_num_sequence=6;prefill_chunk_size=512"``
and pick a memory preset with ``--mode local|interactive|server``. This module is the one
parser and the one table of keys every command uses: ``serve``, ``chat``, ``generate`` and
``bench`` take run-time engine settings, ``gen_config`` (and ``convert_weight``, whose tensors
must match) model-config fields. Keys carry MLC-LLM's names; each maps to one of our options
or Engine arguments (see ``KEYS``).

Precedence, lowest first: the command's defaults, the ``--mode`` preset, then explicit
options and overrides. An option and an override that set the same thing must agree: two
different values are refused rather than one silently winning, since either could be the
one the user meant.

The CLI side (compile-side imports allowed); the runtime never imports this module.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from speccompile.runtime.contract import KV_PAGE_SIZE as PAGE, read_model_config  # PAGE: tokens per KV page
from speccompile.runtime.options import (RUNTIME_COMMANDS, EngineConfig, ModelConfigFields, Option, configs_from,
                                         options_of)
from speccompile.runtime.speculative import SpeculativeConfig

SYNTAX = 'key=value pairs separated by ";" or spaces, e.g. --overrides "max_num_sequence=6;prefill_chunk_size=512"'
MODES = ("local", "interactive", "server")
LOCAL_MAX_NUM_SEQUENCE = 4  # a desktop: a few concurrent requests, as MLC-LLM's local mode
# --mode server takes this share of MemAvailable (after the weights) for KV pages unless
# gpu_memory_utilization says otherwise: on a CPU host the memory is shared with the OS
# and every other program, so half rather than MLC-LLM's 0.85 of a dedicated GPU.
DEFAULT_MEMORY_UTILIZATION = 0.5
MEMINFO = Path("/proc/meminfo")


class OverrideError(ValueError):
    """A bad --overrides string or --mode combination, found before anything loads."""


@dataclass(frozen=True)
class OverrideKey:
    """One accepted key: an option of a config class (runtime/options.py) under its MLC-LLM
    name, for the commands that take it (``option``: click's parameter name of the flag
    that sets the same thing, if any)."""

    spec: Option
    commands: tuple[str, ...]

    @property
    def name(self) -> str:
        return self.spec.override

    @property
    def option(self) -> str | None:
        return self.spec.name if self.spec.flag else None

    @property
    def flag(self) -> str | None:
        return self.spec.flag

    def convert(self, raw: str) -> int | float:
        try:
            value = self.spec.kind(raw)
        except ValueError:
            value = None
        why = "type" if value is None else self.spec.problem(value)
        given, takes = f"--overrides {self.name}={raw}", f"{self.name} takes {self.spec.expect()} ({self.spec.help})"
        if why == "range":
            raise OverrideError(f"{given} is out of range: {takes}")
        if why:
            raise OverrideError(f"{given}: {takes}")
        return value


# --mode server's memory share: a key of the preset below, not an engine setting
MEMORY_UTILIZATION = Option("gpu_memory_utilization", float, None,
                            f"--mode server: share of available memory (after weights) for the KV cache, default "
                            f"{DEFAULT_MEMORY_UTILIZATION}", low=0.01, high=1.0, override="gpu_memory_utilization",
                            commands=("serve",))
KEYS: tuple[OverrideKey, ...] = (
    *(OverrideKey(o, o.commands) for cls in (EngineConfig, SpeculativeConfig, ModelConfigFields)
      for o in options_of(cls) if o.override),
    OverrideKey(MEMORY_UTILIZATION, MEMORY_UTILIZATION.commands),
)
MEDUSA_KEYS = ("medusa_num_heads", "medusa_num_layers")

# MLC-LLM keys with no counterpart here, and why (so the error says more than "unknown").
UNSUPPORTED = {
    "tensor_parallel_shards": "speccompile runs a model on one device",
    "pipeline_parallel_stages": "speccompile runs a model on one device",
    "sliding_window_size": "no sliding-window attention (Llama/Qwen2 use the full window)",
    "attention_sink_size": "no sliding-window attention",
    "prefix_cache_mode": "no prefix cache: each request prefills its prompt",
    "prefix_cache_max_num_recycling_seqs": "no prefix cache",
    "max_history_size": "no prefix cache",
    "prefill_mode": "prefill is always chunked (see prefill_chunk_size)",
    "opt": "optimization flags belong to compile, which has no --opt",
}


def keys_for(command: str) -> dict[str, OverrideKey]:
    return {k.name: k for k in KEYS if command in k.commands}


def _accepted(command: str) -> str:
    names = ", ".join(keys_for(command)) or "(none)"
    return f"`{command} --overrides` accepts: {names}"


def parse_overrides(text: str | None, command: str) -> dict[str, int | float]:
    """``"a=1;b=2"`` (or ``"a=1 b=2"``) -> ``{"a": 1, "b": 2}``, every key and value checked."""
    accepted = keys_for(command)
    out: dict[str, int | float] = {}
    for item in re.split(r"[;\s]+", (text or "").strip()):
        if not item:
            continue
        name, sep, raw = item.partition("=")
        if not sep or not name or not raw:
            raise OverrideError(f"--overrides {item!r} is not key=value: give {SYNTAX}. {_accepted(command)}")
        key = accepted.get(name)
        if key is None:
            raise OverrideError(_unknown(name, command))
        if name in out:
            raise OverrideError(f"--overrides sets {name} twice; give each key once. {_accepted(command)}")
        try:
            out[name] = key.convert(raw)
        except OverrideError as err:
            raise OverrideError(f"{err}. {_accepted(command)}") from None
    return out


def _unknown(name: str, command: str) -> str:
    why = ""
    if name in UNSUPPORTED:
        why = f" (an MLC-LLM setting speccompile does not have: {UNSUPPORTED[name]})"
    else:
        elsewhere = sorted({c for k in KEYS if k.name == name for c in k.commands})
        if elsewhere:
            why = f" (a key of {', '.join(elsewhere)})"
    return f"unknown --overrides key {name!r} for {command}{why}. {_accepted(command)}"


def merge_options(command: str, overrides: dict[str, Any], params: dict[str, Any],
                  typed: set[str]) -> dict[str, Any]:
    """Overrides plus the options the user typed for the same keys (``typed``: click
    parameter names given on the command line). Different values for one key are an error."""
    settings = dict(overrides)
    for key in keys_for(command).values():
        if key.option is None or key.option not in typed:
            continue
        value = params[key.option]
        if key.name in settings and settings[key.name] != value:
            raise OverrideError(f"{key.flag} {value} and --overrides {key.name}={settings[key.name]} disagree: "
                                "an option and an override that set the same thing must agree; give it once")
        settings[key.name] = value
    return settings


def option_defaults(command: str, params: dict[str, Any]) -> dict[str, Any]:
    """The command's own defaults for keys it has an option for (None: no default)."""
    return {k.name: params[k.option] for k in keys_for(command).values()
            if k.option and params.get(k.option) is not None}


# ------------------------------------------------------------------ --mode presets
@dataclass
class ModelFacts:
    """What the presets need, read from speccompile-config.json and the libraries' baked
    ``_metadata`` (from the file's bytes: nothing is loaded)."""

    context_window: int
    prefill_chunk: int  # the library's compiled chunk (or the config's, if smaller)
    max_batch_size: int  # gen_config --max-batch-size
    kv_bytes_per_token: int  # target plus any draft model or head holding a KV cache
    weight_bytes: int  # every model's parameters
    device: str  # the target library's TVM target kind


def _library_meta(lib: Path) -> dict:
    from speccompile.runtime.model import baked_metadata

    lib = Path(lib)
    if not lib.exists():
        raise OverrideError(f"model library {lib} not found: build it with `speccompile compile`")
    meta = baked_metadata(lib)
    if meta is None:
        raise OverrideError(f"{lib} has no speccompile _metadata; it was not built by `speccompile compile`")
    return meta


def _kv_and_weight_bytes(meta: dict) -> tuple[int, int]:
    import numpy as np

    size = np.dtype(meta["model_dtype"]).itemsize
    kv = int(meta["num_hidden_layers"]) * 2 * int(meta["num_key_value_heads"]) * int(meta["head_dim"]) * size
    weights = sum(int(np.prod(p["shape"])) * np.dtype(p["dtype"]).itemsize for p in meta["params"])
    return kv, weights


def model_facts(model_dir: Path, model_lib: Path, additional_models: str | None = None) -> ModelFacts:
    config = read_model_config(Path(model_dir))
    meta = _library_meta(model_lib)
    kv, weights = _kv_and_weight_bytes(meta)
    parts = [p for p in (additional_models or "").split(",") if p]
    if len(parts) == 2 and Path(parts[1]).exists():  # a bad pair is the engine's error to give
        extra_kv, extra_weights = _kv_and_weight_bytes(_library_meta(Path(parts[1])))
        kv, weights = kv + extra_kv, weights + extra_weights
    chunk = min(int(meta["prefill_chunk_size"]), int(config.get("prefill_chunk_size", meta["prefill_chunk_size"])))
    return ModelFacts(int(config["context_window_size"]), chunk,
                      int(config.get("max_batch_size", 8)), kv, weights, str(meta.get("target", "llvm")))


def mem_available(path: Path | None = None) -> int:
    """MemAvailable of /proc/meminfo in bytes: what the kernel can give without swapping."""
    path = path or MEMINFO
    try:
        text = path.read_text()
    except OSError as err:
        raise OverrideError(f"--mode server sizes the KV cache from MemAvailable in {path}, which cannot be read "
                            f"({err}); give --overrides max_total_seq_length=N") from None
    m = re.search(r"^MemAvailable:\s+(\d+)\s*kB", text, re.M)
    if not m:
        raise OverrideError(f"{path} has no MemAvailable line; give --overrides max_total_seq_length=N")
    return int(m.group(1)) * 1024


def mode_preset(mode: str, facts: ModelFacts, settings: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """MLC-LLM's presets, in our units; ``settings`` (the user's) win over them.

    - ``interactive``: one user: max_num_sequence 1, KV for one context window;
    - ``local``: a desktop: 4 sequences sharing one context window of KV;
    - ``server``: max_num_sequence = the config's max_batch_size, and as much KV as
      ``gpu_memory_utilization`` (default 0.5) of MemAvailable, less the weights, holds --
      at most max_num_sequence full context windows, beyond which no page could be used.
    Every mode prefills in the library's compiled chunk (at most the context window).
    Returns the preset and a line saying what was chosen and why.
    """
    if mode not in MODES:
        raise OverrideError(f"unknown --mode {mode!r}; choose {', '.join(MODES)}")
    window = min(int(settings.get("context_window_size", facts.context_window)), facts.context_window)
    n = {"interactive": 1, "local": LOCAL_MAX_NUM_SEQUENCE, "server": facts.max_batch_size}[mode]
    n = int(settings.get("max_num_sequence", n))
    preset = {"max_num_sequence": n, "max_total_seq_length": window,
              "prefill_chunk_size": min(facts.prefill_chunk, window)}
    why = ""
    if mode == "server" and "max_total_seq_length" not in settings:
        preset["max_total_seq_length"], why = _server_kv_tokens(facts, n, window, settings)
    final = {**preset, **{k: v for k, v in settings.items() if k in preset}}
    shown = ", ".join(f"{k}={v}" + (" (override)" if k in settings else "") for k, v in final.items())
    return preset, f"--mode {mode}: {shown}{why}"


def _server_kv_tokens(facts: ModelFacts, n: int, window: int, settings: dict[str, Any]) -> tuple[int, str]:
    if facts.device != "llvm":
        raise OverrideError(f"--mode server sizes the KV cache from this host's MemAvailable, not the memory of a "
                            f"{facts.device} device; give --overrides max_total_seq_length=N for this library")
    share = float(settings.get("gpu_memory_utilization", DEFAULT_MEMORY_UTILIZATION))
    avail = mem_available()
    budget = share * (avail - facts.weight_bytes)
    fits = int(budget // facts.kv_bytes_per_token) // PAGE * PAGE if budget > 0 else 0
    if fits < PAGE:
        raise OverrideError(f"--mode server: {share} x ({avail >> 20} MiB available - {facts.weight_bytes >> 20} MiB "
                            f"of weights) holds no KV page ({PAGE} tokens x {facts.kv_bytes_per_token} bytes); free "
                            "memory, raise gpu_memory_utilization or give max_total_seq_length")
    cap = n * window
    tokens = min(fits, cap)
    why = (f" [KV {tokens * facts.kv_bytes_per_token / 2**20:.0f} MiB at {facts.kv_bytes_per_token} bytes/token: "
           f"{share} x ({avail >> 20} MiB available - {facts.weight_bytes >> 20} MiB weights) holds {fits} tokens"
           + (f", capped at max_num_sequence x context window = {cap}]" if fits > cap else "]"))
    return tokens, why


# ------------------------------------------------------------ the runtime commands


def resolve_runtime(command: str, text: str | None, mode: str | None, params: dict[str, Any], typed: set[str],
                    model_dir: Path | None, model_lib: Path | None,
                    additional_models: str | None = None) -> tuple[dict[str, Any], str | None]:
    """The engine settings of a runtime command, by MLC-LLM key: defaults, then the mode's
    preset, then what the user gave (options and overrides, which must agree). Returns
    them and, with a mode, the line describing the choice."""
    settings = merge_options(command, parse_overrides(text, command), params, typed)
    if "gpu_memory_utilization" in settings and mode != "server":
        raise OverrideError("gpu_memory_utilization sizes the KV cache of --mode server; without it, give "
                            "max_total_seq_length instead")
    preset, summary = {}, None
    if mode is not None:
        preset, summary = mode_preset(mode, model_facts(model_dir, model_lib, additional_models), settings)
    final = {**option_defaults(command, params), **preset, **settings}
    final.pop("gpu_memory_utilization", None)
    return final, summary


def runtime_configs(spec: dict[str, Any], settings: dict[str, Any]) -> tuple[SpeculativeConfig, EngineConfig]:
    """The engine's config objects: the speculative flags, then the resolved settings (keys
    are the fields' names). Every field is checked as the objects are made."""
    spec_cfg, engine_cfg = configs_from({**spec, **settings}, (SpeculativeConfig, None), (EngineConfig, None))
    return spec_cfg, engine_cfg
