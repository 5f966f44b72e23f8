"""MLC-LLM's command lines (--overrides, --mode) through our CLI, on the tiny model.

The commands of the README's "Coming from MLC-LLM" table are read from the README itself and
run, so the table cannot document a command that does not work; each one's resulting engine
settings are checked. serve's HTTP server is replaced by a recorder that builds the
scheduler the server would run.
"""
from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner

from speccompile.cli import overrides
from speccompile.cli.main import main

README = Path(__file__).resolve().parents[2] / "README.md"
ENGINE_KEYS = ("max_num_sequence, max_total_seq_length, prefill_chunk_size, context_window_size, cuda_graph, spec_draft_length, "
               "spec_tree_width, spec_tree_nodes, ngram_min, ngram_max")
TINY_WINDOW, TINY_CHUNK, TINY_KV_BYTES = 512, 512, 2 * 2 * 2 * 16 * 4  # tiny-llama: 2 layers, 2 KV heads x 16, f32


def readme_commands() -> list[str]:
    """The speccompile commands of the README's MLC-LLM table (second column)."""
    text = README.read_text()
    section = text.split("## Coming from MLC-LLM", 1)[1].split("\n## ", 1)[0]
    rows = [line.split(" | ") for line in section.splitlines() if line.startswith("| ")]
    cmds = [m.group(1) for row in rows if len(row) >= 2 for m in [re.fullmatch(r"`(speccompile .*)`", row[1].strip())]
            if m]
    assert len(cmds) >= 10, "the MLC-LLM table lost its commands"
    return cmds


@pytest.fixture(scope="module")
def tiny(build_tiny):
    return build_tiny("tiny-llama", "q0f32")


@pytest.fixture
def recorded(monkeypatch, tmp_path):
    """Run CLI commands with the engine recorded and serve's server replaced."""
    from speccompile.runtime import engine as engine_module
    from speccompile.runtime.scheduler import Scheduler

    seen: dict = {}

    class Recorded(engine_module.Engine):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            seen["engine"] = self

    def run_server(engine, host, port, api_key, max_num_sequence, prefill_tokens_per_step, max_queue, *rest):
        seen["scheduler"] = Scheduler(engine, max_num_sequence, prefill_tokens_per_step, max_queue)

    monkeypatch.setattr(engine_module, "Engine", Recorded)
    monkeypatch.setattr("speccompile.serving.app.run_server", run_server)
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       16000000 kB\nMemAvailable:    1048576 kB\n")  # 1 GiB
    monkeypatch.setattr(overrides, "MEMINFO", meminfo)

    def run(args: list[str], input: str | None = None, code: int = 0):
        seen.clear()
        res = CliRunner().invoke(main, args, input=input)
        assert res.exit_code == code, f"{args}: {res.output}"
        return res, seen.get("engine"), seen.get("scheduler")

    run.meminfo = meminfo
    return run


def kv_tokens(engine) -> int:
    return engine.kv.num_pages * 16


def weight_bytes(model_dir: Path) -> int:
    index = json.loads((model_dir / "tensor-cache.json").read_text())
    return sum(r["nbytes"] for s in index["records"] for r in s["records"])


