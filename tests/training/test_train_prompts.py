"""The prompt-set stage (speccompile/training/prompt_set.py): the Magpie prefix read from chat
templates, the sampler on the tiny model (a job's text depends only on its prefix and seed,
which resuming relies on), the filters and the benchmark exclusion, resuming after an
interruption without repeating or losing a slot, and the held-out set's disjointness; the wide
mix's grounded slots (a document the target writes, wrapped into a request) and the upgrade of
a coder-mix set to it. Sampled text is faked where the model's text does not matter; no real
model is loaded."""
from __future__ import annotations

import json
import random
from dataclasses import asdict

import pytest
from click.testing import CliRunner

from speccompile.training.magpie import Job, MagpieError, MagpieSampler, Sample, cut_answer_leak, magpie_prefix
from speccompile.training.prompt_filters import (BenchmarkGuard, NearDupIndex, benchmark_texts, degenerate,
                                        looks_like_code)
from speccompile.training.prompt_set import (BENCHMARKS, GROUNDED_WEIGHTS, HELD_OUT_WEIGHTS, WIDE_WRITTEN_WEIGHTS,
                                             WRITTEN_WEIGHTS, PromptSet, Settings, build_prompt_set, plan_slot,
                                             read_prompts)
from speccompile.training.prompts_code import CODE_FAMILIES
from speccompile.training.prompts_grounded import clean_document, complete_paragraphs, document_problem

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
QWEN_LIKE = ("{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\n' + messages[0]['content'] + "
             "'<|im_end|>\n' }}{%- else %}{{- '<|im_start|>system\nYou are Qwen, a helpful assistant.<|im_end|>\n' }}"
             "{%- endif %}{%- for m in messages %}{%- if m.role != 'system' or not loop.first %}{{- '<|im_start|>' + "
             "m.role + '\n' + m.content + '<|im_end|>\n' }}{%- endif %}{%- endfor %}"
             "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}")
LLAMA3 = ("{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
          "{{ m['content'] | trim }}<|eot_id|>{% endfor %}")
CHAT = {"chat_template": CHATML, "bos_token": "", "eos_token": ""}


# ------------------------------------------------------------------ the Magpie prefix
def test_magpie_prefix_is_read_from_the_chat_template():
    assert magpie_prefix(CHATML) == "<|im_start|>user\n"
    assert magpie_prefix(CHATML, "Be brief.") == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n"
    # a template with a default system prompt (Qwen's) puts it before the user turn
    assert magpie_prefix(QWEN_LIKE) == "<|im_start|>system\nYou are Qwen, a helpful assistant.<|im_end|>\n<|im_start|>user\n"
    assert magpie_prefix(QWEN_LIKE, "S").startswith("<|im_start|>system\nS<|im_end|>")
    assert magpie_prefix(LLAMA3, bos_token="<s>") == "<s><|start_header_id|>user<|end_header_id|>\n\n"


def test_magpie_prefix_of_the_tiny_models_converted_config(tmp_path):
    from conftest import make_hf_checkpoint

    from speccompile.compiler.gen_config import gen_config
    from speccompile.runtime.contract import read_model_config

    make_hf_checkpoint(tmp_path / "hf", "tiny-llama")
    gen_config(tmp_path / "hf", "q0f32", tmp_path / "out")
    cfg = read_model_config(tmp_path / "out")
    assert magpie_prefix(cfg["chat_template"], None, cfg.get("bos_token") or "") == "<|im_start|>user\n"


@pytest.mark.parametrize("template, system, why", [
    ("", None, "no chat template"),
    ("{% for m in messages %}{{ m['content'] | upper }}{% endfor %}", None, "verbatim"),
    ("{% for m in messages %}{% if m.role == 'user' %}<u>{{ m['content'] }}{% endif %}{% endfor %}", "S",
     "drops the system prompt"),
    ("{% for m in messages %}{{ m['content'] }}{% endfor %}", None, "nothing before"),
    ("{{ raise_exception('only assistant turns') }}", None, "cannot render"),
])
def test_templates_that_cannot_open_a_user_turn_are_refused(template, system, why):
    with pytest.raises(MagpieError, match=why):
        magpie_prefix(template, system)


