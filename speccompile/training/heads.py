"""``speccompile train-heads`` (``make heads MODEL=...``): train the project's own draft heads.

``--model Qwen2.5-Coder-1.5B-Instruct`` (the default) runs the EAGLE-3 pipeline, every stage
resumable, into ``$SPECCOMPILE_CACHE/train/<model>-<quant>-eagle3/``:
1. train-prompts: written prompt families plus Magpie user turns (--train-prompts,
   --held-out-prompts);
2. train-answers: the target's greedy answers with its layer features captured while it
   generates (--answer-prompts caps how many training prompts are answered; --answer-batch
   sequences decode together, 32 by default: 316 tok/s against 294 at 16 on a 2-core Zen 5).
   Stages 1 and 2 alternate in rounds of --prompt-block (2,000) prompts, so that whatever a
   session stops at is answered data a head can train on, not prompts alone (at ~120 prompts
   a minute and ~150 answer tokens a second, 20,000 prompts are hours of the first stage);
3. train-draft --method eagle3: the training-time test, best held-out checkpoint exported to
   ``heads/<model>-eagle3`` (--head-epochs; --head-max-steps, a time box the schedule anneals
   by; --head-draft-vocab, 16,384 tokens, shared in size with Medusa);
4. train-draft --method medusa on the same answers: 3 heads over a 16k draft vocabulary, to
   ``heads/<model>-medusa``, --medusa-epochs (4) passes of 4 conversations a step (3,000 steps,
   ~50 min, for 3,000 answers), or --medusa-steps. ``--heads eagle3`` or ``--heads medusa``
   trains one.
5. ``--heads eagle3 --head-init heads/<model>-eagle3 --head-replay-shards N`` fine-tunes the
   shipped head instead: on the answers it has not seen and N of its old shards
   (training/replay.py; give --head-epochs 2: the measured fine-tune).
Rerun the same command to continue after any interruption. The prompts and the answers' token
ids are also kept in ``heads/data/<model>-<quant>/`` (commit it): on a machine whose cache is
empty, the features are rebuilt from them by prefill instead of generating the answers again.

``--model SmolLM2-135M-Instruct`` trains EAGLE-1 and Medusa heads by self-distillation
(speccompile/training/eagle.py, speccompile/training/medusa.py) on one shared data set: the
target's greedy answers to --head-prompts (2,000) prompts of seven families
(speccompile/training/prompts.py) and its features. Both heads draft over a 12,288-token reduced
vocabulary counted from those answers, whose projection is the target's own lm_head rows;
so the heads hold only their trained layers plus ``d2t`` (EAGLE ~8 MB, Medusa ~3 MB, fp16)
and are committed in ``heads/`` for tests and bench (--head-steps, --medusa-steps: 1,500 each).
"""
from __future__ import annotations

import json
import math
from pathlib import Path

from speccompile.compiler.fetch import cache_root, prepare
from speccompile.training.eagle import run_train_draft
from speccompile.training.settings import HeadsSettings
from speccompile.training.store import read_index

REPO = Path(__file__).resolve().parents[2]
TARGET = "SmolLM2-135M-Instruct"
QUANT = "q4f32_1"
HEAD_DIR = REPO / "heads" / f"{TARGET}-eagle"
MEDUSA_DIR = REPO / "heads" / f"{TARGET}-medusa"


