"""The settings of the training commands, in a module light enough for the CLI to read its
flags from (runtime/options.py: one definition each; the click options are generated, and
ranges are checked when an object is made, so the CLI and the Python API say the same).

Locations (the target, ``--work-dir``, ``-o``) stay plain click arguments of each command:
they say where a run reads and writes, not what it is."""
from __future__ import annotations

from dataclasses import dataclass

from speccompile.runtime.options import check_options, option


def _for(*commands: str) -> dict:
    return {"override": False, "commands": commands}


_HEADS = _for("train-heads")
_DRAFT = _for("train-draft")
_PROMPTS = _for("train-prompts")
_ANSWERS = _for("train-answers")

PLAN_VERSION = 2  # bump when slot plans change: a resumed run refuses a different plan (2: the wide mix)


@dataclass(frozen=True)
class HeadsSettings:
    """``train-heads``' settings: the whole pipeline of the project's own heads."""

    heads: str | None = option(None, "heads to train, comma-separated: eagle3,medusa (EAGLE-3 pipeline) or eagle,medusa "
                                     "(SmolLM2); default all", kind=str, **_HEADS)
    train_prompts: int = option(20000, "EAGLE-3: training prompts to reach", low=1, **_HEADS)
    held_out_prompts: int = option(500, "EAGLE-3: held-out prompts to reach", low=1, **_HEADS)
    prompt_block: int = option(2000, "EAGLE-3: prompts per round of prompts, then their answers", low=1, **_HEADS)
    answer_prompts: int | None = option(None, "EAGLE-3: training prompts answered at most (default: all)", kind=int,
                                        low=1, **_HEADS)
    answer_batch: int = option(32, "EAGLE-3: sequences answering together", low=1, **_HEADS)
    answer_features: bool = option(True, "EAGLE-3: capture features while answering (--no-answer-features: the "
                                         "answers' tokens only, into heads/data, nothing rebuilt first; with --heads "
                                         "none, since training needs every feature)",
                                   flag="--answer-features/--no-answer-features", **_HEADS)
    head_epochs: int = option(8, "EAGLE-3: passes over the answers", low=1, **_HEADS)
    head_draft_vocab: int = option(16384, "EAGLE-3: draft vocabulary (tokens counted from the answers)", low=2,
                                   **_HEADS)
    head_max_steps: int | None = option(None, "EAGLE-3: a time box the learning-rate schedule anneals by", kind=int,
                                        low=1, **_HEADS)
    head_init: str = option("target", "EAGLE-3: how a new run's head starts: target, random, or an exported head's "
                                      "folder to fine-tune (e.g. heads/Qwen2.5-Coder-1.5B-Instruct-eagle3)", kind=str,
                            **_HEADS)
    head_recount_vocab: bool = option(False, "EAGLE-3, with --head-init <head folder>: count its draft vocabulary "
                                             "again, from every answer of the data dir (train-draft --recount-vocab)",
                                      flag="--head-recount-vocab/--head-keep-vocab", **_HEADS)
    head_replay_shards: int | None = option(None, "EAGLE-3, with --head-init <head folder>: fine-tune on the data "
                                                   "dir's answers the head has not seen plus this many of its old "
                                                   "shards, evenly spaced, in a work dir of their own (only their "
                                                   "features are rebuilt; training/replay.py)", kind=int, low=0,
                                            **_HEADS)
    medusa_steps: int | None = option(None, "Medusa steps (default: --medusa-epochs passes of 4 conversations a step; "
                                            "SmolLM2: 1500)", kind=int, low=1, **_HEADS)
    medusa_epochs: float = option(4.0, "EAGLE-3 pipeline: Medusa passes over the answers", low=0.01, **_HEADS)
    head_prompts: int = option(2000, "SmolLM2: prompts answered for its EAGLE-1 and Medusa heads", low=1, **_HEADS)
    head_steps: int = option(1500, "SmolLM2: EAGLE-1 training steps", low=1, **_HEADS)

    def __post_init__(self):
        check_options(self)
        if self.head_replay_shards is not None and (self.head_init in ("target", "random") or self.heads != "eagle3"):
            raise ValueError("--head-replay-shards fine-tunes a shipped EAGLE-3 head: give --heads eagle3 and "
                             "--head-init <its folder>")
        if not self.answer_features and self.heads != "none":
            raise ValueError("--no-answer-features makes data without features: give --heads none (a later run with "
                             "features rebuilds them and trains)")

    def chosen(self, default: str) -> list[str]:
        return (self.heads or default).split(",")