# ------------------------------------------------------------------ the sampler on the tiny model
def test_sampler_refills_the_batch_and_each_text_depends_only_on_prefix_and_seed(build_tiny):
    from speccompile.runtime.engine import Engine
    from speccompile.runtime.sampling import SamplingParams

    built = build_tiny("tiny-llama", "q0f32")
    eng = Engine(built.model_dir, built.lib, max_num_sequence=3)
    sampler = MagpieSampler(eng, batch=3, max_new_tokens=12, temperature=1.0, top_p=0.95, stop=[])
    prefix = sampler.encode(magpie_prefix(eng.config["chat_template"]))
    jobs = [Job(f"t{i}", tuple(prefix + sampler.encode("How" * (i % 2))), 1000 + i) for i in range(7)]
    got: dict[str, Sample] = {}
    sampler.run(iter(jobs), lambda s: got.__setitem__(s.key, s))
    assert sorted(got) == sorted(j.key for j in jobs)
    assert sampler.generated_tokens == sum(len(s.token_ids) for s in got.values())
    for job in jobs:  # alone, with the same seed: the same tokens as inside the refilled batch
        alone = eng.generate(list(job.prompt_ids), 12, SamplingParams(1.0, 0.95, seed=job.seed))
        assert got[job.key].token_ids == tuple(alone.token_ids)
    assert len({s.token_ids for s in got.values()}) > 1  # different seeds, different turns
    with pytest.raises(ValueError, match="temperature > 0"):
        MagpieSampler(eng, 3, 12, temperature=0.0)
    with pytest.raises(ValueError, match="max_num_sequence"):
        MagpieSampler(eng, 4, 12)


# ------------------------------------------------------------------ filters
def test_duplicates_exact_same_words_and_near():
    idx = NearDupIndex()
    idx.add("a", "How can I reverse a string in Python?")
    long = ("I have a Flask app that reads orders from a PostgreSQL table, groups them by customer and renders a "
            "report page, but the page takes twenty seconds to load when there are many orders. How can I speed it up?")
    idx.add("b", long)
    assert idx.find("how can i reverse a string in python") == ("exact", "a")
    assert idx.find("How do I reverse a string in Python?") == ("same_words", "a")
    assert idx.find(long.replace("twenty", "thirty")) == ("near", "b")
    assert idx.find("How can I reverse a string in Rust?") is None
    assert idx.find("Explain the difference between a process and a thread.") is None


def test_degenerate_samples_are_named():
    assert degenerate("What does <|im_end|> mean here?") == "control_token"
    assert degenerate("Sure! Here is a function that sorts a list.") == "assistant_like"
    assert degenerate("Qwen: what are CRM tools?") == "self_reference"
    assert degenerate("如何提高写作成绩？请给我一些建议。") == "non_english"
    assert degenerate("بوت تواصل مع المستخدم وتنظيم الأداء؟") == "non_english"
    assert degenerate("Prove that sin(α + β) = sin α cos β + cos α sin β for all real angles.") is None
    assert degenerate("Why is this so slow " + "!" * 30) == "char_run"
    assert degenerate("Fix this list:\n" + "- buy one more item\n" * 6) == "repeated_lines"
    braces = "Why does this not compile?\n```c\n" + "if (x) {\n  y++;\n}\n" * 6 + "```"
    assert degenerate(braces) is None  # code repeats its lines by nature
    assert degenerate(" ".join(["please sort the list"] * 12)) == "repetitive"
    assert degenerate("Decode this: " + "QUJD" * 30) == "gibberish"
    code = "Why does this fail?\n```python\ndef f(x):\n" + " " * 24 + "return x\n```"
    assert degenerate(code) is None and looks_like_code(code)
    assert degenerate("Write a haiku about autumn leaves.") is None
    assert not looks_like_code("Write a haiku about autumn leaves.")


