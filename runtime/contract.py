"""The compiler/runtime contract: file names the two sides share.

(Filled in further by the contract work: page size, entry points, metadata keys.)
"""
from __future__ import annotations

import json
from pathlib import Path

CONFIG_NAME = "speccompile-config.json"  # written by gen_config, read by compile and every runtime


def read_model_config(model_dir: Path) -> dict:
    """The model folder's ``speccompile-config.json``, or a ValueError saying how to make it."""
    path = Path(model_dir) / CONFIG_NAME
    if not path.exists():
        raise ValueError(f"{path} not found: run `speccompile gen_config SRC -o {model_dir}`")
    return json.loads(path.read_text())
