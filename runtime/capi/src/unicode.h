// The Unicode pieces a byte-level BPE tokenizer needs: strict UTF-8 <-> code points, the
// character classes its pre-tokenizer regex uses (\p{L}, \p{N}, \s as Oniguruma, and so
// HF tokenizers, define them), canonical combining classes, and NFC normalization.
//
// The data (unicode_tables.inc) is generated from Python's unicodedata by
// tools/gen_unicode_tables.py, so NFC here is unicodedata.normalize("NFC", ...) of the same
// Unicode version (kept in UnicodeVersion()); tests/runtime/test_capi_unicode.py checks it.
// Only the C++17 standard library is used.
#ifndef SPECCOMPILE_CAPI_UNICODE_H_
#define SPECCOMPILE_CAPI_UNICODE_H_

#include <cstdint>
#include <string>

namespace spc {
namespace unicode {

// The Unicode version of the tables, e.g. "14.0.0".
const char* UnicodeVersion();

// UTF-8 -> code points. Throws std::invalid_argument("invalid UTF-8 at byte N"), N the offset of
// the first byte of the bad sequence, on anything a strict decoder refuses: a stray
// continuation byte, a truncated sequence, an overlong form, a surrogate (U+D800..DFFF) or a
// value above U+10FFFF.
std::u32string DecodeUtf8(const std::string& s);

// Appends cp's UTF-8 bytes. Throws std::invalid_argument for a surrogate or a value above
// U+10FFFF (UTF-8 cannot carry them; DecodeUtf8 never produces them).
void AppendUtf8(char32_t cp, std::string* out);
std::string EncodeUtf8(const std::u32string& s);

bool IsLetter(char32_t c);      // \p{L}: general category Lu, Ll, Lt, Lm, Lo
bool IsNumber(char32_t c);      // \p{N}: general category Nd, Nl, No
bool IsWhitespace(char32_t c);  // the White_Space property (\s in Oniguruma): U+0009-000D, 0020,
                                // 0085, 00A0, 1680, 2000-200A, 2028, 2029, 202F, 205F, 3000
uint8_t CombiningClass(char32_t c);  // canonical combining class, 0 for starters

// Canonical composition normal form: = unicodedata.normalize("NFC", s).
std::u32string Nfc(const std::u32string& s);

// The UAX #15 quick check: true only if s is certainly NFC already (true for most text:
// ASCII, Latin-1, CJK, precomposed scripts); false means "run Nfc() to know". Nfc() uses it.
bool IsNfcQuick(const std::u32string& s);

}  // namespace unicode
}  // namespace spc

#endif  // SPECCOMPILE_CAPI_UNICODE_H_