def test_answer_leaks_are_cut_from_sampled_turns():
    assert cut_answer_leak("Is there a way to do X?\n\nYes, you can use Y.") == ("Is there a way to do X?", True)
    assert cut_answer_leak("Write a SQL query for Z.\n\nHere is a SQL query that does it:\n```sql\nSELECT 1;\n```") \
        == ("Write a SQL query for Z.", True)
    assert cut_answer_leak("What is special about the book?\n\n\nThe book is known for ...") == (
        "What is special about the book?", True)
    assert cut_answer_leak("Help me write a proposal\n\nAssistant Creating a proposal ...") == (
        "Help me write a proposal", True)
    kept = "My code fails.\n\nHere is my code:\n```python\nx = 1\n```\n\nHere's an example of the input:\n\n[1, 2]"
    assert cut_answer_leak(kept) == (kept, False)


def test_every_benchmark_prompt_is_excluded():
    texts = benchmark_texts(BENCHMARKS)
    assert len(texts) >= 160  # 80 MT-bench questions x 2 turns, plus bench/prompts.jsonl
    guard = BenchmarkGuard(texts)
    for key, turn in texts.items():
        assert guard.overlap(turn) is not None, key
        assert guard.overlap("Quick question. " + turn.upper() + " Thanks!") is not None, key  # wrapped, recased
    w = texts["mt_bench.jsonl:81:0"].split()  # an edit outside one 8-word run still overlaps
    assert guard.overlap(" ".join(w[:9] + ["Bali"] + w[10:])) is not None
    assert guard.overlap("Write a short poem about autumn leaves falling in a quiet park.") is None
    with pytest.raises(FileNotFoundError, match="must be readable"):
        benchmark_texts([BENCHMARKS[0].with_name("missing.jsonl")])


def test_the_stage_rejects_benchmark_lengths_and_truncation_with_reasons(tmp_path):
    ps = PromptSet(tmp_path, Settings(min_tokens=3, max_tokens=40), lambda t: len(t.split()))
    slot = plan_slot(ps.settings, "t", 0)
    bench = json.loads(BENCHMARKS[0].read_text().splitlines()[0])["turns"][0]
    assert ps.judge(slot, "Hey! " + bench)[0].startswith("benchmark:mt_bench.jsonl:")
    assert ps.judge(slot, "Sort it.")[0] == "too_short"
    assert ps.judge(slot, "word " * 41)[0] == "too_long"
    assert ps.judge(slot, "How do I sort a list of tuples by the second item?", "length")[0] == "truncated"
    assert ps.judge(slot, "Q: How do I sort a list of tuples by the second item?") == (
        None, "How do I sort a list of tuples by the second item?")
    ps.close()


# ------------------------------------------------------------------ resuming
NOUNS = ["list", "dictionary", "string", "CSV file", "JSON object", "date", "tree", "matrix", "queue", "log file"]
VERBS = ["sort", "parse", "reverse", "validate", "merge", "flatten", "compress", "search", "serialize", "filter"]
LANGS = ["Python", "Rust", "Go", "Java", "C++"]


class FakeSampler:
    """Magpie without a model: a job's text is a function of its seed (as the engine's is),
    with duplicates and degenerate turns among them. ``fail_after`` jobs, it raises as a
    killed process would, in the middle of a job."""

    def __init__(self, fail_after: int | None = None):
        self.fail_after, self.calls, self.generated_tokens = fail_after, 0, 0

    def encode(self, text: str) -> list[int]:
        return list(text.encode())

    def run(self, jobs, on_sample):
        for job in jobs:
            if self.fail_after is not None and self.calls >= self.fail_after:
                raise KeyboardInterrupt
            self.calls += 1
            rng = random.Random(job.seed)
            r = rng.random()
            if job.stop == ():  # a grounded slot's document: paragraphs, some cut by the cap, some templates
                paras = [" ".join(f"{rng.choice(NOUNS)} {rng.randint(1, 10 ** 6)}" for _ in range(12))
                         for _ in range(rng.randint(2, 4))]
                text = "Sure! Here is the article:\n\n" + "\n\n".join(paras)
                text += " [insert date]" if r < 0.1 else ""
                on_sample(Sample(job.key, text, tuple(range(len(text.split()))), "length" if r > 0.8 else "stop"))
                continue
            if r < 0.1:
                text = " Sure! Here is what you asked for."
            elif r < 0.2:
                text = " parse a date in Python?"  # the same request again and again
            else:
                text = f" {rng.choice(VERBS)} a {rng.choice(NOUNS)} in {rng.choice(LANGS)} when it has " \
                       f"{rng.randint(2, 10 ** 6)} items?"
            self.generated_tokens += len(text.split())
            on_sample(Sample(job.key, text, tuple(range(len(text.split()))), "stop" if r > 0.03 else "length"))


