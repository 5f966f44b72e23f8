"""``make heads``: train the project's own EAGLE head for SmolLM2-135M-Instruct.

No EAGLE weights for our models are reachable from this machine, so we train one by
self-distillation (speccompile/train_draft.py). The head (fp16, ~21 MB with its 12,288-token
reduced draft vocabulary, which covers 95% of held-out answer tokens) is written to
``heads/`` in the repository for tests and bench; data and checkpoints go to the cache
(``$SPECCOMPILE_CACHE/train``), and every stage resumes, so an interrupted run continues
where it stopped.
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


def main() -> None:
    target_dir, lib = prepare(TARGET, QUANT)
    steps = int(os.environ.get("HEAD_STEPS", "1500"))
    report = run_train_draft("eagle", target_dir, lib, HEAD_DIR, num_prompts=int(os.environ.get("HEAD_PROMPTS", "2000")),
                             max_tokens=320, gen_batch=24, steps=steps, train_batch=4, draft_vocab=12288,
                             work_dir=cache_root() / "train" / f"{TARGET}-{QUANT}-eagle")
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
