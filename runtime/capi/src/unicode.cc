// See unicode.h. NFC follows UAX #15: full canonical decomposition, canonical ordering, then
// canonical composition; the tables come from unicode_tables.inc (generated).
#include "unicode.h"

#include <algorithm>
#include <iterator>
#include <stdexcept>

namespace spc {
namespace unicode {

namespace {

// Row types of the generated tables; each table is sorted by its first field.
struct Range {
  char32_t first, last;
};
struct CccRange {
  char32_t first, last;
  uint8_t ccc;
};
struct Decomposition {
  char32_t cp, first, second;  // second == 0: a singleton mapping (U+212B -> U+00C5)
};
struct Composition {
  char32_t first, second, composite;
};

#include "unicode_tables.inc"

// Hangul syllables are not in the tables: UAX #15 / Unicode 3.12 define them arithmetically as
// L (leading consonant) + V (vowel) [+ T (trailing consonant)].
constexpr char32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr char32_t kLCount = 19, kVCount = 21, kTCount = 28;
constexpr char32_t kNCount = kVCount * kTCount, kSCount = kLCount * kNCount;

template <size_t N>
bool InRanges(const Range (&table)[N], char32_t c) {
  // the first range starting after c; c is inside the one before it, if anywhere
  const Range* it = std::upper_bound(std::begin(table), std::end(table), c,
                                     [](char32_t v, const Range& r) { return v < r.first; });
  return it != std::begin(table) && c <= std::prev(it)->last;
}

const Decomposition* FindDecomposition(char32_t c) {
  const Decomposition* it = std::lower_bound(std::begin(kDecompositions), std::end(kDecompositions), c,
                                             [](const Decomposition& d, char32_t v) { return d.cp < v; });
  return it != std::end(kDecompositions) && it->cp == c ? it : nullptr;
}

// Appends c's full canonical decomposition. The table is one level deep, as in the UCD
// (U+1E08 -> U+00C7 U+0301, U+00C7 -> U+0043 U+0327), so both halves are expanded again.
void Decompose(char32_t c, std::u32string* out) {
  if (c >= kSBase && c < kSBase + kSCount) {
    char32_t s = c - kSBase;
    out->push_back(kLBase + s / kNCount);
    out->push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount != 0) out->push_back(kTBase + s % kTCount);
    return;
  }
  const Decomposition* d = FindDecomposition(c);
  if (d == nullptr) {
    out->push_back(c);
    return;
  }
  Decompose(d->first, out);
  if (d->second != 0) Decompose(d->second, out);
}

// Canonical ordering: within each run of non-starters, a stable sort by combining class
// (marks of equal class keep their order, which is meaningful: U+0301 U+0300 != U+0300 U+0301).
void CanonicalOrder(std::u32string* s) {
  auto by_class = [](char32_t a, char32_t b) { return CombiningClass(a) < CombiningClass(b); };
  for (size_t i = 0; i < s->size();) {
    if (CombiningClass((*s)[i]) == 0) {
      ++i;
      continue;
    }
    size_t j = i + 1;
    while (j < s->size() && CombiningClass((*s)[j]) != 0) ++j;
    if (j - i > 1) std::stable_sort(s->begin() + i, s->begin() + j, by_class);
    i = j;
  }
}

// The primary composite of the pair, or 0 when there is none.
char32_t ComposePair(char32_t a, char32_t b) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount)  // L + V -> LV
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  // LV + T -> LVT (T counts from kTBase + 1: kTBase itself means "no trailing consonant")
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase && b < kTBase + kTCount)
    return a + (b - kTBase);
  const Composition* it = std::lower_bound(
      std::begin(kCompositions), std::end(kCompositions), std::make_pair(a, b),
      [](const Composition& c, const std::pair<char32_t, char32_t>& v) {
        return c.first < v.first || (c.first == v.first && c.second < v.second);
      });
  return it != std::end(kCompositions) && it->first == a && it->second == b ? it->composite : 0;
}

// Canonical composition, in place, of a decomposed and canonically ordered string. Each
// character C may merge into the last starter S unless blocked: some character B between them
// has class 0 or a class >= C's. Characters kept between S and C are non-starters in
// ascending class order (canonical ordering, minus the ones already merged), so the last kept
// one alone decides: C is unblocked iff it follows S directly or last_ccc < ccc(C).
void Compose(std::u32string* s) {
  constexpr size_t kNone = static_cast<size_t>(-1);
  size_t starter = kNone;  // output index of the last starter
  uint8_t last_ccc = 0;    // class of the last character kept in the output
  size_t w = 0;            // output length (output overwrites input: it never runs ahead)
  for (size_t r = 0; r < s->size(); ++r) {
    char32_t c = (*s)[r];
    uint8_t ccc = CombiningClass(c);
    if (starter != kNone && (w == starter + 1 || last_ccc < ccc)) {
      if (char32_t composite = ComposePair((*s)[starter], c)) {
        (*s)[starter] = composite;  // C is consumed; last_ccc still describes what is kept
        continue;
      }
    }
    if (ccc == 0) starter = w;
    last_ccc = ccc;
    (*s)[w++] = c;
  }
  s->resize(w);
}