def _files(d):
    return {name: (d / f"{name}.jsonl").read_text().splitlines() for name in ("train", "held_out", "rejected")}


def _build(d, n, h, sampler, **kw):
    return build_prompt_set(d, n, h, Settings(seed=3, magpie_share=0.6), sampler, CHAT, lambda t: len(t.split()),
                            progress=False, **kw)


def test_an_interrupted_run_resumes_where_it_stopped_and_ends_as_an_uninterrupted_one(tmp_path):
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    _build(whole, 60, 12, FakeSampler())
    with pytest.raises(KeyboardInterrupt):
        _build(parts, 60, 12, FakeSampler(fail_after=25))
    interrupted = _files(parts)
    assert 0 < len(interrupted["train"]) < 60
    with (parts / "train.jsonl").open("a") as f:
        f.write('{"id": "t999999", "prompt": "a line cut by the ki')  # a torn last write
    _build(parts, 60, 12, FakeSampler())
    resumed = _files(parts)
    for name, lines in interrupted.items():  # append-only: nothing decided before was rewritten
        assert resumed[name][:len(lines)] == lines
    assert resumed == _files(whole)  # and every slot decided as the uninterrupted run decided it
    rows = read_prompts(parts) + read_prompts(parts, "held_out")
    ids = [r["id"] for r in rows] + [json.loads(x)["id"] for x in resumed["rejected"]]
    assert len(ids) == len(set(ids))  # no slot twice
    assert len({r["prompt"] for r in rows}) == len(rows) == 72
    assert {r["source"] for r in rows} == {"written", "magpie", "grounded"}
    reasons = {json.loads(x)["reason"] for x in resumed["rejected"]}
    assert {"document_placeholder", "document_too_short"} <= reasons


def test_a_larger_target_continues_and_other_settings_are_refused(tmp_path):
    _build(tmp_path, 20, 4, FakeSampler())
    first = read_prompts(tmp_path)
    sampler = FakeSampler()
    _build(tmp_path, 30, 4, sampler)
    more = read_prompts(tmp_path)
    assert more[:20] == first and len(more) == 30
    assert sampler.calls < 30  # only the new slots were sampled
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["train"]["prompts"] == 30 and 0 <= summary["train"]["code_share"] <= 1
    with pytest.raises(ValueError, match="other settings"):
        build_prompt_set(tmp_path, 30, 4, Settings(seed=4, magpie_share=0.6), FakeSampler(), CHAT,
                         lambda t: len(t.split()), progress=False)


def test_a_model_that_only_writes_rejects_stops_with_an_error(tmp_path):
    class Chatty(FakeSampler):
        def run(self, jobs, on_sample):
            for job in jobs:
                on_sample(Sample(job.key, " <|im_start|>assistant", (1,), "stop"))  # every turn broken

    settings = Settings(magpie_share=1.0)  # every slot of the coder mix sampled (the wide mix also writes some)
    (tmp_path / "settings.json").write_text(json.dumps({**asdict(settings), "wide_from": {"t": 10**6, "h": 10**6}}))
    with pytest.raises(RuntimeError, match="slots in a row were rejected"):
        build_prompt_set(tmp_path, 10, 0, settings, Chatty(), CHAT, lambda t: len(t.split()),
                         progress=False, max_idle_slots=50)