# ------------------------------------------------------------ the README's table
def test_every_mlc_llm_command_of_the_readme_runs(tiny, recorded, tmp_path):
    from conftest import make_hf_checkpoint
    from test_eagle_medusa import make_medusa_checkpoint

    from speccompile.models.config import PRESETS

    new = tmp_path / "new"  # convert_weight -> gen_config -> compile build here, not over the shared tiny model
    medusa = tmp_path / "medusa-hf"
    t = PRESETS["tiny-llama"]
    make_medusa_checkpoint(medusa, t["hidden_size"], t["vocab_size"], heads=3)
    (medusa / "config.json").write_text(json.dumps({"base_model_name_or_path": "target"}))  # sizes left out
    src = tmp_path / "src"
    make_hf_checkpoint(src, "tiny-llama")

    def paths(cmd: str) -> dict[str, str]:
        building = cmd.split()[1] in ("convert_weight", "gen_config", "compile") and "medusa" not in cmd
        d, lib = (new, tmp_path / "new.so") if building else (tiny.model_dir, tiny.lib)
        return {"SRC": str(src), "DIR": str(d), "LIB": str(lib), "DRAFT_DIR": str(tiny.model_dir),
                "DRAFT_LIB": str(tiny.lib), "MEDUSA": str(medusa), "HEAD_DIR": str(tmp_path / "head")}

    def substitute(cmd: str) -> list[str]:
        names = paths(cmd)
        pattern = re.compile(r"\b(" + "|".join(sorted(names, key=len, reverse=True)) + r")\b")
        return [pattern.sub(lambda m: names[m.group(1)], tok) for tok in shlex.split(cmd)[1:]]

    checked = set()
    for cmd in readme_commands():
        res, eng, sched = recorded(substitute(cmd), input="/exit\n" if " chat " in cmd else None)
        checked.add(cmd)
        key = " ".join(cmd.split()[1:2] + re.findall(r"--mode \S+", cmd)
                       + re.findall(r'--overrides "([^"]*)"', cmd) + re.findall(r"--speculative-mode \S+", cmd))
        if cmd.startswith("speccompile convert_weight SRC"):
            assert (new / "tensor-cache.json").exists()
        elif cmd.startswith("speccompile gen_config SRC"):
            conf = json.loads((new / "speccompile-config.json").read_text())
            assert (conf["context_window_size"], conf["prefill_chunk_size"]) == (256, 64)
            assert conf["chat_template"].startswith("{% for message in messages %}{{'<|im_start|>'")  # chatml
        elif cmd.startswith("speccompile compile"):
            from speccompile.runtime.model import baked_metadata

            meta = baked_metadata(tmp_path / "new.so")
            assert (meta["context_window_size"], meta["prefill_chunk_size"]) == (256, 64)
        elif "medusa" in cmd:
            head = tmp_path / "head"
            if cmd.startswith("speccompile convert_weight"):
                index = json.loads((head / "tensor-cache.json").read_text())
                names = {r["name"] for s in index["records"] for r in s["records"]}
                assert {n.split(".")[1] for n in names} == {"0", "1"}, "the first two of the three heads"
            else:
                conf = json.loads((head / "speccompile-config.json").read_text())
                assert (conf["model_config"]["num_heads"], conf["model_config"]["num_layers"]) == (2, 1)
        elif key == "serve max_num_sequence=6;max_total_seq_length=4096;prefill_chunk_size=64":
            assert (eng.max_num_sequence, kv_tokens(eng), eng.model.prefill_chunk_size, eng.max_batch_tokens) == \
                (6, 4096, 64, 64)
            assert (sched.max_num_sequence, sched.prefill_tokens_per_step) == (6, 64)
        elif key == "serve --mode local":
            assert (eng.max_num_sequence, kv_tokens(eng), sched.prefill_tokens_per_step) == (4, TINY_WINDOW, TINY_CHUNK)
            assert "--mode local: max_num_sequence=4, max_total_seq_length=512, prefill_chunk_size=512" in res.output
        elif key == "serve --mode interactive":
            assert (eng.max_num_sequence, kv_tokens(eng), sched.max_num_sequence) == (1, TINY_WINDOW, 1)
        elif key == "serve --mode server":  # 1 GiB available: capped at 8 sequences x 512
            assert (eng.max_num_sequence, kv_tokens(eng), sched.prefill_tokens_per_step) == (8, 8 * TINY_WINDOW,
                                                                                              TINY_CHUNK)
            assert "capped at max_num_sequence x context window = 4096" in res.output
        elif key == "serve spec_draft_length=3 --speculative-mode small_draft":
            assert eng.spec.speculative_mode == "small_draft" and eng.policy.fixed_k == 3
        elif key == "serve max_num_sequence=6 --speculative-mode ngram":
            assert eng.spec.speculative_mode == "ngram" and (eng.max_num_sequence, sched.max_num_sequence) == (6, 6)
            assert sched.prefill_tokens_per_step == 256  # no chunk given: serve's own default
        elif key == "chat context_window_size=256;prefill_chunk_size=64":
            assert (eng.context_window, eng.model.prefill_chunk_size, eng.max_num_sequence, kv_tokens(eng)) == \
                (256, 64, 1, 256)  # the interactive preset over the lowered window
        elif key == "generate max_total_seq_length=1024;prefill_chunk_size=32":
            assert (kv_tokens(eng), eng.model.prefill_chunk_size, eng.context_window) == (1024, 32, TINY_WINDOW)
        elif key == "bench spec_draft_length=2 --speculative-mode ngram":
            assert eng.policy.fixed_k == 2 and "tok/s" in res.output
        else:
            pytest.fail(f"README command without a check here: {cmd}")
    assert len(checked) == len(readme_commands())