@dataclass(frozen=True)
class DraftSettings:
    """``train-draft``'s settings shared by its methods, and those of the EAGLE-1 and Medusa
    heads that generate their own data (self-distillation with our engine)."""

    num_prompts: int = option(600, "eagle, medusa: self-distillation conversations", low=1, **_DRAFT)
    max_tokens: int = option(384, "eagle, medusa: answer length cap", low=1, **_DRAFT)
    gen_batch: int = option(8, "eagle, medusa: sequences generated together", low=1, **_DRAFT)
    steps: int = option(3000, "eagle, medusa: training steps (resumes from a checkpoint)", low=1, **_DRAFT)
    train_batch: int = option(4, "eagle, medusa: conversations per step", low=1, **_DRAFT)
    draft_vocab: int | None = option(None, "tokens in the draft vocabulary, counted from the target's answers [eagle, "
                                           "medusa: 16384; eagle3: 16384, or a resumed run's own]", kind=int, low=2,
                                     **_DRAFT)
    medusa_num_heads: int = option(4, "medusa: heads (head k, from 0, predicts token t+k+2 from the feature at t)",
                                   low=1, **_DRAFT)
    medusa_num_layers: int = option(1, "medusa: residual blocks per head", low=0, **_DRAFT)
    medusa_freeze_lm_head: bool = option(
        True, "medusa: keep every head's vocabulary projection equal to the target's lm_head (cheap on a CPU); "
        "--no-... trains one per head (vocab x hidden floats each, plus Adam state)",
        flag="--medusa-freeze-lm-head/--no-medusa-freeze-lm-head", **_DRAFT)

    def __post_init__(self):
        check_options(self)


@dataclass
class Eagle3Settings:
    """What an EAGLE-3 run is (``train-draft --method eagle3``); a resumed run keeps the head's
    shape and vocabulary from its state. Fields without a flag are for the Python API."""

    intermediate_size: int = option(2816, "eagle3: the head layer's MLP width (sets its size: 2816 is 57 MB of fp16 "
                                          "for a 1536-wide target)", low=1, **_DRAFT)
    # None: a resumed run's own, DRAFT_VOCAB for a new one (train-draft sets it from --draft-vocab)
    draft_vocab: int | None = option(None, "draft vocabulary", kind=int, low=2, flag=False, **_DRAFT)
    ttt_steps: int = option(4, "eagle3: training-time test steps (the head trained on its own fed-back outputs)",
                            low=1, **_DRAFT)
    soft_labels: bool = option(False, "eagle3: train on the target's next-token distributions (from the answers' final "
                                      "hidden states) or on its greedy tokens alone (learned faster here: "
                                      "training/eagle3.py)", flag="--soft-labels/--hard-labels", **_DRAFT)
    init: str = option("target", "eagle3: a new head starts as the target's layer above the high feature (target: "
                                 "learned ~3x faster at first on Qwen2.5-Coder-1.5B), from random weights (random), or "
                                 "as an exported head (its folder: fine-tuning it on today's answers, over its own "
                                 "draft vocabulary); a resumed run keeps its own", kind=str, **_DRAFT)
    recount_vocab: bool = option(False, "eagle3, with --init <head folder>: count the draft vocabulary again from the "
                                        "answers instead of keeping the head's, so tokens of new kinds of answers "
                                        "(translations, documents) become draftable; the trained layers carry over, "
                                        "the projection being the target's frozen rows",
                                 flag="--recount-vocab/--keep-vocab", **_DRAFT)
    epochs: int = option(8, "eagle3: passes over the training answers", low=1, **_DRAFT)
    # a time box: the run ends at this many steps in all, annealed by then (train-heads --head-max-steps)
    max_steps: int | None = option(None, "the run's total optimizer steps (train-heads --head-max-steps)", kind=int, low=1, flag=False, **_DRAFT)
    batch_rows: int = 2048  # padded head rows per optimizer step
    max_rows: int = 2048  # longest conversation (head rows) kept
    lr: float = 3e-4
    warmup: int = 100
    eval_every: int = option(50, "eagle3: optimizer steps between held-out evaluations, at least (the curve; the best "
                                 "one is exported); they also wait until they cost at most a tenth of the run's time",
                             low=1, **_DRAFT)
    eval_share: float = 0.1  # and at most this share of the run's time spent scoring them (1.0: no limit)
    save_every_s: float = 300.0
    seed: int = 0

    def __post_init__(self):
        check_options(self)