# ------------------------------------------------------------------ held-out set
def test_held_out_prompts_are_other_styles_and_never_duplicate_training_ones(tmp_path):
    _build(tmp_path, 150, 40, FakeSampler())
    train, held = read_prompts(tmp_path), read_prompts(tmp_path, "held_out")
    assert len(train) == 150 and len(held) == 40
    idx = NearDupIndex()
    for r in train:
        idx.add(r["id"], r["prompt"])
    assert all(idx.find(r["prompt"]) is None for r in held)
    assert {r["family"] for r in held if r["source"] == "written"} <= set(HELD_OUT_WEIGHTS)
    assert not {r["family"] for r in train} & set(HELD_OUT_WEIGHTS)
    assert {r["opener"] for r in held if r["source"] == "magpie"}.isdisjoint(
        {r["opener"] for r in train if r["source"] == "magpie"})


def test_a_sample_in_both_splits_is_kept_once(tmp_path):
    ps = PromptSet(tmp_path, Settings(magpie_share=1.0), lambda t: len(t.split()))
    text = "How do I parse a date with a time zone in Python?"
    assert ps.offer(plan_slot(ps.settings, "h", 0), text)
    assert not ps.offer(plan_slot(ps.settings, "t", 0), "how do I parse a date with a time zone in python")
    ps.close()
    assert [json.loads(x)["reason"] for x in (tmp_path / "rejected.jsonl").read_text().splitlines()] == [
        "duplicate_exact"]


def test_slots_are_a_pure_function_of_seed_split_and_index():
    s = Settings(seed=7)
    assert [plan_slot(s, "t", k) for k in range(50)] == [plan_slot(s, "t", k) for k in range(50)]
    assert [plan_slot(s, "t", k) for k in range(50)] != [plan_slot(Settings(seed=8), "t", k) for k in range(50)]
    coder = [plan_slot(s, "t", k, {"t": 2000, "h": 0}) for k in range(2000)]  # the coder mix below wide_from
    wide = [plan_slot(s, "t", k, {"t": 2000, "h": 0}) for k in range(2000, 4000)]
    assert wide == [plan_slot(s, "t", k) for k in range(2000, 4000)]  # a new set: wide from slot 0
    fams = {x.family for x in coder}
    assert set(WRITTEN_WEIGHTS) <= fams and not fams & (set(HELD_OUT_WEIGHTS) | set(GROUNDED_WEIGHTS))
    wide_fams = {x.family for x in wide}
    assert set(GROUNDED_WEIGHTS) | set(WIDE_WRITTEN_WEIGHTS) <= wide_fams and not wide_fams & set(HELD_OUT_WEIGHTS)

    def code_share(slots):
        return sum(x.family in CODE_FAMILIES or x.family.startswith("magpie_co") for x in slots) / len(slots)

    assert code_share(coder) > 0.45 and code_share(wide) < 0.1  # the wide mix is mostly not code
    assert 0.45 < sum(x.source == "grounded" for x in wide) / len(wide) < 0.55
    held = [plan_slot(s, "h", k) for k in range(400)]
    assert {x.family for x in held if x.source == "written"} <= set(HELD_OUT_WEIGHTS)
    for x in wide + held:  # a grounded slot asks for a document and wraps it into a request about it
        if x.source == "grounded":
            assert x.request.startswith("Write ") and x.wrap.count("{doc}") == 1 and "{" not in x.wrap.replace(
                "{doc}", "")
    # held-out slots write about other things, in other phrasings
    train_reqs = {x.wrap for x in wide if x.source == "grounded"}
    assert not train_reqs & {x.wrap for x in held if x.source == "grounded"}


