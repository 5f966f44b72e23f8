"""The C API's tokenizer (runtime/capi/src/tokenizer.cc) twinned with HF `tokenizers`, which the
Python runtime uses: the same ids for every bench/ prompt and for thousands of generated strings
(CJK, emoji, combining marks, whitespace runs, digits in several scripts, contractions in any
case, special tokens), for SmolLM2's and Qwen2.5's real tokenizers and for the Llama 3 and NFC
variants of Qwen2.5's; the same text back from ids; and a clear refusal of what it cannot run."""
from __future__ import annotations

import json
import random
import unicodedata
import zlib
from pathlib import Path

import pytest
from capi_ctypes import SPC_ERR_INCOMPATIBLE, SPC_ERR_INVALID_ARGUMENT, SPC_ERR_IO, Capi, CapiError
from tokenizers import Tokenizer

pytestmark = pytest.mark.real_model

ROOT = Path(__file__).resolve().parents[2]
LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                r"\s*[\r\n]+|\s+(?!\S)|\s+")
GENERATED = 2400  # strings per tokenizer, beside bench/'s prompts

FRAGMENTS = [
    # words, contractions in every case (Qwen2 and Llama 3 match them case-insensitively), apostrophes
    "hello", "Hello", "WORLD", "don't", "I'M", "we'Ll", "they'VE", "she'd", "'s", "''", "'ſ", "rock'n'roll", "l'été",
    # numbers: ASCII, decimals, Arabic-Indic, fullwidth, fractions and other numerics
    "12345", "3.14159", "1,000,000", "٣٤٥", "１２３", "½", "Ⅻ", "x²", "007", "2026-12-02",
    # whitespace: runs, tabs, CR/LF, no-break and ideographic spaces, separators, not-whitespace \x1c
    " ", "  ", "   ", "\t", "\t\t", "\n", "\r\n", "\n\n\n", " \n ", "\u00a0", "\u3000", "\u2028", "\x0b", "\x0c",
    "\x1c", "\x85", " \t \n",
    # CJK and other scripts
    "你好，世界", "日本語のテキストです。", "한국어 문장입니다", "Привет, мир", "Ελληνικά", "مرحبا بالعالم",
    "שָׁלוֹם", "नमस्ते दुनिया", "สวัสดีครับ", "Tiếng Việt",
    # emoji: skin tones, ZWJ families, flags, variation selectors
    "👍🏽", "👨‍👩‍👧‍👦", "🇫🇷🇯🇵", "❤️", "🤖", "☕︎",
    # combining marks, decomposed and precomposed forms, zalgo
    "e\u0301", "é", "n\u0303", "Å", "A\u030a", "\u212b", "Z\u0324\u0354\u0367\u0311a\u0308\u0316l\u036e\u0312",
    "\u1100\u1161\u11a8", "가",
    # special tokens and their near misses
    "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|im_sta", "<|im_start|>user\n", "< |im_end| >",
    # punctuation and code
    "...", "!!!", "—", "«»", "{}[]()", "```python\n", "->", "=>", "::", "===", "#include <stdio.h>",
    "def f(x):\n    return x ** 2\n", "\tif (a && b) {\n\t\treturn;\n\t}", "$$\\frac{a}{b}$$", "http://x.y/z?q=1",
    # control characters and long runs
    "\x00", "\x07", "\x7f", " " * 40, "a" * 120, "=" * 64, "\n" * 12, "9" * 30,
]


def assigned_code_points() -> list[int]:
    """Assigned, non-surrogate code points of every plane (Python's Unicode 14 tables: what an
    older or newer Oniguruma agrees on), for random draws."""
    out = []
    for cp in range(0x20, 0x32000):
        cat = unicodedata.category(chr(cp))
        if cat not in ("Cn", "Cs", "Co"):
            out.append(cp)
    return out


def generated_strings(seed: int, count: int) -> list[str]:
    rng = random.Random(seed)
    points = assigned_code_points()
    seps = ["", "", " ", "  ", "\n", "\t", " \n", "\r\n", "\u3000"]
    out = []
    for i in range(count):
        parts = []
        for _ in range(rng.randint(1, 8)):
            if rng.random() < 0.2:
                parts.append("".join(chr(rng.choice(points)) for _ in range(rng.randint(1, 6))))
            else:
                frag = rng.choice(FRAGMENTS)
                parts.append(frag.upper() if rng.random() < 0.1 else frag)
            parts.append(rng.choice(seps))
        out.append("".join(parts))
    return out


def bench_prompts() -> list[str]:
    out = []
    for path in sorted((ROOT / "bench").glob("*.jsonl")):
        for line in path.read_text().splitlines():
            if line.strip():
                out.extend(t for t in json.loads(line)["turns"] if isinstance(t, str))
    assert len(out) > 150
    return out


