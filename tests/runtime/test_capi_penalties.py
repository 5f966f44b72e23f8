"""The C API's penalties and logit bias (src/penalties.cc), the twin of runtime/penalties.py:
spc_generate's greedy tokens under each control equal the Python Engine's, plainly and with
speculation (n-gram chains, suffix trees); bad values are refused by name."""
from __future__ import annotations

import json

import pytest
from capi_ctypes import run_example

from speccompile.runtime.engine import Engine
from speccompile.runtime.sampling import SamplingParams

CONTROLS = [{"frequency_penalty": 1.5}, {"repetition_penalty": 1.8},
            {"frequency_penalty": -1.0, "presence_penalty": 2.0, "logit_bias": "198:-100,97:8"}]
PROMPTS = ["abcabcabcabc", "the cat and the cat and the"]


@pytest.fixture(scope="module")
def tiny(build_tiny):
    built = build_tiny("tiny-llama", "q0f32")
    return built.model_dir, built.lib


def _flags(controls: dict) -> list[str]:
    return [x for k, v in controls.items() for x in ("--" + k.replace("_", "-"), str(v))]


@pytest.mark.parametrize("controls", CONTROLS)
def test_tokens_equal_python_under_each_control(capi_build, tiny, controls):
    model_dir, lib = tiny
    eng = Engine(model_dir, lib)
    sp = SamplingParams(**controls)
    drafted, changed = 0, False
    for prompt in PROMPTS:
        ids = eng.encode_prompt(prompt)
        want = eng.generate(ids, 24, sampling=sp).token_ids
        changed |= want != eng.generate(ids, 24).token_ids
        for mode in (["--speculative-mode", "disable"], ["--speculative-mode", "ngram", "--spec-draft-length", "4"],
                     ["--speculative-mode", "suffix", "--spec-tree-width", "2"]):
            proc = run_example(capi_build / "spc_generate", model_dir, lib, "--prompt-ids", ",".join(map(str, ids)),
                               "--max-tokens", "24", "--json", *mode, *_flags(controls))
            assert proc.returncode == 0, proc.stderr
            out = json.loads(proc.stdout)
            assert out["token_ids"] == want, (mode, controls)
            drafted += out["stats"]["draft_tokens"]
    assert drafted > 0 and changed  # it speculated, and the control changed the output


@pytest.mark.parametrize("flags, words", [
    (["--logit-bias", "100000:1"], "logit_bias names token 100000"),
    (["--logit-bias", "5:300"], "logit_bias values must be in [-100, 100]"),
    (["--frequency-penalty", "3"], "frequency_penalty must be in [-2, 2]"),
    (["--repetition-penalty", "-1"], "repetition_penalty must be in (0, 10]"),
    (["--min-p", "2"], "min_p must be in [0, 1]"),
    (["--logit-bias", "5"], "--logit-bias takes ID:BIAS")])
def test_bad_values_are_refused(capi_build, tiny, flags, words):
    model_dir, lib = tiny
    proc = run_example(capi_build / "spc_generate", model_dir, lib, "--prompt-ids", "1,2,3", "--max-tokens", "4",
                       *flags)
    assert proc.returncode != 0 and words in proc.stderr, proc.stderr
