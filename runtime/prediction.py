"""Predicted Outputs: a draft the client supplies (OpenAI's ``prediction``), as one more
source of the suffix index.

Why. Editing a file or revising a document, most of the answer is text the client already
has. The prediction's tokens get their own suffix index (runtime/drafters/suffix.py), matched
per step like the sequence's own text and its tenant's store: where the answer follows the
prediction, the longest-matching source is the prediction and the draft runs along it; where
the answer departs from it (the edit), nothing matches; a few tokens after the edit the
context matches the prediction again and drafting re-aligns by itself. Verification keeps
only the target's own tokens, so a prediction changes the speed, never the output -- a wrong
one costs the rows it wasted, which the step's plan prices like any source's.

Usage, as OpenAI reports it, is runtime/metrics.py's ``prediction_usage``.
"""
from __future__ import annotations

import numpy as np

from .sequence import GenerationError


def check_prediction(engine, prediction: list[int] | None) -> None:
    """A prediction the engine can use, or a clear error before any work."""
    if not prediction:
        return
    if len(prediction) >= engine.context_window:
        raise GenerationError(f"the prediction has {len(prediction)} tokens but the context window is "
                              f"{engine.context_window}: send the part the answer will repeat")
    if engine.proposer is None or not hasattr(engine.proposer, "predict"):
        raise GenerationError(f"a prediction drafts through the suffix index: run with --speculative-mode suffix "
                              f"(the default), not {engine.spec.speculative_mode}")
    try:
        engine.model.check_token_ids(np.asarray(prediction))
    except ValueError as err:
        raise GenerationError(f"the prediction: {err}") from None
