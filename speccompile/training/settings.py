"""The settings of ``speccompile train-heads``, in a module light enough for the CLI to read
its flags from (runtime/options.py: one definition each; the click options are generated)."""
from __future__ import annotations

from dataclasses import dataclass

from speccompile.runtime.options import check_options, option

_HEADS = {"override": False, "commands": ("train-heads",)}


@dataclass(frozen=True)
class HeadsSettings:
    """``train-heads``' settings (runtime/options.py: one definition each, the flags generated)."""

    heads: str | None = option(None, "heads to train, comma-separated: eagle3,medusa (EAGLE-3 pipeline) or eagle,medusa "
                                     "(SmolLM2); default all", kind=str, **_HEADS)
    train_prompts: int = option(20000, "EAGLE-3: training prompts to reach", low=1, **_HEADS)
    held_out_prompts: int = option(500, "EAGLE-3: held-out prompts to reach", low=1, **_HEADS)
    prompt_block: int = option(2000, "EAGLE-3: prompts per round of prompts, then their answers", low=1, **_HEADS)
    answer_prompts: int | None = option(None, "EAGLE-3: training prompts answered at most (default: all)", kind=int,
                                        low=1, **_HEADS)
    answer_batch: int = option(32, "EAGLE-3: sequences answering together", low=1, **_HEADS)
    head_epochs: int = option(8, "EAGLE-3: passes over the answers", low=1, **_HEADS)
    head_draft_vocab: int = option(16384, "EAGLE-3: draft vocabulary (tokens counted from the answers)", low=2,
                                   **_HEADS)
    head_max_steps: int | None = option(None, "EAGLE-3: a time box the learning-rate schedule anneals by", kind=int,
                                        low=1, **_HEADS)
    medusa_steps: int | None = option(None, "Medusa steps (default: --medusa-epochs passes of 4 conversations a step; "
                                            "SmolLM2: 1500)", kind=int, low=1, **_HEADS)
    medusa_epochs: float = option(4.0, "EAGLE-3 pipeline: Medusa passes over the answers", low=0.01, **_HEADS)
    head_prompts: int = option(2000, "SmolLM2: prompts answered for its EAGLE-1 and Medusa heads", low=1, **_HEADS)
    head_steps: int = option(1500, "SmolLM2: EAGLE-1 training steps", low=1, **_HEADS)

    def __post_init__(self):
        check_options(self)

    def chosen(self, default: str) -> list[str]:
        return (self.heads or default).split(",")
