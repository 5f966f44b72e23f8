"""Structured output inside verification (runtime/grammar.py): the grammar masks every row
a step verifies, a draft the grammar forbids is never verified or accepted, the matcher
ends each step where plain decoding leaves it, and greedy output under a schema is the
same with and without speculation in every mode and batch.

SmolLM2-135M-Instruct q4f32_1 is the target; drafts: itself, a
random-weight model (most of its drafts break the grammar), n-gram lookup.
"""
import json

import numpy as np
import pytest

from speccompile.runtime.acceptance import Draft
from speccompile.runtime.engine import Engine
from speccompile.runtime.grammar import GrammarError, apply_masks, load_response_format, schema_of

pytestmark = pytest.mark.real_model

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["name", "age", "tags"],
          "properties": {"name": {"type": "string", "maxLength": 24}, "age": {"type": "integer"},
                         "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3}}}
FORMAT = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA, "strict": True}}
PROMPTS = ["Describe Alice, 31, who likes chess and tennis, as JSON.",
           "Give me a JSON profile of a fictional pirate.",
           "Write a poem about the sea.",
           "List three fruits."]
NEW_TOKENS = 48


def _matches(text: str) -> bool:
    obj = json.loads(text)
    return (set(obj) == {"name", "age", "tags"} and isinstance(obj["name"], str) and len(obj["name"]) <= 24
            and isinstance(obj["age"], int) and isinstance(obj["tags"], list) and len(obj["tags"]) <= 3
            and all(isinstance(t, str) and len(t) <= 12 for t in obj["tags"]))


@pytest.fixture(scope="module")
def target(smollm2_q4):
    return smollm2_q4


@pytest.fixture(scope="module")
def plain(target):
    model_dir, lib = target
    eng = Engine(model_dir, lib)
    prompts = [eng.encode_prompt(p) for p in PROMPTS]
    return eng, prompts, [eng.generate(ids, NEW_TOKENS, response_format=FORMAT) for ids in prompts]


def _bits(mask: np.ndarray, vocab: int) -> np.ndarray:
    return np.unpackbits(mask.view(np.uint8), bitorder="little")[:vocab].astype(bool)


def test_response_formats_and_their_errors(tmp_path):
    assert schema_of(None) is None and schema_of({"type": "text"}) is None
    assert schema_of({"type": "json_object"}) == {"type": "object"}
    assert schema_of(FORMAT) == SCHEMA
    with pytest.raises(GrammarError, match="'yaml' is not supported") as err:
        schema_of({"type": "yaml"})
    assert err.value.param == "response_format.type"
    with pytest.raises(GrammarError, match="must be an object"):
        schema_of({"type": "json_schema", "json_schema": "person"})
    assert load_response_format("json") == {"type": "json_object"}
    (tmp_path / "person.json").write_text(json.dumps(SCHEMA))
    assert load_response_format(str(tmp_path / "person.json"))["json_schema"]["schema"] == SCHEMA
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(GrammarError, match="not a JSON file"):
        load_response_format(str(tmp_path / "bad.json"))
    with pytest.raises(GrammarError, match="give 'json' or the path"):
        load_response_format(str(tmp_path / "missing.json"))


def test_an_invalid_schema_is_refused_before_anything_runs(plain):
    eng, prompts, _ = plain
    bad = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strnig"}}}
    with pytest.raises(GrammarError, match="Invalid type: strnig") as err:
        eng.generate(prompts[0], 8, response_format=bad)
    assert err.value.param == "response_format.json_schema.schema"
    assert set(eng.kv.seqs) == set(eng.kv.recycled)  # nothing was attached (earlier answers are kept)