# ------------------------------------------------------------- presets and precedence
def test_server_mode_sizes_the_kv_cache_from_available_memory(tiny, recorded):
    """fraction x (MemAvailable - weights) / KV bytes per token, in whole pages, printed."""
    weights = weight_bytes(tiny.model_dir)
    avail = weights + 2 * 1000 * TINY_KV_BYTES  # half of it (the default share) holds 1000 tokens
    recorded.meminfo.write_text(f"MemAvailable: {avail // 1024 + 1} kB\n")
    base = ["serve", str(tiny.model_dir), "--model-lib", str(tiny.lib), "--mode", "server"]
    res, eng, _ = recorded(base)
    assert kv_tokens(eng) == 992 and "holds 992 tokens" in res.output  # 1000 rounded down to 16-token pages
    res, eng, _ = recorded(base + ["--overrides", "gpu_memory_utilization=0.25"])
    assert kv_tokens(eng) == 496
    # overrides win over the preset, and the memory is not consulted for a given capacity
    res, eng, sched = recorded(base + ["--overrides", "max_num_sequence=2 max_total_seq_length=320"])
    assert (eng.max_num_sequence, kv_tokens(eng), sched.max_num_sequence) == (2, 320, 2)
    assert "max_num_sequence=2 (override)" in res.output
    recorded.meminfo.write_text(f"MemAvailable: {weights // 1024} kB\n")
    res, _, _ = recorded(base, code=2)
    assert "holds no KV page" in res.output and "max_total_seq_length" in res.output


def test_an_option_and_an_override_must_agree(tiny, recorded):
    base = ["serve", str(tiny.model_dir), "--model-lib", str(tiny.lib)]
    res, eng, _ = recorded(base + ["--max-num-sequence", "8", "--overrides", "max_num_sequence=6"], code=2)
    assert "--max-num-sequence 8 and --overrides max_num_sequence=6 disagree" in res.output and eng is None
    res, eng, _ = recorded(base + ["--max-num-sequence", "6", "--overrides", "max_num_sequence=6"])
    assert eng.max_num_sequence == 6
    # an explicit option also wins over the mode's preset
    res, eng, sched = recorded(base + ["--mode", "interactive", "--max-total-tokens", "1024"])
    assert (eng.max_num_sequence, kv_tokens(eng)) == (1, 1024)
    res, _, _ = recorded(["generate", str(tiny.model_dir), "--model-lib", str(tiny.lib), "--prompt", "x",
                          "--spec-draft-length", "2", "--overrides", "spec_draft_length=3"], code=2)
    assert "--spec-draft-length 2 and --overrides spec_draft_length=3 disagree" in res.output
    # prefill per step: the chunk unless --prefill-tokens-per-step says less; never more
    res, eng, sched = recorded(base + ["--prefill-tokens-per-step", "16", "--overrides", "prefill_chunk_size=64"])
    assert (sched.prefill_tokens_per_step, eng.model.prefill_chunk_size) == (16, 64)
    res, _, _ = recorded(base + ["--prefill-tokens-per-step", "100", "--overrides", "prefill_chunk_size=64"], code=2)
    assert "exceeds prefill_chunk_size=64" in res.output


