"""The draft-head training commands: ``train-prompts``, ``train-answers``, ``train-draft`` and
``train-heads``, all of them in one run (registered on the ``speccompile`` group by speccompile/cli/main.py)."""
from __future__ import annotations

import json
from pathlib import Path

import click

from speccompile.cli.common import USER_ERRORS, fail, resolve_target, target_options
from speccompile.cli.options import config_options
from speccompile.training.settings import (AnswerRun, DraftSettings, Eagle3Settings, HeadsSettings, PromptRun,
                                            PromptSetSettings)


@click.command("train-draft")
@click.argument("target_dir", type=click.Path(path_type=Path))
@click.option("--method", type=click.Choice(["eagle", "eagle3", "medusa"]), required=True,
              help="eagle3 trains on WORK_DIR/answers (train-prompts, then train-answers make them)")
@click.option("--model-lib", type=click.Path(path_type=Path), default=None,
              help="the target's compiled library (eagle, medusa: they generate their data themselves)")
@click.option("-o", "--output", "output", required=True, type=click.Path(path_type=Path),
              help="folder for the head (official layout), its data and checkpoints")
@click.option("--work-dir", type=click.Path(path_type=Path), default=None,
              help="data and checkpoints (default OUTPUT/work); reuse it to resume, or to train "
                   "another method on the same data")
@config_options(DraftSettings, "draft", "train-draft")
@config_options(Eagle3Settings, "eagle3", "train-draft")
@click.option("--export-only", is_flag=True, default=False,
              help="eagle3: export the best checkpoint so far and stop (safe beside a running training)")
def train_draft_cmd(target_dir, method, model_lib, output, work_dir, draft, eagle3, export_only):
    """Train a draft head for TARGET_DIR by self-distillation (resumable; needs torch)."""
    from speccompile.training.eagle import run_train_draft

    try:
        draft = DraftSettings(**draft)
        if method == "eagle3":
            from speccompile.training.eagle3 import train_eagle3

            if work_dir is None:
                raise ValueError("--method eagle3 trains on WORK_DIR/answers: give --work-dir (train-answers' "
                                 "--work-dir)")
            report = train_eagle3(target_dir, work_dir, output, Eagle3Settings(**eagle3, draft_vocab=draft.draft_vocab),
                                  export_only=export_only)
            click.echo(json.dumps(report, indent=1))
            click.echo(f"wrote {output}/config.json and model.safetensors; next: speccompile convert_weight {output} "
                       "--model-type eagle --target <the target's HF folder or GGUF> ...")
            return
        shared = method == "medusa" and work_dir and (Path(work_dir) / "answers" / "train" / "index.jsonl").exists()
        if model_lib is None and not shared:
            raise ValueError(f"--method {method} generates its data: give --model-lib (or, for medusa, --work-dir "
                             "holding train-answers' data)")
        report = run_train_draft(method, target_dir, model_lib, output, draft, work_dir=work_dir)
    except USER_ERRORS as err:
        fail(err)
    click.echo(json.dumps(report, indent=1))
    click.echo(f"wrote {output}/config.json and model.safetensors; next: speccompile convert_weight {output} "
               f"--model-type {method} --target <the target's HF folder or GGUF> ...")


@click.command("train-prompts")
@target_options
@click.option("--work-dir", type=click.Path(path_type=Path), default=None,
              help="prompts go to WORK_DIR/prompts (default $SPECCOMPILE_CACHE/train/<model dir name>-eagle3)")
@click.option("--data-dir", type=click.Path(path_type=Path), default=None,
              help="also keep the prompts and the answers' token ids here (a folder to commit; features are rebuilt "
                   "from them by prefill on a machine whose work dir is empty); make heads uses heads/data/<model>")
@config_options(PromptRun, "run", "train-prompts")
@config_options(PromptSetSettings, "settings", "train-prompts")
@click.option("--exclude", "exclude", multiple=True, type=click.Path(path_type=Path),
              help="benchmark JSONL files (MT-bench format) never to overlap; default bench/mt_bench.jsonl and "
                   "bench/prompts.jsonl")
@click.option("--focus", default=None, metavar="FAMILY",
              help="make only prompts of this focused family (code_typed: typed Python from a prose spec), until the "
                   "set holds --num-prompts of them and a 25th as many held-out; the slots they take are saved with "
                   "the set")
def train_prompts_cmd(model_dir, model_lib, model_name, quantization, work_dir, data_dir, run, settings, exclude, focus):
    """Build the prompt set a draft head trains on: written families plus Magpie user turns
    sampled from the target, filtered (duplicates, degenerate samples, benchmark overlap),
    with a held-out set of other styles. Resumable: rerun the same command to continue."""
    from speccompile.training.prompt_set import run_train_prompts

    try:
        settings, run = PromptSetSettings(**settings), PromptRun(**run)
        model_dir, model_lib = resolve_target(model_dir, model_lib, model_name, quantization)
        report = run_train_prompts(model_dir, model_lib, work_dir, run.num_prompts, run.held_out, settings, run.batch,
                                   list(exclude) or None, data_dir=data_dir, focus=focus)
    except USER_ERRORS as err:
        fail(err)
    click.echo(json.dumps(report, indent=1))


@click.command("train-answers")
@target_options
@click.option("--work-dir", type=click.Path(path_type=Path), default=None,
              help="reads WORK_DIR/prompts, writes WORK_DIR/answers (default as train-prompts)")
@click.option("--data-dir", type=click.Path(path_type=Path), default=None,
              help="also keep the prompts and the answers' token ids here (a folder to commit; features are rebuilt "
                   "from them by prefill on a machine whose work dir is empty); make heads uses heads/data/<model>")
@config_options(AnswerRun, "run", "train-answers")
def train_answers_cmd(model_dir, model_lib, model_name, quantization, work_dir, data_dir, run):
    """The target's greedy answers to the prompt set, with its low/mid/high layer features
    captured while it generates (an EAGLE-3 head's training data). Resumable: rerun the
    same command to continue; raise --num-prompts as train-prompts makes more."""
    from speccompile.training.answers import run_train_answers

    try:
        run = AnswerRun(**run)
        model_dir, model_lib = resolve_target(model_dir, model_lib, model_name, quantization)
        report = run_train_answers(model_dir, model_lib, work_dir, run.num_prompts, run.held_out, run.mt_bench,
                                   run.max_tokens, run.batch, data_dir=data_dir, features=run.features)
    except USER_ERRORS as err:
        fail(err)
    click.echo(json.dumps(report, indent=1))


@click.command("train-heads")
@click.option("--model", "model_name", default="Qwen2.5-Coder-1.5B-Instruct", show_default=True,
              help="a model of speccompile/compiler/fetch.py: the EAGLE-3 pipeline (EAGLE-3 and Medusa heads), or "
                   "SmolLM2-135M-Instruct (EAGLE-1 and Medusa heads)")
@click.option("--quantization", default="q4f32_1", show_default=True)
@config_options(HeadsSettings, "settings", "train-heads")
def train_heads_cmd(model_name, quantization, settings):
    """Train the project's own draft heads, every stage resumable (rerun to continue): prompts,
    answers with features, then the heads, into heads/ (speccompile/training/heads.py)."""
    from speccompile.training.heads import train_heads

    try:
        report = train_heads(model_name, quantization, HeadsSettings(**settings))
    except USER_ERRORS as err:
        fail(err)
    click.echo(json.dumps(report, indent=1))
