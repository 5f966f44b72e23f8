"""The command line as a user runs it, end to end on a tiny model."""
import json

import pytest
from click.testing import CliRunner

from speccompile.cli.main import main


@pytest.mark.tiny
def test_pipeline_commands_and_generate_json(tmp_path):
    from conftest import make_hf_checkpoint

    hf = tmp_path / "hf"
    make_hf_checkpoint(hf, "tiny-qwen2")
    r = CliRunner()
    out = tmp_path / "m"
    assert r.invoke(main, ["convert_weight", str(hf), "--quantization", "q4f32_1", "-o", str(out)]).exit_code == 0
    assert r.invoke(main, ["gen_config", str(hf), "--quantization", "q4f32_1", "-o", str(out),
                           "--context-window-size", "256"]).exit_code == 0
    conf = json.loads((out / "speccompile-config.json").read_text())
    assert conf["context_window_size"] == 256 and (out / "tokenizer.json").exists()
    lib = tmp_path / "m.so"
    res = r.invoke(main, ["compile", str(out / "speccompile-config.json"), "--device", "llvm", "-o", str(lib)])
    assert res.exit_code == 0, res.output
    res = r.invoke(main, ["generate", str(out), "--model-lib", str(lib), "--prompt", "hello", "--max-tokens", "8",
                          "--json", "--speculative-mode", "ngram"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert {"prompt_token_ids", "token_ids", "text", "finish_reason", "stats"} <= set(data)
    assert {"prefill_tokens", "decode_tokens", "prefill_tokens_per_s", "decode_tokens_per_s", "accept_rate",
            "mean_accepted_length", "per_position_accept_rate", "draft_steps", "verify_steps"} <= set(data["stats"])
    assert len(data["token_ids"]) <= 8
    plain = json.loads(r.invoke(main, ["generate", str(out), "--model-lib", str(lib), "--prompt", "hello",
                                       "--max-tokens", "8", "--json"]).output)
    assert plain["token_ids"] == data["token_ids"]
    res = r.invoke(main, ["chat", str(out), "--model-lib", str(lib), "--max-tokens", "4"],
                   input="hi\n/stats\n/reset\nagain\n/exit\n")
    assert res.exit_code == 0 and "decode_tokens" in res.output and "conversation reset" in res.output
    res = r.invoke(main, ["compile", str(out / "speccompile-config.json"), "--device", "metal", "-o", str(lib)])
    assert res.exit_code == 2 and "use -o" in res.output
    res = r.invoke(main, ["generate", str(out), "--model-lib", str(lib), "--prompt", "x" * 400, "--raw"])
    assert res.exit_code == 2 and "context window is 256" in res.output


def test_runtime_never_imports_the_compiler_side():
    """Applications embed speccompile.runtime: it must not pull in models/, passes/ or compile."""
    import subprocess
    import sys

    code = ("import sys, speccompile.runtime.engine, speccompile.runtime.drafters.proposers; "
            "bad = [m for m in sys.modules if m.startswith(('speccompile.models', 'speccompile.passes', 'speccompile.kernels', "
            "'speccompile.compiler'))]; print(bad); sys.exit(1 if bad else 0)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.tiny
def test_bench_runs_each_prompt_plain_spec_spec_plain_and_reports_identical_outputs(tmp_path):
    """`speccompile bench` with a speculative mode: per prompt plain / spec / spec / plain
    (drift cancels), every one of the four outputs identical, JSON with the side-by-side
    figures. (A benchmark's numbers are not asserted: only that it measures the right thing.)"""
    from conftest import make_hf_checkpoint

    hf = tmp_path / "hf"
    make_hf_checkpoint(hf, "tiny-qwen2")
    r, out, lib = CliRunner(), tmp_path / "m", tmp_path / "m.so"
    assert r.invoke(main, ["convert_weight", str(hf), "--quantization", "q0f32", "-o", str(out)]).exit_code == 0
    assert r.invoke(main, ["gen_config", str(hf), "--quantization", "q0f32", "-o", str(out)]).exit_code == 0
    assert r.invoke(main, ["compile", str(out / "speccompile-config.json"), "--device", "llvm", "-o", str(lib)]).exit_code == 0
    report = tmp_path / "bench.json"
    res = r.invoke(main, ["bench", str(out), "--model-lib", str(lib), "--speculative-mode", "ngram", "--num-prompts", "2",
                          "--max-tokens", "12", "--json", str(report)])
    assert res.exit_code == 0, res.output
    data = json.loads(report.read_text())
    assert data["summary"]["identical_outputs"] == 2
    for row in data["per_prompt"]:
        assert row["decode_tokens"] == 11 and row["spec_seconds"] > 0 and row["plain_seconds"] > 0  # 1 from prefill
        assert abs(row["speedup"] - row["spec_tokens_per_s"] / row["plain_tokens_per_s"]) < 1e-9


def test_one_shot_bench_refuses_plain_decoding_before_running_anything(tmp_path):
    """--one-shot compares plain and speculative runs: without a mode there is nothing to compare."""
    import pytest

    from speccompile.bench.oneshot import run_one_shot

    with pytest.raises(ValueError, match="give a --speculative-mode"):
        run_one_shot(tmp_path, tmp_path / "lib.so", {"speculative_mode": "disable"})


LLAMA = """#!/bin/sh
echo "$@" >> {log}
echo "encoded 5 tokens in 0.05 seconds, speed: 100.0 t/s"
echo "decoded 8 tokens in 0.25 seconds, speed: 32.0 t/s"; echo "n_drafted = 4"; echo "n_accept = 3"
"""


def test_one_shot_bench_repeats_fresh_generate_processes(build_tiny, tmp_path):
    """--one-shot --repeat 2: two plain/spec/spec/plain quartets of fresh `speccompile generate`
    processes per prompt (the runtime-only TVM import included), all eight outputs identical,
    counts summed over the spec runs and reported per run; llama.cpp's one-shot process (a
    stand-in printing what llama-speculative-simple prints) beside each quartet, on the prompt
    rendered with the same chat template."""
    import stat

    from speccompile.bench.llama_cpp import default_peers
    from speccompile.bench.oneshot import run_one_shot

    built = build_tiny("tiny-llama", "q0f32")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"question_id": 1, "category": "code", "turns": ["def add(a, b): return a + b"]}) + "\n")
    llama = tmp_path / "llama-speculative-simple"
    llama.write_text(LLAMA.format(log=tmp_path / "calls.log"))
    llama.chmod(llama.stat().st_mode | stat.S_IEXEC)
    assert default_peers("suffix", None) == ["ngram"] and default_peers("eagle", tmp_path) == ["ngram", "small_draft"]
    assert default_peers("small_draft", tmp_path) == ["small_draft"]
    report = run_one_shot(built.model_dir, built.lib, {"speculative_mode": "suffix"}, prompts, max_tokens=10,
                          quiet=True, repeat=2, llama_speculative={"binary": llama, "gguf": tmp_path / "t.gguf",
                                                                  "modes": ["ngram"]})
    calls = (tmp_path / "calls.log").read_text().splitlines()
    assert len(calls) == 2 and all("--spec-type ngram-simple" in c for c in calls)  # once per repeat
    row = report["prompts"][0]
    peer = row["llama_cpp_spec"]["ngram"]
    assert peer["tokens_per_s"] == pytest.approx(32.0) and peer["request_seconds"] == pytest.approx(0.30)
    assert peer["ours_over"] == pytest.approx(row["spec_tokens_per_s"] / 32.0) and peer["accept_rate"] == 0.75
    assert report["overall"]["ours_over_best_llama_cpp"] == pytest.approx(row["spec_tokens_per_s"] / 32.0)
    summary = report["categories"]["code"]["llama_cpp_spec"]["ngram"]
    assert summary["spec_tokens_per_s"] == pytest.approx(32.0) and summary["accept_rate"] == 0.75
    assert summary["ours_over_request"] == pytest.approx(0.30 / row["spec_request_seconds"])
    assert report["repeat"] == 2 and row["runs"] == 8 and row["identical_output"]
    assert row["verify_steps"] + row["plain_steps"] <= 10 and row["plain_seconds"] > 0 and row["spec_seconds"] > 0
    assert report["overall"]["identical_outputs"] == 1
    # end to end: each request's prefill plus decode, which the decode-only figure leaves out
    assert row["plain_request_seconds"] > row["plain_seconds"] and row["spec_request_seconds"] > row["spec_seconds"]
    assert row["request_speedup"] == pytest.approx(row["plain_request_seconds"] / row["spec_request_seconds"])
    assert report["overall"]["request_speedup"] > 0
    with pytest.raises(ValueError, match="--repeat must be >= 1"):
        run_one_shot(built.model_dir, built.lib, {"speculative_mode": "ngram"}, prompts, repeat=0)


