"""bench's llama.cpp comparison plumbing, with a stand-in for llama-speculative-simple (a
script printing what the real binary prints): the command line each peer mode gets, and
the rates and ratios bench reports per peer, overall and per category. (The real binaries
are built by hand and never a dependency: README, "Speculative decoding".)"""
from __future__ import annotations

import json
import stat

import pytest

FAKE = """#!/bin/sh
echo "$@" >> {log}
case "$*" in
  *draft-simple*) echo "decoded 8 tokens in 0.50 seconds, speed: 16.0 t/s"; echo "n_drafted = 6"; echo "n_accept = 3";;
  *) echo "decoded 8 tokens in 0.25 seconds, speed: 32.0 t/s"; echo "n_drafted = 4"; echo "n_accept = 4";;
esac
"""


@pytest.fixture
def fake_llama(tmp_path):
    binary = tmp_path / "llama-speculative-simple"
    binary.write_text(FAKE.format(log=tmp_path / "calls.log"))
    binary.chmod(binary.stat().st_mode | stat.S_IEXEC)
    return binary, tmp_path / "calls.log"


def test_bench_runs_each_llama_peer_beside_ours(smollm2, fake_llama, tmp_path):
    from speccompile.bench.runner import run_bench

    gguf, model_dir, lib = smollm2
    binary, calls = fake_llama
    draft = tmp_path / "draft.gguf"
    draft.write_bytes(b"")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"question_id": 1, "category": "code", "turns": ["Write hello world in C."]}) + "\n")
    rep = run_bench(model_dir, lib, prompts, max_tokens=8, quiet=True, spec={"speculative_mode": "ngram"},
                    llama_speculative={"binary": binary, "gguf": gguf, "draft_gguf": draft, "draft_max": 3,
                                       "modes": ["small_draft", "ngram"]})
    lines = calls.read_text().splitlines()
    assert len(lines) == 2
    assert "--spec-type draft-simple" in lines[0] and f"-md {draft}" in lines[0]
    assert "--spec-type ngram-simple" in lines[1] and "-md" not in lines[1]
    s = rep["summary"]
    peers = s["llama_cpp_speculative"]
    assert peers["small_draft"]["spec_tokens_per_s"] == pytest.approx(16.0)
    assert peers["ngram"]["spec_tokens_per_s"] == pytest.approx(32.0)
    assert peers["small_draft"]["accept_rate"] == pytest.approx(0.5)
    for m, rate in (("small_draft", 16.0), ("ngram", 32.0)):
        assert s["llama_cpp_spec"][m]["ours_over"] == pytest.approx(s["spec_tokens_per_s"] / rate)
        assert rep["per_category"]["code"]["llama_cpp_spec"][m]["spec_tokens_per_s"] == pytest.approx(rate)
