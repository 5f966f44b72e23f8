"""The draft-head training commands: ``train-prompts``, ``train-answers``, ``train-draft`` and
``train-heads``, all of them in one run (registered on the ``speccompile`` group by speccompile/cli/main.py)."""
from __future__ import annotations

import json
from pathlib import Path

import click

from speccompile.cli.common import USER_ERRORS, fail, resolve_target, target_options
from speccompile.cli.options import config_options
from speccompile.training.settings import HeadsSettings


@click.command("train-draft")
@click.argument("target_dir", type=click.Path(path_type=Path))
@click.option("--method", type=click.Choice(["eagle", "eagle3", "medusa"]), required=True,
              help="eagle3 trains on WORK_DIR/answers (train-prompts, then train-answers make them)")
@click.option("--model-lib", type=click.Path(path_type=Path), default=None,
              help="the target's compiled library (eagle, medusa: they generate their data themselves)")
@click.option("-o", "--output", "output", required=True, type=click.Path(path_type=Path),
              help="folder for the head (official layout), its data and checkpoints")
@click.option("--num-prompts", type=int, default=600, show_default=True, help="self-distillation conversations")
@click.option("--max-tokens", type=int, default=384, show_default=True, help="answer length cap")
@click.option("--gen-batch", type=int, default=8, show_default=True, help="sequences generated together")
@click.option("--steps", type=int, default=3000, show_default=True, help="training steps (resumes from a checkpoint)")
@click.option("--train-batch", type=int, default=4, show_default=True, help="conversations per step")
@click.option("--draft-vocab", type=int, default=None,
              help="tokens in the draft vocabulary, counted from the target's answers [eagle, medusa: 16384; "
                   "eagle3: 16384, or a resumed run's own]")
@click.option("--work-dir", type=click.Path(path_type=Path), default=None,
              help="data and checkpoints (default OUTPUT/work); reuse it to resume, or to train "
                   "another method on the same data")
@click.option("--medusa-num-heads", type=int, default=4, show_default=True,
              help="medusa: heads (head k, from 0, predicts token t+k+2 from the feature at t)")
@click.option("--medusa-num-layers", type=int, default=1, show_default=True,
              help="medusa: residual blocks per head")
@click.option("--medusa-freeze-lm-head/--no-medusa-freeze-lm-head", default=True, show_default=True,
              help="medusa: keep every head's vocabulary projection equal to the target's lm_head "
                   "(cheap on a CPU); --no-... trains one per head (vocab x hidden floats each, plus Adam state)")
@click.option("--epochs", type=int, default=8, show_default=True, help="eagle3: passes over the training answers")
@click.option("--ttt-steps", type=int, default=4, show_default=True,
              help="eagle3: training-time test steps (the head trained on its own fed-back outputs)")
@click.option("--eval-every", type=int, default=50, show_default=True,
              help="eagle3: optimizer steps between held-out evaluations, at least (the curve; the best one is "
                   "exported); they also wait until they cost at most a tenth of the run's time")
@click.option("--intermediate-size", type=int, default=2816, show_default=True,
              help="eagle3: the head layer's MLP width (sets its size: 2816 is 57 MB of fp16 for a 1536-wide target)")
@click.option("--soft-labels/--hard-labels", default=False, show_default=True,
              help="eagle3: train on the target's next-token distributions (from the answers' final hidden "
                   "states) or on its greedy tokens alone (learned faster here: training/eagle3.py)")
@click.option("--init", "init", type=click.Choice(["target", "random"]), default="target", show_default=True,
              help="eagle3: a new head starts as the target's layer above the high feature (learned ~3x faster "
                   "at first on Qwen2.5-Coder-1.5B) or from random weights; a resumed run keeps its own")
@click.option("--export-only", is_flag=True, default=False,
              help="eagle3: export the best checkpoint so far and stop (safe beside a running training)")
