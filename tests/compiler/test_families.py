"""Every supported decoder family against HF transformers' own implementation of it.

No machine here reaches a model hub, so each family is a randomly initialised transformers
model built from a small config of that family -- transformers' code for it is the
reference. Each config keeps what makes the family differ where a tiny size would hide it:
Qwen3's head_dim is not hidden/heads; Llama 3's RoPE bands all occur (a short original
context); Mistral's window and Gemma 3's sliding layers are shorter than the prompt; Phi
rotates 3/4 of each head with LongRoPE factors; Gemma 3 keeps its real 262k vocabulary
(the sampling and verify kernels' widest rows) and a query scale that is not head_dim's.
The families share their compiled libraries with tests/runtime/test_family_speculation.py
through :func:`build_family` (one per worker process).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from conftest import make_byte_tokenizer

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.tiny, pytest.mark.hf]

TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=272, max_position_embeddings=512, bos_token_id=256, eos_token_id=257)
WINDOW = 8
FAMILIES = {
    # name: (transformers config class, model class, config fields over TINY)
    "llama3": ("LlamaConfig", "LlamaForCausalLM", dict(
        tie_word_embeddings=True, rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0,
                                                   "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                   "original_max_position_embeddings": 64})),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(head_dim=32, tie_word_embeddings=False,
                                                       rope_parameters={"rope_type": "default", "rope_theta": 1e6})),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(sliding_window=WINDOW)),
    "ministral": ("MinistralConfig", "MinistralForCausalLM", dict(
        head_dim=16, sliding_window=WINDOW, layer_types=["sliding_attention", "full_attention"])),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", dict(
        partial_rotary_factor=0.75, tie_word_embeddings=True, original_max_position_embeddings=128, pad_token_id=0,
        rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": [1.0 + 0.2 * i for i in range(6)],
                         "long_factor": [4.0] * 6, "partial_rotary_factor": 0.75})),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", dict(
        vocab_size=262144, num_key_value_heads=1, head_dim=32, query_pre_attn_scalar=24, sliding_window=WINDOW,
        layer_types=["sliding_attention", "full_attention"])),
}
PROMPT = [int(t) for t in np.random.default_rng(1).integers(0, 256, 64)]
NEW_TOKENS = 32

_built: dict = {}


class Family:
    def __init__(self, name: str, hf_model, hf_dir: Path, model_dir: Path, lib: Path):
        self.name, self.hf_model, self.hf_dir, self.model_dir, self.lib = name, hf_model, hf_dir, model_dir, lib

    def hf_logits(self, ids: list[int]) -> np.ndarray:
        with torch.no_grad():
            return self.hf_model(torch.tensor([ids])).logits[0].float().numpy()

    def hf_greedy(self, ids: list[int], n: int) -> list[int]:
        out = list(ids)
        for _ in range(n):
            out.append(int(self.hf_logits(out)[-1].argmax()))
        return out[len(ids):]


def make_hf_model(name: str, folder: Path, **overrides):
    """A seeded random transformers model of the family, saved as safetensors with a byte tokenizer."""
    config_class, model_class, fields = FAMILIES[name]
    cfg = getattr(transformers, config_class)(**{**TINY, **fields, **overrides})
    torch.manual_seed(0)
    model = getattr(transformers, model_class)(cfg).eval()
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if "norm" in pname:  # Gemma scales by 1 + weight
                p.copy_(0.1 * torch.randn_like(p) + (0.0 if name == "gemma3" else 1.0))
            else:
                p.copy_(0.3 * torch.randn_like(p))
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder, safe_serialization=True)
    make_byte_tokenizer(folder / "tokenizer.json")
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": (
        "{% for m in messages %}<|im_start|>{{ m['content'] }}<|im_end|>{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>{% endif %}")}))
    return model


def build_family(name: str, root: Path, quant: str = "q0f32", device: str = "llvm") -> Family:
    """The family's transformers model, converted, configured and compiled (once per process)."""
    from speccompile.compiler.compile import compile_model
    from speccompile.compiler.convert_weight import convert_weight
    from speccompile.compiler.gen_config import gen_config

    key = (name, quant, device)
    if key not in _built:
        hf_dir = root / f"{name}-hf"
        if (name, "hf") not in _built:
            _built[(name, "hf")] = make_hf_model(name, hf_dir)
        out = root / f"{name}-{quant}"
        if not (out / "speccompile-config.json").exists():
            convert_weight(hf_dir, quant, out, progress=False)
            gen_config(hf_dir, quant, out)
        lib = root / f"{name}-{quant}-{device}.so"
        compile_model(out / "speccompile-config.json", device, lib, verbose=False)
        _built[key] = Family(name, _built[(name, "hf")], hf_dir, out, lib)
    return _built[key]


