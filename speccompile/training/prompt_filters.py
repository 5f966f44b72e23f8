"""Filters for draft-head training prompts: duplicates, degenerate samples, benchmark overlap.

Why each exists:
- **Duplicates** (exact and near): Magpie sampling keeps returning to a model's favourite
  questions ("write a function that checks if a number is prime"), and combinatorial
  templates can collide. A head trained on many copies of one request learns that answer,
  not the target; near-duplicates are found by MinHash over word shingles, so the index
  stays fast at tens of thousands of prompts.
- **Degenerate samples**: a sampled user turn can loop, leak chat-control tokens, be the
  assistant talking ("Sure! Here is ..."), or be mostly another script when the benchmarks
  are English. Each rejection carries a reason, so the stage can report what it threw away.
- **Benchmark overlap**: the heads are measured on bench/mt_bench.jsonl and
  bench/prompts.jsonl; a training prompt sharing an 8-word run with any of their turns is
  dropped (the usual n-gram decontamination, stricter than the 13-grams of GPT-3's paper
  because our prompts are short).

``looks_like_code`` is a heuristic used for reporting the code share of a prompt set (the
target is a coder model, so the share is a quantity to watch, not a filter).
"""
from __future__ import annotations

import hashlib
import json
import re
import unicodedata
import zlib
from pathlib import Path

import numpy as np

_WORD = re.compile(r"[^\W_]+", re.UNICODE)
CONTROL_TOKEN = re.compile(r"<\|[a-z_]+\|>|<(?:/?s|unk|pad)>|\[/?INST\]")
LEADING_LABEL = re.compile(r"^\s*(?:Q|Question|User|Human|Instruction|Prompt|Query|Input)\s*[:：]\s*", re.IGNORECASE)
ASSISTANT_OPENERS = ("sure", "certainly", "of course", "absolutely", "i'm sorry", "i am sorry", "as an ai",
                     "hello! how can i", "hi! how can i", "hello, how can i", "how can i assist", "how can i help you",
                     "great question", "i'd be happy", "i would be happy")


def normalize(text: str) -> str:
    """Case, accents-as-written (NFKC), punctuation and whitespace folded: the form two
    prompts must share to count as the same request."""
    return " ".join(_WORD.findall(unicodedata.normalize("NFKC", text).lower()))


def words(text: str) -> list[str]:
    return normalize(text).split()


def _stable_hash(s: str) -> int:
    """A 64-bit hash that is the same in every process (Python's ``hash`` is salted)."""
    return int.from_bytes(hashlib.blake2b(s.encode(), digest_size=8).digest(), "little")


STOPWORDS = frozenset(
    "a an the and or but if then so of to in on at by for with from into about as is are was were be been being "
    "do does did done have has had i me my mine you your yours we our us he she it its they them their this that "
    "these those there here what which who whom whose how why when where can could would should will shall may "
    "might must please just also some any all very really way ways get got use using want need like let tell "
    "give show help make am not no yes than too more most".split())


def content_key(text: str) -> str:
    """The request's content words as a set (stopwords and order dropped): "How can I
    reverse a string in Python?" and "How do I reverse a string in Python?" share it,
    while "... in Rust?" does not -- short paraphrases that shingles miss."""
    return " ".join(sorted({w for w in words(text) if w not in STOPWORDS}))


def shingles(text: str, n: int = 3) -> set[str]:
    w = words(text)
    if len(w) < n:
        return {" ".join(w)} if w else set()
    return {" ".join(w[i:i + n]) for i in range(len(w) - n + 1)}