def train_draft_cmd(target_dir, method, model_lib, output, num_prompts, max_tokens, gen_batch, steps, train_batch,
                    draft_vocab, work_dir, medusa_num_heads, medusa_num_layers, medusa_freeze_lm_head, epochs,
                    ttt_steps, eval_every, intermediate_size, soft_labels, init, export_only):
    """Train a draft head for TARGET_DIR by self-distillation (resumable; needs torch)."""
    from speccompile.training.eagle import run_train_draft

    try:
        if method == "eagle3":
            from speccompile.training.eagle3 import Settings, train_eagle3

            if work_dir is None:
                raise ValueError("--method eagle3 trains on WORK_DIR/answers: give --work-dir (train-answers' "
                                 "--work-dir)")
            report = train_eagle3(target_dir, work_dir, output,
                                  Settings(intermediate_size=intermediate_size, draft_vocab=draft_vocab,
                                           steps=ttt_steps, epochs=epochs, eval_every=eval_every,
                                           soft_labels=soft_labels, init=init), export_only=export_only)
            click.echo(json.dumps(report, indent=1))
            click.echo(f"wrote {output}/config.json and model.safetensors; next: speccompile convert_weight {output} "
                       "--model-type eagle --target <the target's HF folder or GGUF> ...")
            return
        shared = method == "medusa" and work_dir and (Path(work_dir) / "answers" / "train" / "index.jsonl").exists()
        if model_lib is None and not shared:
            raise ValueError(f"--method {method} generates its data: give --model-lib (or, for medusa, --work-dir "
                             "holding train-answers' data)")
        report = run_train_draft(method, target_dir, model_lib, output, num_prompts, max_tokens, gen_batch, steps,
                                 train_batch, draft_vocab or 16384, work_dir=work_dir, medusa_num_heads=medusa_num_heads,
                                 medusa_num_layers=medusa_num_layers, medusa_freeze_lm_head=medusa_freeze_lm_head)
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
@click.option("--num-prompts", type=int, default=20000, show_default=True, help="training prompts to reach")
@click.option("--held-out", type=int, default=500, show_default=True, help="held-out prompts (other styles) to reach")
@click.option("--magpie-share", type=float, default=0.5, show_default=True,
              help="share of slots whose user turn the target samples itself (the rest are written families)")
@click.option("--batch", type=int, default=8, show_default=True, help="Magpie sequences decoded together")
@click.option("--max-new-tokens", type=int, default=512, show_default=True,
              help="longest sampled user turn (longer ones are dropped as truncated)")
@click.option("--temperature", type=float, default=1.0, show_default=True)
@click.option("--top-p", type=float, default=0.95, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True, help="decides every slot; fixed for a work dir")
@click.option("--exclude", "exclude", multiple=True, type=click.Path(path_type=Path),
              help="benchmark JSONL files (MT-bench format) never to overlap; default bench/mt_bench.jsonl and "
                   "bench/prompts.jsonl")
def train_prompts_cmd(model_dir, model_lib, model_name, quantization, work_dir, data_dir, num_prompts, held_out,
                      magpie_share, batch, max_new_tokens, temperature, top_p, seed, exclude):
    """Build the prompt set a draft head trains on: written families plus Magpie user turns
    sampled from the target, filtered (duplicates, degenerate samples, benchmark overlap),
    with a held-out set of other styles. Resumable: rerun the same command to continue."""
    from speccompile.training.prompt_set import Settings, run_train_prompts

    try:
        settings = Settings(seed=seed, magpie_share=magpie_share, temperature=temperature, top_p=top_p,
                            max_new_tokens=max_new_tokens)
        settings.check()
        model_dir, model_lib = resolve_target(model_dir, model_lib, model_name, quantization)
        report = run_train_prompts(model_dir, model_lib, work_dir, num_prompts, held_out, settings, batch,
                                   list(exclude) or None, data_dir=data_dir)
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
@click.option("--num-prompts", type=int, default=None, help="training prompts to answer (default: all there are)")
@click.option("--held-out", type=int, default=200, show_default=True, help="held-out prompts to answer")
@click.option("--mt-bench/--no-mt-bench", default=True, show_default=True,
              help="also answer MT-bench first turns (offline evaluation only, never trained on)")
@click.option("--max-tokens", type=int, default=768, show_default=True, help="longest answer")
@click.option("--batch", type=int, default=8, show_default=True, help="sequences decoded together")
def train_answers_cmd(model_dir, model_lib, model_name, quantization, work_dir, data_dir, num_prompts, held_out,
                      mt_bench, max_tokens, batch):
    """The target's greedy answers to the prompt set, with its low/mid/high layer features
    captured while it generates (an EAGLE-3 head's training data). Resumable: rerun the
    same command to continue; raise --num-prompts as train-prompts makes more."""
    from speccompile.training.answers import run_train_answers

    try:
        model_dir, model_lib = resolve_target(model_dir, model_lib, model_name, quantization)
        report = run_train_answers(model_dir, model_lib, work_dir, num_prompts, held_out, mt_bench, max_tokens, batch,
                                   data_dir=data_dir)
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
