// Exposes src/unicode.{h,cc} to tests/runtime/test_capi_unicode.py, which compares it with
// Python's unicodedata. No TVM needed:
//   g++ -std=c++17 -O2 -I runtime/capi/src runtime/capi/tools/unicode_selftest.cc
//       runtime/capi/src/unicode.cc -o unicode_selftest   (one command line)
// Modes (all numbers in hex, no 0x):
//   classes  the class of every code point 0..10FFFF, as maximal ranges: "L first last" (letters),
//            "N first last" (numbers), "W first last" (whitespace); then "C cp ccc" for every
//            code point with a non-zero combining class; then "V <unicode version>".
//   nfc      each stdin line is the hex of a UTF-8 string (empty line: empty string); prints
//            the hex of its NFC, or "ERR <message>" when the bytes are not valid UTF-8.
//   quick    same input; prints 1 where IsNfcQuick() holds, else 0 ("ERR ..." as above).
#include <cstdio>
#include <iostream>
#include <stdexcept>
#include <string>

#include "unicode.h"

namespace u = spc::unicode;

namespace {

void PrintRanges(char tag, bool (*in_class)(char32_t)) {
  long start = -1;
  for (long cp = 0; cp <= 0x110000; ++cp) {  // 0x110000 closes a range that reaches 10FFFF
    bool in = cp <= 0x10FFFF && in_class(static_cast<char32_t>(cp));
    if (in && start < 0) start = cp;
    if (!in && start >= 0) {
      std::printf("%c %lX %lX\n", tag, start, cp - 1);
      start = -1;
    }
  }
}

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  throw std::runtime_error("bad hex digit in input");
}

std::string FromHex(const std::string& hex) {
  if (hex.size() % 2) throw std::runtime_error("odd-length hex input");
  std::string out;
  for (size_t i = 0; i < hex.size(); i += 2) out.push_back(static_cast<char>(HexDigit(hex[i]) * 16 + HexDigit(hex[i + 1])));
  return out;
}

std::string ToHex(const std::string& bytes) {
  static const char kDigits[] = "0123456789abcdef";
  std::string out;
  for (unsigned char b : bytes) {
    out.push_back(kDigits[b >> 4]);
    out.push_back(kDigits[b & 15]);
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc == 2 ? argv[1] : "";
  if (mode == "classes") {
    PrintRanges('L', u::IsLetter);
    PrintRanges('N', u::IsNumber);
    PrintRanges('W', u::IsWhitespace);
    for (char32_t cp = 0; cp <= 0x10FFFF; ++cp)
      if (int ccc = u::CombiningClass(cp)) std::printf("C %X %X\n", static_cast<unsigned>(cp), ccc);
    std::printf("V %s\n", u::UnicodeVersion());
    return 0;
  }
  if (mode != "nfc" && mode != "quick") {
    std::fprintf(stderr, "usage: %s classes|nfc|quick (nfc, quick: hex-encoded UTF-8 lines on stdin)\n", argv[0]);
    return 2;
  }
  std::ios::sync_with_stdio(false);
  std::string line, out;
  while (std::getline(std::cin, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    out.clear();
    try {
      std::u32string cps = u::DecodeUtf8(FromHex(line));
      out = mode == "nfc" ? ToHex(u::EncodeUtf8(u::Nfc(cps))) : (u::IsNfcQuick(cps) ? "1" : "0");
    } catch (const std::invalid_argument& e) {
      out = std::string("ERR ") + e.what();
    }
    std::cout << out << '\n';
  }
  return 0;
}