def test_run_time_window_and_chunk_can_only_be_lowered(tiny, recorded):
    """Larger than compiled: a clear error before loading. Lower: applied (a prompt over the
    lowered window is refused; a smaller prefill chunk gives the same tokens)."""
    gen = ["generate", str(tiny.model_dir), "--model-lib", str(tiny.lib), "--max-tokens", "6", "--json", "--raw"]
    res, eng, _ = recorded(gen + ["--prompt", "x", "--overrides", "context_window_size=1024"], code=2)
    assert "configured and compiled for a 512-token window" in res.output and "gen_config" in res.output
    res, _, _ = recorded(gen + ["--prompt", "x", "--overrides", "prefill_chunk_size=1024"], code=2)
    assert "compiled for prefill chunks of at most 512" in res.output
    res, _, _ = recorded(gen + ["--prompt", "y" * 40, "--overrides", "context_window_size=32"], code=2)
    assert "context window is 32" in res.output
    prompt = "the quick brown fox jumps over the lazy dog " * 4  # 176 byte tokens: one chunk, or 6 of 32
    plain, _, _ = recorded(gen + ["--prompt", prompt])
    small, eng, _ = recorded(gen + ["--prompt", prompt, "--overrides", "prefill_chunk_size=32"])
    assert eng.model.prefill_chunk_size == 32
    assert json.loads(small.output)["token_ids"] == json.loads(plain.output)["token_ids"]


# ------------------------------------------------------------------ bad overrides
@pytest.mark.parametrize("text, message", [
    ("max_num_seq=6", "unknown --overrides key 'max_num_seq' for {cmd}"),
    ("max_num_sequence=six", "max_num_sequence takes an integer >= 1"),
    ("max_num_sequence=0", "max_num_sequence=0 is out of range"),
    ("max_num_sequence=2.5", "max_num_sequence takes an integer"),
    ("max_num_sequence", "'max_num_sequence' is not key=value"),
    ("max_num_sequence=2;max_num_sequence=3", "sets max_num_sequence twice"),
    ("spec_tree_nodes=300", "spec_tree_nodes=300 is out of range"),
    ("tensor_parallel_shards=2", "an MLC-LLM setting speccompile does not have: speccompile runs a model on one device"),
    ("max_batch_size=4", "(a key of gen_config)"),
])
@pytest.mark.parametrize("cmd", ["serve", "chat", "generate", "bench"])
def test_bad_overrides_name_the_accepted_keys(cmd, text, message, tmp_path):
    """Refused before anything is read: the model folder and library do not even exist."""
    args = [cmd, str(tmp_path / "none"), "--model-lib", str(tmp_path / "none.so"), "--overrides", text]
    res = CliRunner().invoke(main, args + (["--prompt", "x"] if cmd == "generate" else []))
    assert res.exit_code == 2, res.output
    assert message.format(cmd=cmd) in res.output
    keys = ENGINE_KEYS.replace("spec_tree_nodes,", "spec_tree_nodes, suffix_store_tokens,") if cmd == "serve" \
        else ENGINE_KEYS  # the suffix index keeps finished requests in a server only
    if cmd != "generate":  # one prompt per process: nothing comes after it to reuse its KV
        keys = keys.replace("cuda_graph,", "prefix_cache_max_num_recycling_seqs, cuda_graph,")
    assert f"`{cmd} --overrides` accepts: {keys}" in res.output