def test_a_draft_the_grammar_forbids_is_dropped_and_the_matcher_is_left_as_it_was(plain):
    eng, _, _ = plain
    vocab = eng.model.vocab_size
    c = eng.grammars.constraint(FORMAT)
    tok = eng.tokenizer
    root = c.root_mask().copy()
    allowed = np.nonzero(_bits(root, vocab))[0]
    assert len(allowed) and len(allowed) < 50  # '{' and its merges only
    brace, name = tok.encode('{"', add_special_tokens=False).ids, tok.encode('name', add_special_tokens=False).ids
    assert len(brace) == 1 and _bits(root, vocab)[brace[0]]
    bad = tok.encode("Hello", add_special_tokens=False).ids[0]
    # a tree: root -> '{"' -> 'name' ; root -> 'Hello' -> '{"' (forbidden, and its child with it)
    draft = Draft([brace[0], name[0], bad, brace[0]], parents=[-1, 0, -1, 2], conf=[0.9, 0.8, 0.7, 0.6])
    kept, masks = c.plan(draft)
    assert kept.tokens == [brace[0], name[0]] and kept.parents == [-1, 0] and kept.conf == [0.9, 0.8]
    assert masks.shape == (3, (vocab + 31) // 32) and np.array_equal(masks[0], root)
    assert _bits(masks[1], vocab)[name[0]] and not _bits(masks[1], vocab)[brace[0]]
    assert np.array_equal(c.root_mask(), root)  # planning consumed nothing
    c.commit([brace[0]])  # what a step emitted
    assert np.array_equal(c.root_mask(), masks[1])
    chain = Draft([bad, brace[0]])  # a chain whose first token is forbidden verifies nothing
    kept, masks = c.plan(chain)
    assert kept.tokens == [] and kept.parents is None and masks.shape[0] == 1
    logits = np.zeros((1, vocab), np.float32)
    apply_masks(logits, masks)
    assert np.isfinite(logits[0]).sum() == _bits(masks[0], vocab).sum()


def test_greedy_plain_output_follows_the_schema(plain):
    _, _, results = plain
    finished = [r for r in results if r.finish_reason == "stop"]
    assert len(finished) >= 2  # bounded strings and arrays: the model closes the object
    for r in finished:
        assert _matches(r.text), r.text


@pytest.mark.parametrize("mode,k", [("self", 7), ("random", 3), ("ngram", 3), ("self", 0)])
def test_greedy_under_a_schema_is_identical_with_speculation(target, plain, random_draft, mode, k):
    """Chains here; trees (EAGLE and Medusa heads) in test_eagle_medusa."""
    model_dir, lib = target
    _, prompts, expected = plain
    if mode == "ngram":
        eng = Engine(model_dir, lib, speculative_mode="ngram", spec_draft_length=k)
    else:
        draft = (str(model_dir), str(lib)) if mode == "self" else random_draft
        eng = Engine(model_dir, lib, speculative_mode="small_draft", additional_models=[draft], spec_draft_length=k)
    drafted = 0
    for ids, exp in zip(prompts, expected):
        res = eng.generate(ids, NEW_TOKENS, response_format=FORMAT)
        assert res.token_ids == exp.token_ids, (mode, k, res.text, exp.text)
        drafted += res.stats.spec.draft_tokens
    batch = eng.generate_batch(prompts, NEW_TOKENS, response_format=FORMAT)
    assert [r.token_ids for r in batch] == [e.token_ids for e in expected]
    if k:
        assert drafted > 0
    # one constrained sequence beside free-text ones in the same steps
    free = Engine(model_dir, lib).generate(prompts[2], NEW_TOKENS).token_ids
    seqs = [eng.new_sequence(prompts[0], NEW_TOKENS, grammar=eng.grammars.constraint(FORMAT)),
            eng.new_sequence(prompts[2], NEW_TOKENS)]
    for s in seqs:
        eng.attach(s)
        while s.prefilling:
            eng.prefill([s], 512)
    while not all(s.done for s in seqs):
        eng.step([s for s in seqs if not s.done])
    for s in seqs:
        eng.detach(s)
    assert seqs[0].result.token_ids == expected[0].token_ids and seqs[1].result.token_ids == free


def test_sampling_under_a_schema_keeps_the_target_distribution(target):
    """At T > 0 the verification samples from the masked distributions: the enum value a
    seeded run picks has the same law with and without speculation (a draft model that
    ignores the grammar proposes, rejection sampling corrects it)."""
    from speccompile.runtime.sampling import SamplingParams

    model_dir, lib = target
    choices = ["red", "green", "blue", "yellow"]
    fmt = {"type": "json_schema", "json_schema": {"name": "c", "schema": {
        "type": "object", "properties": {"color": {"enum": choices}}, "required": ["color"],
        "additionalProperties": False}}}
    counts, batch = {}, 30  # 150 seeded runs per mode, 30 sequences per batch (one forward per step for all)
    for mode in ("plain", "spec"):
        eng = (Engine(model_dir, lib, max_num_sequence=batch) if mode == "plain" else
               Engine(model_dir, lib, speculative_mode="small_draft", additional_models=[(str(model_dir), str(lib))],
                      spec_draft_length=2, max_num_sequence=batch))
        ids = eng.encode_prompt("Name a color, as JSON.")
        seen = []
        for first in range(0, 150, batch):
            runs = eng.generate_batch([ids] * batch, 24, [SamplingParams(temperature=1.5, seed=s)
                                                          for s in range(first, first + batch)], response_format=fmt)
            seen += [json.loads(r.text)["color"] for r in runs]
        counts[mode] = np.array([seen.count(c) for c in choices], float)
    a, b = counts["plain"], counts["spec"]
    assert (a > 0).sum() >= 2  # the test can see a difference in law
    expected = (a + b) / 2
    keep = expected > 0
    chi2 = (((a - expected) ** 2 + (b - expected) ** 2)[keep] / expected[keep]).sum()
    print("color counts plain", a, "spec", b, "chi2", chi2)
    assert chi2 < 16.3, (a, b)  # p = 0.001 with 3 degrees of freedom


def test_generate_and_chat_take_a_response_format(target, tmp_path):
    from click.testing import CliRunner

    from speccompile.cli.main import main

    model_dir, lib = target
    schema = tmp_path / "answer.json"
    schema.write_text(json.dumps({"type": "object", "properties": {"answer": {"type": "integer", "minimum": 0,
                                  "maximum": 1000}}, "required": ["answer"], "additionalProperties": False}))
    args = ["generate", str(model_dir), "--model-lib", str(lib), "--prompt", "What is 12 + 30? Answer as JSON.",
            "--max-tokens", "24", "--speculative-mode", "ngram", "--json"]
    out = CliRunner().invoke(main, args + ["--response-format", str(schema)])
    assert out.exit_code == 0, out.output
    assert set(json.loads(json.loads(out.output)["text"])) == {"answer"}
    (tmp_path / "bad.json").write_text(json.dumps({"type": "strnig"}))
    out = CliRunner().invoke(main, args + ["--response-format", str(tmp_path / "bad.json")])
    assert out.exit_code != 0 and "Invalid type: strnig" in out.output
    out = CliRunner().invoke(main, ["chat", str(model_dir), "--model-lib", str(lib), "--response-format", "json",
                                    "--max-tokens", "24"], input="Describe a cat.\n/exit\n")
    assert out.exit_code == 0, out.output
    answer = out.output.split(">>> ")[1].strip()
    assert answer.startswith("{")


def test_logprobs_are_the_same_with_a_draft_model_and_in_a_batch(target, plain):
    model_dir, lib = target
    eng, prompts, _ = plain
    want = [eng.generate(ids, 16, top_logprobs=2, response_format=FORMAT if i % 2 else None)
            for i, ids in enumerate(prompts)]
    spec = Engine(model_dir, lib, speculative_mode="small_draft", additional_models=[(str(model_dir), str(lib))],
                  spec_draft_length=3)
    for i, ids in enumerate(prompts):
        got = spec.generate(ids, 16, top_logprobs=2, response_format=FORMAT if i % 2 else None)
        assert got.token_ids == want[i].token_ids and got.logprobs == want[i].logprobs
        assert got.stats.spec.draft_tokens > 0 and len(got.logprobs) == len(got.token_ids)
        assert [t for t, _, _ in got.logprobs] == got.token_ids
    batch = spec.generate_batch(prompts, 16, top_logprobs=2)
    assert [r.logprobs for r in batch[::2]] == [w.logprobs for w in want[::2]]
    with pytest.raises(ValueError, match="top_logprobs=21"):
        spec.generate(prompts[0], 4, top_logprobs=21)


def test_ignore_eos_ends_where_the_grammar_ends(plain):
    eng, prompts, expected = plain
    done = next(r for r in expected if r.finish_reason == "stop")
    ids = done.prompt_token_ids
    r = eng.generate(ids, NEW_TOKENS, ignore_eos=True, response_format=FORMAT)
    assert r.finish_reason == "stop" and r.text == done.text and _matches(r.text)