def eagle3_pipeline(model: str, quant: str, settings: HeadsSettings) -> dict:
    """The stages for one target; returns the training reports."""
    from speccompile.training.answers import run_train_answers
    from speccompile.training.eagle3 import Settings, train_eagle3
    from speccompile.training.prompt_set import Settings as PromptSettings
    from speccompile.training.prompt_set import default_work_dir, run_train_prompts

    target_dir, lib = prepare(model, quant)
    work = default_work_dir(target_dir)
    data = REPO / "heads" / "data" / target_dir.name  # prompts and answer ids, committed (training/store.py)
    final, block = settings.train_prompts, settings.prompt_block
    limit = settings.answer_prompts or final
    replay = settings.head_replay_shards is not None
    target = 0
    while target < final:  # rounds: prompts up to the next block, then their answers (each returns at once if done)
        target = min(final, target + block)
        run_train_prompts(target_dir, lib, work, target, settings.held_out_prompts, PromptSettings(), data_dir=data)
        run_train_answers(target_dir, lib, work, min(target, limit), held_out=settings.held_out_prompts,
                          mt_bench=True, max_tokens=768,
                          batch=settings.answer_batch, data_dir=data,
                          # a fine-tune with replay rebuilds only the features it trains on (below)
                          features=settings.answer_features and not replay)
    which = settings.chosen("eagle3,medusa")
    reports = {}
    if "eagle3" in which:
        head = Settings(epochs=settings.head_epochs, draft_vocab=settings.head_draft_vocab,
                        max_steps=settings.head_max_steps, init=settings.head_init,
                        recount_vocab=settings.head_recount_vocab)
        if replay:
            reports["eagle3"] = fine_tune_with_replay(target_dir, lib, work, data, REPO / "heads" / f"{model}-eagle3",
                                                      head, settings.head_replay_shards)
        else:
            reports["eagle3"] = train_eagle3(target_dir, work, REPO / "heads" / f"{model}-eagle3", head,
                                             record={"data_shards": len(read_index(work / "answers" / "train"))})
    if "medusa" in which:  # on the same answers (their final hidden states), 3 heads over a 16k vocabulary
        # steps follow the data (--medusa-epochs passes of 4 conversations a step), so a rerun after
        # more answers continues the checkpoint over them instead of finding it done
        index = work / "answers" / "train" / "index.jsonl"
        answered = sum(len(json.loads(line)["ids"]) for line in index.read_text().splitlines() if line.strip())
        steps = settings.medusa_steps or math.ceil(settings.medusa_epochs * answered / 4)
        reports["medusa"] = run_train_draft("medusa", target_dir, None, REPO / "heads" / f"{model}-medusa",
                                            steps=steps, train_batch=4, draft_vocab=16384, work_dir=work,
                                            medusa_num_heads=3)
    return reports


def fine_tune_with_replay(target_dir: Path, lib: Path, work: Path, data: Path, out: Path, head, replay: int) -> dict:
    """``--head-init <folder> --head-replay-shards N``: the new answers and N old shards, their
    features rebuilt into ``<work>-finetune`` (training/replay.py), then the fine-tune at the
    replay's peak lr; the exported report says which data shards the head has now seen."""
    from dataclasses import replace

    from speccompile.runtime.engine import Engine
    from speccompile.training.answers import FeatureBuffers, restore_split
    from speccompile.training.eagle3 import train_eagle3
    from speccompile.training.replay import FINE_TUNE_LR, assemble, plan_for
    from speccompile.training.store import answer_tokens, sync_prompts

    ft = work.with_name(work.name + "-finetune")
    seen, plan = plan_for(Path(head.init), data / "answers" / "train", ft / "answers" / "train", replay)
    sync_prompts(ft / "prompts", data / "prompts")  # the held-out families, for the offline scores
    engine = Engine(target_dir, lib, max_num_sequence=8, max_total_seq_length=8 * 4096)
    sink = FeatureBuffers(engine.model.hidden_size)
    report = {}
    with engine.capture_features(sink):
        for split in ("held_out", "mt_bench"):
            if (data / "answers" / split / "index.jsonl").exists():
                report[split] = restore_split(engine, ft / "answers" / split, data / "answers" / split, sink)
        report["train"] = assemble(engine, seen, replay, plan, ft / "answers" / "train", data / "answers" / "train",
                                   sink)
    del engine
    record = {"data_shards": len(read_index(data / "answers" / "train")),
              "fine_tune_data": {"seen": seen, "replay": replay, "shards": [e["shard"] for e in plan], "rebuilt": report}}
    every = answer_tokens(data / "answers" / "train") if head.recount_vocab else None  # not the sample's alone
    return train_eagle3(target_dir, ft, out, replace(head, lr=FINE_TUNE_LR), record=record, vocab_from=every)


def train_heads(model: str, quant: str, settings: HeadsSettings) -> dict:
    """Every stage for ``model`` (resumable); returns the training reports by head."""
    if model != TARGET:
        return eagle3_pipeline(model, quant, settings)
    target_dir, lib = prepare(TARGET, quant)
    which = settings.chosen("eagle,medusa")
    common = dict(num_prompts=settings.head_prompts, max_tokens=320, gen_batch=24, train_batch=4, draft_vocab=12288,
                  work_dir=cache_root() / "train" / f"{TARGET}-{quant}-eagle")
    reports = {}
    if "eagle" in which:
        reports["eagle"] = run_train_draft("eagle", target_dir, lib, HEAD_DIR, steps=settings.head_steps, **common)
    if "medusa" in which:
        reports["medusa"] = run_train_draft("medusa", target_dir, lib, MEDUSA_DIR, steps=settings.medusa_steps or 1500,
                                            medusa_num_heads=3, medusa_num_layers=1, **common)
    return reports