def test_one_shot_bench_samples_as_told_and_compares_per_token(build_tiny, tmp_path, monkeypatch):
    """--one-shot with sampling options: every generate process gets them (a server's default
    for most models is to sample), answers are not compared (each is its own draw), a seeded
    plain pair repeats itself, and times are per decoded token. Sampling options anywhere but
    --one-shot, or beside llama.cpp's greedy peer, are refused before anything runs."""
    from speccompile.bench import oneshot

    built = build_tiny("tiny-llama", "q0f32")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"question_id": 1, "category": "qa", "turns": ["Why is the sky blue?"]}) + "\n")
    calls, real = [], oneshot.generate_process
    graphs = {"enabled": True, "failed": None, "graphs": 2, "captures": 2, "capture_seconds": 0.02, "replays": 9}
    # what a cuda process adds to its JSON: the graphs it captured, at what cost
    monkeypatch.setattr(oneshot, "generate_process", lambda *a: calls.append(a) or {**real(*a), "cuda_graph": graphs})
    sampling = {"temperature": 2.0, "top_p": 0.95, "top_k": 50, "seed": 3}
    report = oneshot.run_one_shot(built.model_dir, built.lib, {"speculative_mode": "ngram"}, prompts, max_tokens=12,
                                  quiet=True, sampling=sampling)
    assert [c[-2:] for c in calls] == [(sampling, None)] * 4 and report["sampling"] == sampling
    row = report["prompts"][0]
    assert row["identical_output"] is None and report["overall"]["identical_outputs"] == 0
    assert row["spec_seconds"] > 0 and row["plain_request_seconds"] > row["plain_seconds"]
    assert row["verify_seconds"] > 0 and row["draft_seconds"] > 0 and row["other_seconds"] > 0  # a spec run's steps
    assert row["cuda_graph"] == {"plain_captures": 2, "plain_capture_seconds": 0.02, "plain_replays": 9,
                                 "spec_captures": 2, "spec_capture_seconds": 0.02, "spec_replays": 9}
    a = real(built.model_dir, built.lib, "Why is the sky blue?", 12, oneshot.PLAIN, None, None, sampling)
    b = real(built.model_dir, built.lib, "Why is the sky blue?", 12, oneshot.PLAIN, None, None, sampling)
    greedy = real(built.model_dir, built.lib, "Why is the sky blue?", 12, oneshot.PLAIN)
    assert a["token_ids"] == b["token_ids"] != greedy["token_ids"]  # the seed is honoured, and it samples
    with pytest.raises(ValueError, match="greedily"):
        oneshot.run_one_shot(built.model_dir, built.lib, {"speculative_mode": "ngram"}, prompts, sampling=sampling,
                             llama_speculative={"binary": tmp_path, "gguf": tmp_path, "modes": ["ngram"]})
    res = CliRunner().invoke(main, ["bench", str(built.model_dir), "--model-lib", str(built.lib), "--temperature", "0.7"])
    assert res.exit_code == 2 and "are for --one-shot runs" in res.output