def test_a_coder_mix_set_is_upgraded_in_place_and_goes_on_with_the_wide_mix(tmp_path):
    _build(tmp_path, 40, 6, FakeSampler())
    before = _files(tmp_path)
    rows = read_prompts(tmp_path) + read_prompts(tmp_path, "held_out")
    decided = {s: 1 + max(int(r["id"][1:]) for r in rows + [json.loads(x) for x in before["rejected"]]
                          if r["id"][0] == s) for s in "th"}
    saved = json.loads((tmp_path / "settings.json").read_text())
    assert saved["plan_version"] == 2 and saved["wide_from"] == {"t": 0, "h": 0}
    # what plan 1 wrote: no wide_from
    old = {k: v for k, v in saved.items() if k != "wide_from"} | {"plan_version": 1}
    (tmp_path / "settings.json").write_text(json.dumps(old))
    _build(tmp_path, 60, 6, FakeSampler())
    upgraded = json.loads((tmp_path / "settings.json").read_text())
    assert upgraded == {**old, "plan_version": 2, "wide_from": decided}
    after = _files(tmp_path)
    for name, lines in before.items():
        assert after[name][:len(lines)] == lines  # nothing decided was touched
    new = [r for r in read_prompts(tmp_path)[40:]]
    assert len(new) == 20 and all(int(r["id"][1:]) >= decided["t"] for r in new)
    with pytest.raises(ValueError, match="other settings"):  # the upgrade keeps refusing other settings
        build_prompt_set(tmp_path, 60, 6, Settings(seed=4, magpie_share=0.6), FakeSampler(), CHAT,
                         lambda t: len(t.split()), progress=False)


def test_grounded_documents_are_cleaned_cut_to_whole_paragraphs_and_refused_as_templates():
    doc = "Headline\n\n" + "word " * 50 + "\n\nSecond paragraph."
    assert clean_document("Sure! Here is the article:\n\n" + doc + "\n\nI hope this helps!") == doc
    assert clean_document("```\n" + doc + "\n```") == doc
    assert document_problem(doc) is None
    assert document_problem("Dear [Your Name], " + doc) == "document_placeholder"
    assert document_problem("Too short.") == "document_too_short"
    cut = "[1] " + "a " * 40 + "\n[2] " + "b " * 40 + "\n[3] the cap hit in the middle of"
    assert complete_paragraphs(cut).endswith("b") and "[3]" not in complete_paragraphs(cut)
    assert complete_paragraphs("one long paragraph " * 20) == ""  # nothing whole is left


# ------------------------------------------------------------------ the command
def test_cli_refuses_bad_input_before_loading_anything(tmp_path):
    from speccompile.cli.main import main

    r = CliRunner().invoke(main, ["train-prompts", str(tmp_path / "nope"), "--model-lib", str(tmp_path / "x.so")])
    assert r.exit_code == 2 and "not a converted model" in r.output
    r = CliRunner().invoke(main, ["train-prompts", str(tmp_path), "--model-lib", "x.so", "--magpie-share", "1.5"])
    assert r.exit_code == 2 and "--magpie-share" in r.output
    r = CliRunner().invoke(main, ["train-prompts", "--num-prompts", "5"])
    assert r.exit_code == 2 and "--model NAME" in r.output