[[noreturn]] void BadUtf8(size_t at) {
  throw std::invalid_argument("invalid UTF-8 at byte " + std::to_string(at));
}

}  // namespace

const char* UnicodeVersion() { return kUnicodeVersion; }

std::u32string DecodeUtf8(const std::string& s) {
  std::u32string out;
  out.reserve(s.size());
  const size_t n = s.size();
  for (size_t i = 0; i < n;) {
    const unsigned char b0 = static_cast<unsigned char>(s[i]);
    if (b0 < 0x80) {
      out.push_back(b0);
      ++i;
      continue;
    }
    // The lead byte fixes the length and the range allowed for the second byte: these ranges
    // are what exclude overlong forms (C0, C1, E0 80..9F, F0 80..8F), surrogates (ED A0..BF)
    // and values above U+10FFFF (F4 90..BF, F5..FF), as in the Unicode standard's Table 3-7.
    size_t len;
    unsigned char lo = 0x80, hi = 0xBF;
    char32_t cp;
    if (b0 >= 0xC2 && b0 <= 0xDF) {
      len = 2, cp = b0 & 0x1F;
    } else if (b0 >= 0xE0 && b0 <= 0xEF) {
      len = 3, cp = b0 & 0x0F;
      if (b0 == 0xE0) lo = 0xA0;
      if (b0 == 0xED) hi = 0x9F;
    } else if (b0 >= 0xF0 && b0 <= 0xF4) {
      len = 4, cp = b0 & 0x07;
      if (b0 == 0xF0) lo = 0x90;
      if (b0 == 0xF4) hi = 0x8F;
    } else {
      BadUtf8(i);  // a continuation byte with no lead, or C0, C1, F5..FF
    }
    if (i + len > n) BadUtf8(i);  // truncated
    for (size_t k = 1; k < len; ++k) {
      const unsigned char b = static_cast<unsigned char>(s[i + k]);
      if (b < (k == 1 ? lo : 0x80) || b > (k == 1 ? hi : 0xBF)) BadUtf8(i);
      cp = (cp << 6) | (b & 0x3F);
    }
    out.push_back(cp);
    i += len;
  }
  return out;
}

void AppendUtf8(char32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    if (cp >= 0xD800 && cp <= 0xDFFF) throw std::invalid_argument("cannot encode a surrogate code point in UTF-8");
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp <= 0x10FFFF) {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    throw std::invalid_argument("code point above U+10FFFF cannot be encoded in UTF-8");
  }
}

std::string EncodeUtf8(const std::u32string& s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s) AppendUtf8(c, &out);
  return out;
}

bool IsLetter(char32_t c) { return InRanges(kLetterRanges, c); }

bool IsNumber(char32_t c) {
  if (c < 0x80) return c >= '0' && c <= '9';
  return InRanges(kNumberRanges, c);
}

bool IsWhitespace(char32_t c) {
  switch (c) {
    case 0x09: case 0x0A: case 0x0B: case 0x0C: case 0x0D: case 0x20: case 0x85: case 0xA0:
    case 0x1680: case 0x2028: case 0x2029: case 0x202F: case 0x205F: case 0x3000:
      return true;
    default:
      return c >= 0x2000 && c <= 0x200A;
  }
}

uint8_t CombiningClass(char32_t c) {
  if (c < 0x300) return 0;  // the first non-zero class is U+0300's
  const CccRange* it = std::upper_bound(std::begin(kCombiningClasses), std::end(kCombiningClasses), c,
                                        [](char32_t v, const CccRange& r) { return v < r.first; });
  if (it == std::begin(kCombiningClasses)) return 0;
  --it;
  return c <= it->last ? it->ccc : 0;
}

bool IsNfcQuick(const std::u32string& s) {
  uint8_t last_ccc = 0;
  for (char32_t c : s) {
    if (c < 0x300) {  // below U+0300 everything is a starter that stays as it is
      last_ccc = 0;
      continue;
    }
    uint8_t ccc = CombiningClass(c);
    // marks out of canonical order, or a character NFC removes (No) or may merge (Maybe)
    if ((ccc != 0 && last_ccc > ccc) || InRanges(kNfcQuickCheckNotYes, c)) return false;
    last_ccc = ccc;
  }
  return true;
}

std::u32string Nfc(const std::u32string& s) {
  if (IsNfcQuick(s)) return s;
  std::u32string out;
  out.reserve(s.size() + s.size() / 2);
  for (char32_t c : s) Decompose(c, &out);
  CanonicalOrder(&out);
  Compose(&out);
  return out;
}

}  // namespace unicode
}  // namespace spc