def test_overrides_that_do_not_apply_are_refused(tmp_path):
    r = CliRunner()
    res = r.invoke(main, ["serve", "D", "--model-lib", "L", "--overrides", "gpu_memory_utilization=0.8"])
    assert res.exit_code == 2 and "gpu_memory_utilization sizes the KV cache of --mode server" in res.output
    res = r.invoke(main, ["chat", "D", "--model-lib", "L", "--overrides", "gpu_memory_utilization=0.8"])
    assert res.exit_code == 2 and "(a key of serve)" in res.output
    res = r.invoke(main, ["chat", "D", "--model-lib", "L", "--mode", "server"])
    assert res.exit_code == 2 and "'server' is not 'interactive'" in res.output
    res = r.invoke(main, ["bench", "--endpoint", "http://127.0.0.1:9", "--overrides", "max_num_sequence=2"])
    assert res.exit_code == 2 and "with --endpoint the server's settings apply" in res.output
    res = r.invoke(main, ["serve", "D", "--model-lib", "L", "--overrides", "ngram_min=5;ngram_max=3"])
    assert res.exit_code == 2 and "ngram_min=5 exceeds ngram_max=3" in res.output
    res = r.invoke(main, ["gen_config", "S", "--quantization", "q0f32", "-o", str(tmp_path / "o"),
                          "--overrides", "max_num_sequence=4"])
    assert res.exit_code == 2 and "(a key of bench, chat, generate, serve)" in res.output
    assert "`gen_config --overrides` accepts: context_window_size, prefill_chunk_size, max_batch_size, " \
           "medusa_num_heads, medusa_num_layers" in res.output


def test_parser_accepts_semicolons_and_spaces():
    assert overrides.parse_overrides(" max_num_sequence=6; prefill_chunk_size=64  spec_draft_length=0;", "serve") == \
        {"max_num_sequence": 6, "prefill_chunk_size": 64, "spec_draft_length": 0}
    assert overrides.parse_overrides("gpu_memory_utilization=0.3", "serve") == {"gpu_memory_utilization": 0.3}
    assert overrides.parse_overrides("", "chat") == {} and overrides.parse_overrides(None, "chat") == {}
    with pytest.raises(overrides.OverrideError, match="gpu_memory_utilization takes a number"):
        overrides.parse_overrides("gpu_memory_utilization=nan", "serve")


def test_gen_config_and_convert_weight_overrides(tiny, tmp_path):
    """Model-config fields: an option and an override must agree; Medusa sizes cannot exceed
    the checkpoint, and mean nothing for a target model."""
    from test_eagle_medusa import make_medusa_checkpoint

    from speccompile.models.config import PRESETS

    r, hf = CliRunner(), str(tiny.hf_dir)
    out = tmp_path / "cfg"
    res = r.invoke(main, ["gen_config", hf, "--quantization", "q0f32", "-o", str(out), "--context-window-size", "128",
                          "--overrides", "context_window_size=256"])
    assert res.exit_code == 2 and "--context-window-size 128 and --overrides context_window_size=256 disagree" \
        in res.output
    res = r.invoke(main, ["gen_config", hf, "--quantization", "q0f32", "-o", str(out),
                          "--overrides", "max_batch_size=3;context_window_size=128"])
    assert res.exit_code == 0, res.output
    conf = json.loads((out / "speccompile-config.json").read_text())
    assert (conf["max_batch_size"], conf["context_window_size"], conf["prefill_chunk_size"]) == (3, 128, 128)
    res = r.invoke(main, ["gen_config", hf, "--quantization", "q0f32", "-o", str(out),
                          "--overrides", "medusa_num_heads=2"])
    assert res.exit_code == 2 and "apply to Medusa heads" in res.output
    t = PRESETS["tiny-llama"]
    medusa = tmp_path / "medusa"
    make_medusa_checkpoint(medusa, t["hidden_size"], t["vocab_size"], heads=3)
    for args, message in ((["--overrides", "medusa_num_heads=4"], "medusa_num_heads=4 but the checkpoint holds 3 heads"),
                          (["--overrides", "medusa_num_layers=2"], "lacks medusa_head.0.1.linear.weight")):
        for cmd in ("convert_weight", "gen_config"):
            res = r.invoke(main, [cmd, str(medusa), "--model-type", "medusa", "--target", hf, "--quantization", "q0f32",
                                  "-o", str(tmp_path / "h"), *args])
            assert res.exit_code == 2 and message in res.output, (cmd, res.output)
