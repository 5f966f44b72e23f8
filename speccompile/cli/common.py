"""What the command modules share: the user-error exit and the target of a data command."""
from __future__ import annotations

import sys
from pathlib import Path

import click

USER_ERRORS = (ValueError, FileNotFoundError)


def fail(err: Exception) -> None:
    click.echo(f"error: {err}", err=True)
    sys.exit(2)


def target_options(command):
    """MODEL_DIR --model-lib, or --model NAME [--quantization]: the target of a data command
    (resolved by ``resolve_target``)."""
    for option in reversed([
            click.argument("model_dir", type=click.Path(path_type=Path), required=False),
            click.option("--model-lib", type=click.Path(path_type=Path), default=None,
                         help="the target's compiled library"),
            click.option("--model", "model_name", default=None,
                         help="instead of MODEL_DIR --model-lib: a model of speccompile/compiler/fetch.py, prepared once and cached"),
            click.option("--quantization", default="q4f32_1", show_default=True, help="with --model")]):
        command = option(command)
    return command


def resolve_target(model_dir, model_lib, model_name: str | None, quantization: str) -> tuple[Path, Path]:
    """MODEL_DIR and --model-lib as given, or those of --model NAME (prepared once and cached)."""
    if model_name:
        from speccompile.compiler.fetch import prepare

        model_dir, model_lib = prepare(model_name, quantization)
    if model_dir is None or model_lib is None:
        raise ValueError("give MODEL_DIR --model-lib LIB, or --model NAME")
    return model_dir, model_lib
