"""The speculative modes: one config, one registry.

``SpeculativeConfig`` holds every speculative option under the names the CLI, ``--overrides``
and MLC-LLM use (``speculative_mode``, ``spec_draft_length``, ...). ``PROPOSERS`` maps each
mode to its proposer class; the CLI, bench, serve and the docs take the list of modes from
``MODES``. A proposer class validates its own options before anything loads
(``check``) and builds itself (``build``), so the engine never branches on a mode's name:
adding a mode means one proposer file plus one line here.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, fields
from pathlib import Path

from .contract import read_model_config
from .options import RUNTIME_COMMANDS, check_options, option
from .sequence import GenerationError

# mode -> the module (in this package: its drafters/ room) and class of its proposer. Named, not imported: the
# CLI lists the modes without loading TVM; a mode's module loads when an engine uses it.
PROPOSERS = {"small_draft": "drafters.proposers.SmallDraftProposer", "ngram": "drafters.proposers.NGramProposer",
             "suffix": "drafters.suffix.SuffixProposer", "eagle": "drafters.eagle.EagleProposer",
             "medusa": "drafters.medusa.MedusaProposer"}
MODES = ("disable", *PROPOSERS)  # "disable" = plain decoding, no proposer
DEFAULT_TREE_WIDTH, DEFAULT_TREE_NODES = 1, 64
DEFAULT_SUFFIX_STORE_TOKENS = 1 << 15


@dataclass(frozen=True)
class SpeculativeConfig:
    """Every speculative option (runtime/options.py: one definition each); the defaults are
    plain decoding."""

    # the commands speculate by default (suffix drafting costs no model, and the policy drafts
    # only where it pays); the Python API decodes plainly unless asked
    speculative_mode: str = option("disable", "where drafts come from; disable = plain decoding; suffix (the "
                                   "commands' default) merges the suffix index with the drafter --additional-models "
                                   "names, if any; small_draft, eagle, medusa: that drafter alone",
                                   choices=MODES, override=False, defaults={c: "suffix" for c in RUNTIME_COMMANDS})
    # ((DIR, LIB),): a draft model or a head; the CLI form is "DIR,LIB"
    additional_models: tuple[tuple[str, str], ...] = option(
        (), "small_draft: DRAFT_DIR,DRAFT_LIB; eagle/medusa: HEAD_DIR,HEAD_LIB", kind=str, override=False)
    spec_draft_length: int = option(0, "draft length k (chain length, or tree depth); 0 = adaptive "
                                       "(runtime/adaptive.py)", low=0)
    spec_tree_width: int = option(DEFAULT_TREE_WIDTH, "eagle/medusa/suffix: candidates per tree level (top-k); 1 = chain",
                                  low=1)
    spec_tree_nodes: int = option(DEFAULT_TREE_NODES, "eagle/medusa/suffix: most draft nodes verified per step", low=1,
                                  high=256)
    suffix_store_tokens: int = option(DEFAULT_SUFFIX_STORE_TOKENS, "suffix: tokens of recent finished requests a "
                                      "server keeps per API key to draft from (about 0.5 KB each; 0 = none)", low=0,
                                      commands=("serve",))
    ngram_min: int = option(1, "ngram: shortest suffix matched", low=1)
    ngram_max: int = option(4, "ngram: longest suffix matched", low=1)

    def __post_init__(self):
        """Each field in its range, checked when the config is made (before anything loads)."""
        object.__setattr__(self, "additional_models", parse_additional_models(self.additional_models))
        try:
            check_options(self)
        except ValueError as err:
            raise GenerationError(str(err)) from None
        if self.ngram_min > self.ngram_max:
            raise GenerationError(f"ngram_min={self.ngram_min} exceeds ngram_max={self.ngram_max}; n-gram sizes need "
                                  "min <= max")

    @classmethod
    def keys(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    @property
    def enabled(self) -> bool:
        return self.speculative_mode != "disable"

    @property
    def proposer_class(self) -> type | None:
        return proposer_class(self.speculative_mode) if self.speculative_mode in PROPOSERS else None

    def check(self, model_dir: Path, max_batch_tokens: int) -> None:
        """Refuse bad options with a clear message, before any model loads."""
        if self.speculative_mode not in MODES:
            raise GenerationError(f"unknown --speculative-mode {self.speculative_mode!r}; choose {', '.join(MODES)}")
        cls = self.proposer_class
        trees = cls is not None and cls.supports_trees
        if (self.spec_tree_width, self.spec_tree_nodes) != (DEFAULT_TREE_WIDTH, DEFAULT_TREE_NODES) and not trees:
            with_trees = " or ".join(n for n in PROPOSERS if proposer_class(n).supports_trees)
            raise GenerationError(f"--spec-tree-width/--spec-tree-nodes apply to --speculative-mode {with_trees}")
        if cls is None:
            return
        if self.spec_draft_length + 1 > max_batch_tokens:
            raise GenerationError(f"the token budget per forward ({max_batch_tokens}) cannot hold "
                                  f"spec_draft_length + 1 = {self.spec_draft_length + 1} tokens; lower --spec-draft-length")
        if cls.additional_model and not self.additional_models and not cls.additional_model_optional:
            raise GenerationError(f"--speculative-mode {self.speculative_mode} needs {cls.additional_model}: "
                                  f"--additional-models {cls.additional_model_form}")
        if self.additional_models and not cls.additional_model:
            takers = ", ".join(n for n in PROPOSERS if proposer_class(n).additional_model)
            raise GenerationError(f"--speculative-mode {self.speculative_mode} drafts without a model: "
                                  f"--additional-models is for {takers}")
        try:
            cls.check(self, Path(model_dir))
        except ValueError as err:
            raise GenerationError(str(err)) from err

    def build(self, target, kv_tokens: int, max_num_sequence: int, device: str) -> object | None:
        """The mode's proposer (runtime/drafters/proposers.py's Protocol) for this target Model, or None
        for plain decoding. Composed here, in sight: a mode that merges with a drafter (the
        suffix index, the default) and a drafter named by --additional-models become one
        MergedProposer (runtime/drafters/merged.py); every other mode is its proposer alone."""
        cls = self.proposer_class
        if cls is None:
            return None
        try:
            proposer = cls.build(self, target, kv_tokens, max_num_sequence, device)
            if getattr(cls, "merges_drafter", False) and self.additional_models:
                from .drafters.merged import MergedProposer

                drafter = proposer_class(drafter_mode(self.additional_models))
                proposer = MergedProposer(proposer, drafter.build(self, target, kv_tokens, max_num_sequence, device))
            return proposer
        except ValueError as err:  # a head built for another target, a bad draft library, ...
            raise GenerationError(str(err)) from err


def proposer_class(mode: str) -> type:
    """The proposer class registered for a mode; it names itself after the mode."""
    module, name = PROPOSERS[mode].rsplit(".", 1)
    cls = getattr(importlib.import_module(f"{__package__}.{module}"), name)
    assert cls.name == mode, f"{cls.__name__}.name is {cls.name!r}, registered as {mode!r}"
    return cls


def drafter_mode(additional_models) -> str:
    """The mode whose proposer drives this drafter (merged with the suffix index): an EAGLE or
    Medusa head by its converted config's ``model_type``, else a draft model."""
    (draft_dir, _), = parse_additional_models(additional_models)
    kind = read_model_config(Path(draft_dir)).get("model_type")
    return {"eagle": "eagle", "eagle3": "eagle", "medusa": "medusa"}.get(kind, "small_draft")


def parse_additional_models(value) -> tuple[tuple[str, str], ...]:
    """``"DIR,LIB"`` (the CLI form), or [(DIR, LIB)] -> ((DIR, LIB),)."""
    if not value:
        return ()
    if isinstance(value, str):
        parts = [p for p in value.split(",") if p]
        if len(parts) != 2:
            raise GenerationError("--additional-models takes DRAFT_DIR,DRAFT_LIB (or HEAD_DIR,HEAD_LIB)")
        return ((parts[0], parts[1]),)
    return tuple((str(d), str(lib)) for d, lib in value)