class NearDupIndex:
    """Duplicate lookup at three levels: the same normalized text ("exact"), the same set of
    content words ("same_words"), and Jaccard of word 3-gram shingles >= threshold ("near",
    which catches edits of long prompts: a changed word in a pasted snippet). The last is
    MinHash with locality-sensitive banding: only prompts sharing a band are compared
    exactly, so a lookup costs about the same at 100 prompts as at 100,000.

    With 16 bands of 4 hashes, a pair at Jaccard 0.7 is a candidate with probability 0.99;
    the exact Jaccard check then decides."""

    BANDS, ROWS = 16, 4
    # Below this many shingles one changed word already weighs 0.3 of the Jaccard ("reverse
    # a string in Python" / "... in Rust"): short prompts are left to the exact and
    # content-word checks.
    MIN_SHINGLES = 12
    _PRIME = (1 << 61) - 1

    def __init__(self, threshold: float = 0.7, seed: int = 0):
        if not 0 < threshold <= 1:
            raise ValueError(f"near-duplicate threshold {threshold} must be in (0, 1]")
        self.threshold = threshold
        rng = np.random.default_rng(seed)
        k = self.BANDS * self.ROWS
        self._a = rng.integers(1, self._PRIME, k, dtype=np.uint64)
        self._b = rng.integers(0, self._PRIME, k, dtype=np.uint64)
        self.exact: dict[str, str] = {}
        self.content: dict[str, str] = {}
        self.bands: list[dict[bytes, list[str]]] = [{} for _ in range(self.BANDS)]
        self.sets: dict[str, set[str]] = {}

    def _signature(self, sh: set[str]) -> np.ndarray:
        h = np.fromiter((_stable_hash(s) & 0xFFFFFFFF for s in sh), np.uint64, len(sh))
        # (a*h + b) mod p with h < 2^32 and a < 2^61: the product wraps in uint64, which is
        # still a fixed pseudo-random permutation per row -- all MinHash needs
        return ((h[None, :] * self._a[:, None] + self._b[:, None]) % np.uint64(self._PRIME)).min(1)

    def _keys(self, sig: np.ndarray) -> list[bytes]:
        return [sig[i * self.ROWS:(i + 1) * self.ROWS].tobytes() for i in range(self.BANDS)]

    def find(self, text: str) -> tuple[str, str] | None:
        """(kind, the key of an earlier prompt this one duplicates) or None."""
        norm = normalize(text)
        if norm in self.exact:
            return "exact", self.exact[norm]
        ck = content_key(text)
        if ck and ck in self.content:
            return "same_words", self.content[ck]
        sh = shingles(text)
        if len(sh) < self.MIN_SHINGLES:
            return None
        seen: set[str] = set()
        for band, key in zip(self.bands, self._keys(self._signature(sh))):
            for other in band.get(key, ()):
                if other in seen:
                    continue
                seen.add(other)
                o = self.sets[other]
                if len(sh & o) / len(sh | o) >= self.threshold:
                    return "near", other
        return None

    def add(self, key: str, text: str) -> None:
        self.exact.setdefault(normalize(text), key)
        ck = content_key(text)
        if ck:
            self.content.setdefault(ck, key)
        sh = shingles(text)
        if not sh:
            return
        self.sets[key] = sh
        for band, k in zip(self.bands, self._keys(self._signature(sh))):
            band.setdefault(k, []).append(key)

    def __len__(self) -> int:
        return len(self.exact)


