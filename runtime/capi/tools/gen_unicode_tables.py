"""Writes runtime/capi/src/unicode_tables.inc: the Unicode data that runtime/capi/src/unicode.cc
needs (letter/number classes, canonical combining classes, canonical decompositions and
compositions, the NFC quick-check set), taken from Python's unicodedata so that the C++ side
agrees with the Python reference it is tested against (tests/runtime/test_capi_unicode.py).

Run by hand after a Python upgrade changes unicodedata.unidata_version:

    .venv/bin/python runtime/capi/tools/gen_unicode_tables.py

The output depends only on the Unicode version: every table is sorted, so regenerating with
the same Python gives the same bytes.
"""
from __future__ import annotations

import sys
import unicodedata
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "src" / "unicode_tables.inc"
MAX_CP = 0x10FFFF
# Hangul syllables decompose algorithmically (unicode.cc), never through the tables
S_BASE, S_COUNT = 0xAC00, 11172
LETTER_CATEGORIES = {"Lu", "Ll", "Lt", "Lm", "Lo"}  # \p{L}
NUMBER_CATEGORIES = {"Nd", "Nl", "No"}  # \p{N}


def ranges(cps) -> list[tuple[int, int]]:
    """Sorted code points -> maximal [first, last] runs."""
    out: list[list[int]] = []
    for cp in cps:
        if out and out[-1][1] == cp - 1:
            out[-1][1] = cp
        else:
            out.append([cp, cp])
    return [(a, b) for a, b in out]


def canonical_decomposition(cp: int) -> list[int] | None:
    """The UCD's one-level canonical mapping (a compatibility one has a <tag>: not ours)."""
    d = unicodedata.decomposition(chr(cp))
    if not d or d.startswith("<"):
        return None
    return [int(x, 16) for x in d.split()]


def build() -> dict:
    letters, numbers, ccc, decomps = [], [], [], []
    for cp in range(MAX_CP + 1):
        ch = chr(cp)
        cat = unicodedata.category(ch)
        if cat in LETTER_CATEGORIES:
            letters.append(cp)
        elif cat in NUMBER_CATEGORIES:
            numbers.append(cp)
        c = unicodedata.combining(ch)
        if c:
            ccc.append((cp, c))
        d = canonical_decomposition(cp)
        if d is not None:
            assert not S_BASE <= cp < S_BASE + S_COUNT, "Hangul syllables are algorithmic"
            assert len(d) in (1, 2), (hex(cp), d)  # the UCD guarantees it; the C++ layout relies on it
            decomps.append((cp, d[0], d[1] if len(d) == 2 else 0))

    # Primary composites. The UCD lists the characters excluded from composition in
    # CompositionExclusions.txt, which unicodedata does not expose (and there is no network
    # here). We derive the full exclusion set from NFC itself: a character c with a two-char
    # canonical mapping is composed back by NFC exactly when it is not excluded, and
    # NFC(NFD(c)) = NFC(c) (NFC is unique across canonically equivalent strings), so
    # NFC(NFD(c)) == c keeps c and drops the script-specific exclusions (U+0958...), the
    # post-composition-version ones, and the non-starter decompositions (U+0344...).
    # Singletons (U+212B...) have a one-char mapping and never compose.
    compose = []
    for cp, a, b in decomps:
        if b == 0:
            continue
        ch = chr(cp)
        if unicodedata.normalize("NFC", unicodedata.normalize("NFD", ch)) == ch:
            # and the pair itself composes to it (a may be decomposable: NFC recomposes it first)
            assert unicodedata.normalize("NFC", chr(a) + chr(b)) == ch, hex(cp)
            compose.append((a, b, cp))
    compose.sort()
    assert len({(a, b) for a, b, _ in compose}) == len(compose), "a pair composes to one character"

    # NFC quick check (UAX #15): code points whose NFC_Quick_Check is not Yes. "No": the
    # character never survives NFC (NFC(c) != c: excluded or singleton decompositions).
    # "Maybe": it may compose with what precedes it: the second of any composition pair,
    # including the Hangul medial vowels and final consonants that LV/LVT composition takes.
    not_yes = {cp for cp, _, _ in decomps if unicodedata.normalize("NFC", chr(cp)) != chr(cp)}
    not_yes |= {b for _, b, _ in compose}
    not_yes |= set(range(0x1161, 0x1176)) | set(range(0x11A8, 0x11C3))

    # runs of consecutive code points with the same combining class
    ccc_runs: list[list[int]] = []
    for cp, c in ccc:
        if ccc_runs and ccc_runs[-1][1] == cp - 1 and ccc_runs[-1][2] == c:
            ccc_runs[-1][1] = cp
        else:
            ccc_runs.append([cp, cp, c])
    return {"letters": ranges(letters), "numbers": ranges(numbers), "ccc": ccc_runs,
            "decomps": decomps, "compose": compose, "not_yes": ranges(sorted(not_yes))}


def emit_array(lines: list[str], ctype: str, name: str, rows: list[tuple], comment: str, per_line: int = 4) -> None:
    lines.append(f"// {comment} ({len(rows)} entries)")
    lines.append(f"constexpr {ctype} {name}[] = {{")
    cells = ["{" + ", ".join(f"0x{v:X}" for v in row) + "}" for row in rows]
    for i in range(0, len(cells), per_line):
        lines.append("    " + ", ".join(cells[i:i + per_line]) + ",")
    lines.append("};")
    lines.append("")


def render(t: dict) -> str:
    """The .inc text. It names only the Unicode version (not Python's), so that the test that
    compares it with a fresh render passes under any Python with the same unicodedata."""
    lines = [
        "// GENERATED FILE: do not edit. Written by runtime/capi/tools/gen_unicode_tables.py from",
        f"// Python's unicodedata, Unicode {unicodedata.unidata_version}. Regenerate with:",
        "//   .venv/bin/python runtime/capi/tools/gen_unicode_tables.py",
        "// Included once, by unicode.cc, inside its anonymous namespace (which defines the row types).",
        "// Every table is sorted by its first column for binary search.",
        "",
        f'constexpr const char kUnicodeVersion[] = "{unicodedata.unidata_version}";',
        "",
    ]
    emit_array(lines, "Range", "kLetterRanges", t["letters"], "\\p{L}: general category Lu, Ll, Lt, Lm, Lo")
    emit_array(lines, "Range", "kNumberRanges", t["numbers"], "\\p{N}: general category Nd, Nl, No")
    emit_array(lines, "CccRange", "kCombiningClasses", t["ccc"],
               "non-zero canonical combining classes: {first, last, class}")
    emit_array(lines, "Decomposition", "kDecompositions", t["decomps"],
               "one-level canonical decompositions {cp, first, second (0: singleton)}, Hangul excluded", 3)
    emit_array(lines, "Composition", "kCompositions", t["compose"],
               "canonical compositions {first, second, composite}, sorted by (first, second)", 3)
    emit_array(lines, "Range", "kNfcQuickCheckNotYes", t["not_yes"],
               "NFC_Quick_Check No or Maybe (the quick check stops there)")
    return "\n".join(lines)


def main() -> int:
    t = build()
    OUT.write_text(render(t))
    sizes = {k: len(v) for k, v in t.items()}
    print(f"wrote {OUT} (Unicode {unicodedata.unidata_version}): {sizes}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