@pytest.fixture(scope="module")
def families(tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    return lambda name, **kw: build_family(name, root, **kw)


@pytest.mark.parametrize("name", list(FAMILIES))
def test_logits_match_transformers(families, name):
    """q0f32 logits of a 64-token prompt within 1e-4 of transformers (every position: the
    sliding layers' window of 8 is passed 56 times)."""
    from speccompile.runtime.model import Model

    fam = families(name)
    model = Model(fam.model_dir, fam.lib)
    kv = model.create_kv_cache(256)
    kv.add_sequence(0)
    ours = model.forward(kv, [0], [PROMPT])
    ref = fam.hf_logits(PROMPT)
    assert ours.shape == ref.shape
    assert np.abs(ours - ref).max() < 1e-4, (name, float(np.abs(ours - ref).max()), float(np.abs(ref).max()))


@pytest.mark.parametrize("name", ["mistral", "gemma3"])
def test_the_window_is_what_makes_them_match(families, name, tmp_path):
    """Not vacuous: the same weights without the sliding window give other logits past the
    window, and the same ones inside it."""
    fam = families(name)
    config_class, model_class, _ = FAMILIES[name]
    cfg = fam.hf_model.config.to_dict()
    cfg.update(sliding_window=None if name == "mistral" else 10 ** 6)
    unwindowed = getattr(transformers, model_class)(getattr(transformers, config_class)(**{
        k: v for k, v in cfg.items() if k not in ("architectures", "model_type", "transformers_version")})).eval()
    unwindowed.load_state_dict(fam.hf_model.state_dict())
    with torch.no_grad():
        full = unwindowed(torch.tensor([PROMPT])).logits[0].numpy()
    windowed = fam.hf_logits(PROMPT)
    assert np.abs(full[:WINDOW] - windowed[:WINDOW]).max() < 1e-5
    assert np.abs(full[WINDOW + 1:] - windowed[WINDOW + 1:]).max() > 1e-2


@pytest.mark.parametrize("name", list(FAMILIES))
def test_greedy_tokens_identical_to_transformers(families, name):
    from speccompile.runtime.engine import Engine

    fam = families(name)
    eng = Engine(fam.model_dir, fam.lib)
    assert eng.generate(PROMPT[:40], NEW_TOKENS, ignore_eos=True).token_ids == fam.hf_greedy(PROMPT[:40], NEW_TOKENS)


def test_config_reading_per_family(families):
    """What each family's config.json turns into (the switches models/llama.py reads)."""
    from speccompile.models.config import LlamaConfig

    def cfg(name):
        return LlamaConfig.from_hf_folder(families(name).hf_dir)

    g = cfg("gemma3")
    assert (g.model_type, g.qk_norm, g.sandwich_norms, g.embed_scale, g.hidden_act) == \
        ("gemma3", True, True, True, "gelu_pytorch_tanh")
    assert [g.window(i) for i in range(2)] == [WINDOW, 0] and g.attention_scale == 24 ** -0.5
    assert g.rope(0).inv_freq != g.rope(1).inv_freq  # local and global thetas
    q = cfg("qwen3")
    assert q.qk_norm and q.head_dim == 32 and q.window(0) == 0 and not q.attention_bias
    p = cfg("phi3")
    assert p.rope(0).rotary_dim == 12 and p.rope(0).scale > 1 and p.context_window_size == 128
    m = cfg("mistral")
    assert [m.window(i) for i in range(2)] == [WINDOW, WINDOW]


def test_rope_tables_equal_transformers():
    """models/rope.py's inverse frequencies and cos/sin factor against transformers' for
    every rope type it supports."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from speccompile.models.rope import make_rope

    cases = {
        "linear": dict(rope_type="linear", factor=4.0),
        "llama3": FAMILIES["llama3"][2]["rope_parameters"],
        "yarn": dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=128),
        "longrope": dict(rope_type="longrope", short_factor=[1.0 + 0.1 * i for i in range(8)],
                         long_factor=[2.0] * 8, original_max_position_embeddings=128),
    }
    for kind, params in cases.items():
        params = {"rope_theta": 10000.0, **params}
        cfg = transformers.LlamaConfig(**{**TINY, "max_position_embeddings": 512, "rope_parameters": dict(params)})
        inv, attention = ROPE_INIT_FUNCTIONS[kind](cfg, "cpu")
        ours = make_rope(params, 10000.0, 16, max_position_embeddings=512)
        np.testing.assert_allclose(np.asarray(ours.inv_freq, np.float32), inv.numpy(), rtol=2e-7, err_msg=kind)
        assert ours.scale == pytest.approx(attention, rel=1e-7), kind


def test_unsupported_architectures_are_named(tmp_path):
    from speccompile.compiler.convert_weight import convert_weight
    from speccompile.compiler.sources import SourceError
    from speccompile.models.config import ConfigError

    (tmp_path / "config.json").write_text(json.dumps({**TINY, "model_type": "falcon",
                                                      "architectures": ["FalconForCausalLM"]}))
    with pytest.raises((SourceError, ConfigError)) as err:
        convert_weight(tmp_path, "q0f32", tmp_path / "out", progress=False)
    message = str(err.value)
    assert "falcon" in message and "FalconForCausalLM" in message
    for arch in ("Qwen3ForCausalLM", "Gemma3ForCausalLM", "Phi3ForCausalLM", "MistralForCausalLM"):
        assert arch in message
    (tmp_path / "config.json").write_text(json.dumps({**TINY, "model_type": "gemma2", "attn_logit_softcapping": 50.0}))
    with pytest.raises((SourceError, ConfigError), match="gemma2"):
        convert_weight(tmp_path, "q0f32", tmp_path / "out", progress=False)


def test_end_of_turn_ids_from_generation_config(families, tmp_path):
    """Gemma and Llama 3 list their end-of-turn tokens in generation_config.json, not in
    config.json: gen_config stops on both."""
    import shutil

    from speccompile.compiler.gen_config import gen_config

    src = tmp_path / "hf"
    shutil.copytree(families("gemma3").hf_dir, src)
    (src / "generation_config.json").write_text(json.dumps({"eos_token_id": [257, 258]}))
    conf = json.loads(gen_config(src, "q0f32", tmp_path / "out").read_text())
    assert {257, 258} <= set(conf["stop_token_ids"])


def test_final_logit_softcapping(tmp_path):
    """final_logit_softcapping (c tanh(logits / c), Gemma 2's and an option of Gemma 3's config)
    against transformers, with a cap small enough to bend every logit."""
    from speccompile.compiler.compile import compile_model
    from speccompile.compiler.convert_weight import convert_weight
    from speccompile.compiler.gen_config import gen_config
    from speccompile.runtime.model import Model

    hf = make_hf_model("gemma3", tmp_path / "hf", vocab_size=512, final_logit_softcapping=3.0)
    convert_weight(tmp_path / "hf", "q0f32", tmp_path / "out", progress=False)
    gen_config(tmp_path / "hf", "q0f32", tmp_path / "out")
    compile_model(tmp_path / "out" / "speccompile-config.json", "llvm", tmp_path / "lib.so", verbose=False)
    model = Model(tmp_path / "out", tmp_path / "lib.so")
    kv = model.create_kv_cache(128)
    kv.add_sequence(0)
    ours = model.forward(kv, [0], [PROMPT[:24]])
    ref = Family("gemma3", hf, tmp_path / "hf", None, None).hf_logits(PROMPT[:24])
    assert np.abs(ref).max() < 3.0 and np.abs(ours - ref).max() < 1e-4
