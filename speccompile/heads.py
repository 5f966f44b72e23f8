"""``make heads``: train the project's own EAGLE and Medusa heads for SmolLM2-135M-Instruct.

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
import os
from pathlib import Path

from .fetch import cache_root, prepare
from .train_draft import run_train_draft

REPO = Path(__file__).resolve().parent.parent
TARGET = "SmolLM2-135M-Instruct"
QUANT = "q4f32_1"
HEAD_DIR = REPO / "heads" / f"{TARGET}-eagle"
MEDUSA_DIR = REPO / "heads" / f"{TARGET}-medusa"


def main() -> None:
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