def test_a_focused_family_takes_new_slots_saved_with_the_set_and_is_resumable(tmp_path):
    """--focus: the set gets exactly N training prompts of the family (and a 25th as many
    held-out, on held-out records), in a stretch just past every decided slot, saved in
    settings.json; nothing decided changes, a rerun adds nothing, a later plain run goes on with
    the wide mix past the stretch, and no focused prompt overlaps a benchmark."""
    from speccompile.training.prompt_set import plan_slot
    from speccompile.training.prompts_code import RECORDS, code_typed

    _build(tmp_path, 30, 4, FakeSampler())
    rejected = (tmp_path / "rejected.jsonl").read_text().splitlines()
    hole = json.loads(rejected[-1])["id"]  # an undecided slot below the stretch (as an interrupted run leaves)
    (tmp_path / "rejected.jsonl").write_text("".join(x + "\n" for x in rejected[:-1]))
    before = _files(tmp_path)
    _build(tmp_path, 25, 0, FakeSampler(), focus="code_typed")
    assert hole not in (tmp_path / "rejected.jsonl").read_text() + (tmp_path / "train.jsonl").read_text() + \
        (tmp_path / "held_out.jsonl").read_text()  # a focused run takes its stretch's slots only
    saved = json.loads((tmp_path / "settings.json").read_text())
    rows = {s: read_prompts(tmp_path, s) for s in ("train", "held_out")}
    typed = {s: [r for r in rows[s] if r["family"] == "code_typed"] for s in rows}
    assert len(typed["train"]) == 25 and len(typed["held_out"]) == 1 and len(rows["train"]) == 55
    after = _files(tmp_path)
    for name, lines in before.items():
        assert after[name][:len(lines)] == lines  # nothing decided was touched
    stretch = {f["split"]: f for f in saved["focus"]}
    assert stretch["t"]["family"] == "code_typed" and stretch["t"]["to"] - stretch["t"]["from"] == 25
    assert all(stretch[r["id"][0]]["from"] <= int(r["id"][1:]) < stretch[r["id"][0]]["to"] for s in typed for r in typed[s])
    assert min(int(r["id"][1:]) for r in typed["train"]) > max(int(json.loads(x)["id"][1:]) for x in before["train"])
    # the slots are the plan's: planned again from the saved file, each gives the same prompt
    for r in typed["train"][:5]:
        assert plan_slot(Settings(seed=3, magpie_share=0.6), "t", int(r["id"][1:]), saved["wide_from"],
                         saved["focus"]).text == r["prompt"]
    held_records = {p for p, *_ in RECORDS[::5]}
    assert all(any(f"`{p}`" in r["prompt"] for p in held_records) for r in typed["held_out"])
    assert not any(any(f"`{p}`" in r["prompt"] for p in held_records) for r in typed["train"])
    _build(tmp_path, 25, 0, FakeSampler(), focus="code_typed")  # asked again: nothing new
    assert _files(tmp_path) == after
    _build(tmp_path, 60, 4, FakeSampler())  # the mixes go on past the stretch
    more = read_prompts(tmp_path)[55:]
    assert len(more) == 5 and all(r["family"] != "code_typed" and int(r["id"][1:]) >= stretch["t"]["to"] for r in more)
    import random
    from speccompile.training.prompt_filters import BenchmarkGuard, benchmark_texts
    from speccompile.training.prompt_set import BENCHMARKS
    guard = BenchmarkGuard(benchmark_texts(BENCHMARKS))
    assert not [t for t in (code_typed(random.Random(i), i % 2 == 0) for i in range(300)) if guard.overlap(t)]
    with pytest.raises(ValueError, match="--focus 'nope'"):
        _build(tmp_path, 5, 0, FakeSampler(), focus="nope")
    # enough slots that some come out as exact duplicates: each is made up by one more slot of the stretch
    big = tmp_path / "big"
    _build(big, 1, 0, FakeSampler(), focus="code_typed")
    _build(big, 400, 0, FakeSampler(), focus="code_typed")
    dups = [json.loads(x) for x in _files(big)["rejected"]]
    assert dups and all(r["family"] == "code_typed" and r["reason"] == "duplicate_exact" for r in dups)
    assert sum(r["family"] == "code_typed" for r in read_prompts(big)) == 400
    # a data dir that kept the set before the focus run takes its stretches and prompts (and gives nothing back)
    from speccompile.training.store import DataConflict, sync_prompts
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "settings.json").write_text(json.dumps({k: v for k, v in saved.items() if k != "focus"}))
    for name in ("train", "held_out", "rejected"):
        (kept / f"{name}.jsonl").write_text("".join(x + "\n" for x in before[name]))
    assert sync_prompts(tmp_path, kept)["settings.json"] == "saved"
    assert json.loads((kept / "settings.json").read_text()) == json.loads((tmp_path / "settings.json").read_text())
    (kept / "settings.json").write_text(json.dumps({**saved, "focus": [{**saved["focus"][0], "to": 1}]}))
    with pytest.raises(DataConflict):  # other stretches: two different sets
        sync_prompts(tmp_path, kept)