def test_train_heads_takes_its_settings_as_options_checked_before_anything_loads():
    """train-heads' settings are generated options (no environment variables); a bad value
    is refused by name before any model is fetched (the unit tier refuses a fetch anyway)."""
    from speccompile.training.settings import HeadsSettings

    r = CliRunner()
    res = r.invoke(main, ["train-heads", "--help"])
    assert res.exit_code == 0 and "--head-max-steps" in res.output and "--answer-batch" in res.output
    res = r.invoke(main, ["train-heads", "--train-prompts", "0"])
    assert res.exit_code == 2 and "--train-prompts 0" in res.output and ">= 1" in res.output
    res = r.invoke(main, ["train-heads", "--medusa-epochs", "zero"])
    assert res.exit_code == 2 and "--medusa-epochs" in res.output
    assert HeadsSettings().train_prompts == 20000 and HeadsSettings(heads="eagle3").chosen("x") == ["eagle3"]


@pytest.mark.parametrize("command, classes", [
    ("train-draft", ("DraftSettings", "Eagle3Settings")),
    ("train-prompts", ("PromptRun", "PromptSetSettings")),
    ("train-answers", ("AnswerRun",)),
])
def test_training_commands_take_generated_options_checked_before_anything_loads(tmp_path, command, classes):
    """Each training command's flags come from its settings classes (one definition: type,
    default, range, help), and a value out of range is refused by its flag before the target
    is read: the target folder here does not exist, so any later check would say so instead."""
    from speccompile.cli.options import flagged
    from speccompile.training import settings

    r = CliRunner()
    shown = r.invoke(main, [command, "--help"]).output
    opts = [o for name in classes for o in flagged(getattr(settings, name), command)]
    assert opts and all(o.flag.split("/")[0] in shown for o in opts)
    numeric = next(o for o in opts if o.kind is int and o.low is not None)
    args = [command, str(tmp_path / "no-model"), "--model-lib", "x.so", numeric.flag, str(int(numeric.low) - 1)]
    if command == "train-draft":
        args[2:2] = ["--method", "eagle", "-o", str(tmp_path / "out")]
    res = r.invoke(main, args)
    assert res.exit_code == 2 and f"{numeric.flag} {int(numeric.low) - 1}" in res.output, res.output
    assert not (tmp_path / "out").exists()
