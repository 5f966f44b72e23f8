"""The C API's Unicode support (runtime/capi/src/unicode.{h,cc}), which the C++ tokenizer's
pre-tokenizer and normalizer rely on, against Python's unicodedata: the letter, number and
whitespace classes and the combining class of every code point, NFC on thousands of generated
strings (plus every character with a canonical decomposition, and all of 0..10FFFF in
chunks), the NFC quick check, and strict UTF-8 decoding. The tables are generated
(runtime/capi/tools/gen_unicode_tables.py) and must be current.

The driver, runtime/capi/tools/unicode_selftest.cc, is built with g++ alone (no TVM, no
model): a unit test."""
from __future__ import annotations

import importlib.util
import os
import random
import shutil
import subprocess
import unicodedata
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

CAPI = Path(__file__).resolve().parents[2] / "runtime" / "capi"
MAX_CP = 0x10FFFF
WHITE_SPACE = [*range(0x09, 0x0E), 0x20, 0x85, 0xA0, 0x1680, *range(0x2000, 0x200B), 0x2028, 0x2029, 0x202F,
               0x205F, 0x3000]


@pytest.fixture(scope="module")
def selftest(tmp_path_factory) -> Path:
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("no C++ compiler (g++, c++ or clang++) to build runtime/capi/tools/unicode_selftest.cc")
    exe = tmp_path_factory.mktemp("unicode") / "unicode_selftest"
    proc = subprocess.run([cxx, "-std=c++17", "-O2", "-Wall", "-Werror", "-I", str(CAPI / "src"),
                           str(CAPI / "tools" / "unicode_selftest.cc"), str(CAPI / "src" / "unicode.cc"),
                           "-o", str(exe)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return exe


def run(exe: Path, mode: str, lines: list[bytes] | None = None) -> list[str]:
    stdin = "".join(b.hex() + "\n" for b in lines) if lines is not None else None
    proc = subprocess.run([str(exe), mode], input=stdin, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.splitlines()
    assert lines is None or len(out) == len(lines)
    return out


def nfc_c(exe: Path, strings: list[str]) -> list[str]:
    return [bytes.fromhex(h).decode() for h in run(exe, "nfc", [s.encode() for s in strings])]


def ranges(pred) -> list[tuple[int, int]]:
    out: list[list[int]] = []
    for cp in range(MAX_CP + 1):
        if pred(cp):
            if out and out[-1][1] == cp - 1:
                out[-1][1] = cp
            else:
                out.append([cp, cp])
    return [tuple(r) for r in out]


def test_tables_are_generated_from_this_unicode_version():
    spec = importlib.util.spec_from_file_location("gen_unicode_tables", CAPI / "tools" / "gen_unicode_tables.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    assert gen.render(gen.build()) == (CAPI / "src" / "unicode_tables.inc").read_text(), \
        "unicode_tables.inc is stale: run .venv/bin/python runtime/capi/tools/gen_unicode_tables.py"


def test_classes_and_combining_classes_of_every_code_point(selftest):
    got: dict[str, list] = {"L": [], "N": [], "W": [], "C": [], "V": []}
    for line in run(selftest, "classes"):
        tag, *fields = line.split()
        got[tag].append(fields[0] if tag == "V" else tuple(int(f, 16) for f in fields))
    assert got["V"] == [unicodedata.unidata_version]
    cats = [unicodedata.category(chr(cp)) for cp in range(MAX_CP + 1)]
    assert got["L"] == ranges(lambda cp: cats[cp] in ("Lu", "Ll", "Lt", "Lm", "Lo"))
    assert got["N"] == ranges(lambda cp: cats[cp] in ("Nd", "Nl", "No"))
    # White_Space is not in unicodedata; str.isspace() differs from it only at U+001C..001F
    # (bidi class B/S, not White_Space): a cross-check of the list above
    assert WHITE_SPACE == [cp for cp in range(MAX_CP + 1) if chr(cp).isspace() and not 0x1C <= cp <= 0x1F]
    assert got["W"] == ranges(lambda cp: cp in WHITE_SPACE)
    expected = [(cp, unicodedata.combining(chr(cp))) for cp in range(MAX_CP + 1) if unicodedata.combining(chr(cp))]
    assert got["C"] == expected


# --- NFC --------------------------------------------------------------------------------------

def cps(*spans) -> list[int]:
    """Code points from ints and (first, last) inclusive spans."""
    out = []
    for s in spans:
        out.extend(range(s[0], s[1] + 1) if isinstance(s, tuple) else [s])
    return out


ASCII = cps((0x20, 0x7E), 0x09)
LATIN_MARKS = cps((0x300, 0x36F), 0x323, 0x327, 0x328, 0x31B, 0x1AB0, 0x1DC0, 0x20D0, 0x20E3)
LATIN_BASES = cps((0x41, 0x5A), (0x61, 0x7A), (0xC0, 0xFF), (0x100, 0x17F), (0x1E00, 0x1EFF), 0x1B7, 0x292)
GREEK = cps((0x391, 0x3A9), (0x3B1, 0x3C9), (0x386, 0x38F), (0x3AA, 0x3B0), (0x3CA, 0x3CE), (0x1F00, 0x1FFE))
GREEK_MARKS = cps(0x301, 0x308, 0x300, 0x342, 0x313, 0x314, 0x345, 0x344, 0x304, 0x306, 0x343, 0x340, 0x341)
VIET_BASES = [ord(c) for c in "aeiouyAEIOUYâêôơưăÂÊÔƠƯĂ"]
VIET_MARKS = cps(0x302, 0x306, 0x31B, 0x300, 0x301, 0x303, 0x309, 0x323)
HANGUL_L, HANGUL_V, HANGUL_T = cps((0x1100, 0x1112)), cps((0x1161, 0x1175)), cps((0x11A8, 0x11C2))
HANGUL_OTHER = cps((0x1113, 0x1160), (0x1176, 0x11A7), (0x11C3, 0x11FF), (0xAC00, 0xD7A3), 0x11A7)
CJK = cps((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1D), (0x3040, 0x30FF),
          0x3099, 0x309A)
EMOJI = cps((0x1F600, 0x1F64F), (0x1F466, 0x1F469), 0x2764, 0x2640, 0x2642, (0x1F1E6, 0x1F1FF))
EMOJI_MODS = cps((0x1F3FB, 0x1F3FF), 0x200D, 0xFE0F, 0xFE0E, 0x20E3)
DEVANAGARI = cps((0x900, 0x97F), (0x980, 0x9FF), (0xA00, 0xA7F))
DEVANAGARI_MARKS = cps(0x93C, 0x94D, 0x9BC, 0x9BE, 0x9D7, 0x951, 0x952, 0x901)
SINGLETONS = cps(0x212B, 0x2126, 0x212A, 0x340, 0x341, 0x343, 0x374, 0x37E, 0x387, 0x1F71, 0x2000, 0x2001,
                 0xF900, 0x2F800, 0x1FEE, 0x344, 0x0F73, 0x0F75, 0x0F81)
EXCLUSIONS = cps((0x958, 0x95F), (0x9DC, 0x9DF), 0xA33, 0xA36, (0xA59, 0xA5E), (0xFB1D, 0xFB4E), 0x2ADC,
                 0x1D15E, 0x1D160)
ARABIC = cps((0x621, 0x64A), (0x64B, 0x655), 0x670, (0x6C0, 0x6D3))
HEBREW = cps((0x5D0, 0x5EA), (0x5B0, 0x5C7), (0x591, 0x5AF))
# scripts whose vowel signs are starters that still compose (0B47 + 0B3E -> 0B4B), chains included
# (0CC6 + 0CC2 -> 0CCA, + 0CD5 -> 0CCB), and supplementary-plane pairs (Kaithi, Chakma, Grantha...)
INDIC_STARTERS = cps(0xB47, 0xB3E, 0xB56, 0xB57, 0xBC6, 0xBC7, 0xBBE, 0xBD7, 0xB92, 0xBD7, 0xCC6, 0xCC2,
                     0xCD5, 0xCD6, 0xCBF, 0xD46, 0xD47, 0xD3E, 0xD57, 0xDD9, 0xDCF, 0xDCA, 0xDDF, 0x1025, 0x102E,
                     0x1B05, 0x1B35, 0x1B3A, 0x1B3E, 0x11099, 0x110BA, 0x11131, 0x11132, 0x11127, 0x11347,
                     0x1133E, 0x11357, 0x114B9, 0x114BA, 0x114B0, 0x114BD, 0x115B8, 0x115AF, 0x11935, 0x11930)


def assigned(rng: random.Random) -> int:
    """A random assigned code point (not unassigned, not a surrogate)."""
    while True:
        cp = rng.randrange(MAX_CP + 1) if rng.random() < 0.3 else rng.randrange(0x30000)
        if unicodedata.category(chr(cp)) not in ("Cn", "Cs"):
            return cp


def clusters(rng: random.Random, bases: list[int], marks: list[int], n: int, max_marks: int = 4) -> list[int]:
    """n base characters, each followed by up to max_marks marks in random order."""
    out = []
    for _ in range(n):
        out.append(rng.choice(bases))
        out.extend(rng.choice(marks) for _ in range(rng.randint(0, max_marks)))
    return out


def hangul(rng: random.Random) -> list[int]:
    out = []
    for _ in range(rng.randint(1, 6)):
        kind = rng.random()
        if kind < 0.5:  # L V [T]: composes to one syllable
            out += [rng.choice(HANGUL_L), rng.choice(HANGUL_V)] + ([rng.choice(HANGUL_T)] if rng.random() < 0.6 else [])
        elif kind < 0.7:  # a precomposed LV or LVT syllable, perhaps followed by a T
            out += [rng.choice(cps((0xAC00, 0xD7A3)))] + ([rng.choice(HANGUL_T)] if rng.random() < 0.5 else [])
        else:  # jamo in any order, archaic ones, marks in between (which block composition)
            out += [rng.choice(HANGUL_L + HANGUL_V + HANGUL_T + HANGUL_OTHER + [0x301, 0x302E, 0x302F])
                    for _ in range(rng.randint(1, 4))]
    return out


THEMES = [
    lambda r: [r.choice(ASCII) for _ in range(r.randint(0, 12))],
    lambda r: clusters(r, LATIN_BASES, LATIN_MARKS, r.randint(1, 5)),
    lambda r: clusters(r, LATIN_BASES + ASCII, [0x300, 0x301, 0x323, 0x327, 0x302, 0x308, 0x30A], r.randint(1, 5)),
    lambda r: clusters(r, GREEK, GREEK_MARKS, r.randint(1, 5)),
    lambda r: clusters(r, VIET_BASES, VIET_MARKS, r.randint(1, 5), 3),
    hangul,
    lambda r: [r.choice(CJK) for _ in range(r.randint(1, 8))],
    lambda r: clusters(r, EMOJI, EMOJI_MODS, r.randint(1, 4), 3),
    lambda r: clusters(r, DEVANAGARI, DEVANAGARI_MARKS, r.randint(1, 6), 2),
    lambda r: clusters(r, SINGLETONS + EXCLUSIONS + LATIN_BASES, LATIN_MARKS + DEVANAGARI_MARKS, r.randint(1, 5), 2),
    lambda r: [r.choice(ARABIC) for _ in range(r.randint(1, 10))],
    lambda r: [r.choice(HEBREW) for _ in range(r.randint(1, 10))],
    lambda r: [r.choice(INDIC_STARTERS + [0x301, 0x94D]) for _ in range(r.randint(1, 8))],
    # long runs of marks, where a sort that is not stable would swap marks of equal class
    lambda r: clusters(r, LATIN_BASES + HEBREW, LATIN_MARKS + HEBREW + DEVANAGARI_MARKS, 1, 40),
    lambda r: [assigned(r) for _ in range(r.randint(1, 8))],
]


def generated_strings(n: int = 4000, seed: int = 20240531) -> list[str]:
    """Each string mixes one to three themes, so that scripts meet (a mark after CJK...)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        seq = []
        for _ in range(rng.choice((1, 1, 1, 2, 3))):
            seq += rng.choice(THEMES)(rng)
        out.append("".join(map(chr, seq)))
    return out


def decomposable() -> list[str]:
    return [chr(cp) for cp in range(MAX_CP + 1) if unicodedata.decomposition(chr(cp))
            and not unicodedata.decomposition(chr(cp)).startswith("<")] + \
        [chr(cp) for cp in range(0xAC00, 0xD7A4, 7)]  # Hangul: algorithmic, so not in the list above


def test_nfc_matches_unicodedata(selftest):
    strings = generated_strings()
    singles = decomposable()
    strings += singles + [s + "\u0301" for s in singles] + [unicodedata.normalize("NFD", s) for s in singles]
    # every L V and L V T jamo sequence, each in one line per (L, V)
    strings += [" ".join(chr(l) + chr(v) + (chr(t) if t else "") for t in [0] + HANGUL_T)
                for l in HANGUL_L for v in HANGUL_V]
    # every code point (surrogates excepted), in chunks: decoding, encoding and NFC of all of them
    everything = [cp for cp in range(MAX_CP + 1) if not 0xD800 <= cp <= 0xDFFF]
    strings += ["".join(map(chr, everything[i:i + 4096])) for i in range(0, len(everything), 4096)]
    expected = [unicodedata.normalize("NFC", s) for s in strings]
    assert sum(e != s for e, s in zip(expected, strings)) > 2000  # the cases do exercise NFC
    got = nfc_c(selftest, strings)
    wrong = [(s, g, e) for s, g, e in zip(strings, got, expected) if g != e]
    assert not wrong, f"{len(wrong)} wrong NFCs, e.g. " + "; ".join(
        f"{' '.join(f'{ord(c):04X}' for c in s[:16])}: got {' '.join(f'{ord(c):04X}' for c in g[:16])}, "
        f"want {' '.join(f'{ord(c):04X}' for c in e[:16])}" for s, g, e in wrong[:5])


def test_nfc_quick_check_is_never_wrong(selftest):
    strings = generated_strings(2000, seed=7) + decomposable()
    strings += [unicodedata.normalize("NFC", s) for s in strings]
    quick = run(selftest, "quick", [s.encode() for s in strings])
    assert all(q in ("0", "1") for q in quick)
    # "1" promises the string is NFC already
    assert not [s for s, q in zip(strings, quick) if q == "1" and unicodedata.normalize("NFC", s) != s]
    # and common text takes the fast path
    fast = ["plain ASCII", "café crème", "日本語のテキスト", "한국어 텍스트", "Ελληνικά", "Привет", "😀👍🏽", ""]
    assert run(selftest, "quick", [s.encode() for s in fast]) == ["1"] * len(fast)
    slow = ["e\u0301", "\u212b", "\u0958", "\u1100\u1161", "a\u0315\u0316", "a\u0301\u0316"]
    assert run(selftest, "quick", [s.encode() for s in slow]) == ["0"] * len(slow)


# --- UTF-8 ------------------------------------------------------------------------------------

INVALID_UTF8 = [
    b"ab\xe2\x82",          # truncated 3-byte sequence
    b"\xc3",                # truncated 2-byte sequence at the end
    b"\xc3A",               # lead byte without its continuation
    b"x\x80y",              # lone continuation byte
    b"\xc0\xaf",            # overlong '/'
    b"\xc1\xbf",            # overlong
    b"\xe0\x80\xaf",        # overlong 3-byte
    b"\xf0\x80\x80\xaf",    # overlong 4-byte
    b"\xed\xa0\x80",        # surrogate U+D800
    b"\xed\xbf\xbf",        # surrogate U+DFFF
    b"\xf4\x90\x80\x80",    # U+110000
    b"\xf5\x80\x80\x80",    # lead byte beyond U+10FFFF
    b"\xff",
    b"ok \xf0\x9f\x98",     # emoji cut short
]


def test_invalid_utf8_is_refused_where_python_refuses_it(selftest):
    out = run(selftest, "nfc", INVALID_UTF8)
    for raw, line in zip(INVALID_UTF8, out):
        with pytest.raises(UnicodeDecodeError) as err:
            raw.decode("utf-8")
        assert line == f"ERR invalid UTF-8 at byte {err.value.start}", raw


def test_utf8_edges_round_trip(selftest):
    edges = ["\x00", "\x7f", "\x80", "\u07ff", "\u0800", "\ud7ff", "\ue000", "\uffff", "\U00010000", "\U0010ffff"]
    assert nfc_c(selftest, edges) == edges