# ------------------------------------------------------------------ benchmarks
def benchmark_texts(paths: list[Path]) -> dict[str, str]:
    """Every turn of every question in MT-bench-format JSONL files, by "file:id:turn".

    A missing or unreadable file is an error, not an empty set: a prompt set built without
    the exclusion could silently contaminate the benchmark."""
    out = {}
    for p in paths:
        p = Path(p)
        if not p.exists():
            raise FileNotFoundError(f"benchmark file {p} not found: training prompts are checked against every "
                                    "benchmark prompt, so it must be readable")
        for n, line in enumerate(p.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                q = json.loads(line)
                turns = q["turns"]
            except (json.JSONDecodeError, KeyError, TypeError) as err:
                raise ValueError(f"{p}:{n} is not an MT-bench style question (JSON with 'turns'): {err}") from err
            for t, turn in enumerate(turns):
                out[f"{p.name}:{q.get('question_id', n)}:{t}"] = str(turn)
    return out


class BenchmarkGuard:
    """Drops prompts that share an ``n``-word run with a benchmark turn (after normalization).
    Turns shorter than ``n`` words ("Rewrite your previous response.") have no such run: a
    prompt containing one whole is dropped; so is a short prompt found whole inside a turn."""

    def __init__(self, texts: dict[str, str], n: int = 8):
        if n < 3:
            raise ValueError("benchmark overlap n-grams shorter than 3 words would drop ordinary phrases")
        self.n = n
        self.grams: dict[tuple[str, ...], str] = {}
        self.normalized = {k: " " + normalize(t) + " " for k, t in texts.items()}
        self.short = {k: t for k, t in self.normalized.items() if 3 <= len(t.split()) < n}
        for key, text in texts.items():
            w = words(text)
            for i in range(len(w) - n + 1):
                self.grams.setdefault(tuple(w[i:i + n]), key)

    def overlap(self, text: str) -> str | None:
        """The benchmark turn this prompt overlaps ("file:id:turn"), or None."""
        w = words(text)
        joined = " " + " ".join(w) + " "
        hit = next((k for k, t in self.short.items() if t in joined), None)
        if hit is not None:
            return hit
        if len(w) < self.n:
            if len(w) < 3:
                return None
            return next((k for k, t in self.normalized.items() if joined in t), None)
        for i in range(len(w) - self.n + 1):
            hit = self.grams.get(tuple(w[i:i + self.n]))
            if hit is not None:
                return hit
        return None


# ------------------------------------------------------------------ degenerate samples
def clean_user_turn(text: str) -> str:
    """A sampled user turn as a user would have typed it: outer whitespace and a leading
    "Q:" / "Question:" style label (a common Magpie artifact) removed."""
    text = text.strip()
    stripped = LEADING_LABEL.sub("", text, count=1)
    return stripped.strip() if stripped.strip() else text


def non_latin_share(text: str) -> float:
    """Share of the letters in another script than Latin (CJK, Arabic, Cyrillic ...). Greek
    letters are not counted: in these prompts they are formulas' variables."""
    letters = [c for c in text if c.isalpha()]
    if not letters:
        return 0.0
    return sum(1 for c in letters if not unicodedata.name(c, "").startswith(("LATIN", "GREEK"))) / len(letters)


def degenerate(text: str, max_non_latin: float = 0.1) -> str | None:
    """Why this user turn is unusable as a training prompt, or None if it is fine."""
    if CONTROL_TOKEN.search(text):
        return "control_token"
    low = text.lower().lstrip()
    if low.startswith(ASSISTANT_OPENERS):
        return "assistant_like"
    if low.startswith("qwen"):
        return "self_reference"  # Magpie on Qwen: "Qwen: ..." turns are the model echoing its system prompt
    if non_latin_share(text) > max_non_latin:
        return "non_english"  # the benchmarks are English: another script's tokens train little that is used
    if re.search(r"(\S)\1{19,}", text):
        return "char_run"
    # Repetition is judged on the prose: code repeats lines ("}", "end") and phrases by nature.
    prose = re.sub(r"```.*?(?:```|$)", " ", text, flags=re.DOTALL)
    lines = [ln.strip() for ln in prose.splitlines() if len(ln.split()) >= 4]
    if len(lines) >= 4 and max(lines.count(ln) for ln in set(lines)) >= 4:
        return "repeated_lines"
    w = words(prose)
    if len(w) >= 24:
        grams = [tuple(w[i:i + 3]) for i in range(len(w) - 2)]
        if len(set(grams)) / len(grams) < 0.5:
            return "repetitive"
    raw = text.encode()  # the whole turn, code included, only when it is one thing over and over
    if len(raw) >= 400 and len(zlib.compress(raw)) / len(raw) < 0.12:
        return "repetitive"
    if re.search(r"[A-Za-z0-9+/=]{80,}", text):
        return "gibberish"  # long unbroken runs: base64, hashes, keyboard mash
    plain = sum(c.isalnum() or c.isspace() for c in text)
    if plain < 0.5 * len(text) and "```" not in text:
        return "gibberish"  # mostly symbols (arithmetic and LaTeX stay well above half)
    return None


# ------------------------------------------------------------------ code share
_FENCE = re.compile(r"```|^(?: {4}|\t)\S", re.MULTILINE)
_SYNTAX = re.compile(
    r"\bdef \w+\(|\bfunction\s*\w*\s*\(|=>|#include\s*<|\bconsole\.log\(|\bprint\(|\bimport \w+|\bfrom \w+ import\b|"
    r"\bSELECT\b.+\bFROM\b|\bpublic (?:static )?(?:void|class|int)\b|\bfn \w+\(|\bfunc \w+\(|\w+\(\)|\$\(|"
    r"\bsudo \w+|\bgit (?:commit|push|pull|merge|rebase|checkout|clone)\b|\bpip install\b|\bnpm (?:install|run)\b|"
    r"[{};]\s*$", re.MULTILINE | re.DOTALL)
_STRONG = re.compile(
    r"(?<![\w+#])(?:c\+\+|c#|f#)(?![\w+#])|"
    r"\b(?:python|javascript|typescript|java|golang|rust|ruby|php|swiftui|kotlin|scala|sql|mysql|postgres(?:ql)?|"
    r"sqlite|bash|shell script|powershell|html|css|react|vue|angular|node\.?js|django|flask|fastapi|spring boot|"
    r"pandas|numpy|pytorch|tensorflow|keras|docker|kubernetes|git|github|regex|regular expression|linux|"
    r"json|yaml|csv|api|jquery|matlab|haskell|perl|lua|flutter|excel formula|vba|ansible|terraform|"
    r"nginx|redis|mongodb|graphql|webpack|npm|pip|cmake|makefile|jupyter|arduino|android|ios app|tkinter|streamlit|"
    r"next\.js|bigquery|command[- ]line|one-liner|shell command|cron|ssh|rsync|curl|segmentation fault|goroutines?)\b",
    re.IGNORECASE)
# language names that are also common words count only as written in a programming request
_NAMED = re.compile(r"\b(?:in|using|with|to|for) (?:Go|Rust|Swift|Dart|C|R|Julia|Elixir|Zig)\b|"
                    r"\b(?:Go|Rust|Swift|Dart|C|R|Julia|Elixir|Zig) (?:code|function|program|script|error|compiler)|"
                    r"\b[A-Z]\w*(?:Error|Exception)\b|`[^`\n]+`|\b\w+\.(?:py|js|ts|java|cpp|rs|go|sh|csv|json|log)\b|"
                    r"\b[a-z_]+\((?:[a-z_]+, )+[a-z_]+\)")
_TERMS = re.compile(
    r"\b(?:code|coding|program|programming|function|method|class|variable|array|list comprehension|loop|error|crash|"
    r"recursion|algorithm|compile[rd]?|runtime|exception|stack trace|traceback|bug|debug(?:ging)?|script|snippet|"
    r"query|database|server|backend|frontend|library|framework|module|package|syntax|unit tests?|refactor|"
    r"repository|endpoint|deploy|data ?frame|string|integer|boolean|pointer|thread|async|compiler|binary tree|"
    r"linked list|hash ?map|dictionary|parse|parser|command line|terminal|implement|developer|software)\b",
    re.IGNORECASE)


def looks_like_code(text: str) -> bool:
    """Whether a prompt is about programming: code in it, a language or tool named, or two
    or more programming terms."""
    if _FENCE.search(text) or _STRONG.search(text) or _SYNTAX.search(text) or _NAMED.search(text):
        return True
    return len({m.lower() for m in _TERMS.findall(text)}) >= 2
