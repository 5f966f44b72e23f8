"""One definition of each option: a dataclass field carries its type, default, range, help,
command-line flag and MLC-LLM ``--overrides`` key.

Why. An option used to be written three times -- a click option, a row of the overrides
table and a config field -- with its default and its range restated (and checked) in
each; they drifted. Now the config classes (``EngineConfig`` here, ``SpeculativeConfig``,
``SamplingParams``) are the definitions: the CLI generates its click options from them
(speccompile/cli/options.py), ``--overrides`` takes its keys and ranges from them
(speccompile/cli/overrides.py), and the engine and server take the config objects, which
check every field's range when they are made. The runtime imports nothing of the CLI.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

from .contract import KV_PAGE_SIZE

RUNTIME_COMMANDS = ("serve", "chat", "generate", "bench")


@dataclass(frozen=True)
class Option:
    """What a config field is to its users. ``flag``: the command-line flag (None: set only
    through ``--overrides`` or the Python API); ``override``: the ``--overrides`` key (MLC-LLM's
    name); ``commands``: the commands that take it; ``defaults``: a command's own default
    where it differs from the field's (serve decodes more sequences than a one-off generate)."""

    name: str
    kind: type
    default: Any
    help: str
    low: float | None = None
    high: float | None = None
    choices: tuple | None = None
    open_low: bool = False  # low itself excluded (top_p > 0)
    flag: str | None = None
    override: str | None = None
    commands: tuple[str, ...] = RUNTIME_COMMANDS
    defaults: tuple[tuple[str, Any], ...] = ()

    def default_for(self, command: str) -> Any:
        return dict(self.defaults).get(command, self.default)

    def expect(self) -> str:
        """``an integer >= 1 and <= 256``: what the option takes, for error messages."""
        if self.choices:
            return "one of " + ", ".join(map(str, self.choices))
        what = {int: "an integer", float: "a number"}.get(self.kind, "a value")
        return what + (f" {'>' if self.open_low else '>='} {self.low}" if self.low is not None else "") + (
            f" and <= {self.high}" if self.high is not None else "")

    def problem(self, value: Any) -> str | None:
        """Why ``value`` is not acceptable: "type" (not what the option takes), "range", or
        None when it is. None values mean "not given"."""
        if value is None:
            return None
        if self.choices is not None:
            return None if value in self.choices else "type"
        if self.kind in (int, float):
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or (
                    self.kind is int and not float(value).is_integer()) or not math.isfinite(value):
                return "type"
            below = self.low is not None and (value <= self.low if self.open_low else value < self.low)
            if below or (self.high is not None and value > self.high):
                return "range"
        return None

    def check(self, value: Any, *, via: str | None = None) -> None:
        """Raise ValueError naming the option as the user gave it (``via``: how)."""
        why = self.problem(value)
        if why:
            shown = via or (f"{self.flag} {value}" if self.flag else f"{self.override or self.name}={value}")
            said = "is out of range: it takes" if why == "range" else "takes"
            raise ValueError(f"{shown}: {self.override or self.name} {said} {self.expect()} ({self.help})")


def option(default: Any, help: str, *, kind: type | None = None, low: float | None = None, high: float | None = None,
           choices: tuple | None = None, open_low: bool = False, flag: bool | str = True, override: bool | str = True,
           commands: tuple[str, ...] = RUNTIME_COMMANDS, defaults: dict | None = None) -> Any:
    """A dataclass field defined as an option (the field's name is the option's name; ``flag``
    True = ``--field-name``; ``override`` True = the field's name as the ``--overrides`` key)."""
    meta = {"default": default, "help": help, "kind": kind or type(default), "low": low, "high": high,
            "choices": choices, "open_low": open_low, "flag": flag, "override": override, "commands": commands,
            "defaults": tuple((defaults or {}).items())}
    return field(default=default, metadata={"option": meta})


def options_of(cls) -> tuple[Option, ...]:
    """The options a config class defines, in field order."""
    out = []
    for f in fields(cls):
        meta = f.metadata.get("option")
        if meta is None:
            continue
        m = dict(meta)
        flag = "--" + f.name.replace("_", "-") if m["flag"] is True else (m["flag"] or None)
        override = f.name if m["override"] is True else (m["override"] or None)
        out.append(Option(f.name, m["kind"], m["default"], m["help"], m["low"], m["high"], m["choices"], m["open_low"],
                          flag, override, m["commands"], m["defaults"]))
    assert all(f.default is not MISSING for f in fields(cls) if f.metadata.get("option")), cls
    return tuple(out)


def check_options(obj) -> None:
    """Every option field of a config object in its range (raises ValueError)."""
    for opt in options_of(type(obj)):
        opt.check(getattr(obj, opt.name))