@dataclass(frozen=True)
class PromptSetSettings:
    """Everything that decides what a slot of ``train-prompts`` produces; fixed for the life of
    a prompt set (saved beside it, and a resumed run must match)."""

    seed: int = option(0, "decides every slot; fixed for a work dir", low=0, **_PROMPTS)
    magpie_share: float = option(0.5, "share of the coder mix's slots whose user turn the target samples itself (the "
                                      "rest are written families); the wide mix samples 0.4 of it", low=0.0, high=1.0,
                                 **_PROMPTS)
    temperature: float = option(1.0, "sampling temperature of Magpie turns and grounded documents (> 0)", low=0.0,
                                **_PROMPTS)
    top_p: float = option(0.95, "Magpie nucleus sampling", low=0.0, high=1.0, open_low=True, **_PROMPTS)
    max_new_tokens: int = option(512, "longest sampled user turn (longer ones are dropped as truncated)", low=8,
                                 **_PROMPTS)
    min_tokens: int = 4
    max_tokens: int = 1024
    plan_version: int = PLAN_VERSION

    def __post_init__(self):
        self.check()

    def check(self) -> None:
        check_options(self)
        if not self.temperature > 0:
            raise ValueError("--temperature must be > 0: Magpie turns and grounded documents are sampled (greedy "
                             "decoding gives one text per request)")
        if not 1 <= self.min_tokens <= self.max_tokens:
            raise ValueError(f"prompt length bounds {self.min_tokens}..{self.max_tokens} tokens are empty")


@dataclass(frozen=True)
class PromptRun:
    """How much one ``train-prompts`` run makes, and how (rerun with larger targets to grow a set)."""

    num_prompts: int = option(20000, "training prompts to reach", low=1, **_PROMPTS)
    held_out: int = option(500, "held-out prompts (other styles) to reach", low=0, **_PROMPTS)
    batch: int = option(8, "Magpie sequences decoded together", low=1, **_PROMPTS)

    def __post_init__(self):
        check_options(self)


@dataclass(frozen=True)
class AnswerRun:
    """How much one ``train-answers`` run answers, and how."""

    num_prompts: int | None = option(None, "training prompts to answer (default: all there are)", kind=int, low=0,
                                     **_ANSWERS)
    held_out: int = option(200, "held-out prompts to answer", low=0, **_ANSWERS)
    mt_bench: bool = option(True, "also answer MT-bench first turns (offline evaluation only, never trained on)",
                            flag="--mt-bench/--no-mt-bench", **_ANSWERS)
    max_tokens: int = option(768, "longest answer", low=1, **_ANSWERS)
    batch: int = option(8, "sequences decoded together", low=1, **_ANSWERS)
    features: bool = option(True, "capture the target's features as it answers (--no-features: tokens only, into "
                                  "--data-dir; the training run rebuilds the features by prefill)",
                            flag="--features/--no-features", **_ANSWERS)

    def __post_init__(self):
        check_options(self)