def variants(tmp: Path) -> dict[str, Path]:
    """The real tokenizers, and Qwen2.5's with Llama 3's split (digits in threes) and merges
    ignored for whole-vocabulary pieces (as Llama 3 ships), and with the NFC normalizer HF's
    Qwen2 tokenizer.json carries."""
    from speccompile.compiler.fetch import fetch_tokenizer

    smol = fetch_tokenizer("SmolLM2-135M-Instruct", quiet=True) / "tokenizer.json"
    qwen = fetch_tokenizer("Qwen2.5-Coder-1.5B-Instruct", quiet=True) / "tokenizer.json"
    data = json.loads(qwen.read_text())
    llama3 = json.loads(json.dumps(data))
    llama3["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = LLAMA3_REGEX
    llama3["model"]["ignore_merges"] = True
    # Qwen2.5's vocabulary has no multi-digit token: give it some, so that digits in threes and
    # ignore_merges tokenize differently ("999" is in the vocabulary but no merge builds it)
    first = 1 + max(max(llama3["model"]["vocab"].values()), max(t["id"] for t in llama3["added_tokens"]))
    for i, text in enumerate(["12", "123", "45", "999"]):
        llama3["model"]["vocab"][text] = first + i
    llama3["model"]["merges"] += [["1", "2"], ["12", "3"], ["4", "5"]]
    nfc = json.loads(json.dumps(data))
    nfc["normalizer"] = {"type": "NFC"}
    gpt2 = json.loads(smol.read_text())
    gpt2["pre_tokenizer"] = gpt2["pre_tokenizer"]["pretokenizers"][1]  # ByteLevel alone: GPT-2's own regex
    out = {"smollm2": smol, "qwen2.5": qwen}
    for name, obj in (("llama3-split", llama3), ("qwen2.5-nfc", nfc), ("gpt2-bytelevel", gpt2)):
        path = tmp / f"{name}.json"
        path.write_text(json.dumps(obj))
        out[name] = path
    return out


@pytest.fixture(scope="module")
def capi(capi_build) -> Capi:
    return Capi(capi_build)


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory) -> dict[str, Path]:
    return variants(tmp_path_factory.mktemp("tokenizers"))


@pytest.mark.parametrize("name", ["smollm2", "qwen2.5", "llama3-split", "qwen2.5-nfc", "gpt2-bytelevel"])
def test_ids_equal_hf_tokenizers(capi, tokenizers, name):
    path = tokenizers[name]
    hf = Tokenizer.from_file(str(path))
    texts = bench_prompts() + generated_strings(seed=zlib.crc32(name.encode()), count=GENERATED)
    want = [e.ids for e in hf.encode_batch(texts, add_special_tokens=False)]
    tok = capi.tokenizer(path)
    try:
        got = [capi.encode(tok, t) for t in texts]
    finally:
        capi.free_tokenizer(tok)
    bad = [(t, w, g) for t, w, g in zip(texts, want, got) if w != g]
    assert not bad, f"{len(bad)} of {len(texts)} differ; first: {bad[0][0]!r}\nHF {bad[0][1]}\nC  {bad[0][2]}"


def test_text_from_ids_equals_hf_decode(capi, tokenizers):
    """Random id runs (tokens that cut characters in the middle included: U+FFFD as HF gives
    it), special tokens kept or skipped."""
    path = tokenizers["qwen2.5"]
    hf = Tokenizer.from_file(str(path))
    rng = random.Random(3)
    vocab = hf.get_vocab_size()
    specials = [hf.token_to_id(t) for t in ("<|im_start|>", "<|im_end|>", "<|endoftext|>")]
    tok = capi.tokenizer(path)
    try:
        for _ in range(300):
            ids = [rng.choice(specials) if rng.random() < 0.1 else rng.randrange(vocab) for _ in range(rng.randint(0, 12))]
            for skip in (True, False):
                assert capi.decode(tok, ids, skip) == hf.decode(ids, skip_special_tokens=skip), ids
        text = "Grüße, 世界! 👋🏽 <|im_end|>"
        assert capi.decode(tok, capi.encode(tok, text), skip_special=False) == text
        assert capi.token_id(tok, "<|im_end|>") == hf.token_to_id("<|im_end|>")
        assert capi.token_id(tok, "no such token") == -1
    finally:
        capi.free_tokenizer(tok)


def test_refusals_are_clear(capi, tokenizers, tmp_path):
    from tokenizers import models, pre_tokenizers

    wordpiece = Tokenizer(models.WordPiece({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
    wordpiece.pre_tokenizer = pre_tokenizers.Whitespace()
    wordpiece.save(str(tmp_path / "wp.json"))
    with pytest.raises(CapiError) as err:
        capi.tokenizer(tmp_path / "wp.json")
    assert err.value.code == SPC_ERR_INCOMPATIBLE and "ByteLevel" in err.value.message
    other = json.loads(tokenizers["qwen2.5"].read_text())
    other["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = r"\w+|\s+"
    (tmp_path / "regex.json").write_text(json.dumps(other))
    with pytest.raises(CapiError) as err:
        capi.tokenizer(tmp_path / "regex.json")
    assert err.value.code == SPC_ERR_INCOMPATIBLE and r"\w+|\s+" in err.value.message
    with pytest.raises(CapiError) as err:
        capi.tokenizer(tmp_path / "missing.json")
    assert err.value.code == SPC_ERR_IO
    tok = capi.tokenizer(tokenizers["smollm2"].parent)  # a folder holding tokenizer.json
    try:
        for bad in (b"\xff", b"ab\xc3", b"\xed\xa0\x80", b"\xc0\xaf"):
            with pytest.raises(CapiError) as err:
                capi.encode(tok, bad)
            assert err.value.code == SPC_ERR_INVALID_ARGUMENT and "UTF-8" in err.value.message
        with pytest.raises(CapiError) as err:
            capi.decode(tok, [10 ** 6])
        assert err.value.code == SPC_ERR_INVALID_ARGUMENT
    finally:
        capi.free_tokenizer(tok)