@dataclass(frozen=True)
class EngineConfig:
    """How an engine is sized: sequences, KV cache, tokens per forward. ``None`` = what the
    model config and library were built for; run-time values may only lower them (the
    engine checks them against the library when it loads)."""

    max_num_sequence: int = option(4, "sequences decoded together; sizes the default KV cache", low=1,
                                   defaults={"serve": 8})
    max_total_seq_length: int | None = option(
        None, "KV cache capacity in tokens over all sequences (default: context window x sequences, <= 32768)",
        kind=int, low=KV_PAGE_SIZE, flag="--max-total-tokens")
    prefill_chunk_size: int | None = option(
        None, "most tokens in one forward (prompt chunk, verify), at most the library's compiled chunk; serve: also "
        "the prompt tokens prefilled per step unless --prefill-tokens-per-step", kind=int, low=1, flag=False)
    context_window_size: int | None = option(
        None, "lowers the configured context window (a larger one needs gen_config + compile)", kind=int, low=2,
        flag=False)

    prefix_cache_max_num_recycling_seqs: int | None = option(
        None, "finished sequences whose KV is kept for a later prompt that starts with the same tokens (a chat's next "
        "turn): it is reused, not prefilled again, and freed first when pages run short; 0 = off (default: "
        "max_num_sequence; bench: 0, so that every run prefills its prompt)", kind=int, low=0,
        commands=("serve", "chat", "bench"), defaults={"bench": 0})
    cuda_graph: str = option("on", "replay decode and draft-verify forwards of up to 64 rows as CUDA graphs (cuda "
                             "libraries; one launch per step instead of one per kernel; same kernels, same bits)",
                             choices=("on", "off"))

    def __post_init__(self):
        check_options(self)

    def limits(self, config: dict, max_batch_tokens: int | None = None) -> tuple[int, int]:
        """(the context window, the tokens one forward takes) of these sizes for a model with this
        speccompile-config.json. Run-time sizes only lower what it was configured and compiled
        for: asking for more is a ValueError saying what to rebuild."""
        configured = int(config["context_window_size"])
        window = self.context_window_size
        if window is not None and not 2 <= window <= configured:
            raise ValueError(f"context_window_size={window}: the model was configured and compiled for a "
                             f"{configured}-token window, which can only be lowered at run time (2..{configured}); "
                             "for a larger one rerun gen_config --context-window-size and compile")
        chunk = int(config.get("prefill_chunk_size", 2048))
        if self.prefill_chunk_size is not None and not 1 <= self.prefill_chunk_size <= chunk:
            raise ValueError(f"prefill_chunk_size={self.prefill_chunk_size}: the library was compiled for prefill "
                             f"chunks of at most {chunk} tokens (1..{chunk}); for larger ones rerun gen_config "
                             "--prefill-chunk-size and compile")
        budget = max_batch_tokens or self.prefill_chunk_size or chunk
        # one forward takes at most the compiled chunk of tokens, and of sequences: the library's
        # buffers are planned for that many (runtime/contract.py SYMBOLIC_DIM_BOUNDS)
        for name, value in (("max_batch_tokens", budget), ("max_num_sequence", self.max_num_sequence)):
            if value > chunk:
                raise ValueError(f"{name}={value}: one forward of the library takes at most prefill_chunk_size="
                                 f"{chunk} tokens (its buffers are planned for that many); for more rerun "
                                 "gen_config --prefill-chunk-size and compile")
        return window or configured, budget


def configs_from(options: dict[str, Any], *given: tuple[type, Any]) -> list:
    """Config objects from ``(cls, object or None)`` pairs and leftover fields by name: each
    class takes its own fields from ``options`` (the Python API's keyword form); a class
    given as an object takes none. Unknown names are an error."""
    out, left = [], dict(options)
    for cls, obj in given:
        names = {f.name for f in fields(cls)}
        mine = {k: left.pop(k) for k in list(left) if k in names}
        if obj is not None and mine:
            raise ValueError(f"options {sorted(mine)} given beside a {cls.__name__}: give one or the other")
        out.append(obj if obj is not None else cls(**mine))
    if left:
        known = sorted(f.name for cls, _ in given for f in fields(cls))
        raise ValueError(f"unknown options {sorted(left)}; known: {', '.join(known)}")
    return out


@dataclass(frozen=True)
class ModelConfigFields:
    """The fields of speccompile-config.json a user chooses: ``gen_config`` writes them (and
    ``convert_weight`` reads the Medusa sizes, which decide the tensors converted); the
    runtime reads them back and may only lower the first two (``EngineConfig``)."""

    context_window_size: int | None = option(None, "tokens a sequence may hold", kind=int, low=16,
                                             commands=("gen_config",))
    prefill_chunk_size: int | None = option(None, "most tokens one forward of the compiled library takes", kind=int,
                                            low=1, commands=("gen_config",))
    max_batch_size: int = option(8, "sequences --mode server decodes together", low=1, commands=("gen_config",))
    medusa_num_heads: int | None = option(None, "medusa: heads used (the checkpoint's first N)", kind=int, low=1,
                                          flag=False, commands=("gen_config", "convert_weight"))
    medusa_num_layers: int | None = option(None, "medusa: residual blocks per head", kind=int, low=0, flag=False,
                                           commands=("gen_config", "convert_weight"))

    def __post_init__(self):
        check_options(self)
