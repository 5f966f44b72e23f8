"""SmolLM2-135M-Instruct (real weights, real tokenizer) against HF transformers."""
import numpy as np
import pytest

pytestmark = [pytest.mark.real_model, pytest.mark.hf]

PROMPTS = [
    "What is the capital of France?",
    "Write a Python function that checks whether a number is prime.",
    "List three facts about the moon.",
]


@pytest.fixture(scope="module")
def hf_model(smollm2):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    gguf, _, _ = smollm2
    model = transformers.AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    model.eval()
    return model


@pytest.fixture(scope="module")
def engine(smollm2):
    from speccompile.runtime.engine import Engine

    _, model_dir, lib = smollm2
    return Engine(model_dir, lib)


def test_prefill_logits_match_transformers(engine, hf_model):
    import torch

    ids = engine.encode_prompt(PROMPTS[1])
    with torch.no_grad():
        ref = hf_model(torch.tensor([ids])).logits[0].numpy()
    engine.kv.add_sequence(1000)
    try:
        ours = engine.model.forward(engine.kv, [1000], [ids])
    finally:
        engine.kv.remove_sequence(1000)
    assert np.abs(ours - ref).max() < 1e-3


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_64_tokens_identical_to_transformers(engine, hf_model, prompt):
    import torch

    ids = engine.encode_prompt(prompt)
    with torch.no_grad():
        out = hf_model.generate(torch.tensor([ids]), max_new_tokens=64, do_sample=False,
                                eos_token_id=None, pad_token_id=0)
    ref = out[0, len(ids):].tolist()
    ours = engine.generate(ids, max_tokens=64, ignore_eos=True).token_ids
    assert ours == ref


def test_tokenizer_and_chat_template_match_transformers(engine, smollm2):
    transformers = pytest.importorskip("transformers")
    gguf, _, _ = smollm2
    tok = transformers.AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    texts = ["Hello world!", "  leading spaces and 12345 digits", "naïve café ünïcödé — dash", "def f(x):\n\treturn x**2"]
    for t in texts:
        assert engine.tokenizer.encode(t, add_special_tokens=False).ids == tok.encode(t, add_special_tokens=False)
    messages = [{"role": "user", "content": "Hi there"}]
    hf_text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert engine.render(messages) == hf_text


def test_q4_generates_sensible_text(smollm2_q4):
    from speccompile.runtime.engine import Engine

    model_dir, lib = smollm2_q4
    eng = Engine(model_dir, lib)
    res = eng.generate(eng.encode_prompt("What is the capital of France?"), max_tokens=24)
    assert "Paris" in res.text
