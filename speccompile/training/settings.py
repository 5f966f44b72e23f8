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


_EAGLE3 = {"override": False, "commands": ("train-draft",)}


@dataclass(frozen=True)
class Eagle3Settings:
    """What an EAGLE-3 training run is (``train-draft --method eagle3``); a resumed run keeps the
    head's shape and vocabulary from its state. Fields with a help text are flags of
    ``train-draft``; the rest are the trainer's own constants, settable from Python."""

    intermediate_size: int = option(2816, "eagle3: the head layer's MLP width (sets its size: 2816 is 57 MB of fp16 "
                                          "for a 1536-wide target)", low=1, **_EAGLE3)
    draft_vocab: int | None = None  # None: a resumed run's own, DRAFT_VOCAB for a new one (train-draft --draft-vocab)
    steps: int = option(4, "eagle3: training-time test steps (the head trained on its own fed-back outputs)", low=1,
                        flag="--ttt-steps", **_EAGLE3)
    soft_labels: bool = option(False, "eagle3: train on the target's next-token distributions (from the answers' "
                                      "final hidden states) or on its greedy tokens alone (learned faster here: "
                                      "training/eagle3.py)", flag="--soft-labels/--hard-labels", **_EAGLE3)
    init: str = option("target", "eagle3: a new head starts as the target's layer above the high feature (learned "
                                 "~3x faster at first on Qwen2.5-Coder-1.5B) or from random weights; a resumed run "
                                 "keeps its own", choices=("target", "random"), **_EAGLE3)
    epochs: int = option(8, "eagle3: passes over the training answers", low=1, **_EAGLE3)
    max_steps: int | None = option(None, "eagle3: a time box: the run ends at this many steps in all, its schedule "
                                         "annealed by then (default: every epoch)", kind=int, low=1, **_EAGLE3)
    batch_rows: int = 2048  # padded head rows per optimizer step
    max_rows: int = 2048  # longest conversation (head rows) kept
    lr: float = 3e-4
    warmup: int = 100
    eval_every: int = option(50, "eagle3: optimizer steps between held-out evaluations, at least (the curve; the "
                                 "best one is exported); they also wait until they cost at most eval_share of the "
                                 "run's time", low=1, **_EAGLE3)
    eval_share: float = 0.1  # and at most this share of the run's time spent scoring them (1.0: no limit)
    save_every_s: float = 300.0
    seed: int = 0

    def __post_init__(self):
        check_options(self)
