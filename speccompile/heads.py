"""``make heads MODEL=...``: train the project's own draft heads.

``MODEL=Qwen2.5-Coder-1.5B-Instruct`` (the default) runs the EAGLE-3 pipeline, every stage
resumable, into ``$SPECCOMPILE_CACHE/train/<model>-<quant>-eagle3/``:
1. train-prompts: written prompt families plus Magpie user turns (TRAIN_PROMPTS, HELD_OUT_PROMPTS);
2. train-answers: the target's greedy answers with its layer features captured while it
   generates (ANSWER_PROMPTS caps how many training prompts are answered; ANSWER_BATCH
   sequences decode together, 32 by default: 316 tok/s against 294 at 16 on a 2-core Zen 5).
   Stages 1 and 2 alternate in rounds of PROMPT_BLOCK (2,000) prompts, so that whatever a
   session stops at is answered data a head can train on, not prompts alone (at ~120 prompts
   a minute and ~150 answer tokens a second, 20,000 prompts are hours of the first stage);
3. train-draft --method eagle3: the training-time test, best held-out checkpoint exported to
   ``heads/<model>-eagle3`` (HEAD_EPOCHS; HEAD_MAX_STEPS, a time box the schedule anneals by;
   HEAD_DRAFT_VOCAB, 16,384 tokens, shared in size with Medusa);
4. train-draft --method medusa on the same answers: 3 heads over a 16k draft vocabulary, to
   ``heads/<model>-medusa``, MEDUSA_EPOCHS (4) passes of 4 conversations a step (3,000 steps,
   ~50 min, for 3,000 answers), or MEDUSA_STEPS. ``HEADS=eagle3`` or ``HEADS=medusa`` trains one.
Rerun the same command to continue after any interruption. The prompts and the answers' token
ids are also kept in ``heads/data/<model>-<quant>/`` (commit it): on a machine whose cache is
empty, the features are rebuilt from them by prefill instead of generating the answers again.

``MODEL=SmolLM2-135M-Instruct`` trains the EAGLE-1 and Medusa heads described below.

No EAGLE or Medusa weights for our models are reachable from this machine, so we train
them by self-distillation (speccompile/train_draft.py, speccompile/train_medusa.py) on
one shared data set: the target's greedy answers to 2,000 prompts of seven families
(speccompile/prompts.py) and its features. Both heads draft over a 12,288-token reduced
vocabulary counted from those answers, whose projection is the target's own lm_head rows;
so the heads hold only their trained layers plus ``d2t`` (EAGLE ~8 MB, Medusa ~3 MB, fp16)
and are committed in ``heads/`` for tests and bench. Data and checkpoints go to the cache
(``$SPECCOMPILE_CACHE/train``); every stage resumes, so an interrupted run continues where
it stopped. ``HEADS=eagle`` or ``HEADS=medusa`` trains one; HEAD_STEPS, MEDUSA_STEPS and
HEAD_PROMPTS override the defaults.
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path

from .fetch import cache_root, prepare
from .train_draft import run_train_draft

REPO = Path(__file__).resolve().parent.parent
TARGET = "SmolLM2-135M-Instruct"
QUANT = "q4f32_1"
HEAD_DIR = REPO / "heads" / f"{TARGET}-eagle"
MEDUSA_DIR = REPO / "heads" / f"{TARGET}-medusa"


def eagle3_pipeline(model: str, quant: str) -> dict:
    """The stages for one target; returns the training reports."""
    from .train_answers import run_train_answers
    from .train_eagle3 import Settings, train_eagle3
    from .train_prompts import Settings as PromptSettings
    from .train_prompts import default_work_dir, run_train_prompts

    target_dir, lib = prepare(model, quant)
    work = default_work_dir(target_dir)
    data = REPO / "heads" / "data" / target_dir.name  # prompts and answer ids, committed (train_store.py)
    env = os.environ.get
    final, block = int(env("TRAIN_PROMPTS", "20000")), int(env("PROMPT_BLOCK", "2000"))
    limit = int(env("ANSWER_PROMPTS") or final)
    if final < 1 or block < 1:
        raise ValueError("TRAIN_PROMPTS and PROMPT_BLOCK must be positive")
    target = 0
    while target < final:  # rounds: prompts up to the next block, then their answers (each returns at once if done)
        target = min(final, target + block)
        run_train_prompts(target_dir, lib, work, target, int(env("HELD_OUT_PROMPTS", "500")), PromptSettings(),
                          data_dir=data)
        run_train_answers(target_dir, lib, work, min(target, limit), held_out=200, mt_bench=True, max_tokens=768,
                          batch=int(env("ANSWER_BATCH", "32")), data_dir=data)
    which = env("HEADS", "eagle3,medusa").split(",")
    reports = {}
    if "eagle3" in which:
        reports["eagle3"] = train_eagle3(target_dir, work, REPO / "heads" / f"{model}-eagle3",
                                         Settings(epochs=int(env("HEAD_EPOCHS", "8")),
                                                  draft_vocab=int(env("HEAD_DRAFT_VOCAB", "16384")),
                                                  max_steps=int(env("HEAD_MAX_STEPS") or 0) or None))
    if "medusa" in which:  # on the same answers (their final hidden states), 3 heads over a 16k vocabulary
        # steps follow the data (MEDUSA_EPOCHS passes of 4 conversations a step), so a rerun after
        # more answers continues the checkpoint over them instead of finding it done
        index = work / "answers" / "train" / "index.jsonl"
        answered = sum(len(json.loads(line)["ids"]) for line in index.read_text().splitlines() if line.strip())
        steps = int(env("MEDUSA_STEPS") or math.ceil(float(env("MEDUSA_EPOCHS", "4")) * answered / 4))
        reports["medusa"] = run_train_draft("medusa", target_dir, None, REPO / "heads" / f"{model}-medusa",
                                            steps=steps, train_batch=4, draft_vocab=16384, work_dir=work,
                                            medusa_num_heads=3)
    return reports


def main() -> None:
    model = os.environ.get("MODEL", "Qwen2.5-Coder-1.5B-Instruct")
    if model != TARGET:
        print(json.dumps(eagle3_pipeline(model, os.environ.get("QUANT", QUANT)), indent=1))
        return
    target_dir, lib = prepare(TARGET, QUANT)
    which = os.environ.get("HEADS", "eagle,medusa").split(",")
    common = dict(num_prompts=int(os.environ.get("HEAD_PROMPTS", "2000")), max_tokens=320, gen_batch=24,
                  train_batch=4, draft_vocab=12288, work_dir=cache_root() / "train" / f"{TARGET}-{QUANT}-eagle")
    if "eagle" in which:
        report = run_train_draft("eagle", target_dir, lib, HEAD_DIR, steps=int(os.environ.get("HEAD_STEPS", "1500")),
                                 **common)
        print(json.dumps(report, indent=1))
    if "medusa" in which:
        report = run_train_draft("medusa", target_dir, lib, MEDUSA_DIR,
                                 steps=int(os.environ.get("MEDUSA_STEPS", "1500")), medusa_num_heads=3,
                                 medusa_num_layers=1, **common)
        print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
