// See tokenizer.h. The regexes are not run by a regex engine: each of the three patterns
// byte-level vocabularies use is written out below as the match its alternation makes at a
// position (leftmost alternative first, greedy, backtracking spelled out), so no regex
// library is linked and a fourth pattern is refused at load instead of approximated.
#include "tokenizer.h"

#include <climits>
#include <stdexcept>

#include "json_util.h"
#include "model.h"
#include "unicode.h"

namespace spc {

namespace fj = tvm::ffi::json;
using tvm::ffi::Any;

namespace {

// The patterns as tokenizer.json spells them (HF's ByteLevel regex is GPT-2's; Qwen2 and
// Llama 3 name theirs in a Split pre-tokenizer, and differ only in how many digits go together).
const char* const kGpt2Regex = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
const char* const kQwen2Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* const kLlama3Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

using Pattern = Tokenizer::Pattern;

// GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves, the other 68 bytes
// for code points 256.. in byte order, so that every byte is a visible vocabulary character.
char32_t ByteChar(int b) {
  static const std::vector<char32_t> table = [] {
    std::vector<char32_t> t(256);
    char32_t shifted = 256;
    for (int i = 0; i < 256; ++i) {
      bool printable = (i >= '!' && i <= '~') || (i >= 0xA1 && i <= 0xAC) || (i >= 0xAE && i <= 0xFF);
      t[i] = printable ? static_cast<char32_t>(i) : shifted++;
    }
    return t;
  }();
  return table[b];
}

// A vocabulary string back to its bytes; a character outside the table keeps the string's
// own UTF-8 bytes (HF's ByteLevel decoder does the same).
std::string ByteLevelDecode(const std::string& token) {
  static const std::unordered_map<char32_t, char> inverse = [] {
    std::unordered_map<char32_t, char> m;
    for (int b = 0; b < 256; ++b) m[ByteChar(b)] = static_cast<char>(b);
    return m;
  }();
  std::u32string cps;
  try {
    cps = unicode::DecodeUtf8(token);
  } catch (const std::invalid_argument&) {
    return token;
  }
  std::string out;
  for (char32_t c : cps) {
    auto it = inverse.find(c);
    if (it == inverse.end()) return token;
    out.push_back(it->second);
  }
  return out;
}

// Length of a contraction ('s 't 're 've 'm 'll 'd) at s[i] == '\'', or 0. `fold`: the (?i:...)
// of Qwen2 and Llama 3, where Unicode case folding also lets U+017F (long s) match s.
size_t Contraction(const char32_t* s, size_t n, size_t i, bool fold) {
  auto at = [&](size_t k) -> char32_t {
    if (k >= n) return 0;
    char32_t c = s[k];
    if (!fold) return c;
    if (c >= 'A' && c <= 'Z') return c + 32;
    return c == 0x17F ? U's' : c;
  };
  char32_t a = at(i + 1), b = at(i + 2);
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
  if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
  return 0;
}

// End of the pattern's match at s[i] (i < n). Every character is a letter (\p{L}), a number
// (\p{N}), whitespace (\s) or other, and each pattern has an alternative for each, so a match
// always exists and the pieces tile the text.
size_t MatchAt(Pattern pat, const char32_t* s, size_t n, size_t i) {
  auto letter = [&](size_t k) { return k < n && unicode::IsLetter(s[k]); };
  auto number = [&](size_t k) { return k < n && unicode::IsNumber(s[k]); };
  auto space = [&](size_t k) { return k < n && unicode::IsWhitespace(s[k]); };
  auto other = [&](size_t k) { return k < n && !space(k) && !letter(k) && !number(k); };
  auto crlf = [&](size_t k) { return k < n && (s[k] == '\r' || s[k] == '\n'); };
  if (s[i] == '\'') {
    if (size_t c = Contraction(s, n, i, pat != Pattern::kGpt2)) return i + c;
  }
  if (pat == Pattern::kGpt2) {
    size_t j = i + (s[i] == ' ' ? 1 : 0);  // ` ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+`
    if (letter(j)) {
      while (letter(j)) ++j;
      return j;
    }
    if (number(j)) {
      while (number(j)) ++j;
      return j;
    }
    if (other(j)) {
      while (other(j)) ++j;
      return j;
    }
  } else {
    // `[^\r\n\p{L}\p{N}]?\p{L}+`: one leading non-letter (a space, a tab, punctuation) joins the word
    size_t j = (!letter(i) && !number(i) && !crlf(i) && letter(i + 1)) ? i + 1 : i;
    if (letter(j)) {
      while (letter(j)) ++j;
      return j;
    }
    if (number(i)) {  // `\p{N}` (Qwen2) or `\p{N}{1,3}` (Llama 3)
      size_t most = pat == Pattern::kQwen2 ? 1 : 3;
      j = i;
      while (j < i + most && number(j)) ++j;
      return j;
    }
    j = i + (s[i] == ' ' ? 1 : 0);  // ` ?[^\s\p{L}\p{N}]+[\r\n]*`
    if (other(j)) {
      while (other(j)) ++j;
      while (crlf(j)) ++j;
      return j;
    }
    if (space(i)) {  // `\s*[\r\n]+`: the whitespace run up to its last line break
      size_t k = i, last = n;
      for (; space(k); ++k) {
        if (crlf(k)) last = k;
      }
      if (last != n) return last + 1;
    }
  }
  // `\s+(?!\S)`: a whitespace run but its last character when a non-space follows (that one
  // then leads the next word); a single space before a non-space falls to `\s+`.
  size_t k = i;
  while (space(k)) ++k;
  if (k == i) return i + 1;  // unreachable: the alternatives above cover every class
  return (k == n || k - i < 2) ? k : k - 1;
}

// Malformed UTF-8 replaced as Rust's from_utf8_lossy and Python's errors="replace" do: each
// maximal prefix of a valid sequence (or a lone bad byte) becomes one U+FFFD.
std::string LossyUtf8(const std::string& in) {
  const auto* s = reinterpret_cast<const unsigned char*>(in.data());
  size_t n = in.size();
  std::string out;
  out.reserve(n);
  for (size_t i = 0; i < n;) {
    unsigned char b = s[i];
    if (b < 0x80) {
      out.push_back(static_cast<char>(b));
      ++i;
      continue;
    }
    size_t need = 0;
    unsigned char lo = 0x80, hi = 0xBF;  // the second byte's range (narrower after E0, ED, F0, F4)
    if (b >= 0xC2 && b <= 0xDF) need = 1;
    else if (b >= 0xE0 && b <= 0xEF) need = 2, lo = b == 0xE0 ? 0xA0 : 0x80, hi = b == 0xED ? 0x9F : 0xBF;
    else if (b >= 0xF0 && b <= 0xF4) need = 3, lo = b == 0xF0 ? 0x90 : 0x80, hi = b == 0xF4 ? 0x8F : 0xBF;
    size_t k = 1;
    while (k <= need && i + k < n && s[i + k] >= (k == 1 ? lo : 0x80) && s[i + k] <= (k == 1 ? hi : 0xBF)) ++k;
    if (need && k == need + 1) {
      out.append(in, i, k);
    } else {
      out += "\xEF\xBF\xBD";
    }
    i += k;
  }
  return out;
}

// tokenizer.json's `key` (a normalizer, a pre-tokenizer) as its parts: none when absent or
// null, the parts of a Sequence (listed under `list`), else itself.
std::vector<fj::Object> Parts(const fj::Object& tok, const char* key, const char* list) {
  std::vector<fj::Object> parts;
  if (!json::Has(tok, key)) return parts;
  fj::Object part = json::GetObject(tok, key);
  if (json::GetString(part, "type") != "Sequence") return {part};
  for (const Any& a : json::GetArray(part, list)) parts.push_back(json::AsObject(a, key));
  return parts;
}

bool GetBool(const fj::Object& o, const char* key, bool fallback) {
  if (!json::Has(o, key)) return fallback;
  auto b = json::Get(o, key).try_cast<bool>();
  if (!b) throw std::runtime_error(std::string("'") + key + "' is not a boolean");
  return *b;
}

}  // namespace

Tokenizer::Tokenizer(const std::string& path) {
  fj::Object tok;
  try {
    tok = json::AsObject(json::ParseFile(path), path);
  } catch (const std::runtime_error& e) {
    throw IoError(e.what());
  }
  auto refuse = [&](const std::string& what) {
    throw IncompatibleError(path + ": " + what + "; the C API tokenizes byte-level BPE vocabularies (GPT-2 style: " +
                            "SmolLM2, Qwen2, Llama 3) with their pre-tokenizers; tokenize in the app and pass token ids");
  };
  if (!json::Has(tok, "decoder") || json::GetString(json::GetObject(tok, "decoder"), "type") != "ByteLevel") {
    refuse("the decoder is not ByteLevel");
  }
  // -- normalizer: none, or NFC (alone or in a Sequence)
  for (const fj::Object& p : Parts(tok, "normalizer", "normalizers")) {
    std::string type = json::GetString(p, "type");
    if (type != "NFC") refuse("normalizer '" + type + "' is not supported (only NFC)");
    nfc_ = true;
  }
  // -- pre-tokenizer: Split (a known regex, Isolated), ByteLevel, Digits
  bool byte_level = false;
  for (const fj::Object& p : Parts(tok, "pre_tokenizer", "pretokenizers")) {
    std::string type = json::GetString(p, "type");
    if (type == "ByteLevel") {
      if (GetBool(p, "add_prefix_space", false)) refuse("ByteLevel add_prefix_space is not supported");
      byte_level = true;
      if (GetBool(p, "use_regex", true)) steps_.push_back({PreStep::kRegex, Pattern::kGpt2, false});
    } else if (type == "Digits") {
      steps_.push_back({PreStep::kDigits, Pattern::kGpt2, GetBool(p, "individual_digits", false)});
    } else if (type == "Split") {
      fj::Object pat = json::GetObject(p, "pattern");
      if (!json::Has(pat, "Regex")) refuse("a Split on a plain string is not supported");
      std::string re = json::GetString(pat, "Regex");
      Pattern which;
      if (re == kGpt2Regex) which = Pattern::kGpt2;
      else if (re == kQwen2Regex) which = Pattern::kQwen2;
      else if (re == kLlama3Regex) which = Pattern::kLlama3;
      else refuse("the Split regex " + re + " is not one of GPT-2's, Qwen2's or Llama 3's");
      if (json::GetString(p, "behavior") != "Isolated" || GetBool(p, "invert", false)) {
        refuse("a Split that is not Isolated (or is inverted) is not supported");
      }
      steps_.push_back({PreStep::kRegex, which, false});
    } else {
      refuse("pre-tokenizer '" + type + "' is not supported");
    }
  }
  if (!byte_level) refuse("no ByteLevel pre-tokenizer");
  // -- the BPE model
  fj::Object model = json::GetObject(tok, "model");
  if (json::GetString(model, "type") != "BPE") refuse("the model is not BPE");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (json::Has(model, key) && !json::GetString(model, key).empty()) refuse(std::string(key) + " is not supported");
  }
  if (GetBool(model, "byte_fallback", false)) refuse("byte_fallback is not supported");
  ignore_merges_ = GetBool(model, "ignore_merges", false);
  auto put = [&](int64_t id, const std::string& text, bool special) {
    if (id < 0 || id > INT32_MAX) throw std::runtime_error(path + ": token id " + std::to_string(id) + " out of range");
    if (static_cast<size_t>(id) >= bytes_.size()) {
      bytes_.resize(id + 1);
      special_.resize(id + 1, false);
    }
    bytes_[id] = ByteLevelDecode(text);
    special_[id] = special;
  };
  for (const auto& kv : json::GetObject(model, "vocab")) {
    std::string text = json::AsString(kv.first, "vocab key");
    int64_t id = json::AsInt(kv.second, "vocab id");
    vocab_[text] = static_cast<int32_t>(id);
    put(id, text, false);
  }
  for (int b = 0; b < 256; ++b) {
    std::string ch;
    unicode::AppendUtf8(ByteChar(b), &ch);
    auto it = vocab_.find(ch);
    byte_id_[b] = it == vocab_.end() ? -1 : it->second;
  }
  int32_t rank = 0;
  for (const Any& m : json::GetArray(model, "merges")) {
    std::string left, right;
    if (auto pair = m.try_cast<fj::Array>()) {  // newer files: ["a", "b"]
      if ((*pair).size() != 2) throw std::runtime_error(path + ": a merge is not a pair");
      left = json::AsString((*pair)[0], "merge");
      right = json::AsString((*pair)[1], "merge");
    } else {  // older files: "a b"
      std::string s = json::AsString(m, "merge");
      size_t sp = s.find(' ', 1);
      if (sp == std::string::npos) throw std::runtime_error(path + ": merge '" + s + "' has no space");
      left = s.substr(0, sp);
      right = s.substr(sp + 1);
    }
    auto l = vocab_.find(left), r = vocab_.find(right), lr = vocab_.find(left + right);
    if (l == vocab_.end() || r == vocab_.end() || lr == vocab_.end()) {
      throw IncompatibleError(path + ": merge '" + left + " " + right + "' names a token missing from the vocabulary");
    }
    uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(l->second)) << 32) | static_cast<uint32_t>(r->second);
    merges_.emplace(key, std::make_pair(rank++, lr->second));  // the first listing of a pair ranks it
  }
  // -- added tokens
  if (json::Has(tok, "added_tokens")) {
    for (const Any& a : json::GetArray(tok, "added_tokens")) {
      fj::Object at = json::AsObject(a, "added token");
      std::string content = json::GetString(at, "content");
      Added t{content, unicode::DecodeUtf8(content), static_cast<int32_t>(json::GetInt(at, "id")),
              GetBool(at, "special", false), GetBool(at, "normalized", false), GetBool(at, "lstrip", false),
              GetBool(at, "rstrip", false)};
      if (GetBool(at, "single_word", false)) refuse("added token '" + t.content + "' is single_word");
      if (t.content.empty()) continue;
      put(t.id, t.content, t.special);
      added_.push_back(t);
    }
  }
}

int32_t Tokenizer::TokenId(const std::string& token) const {
  for (const Added& a : added_) {
    if (a.content == token) return a.id;
  }
  auto it = vocab_.find(token);
  return it == vocab_.end() ? -1 : it->second;
}

void Tokenizer::Bpe(const std::string& piece, std::vector<int32_t>* out) const {
  if (ignore_merges_) {  // Llama 3: a piece that is a whole vocabulary entry is that token
    std::string mapped;
    for (unsigned char b : piece) unicode::AppendUtf8(ByteChar(b), &mapped);
    auto it = vocab_.find(mapped);
    if (it != vocab_.end()) {
      out->push_back(it->second);
      return;
    }
  }
  std::vector<int32_t> sym;
  sym.reserve(piece.size());
  for (unsigned char b : piece) {
    if (byte_id_[b] >= 0) sym.push_back(byte_id_[b]);  // HF drops a byte missing from the vocabulary
  }
  // Merge the lowest-ranked adjacent pair, leftmost first, until none is listed: the order
  // HF's priority queue of (rank, position) pops them in.
  while (sym.size() > 1) {
    int32_t best_rank = INT32_MAX, merged = -1;
    size_t best = 0;
    for (size_t i = 0; i + 1 < sym.size(); ++i) {
      uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(sym[i])) << 32) | static_cast<uint32_t>(sym[i + 1]);
      auto it = merges_.find(key);
      if (it != merges_.end() && it->second.first < best_rank) {
        best_rank = it->second.first;
        merged = it->second.second;
        best = i;
      }
    }
    if (merged < 0) break;
    sym[best] = merged;
    sym.erase(sym.begin() + best + 1);
  }
  out->insert(out->end(), sym.begin(), sym.end());
}

void Tokenizer::EncodeSegment(const std::u32string& text, std::vector<int32_t>* out) const {
  std::vector<std::u32string> pieces{text}, next;
  for (const PreStep& step : steps_) {
    next.clear();
    for (const std::u32string& p : pieces) {
      const char32_t* s = p.data();
      size_t n = p.size();
      for (size_t i = 0; i < n;) {
        size_t e;
        if (step.kind == PreStep::kRegex) {
          e = MatchAt(step.pattern, s, n, i);
        } else {  // Digits: each number alone (individual) or a run of them, and the runs between
          bool num = unicode::IsNumber(s[i]);
          e = i + 1;
          if (!(num && step.individual_digits)) {
            while (e < n && unicode::IsNumber(s[e]) == num) ++e;
          }
        }
        next.emplace_back(s + i, s + e);
        i = e;
      }
    }
    pieces.swap(next);
  }
  for (const std::u32string& p : pieces) {
    if (!p.empty()) Bpe(unicode::EncodeUtf8(p), out);
  }
}

void Tokenizer::SplitAdded(const std::u32string& text, bool normalized, std::vector<int32_t>* out) const {
  std::vector<const Added*> tokens;
  for (const Added& a : added_) {
    if (a.normalized == normalized) tokens.push_back(&a);
  }
  auto between = [&](std::u32string segment) {
    if (segment.empty()) return;
    if (normalized) return EncodeSegment(segment, out);
    if (nfc_) segment = unicode::Nfc(segment);
    SplitAdded(segment, true, out);
  };
  size_t start = 0, i = 0;
  while (i < text.size()) {
    int best = -1;
    for (size_t t = 0; t < tokens.size(); ++t) {
      const std::u32string& c = tokens[t]->chars;
      if (text.compare(i, c.size(), c) == 0 && (best < 0 || c.size() > tokens[best]->chars.size())) {
        best = static_cast<int>(t);
      }
    }
    if (best < 0) {
      ++i;
      continue;
    }
    size_t seg_end = i, after = i + tokens[best]->chars.size();
    if (tokens[best]->lstrip) {
      while (seg_end > start && unicode::IsWhitespace(text[seg_end - 1])) --seg_end;
    }
    between(text.substr(start, seg_end - start));
    out->push_back(tokens[best]->id);
    if (tokens[best]->rstrip) {
      while (after < text.size() && unicode::IsWhitespace(text[after])) ++after;
    }
    start = i = after;
  }
  between(text.substr(start));
}

std::vector<int32_t> Tokenizer::Encode(const std::string& utf8) const {
  // Added tokens split the text first, as HF does: the unnormalized ones on the raw text
  // (leftmost, then longest; `lstrip` / `rstrip` let one swallow the whitespace beside it),
  // then, in what lies between, the normalized ones on the normalized text.
  std::vector<int32_t> out;
  SplitAdded(unicode::DecodeUtf8(utf8), false, &out);
  return out;
}

std::string Tokenizer::Decode(const int32_t* ids, size_t n, bool skip_special, bool lossy) const {
  std::string bytes;
  for (size_t i = 0; i < n; ++i) {
    if (ids[i] < 0 || static_cast<size_t>(ids[i]) >= bytes_.size()) {
      throw std::invalid_argument("token id " + std::to_string(ids[i]) + " is not in the vocabulary");
    }
    if (skip_special && special_[ids[i]]) continue;
    bytes += bytes_[ids[i]];
  }
  return lossy ? LossyUtf8(bytes) : bytes;
}

std::string StreamDecoder::Push(const int32_t* ids, size_t n) {
  ids_.insert(ids_.end(), ids, ids + n);
  size_t ctx = start_ > kContext ? start_ - kContext : 0;
  std::string prefix = tok_->Decode(ids_.data() + ctx, start_ - ctx, skip_);
  std::string window = tok_->Decode(ids_.data() + ctx, ids_.size() - ctx, skip_);
  static const std::string kReplacement = "\xEF\xBF\xBD";  // U+FFFD: the rest of a character is still to come
  bool cut = window.size() >= 3 && window.compare(window.size() - 3, 3, kReplacement) == 0;
  if (cut || window.compare(0, prefix.size(), prefix) != 0) return "";
  std::string delta = window.substr(prefix.size());
  text_ += delta;
  start_ = ids_.size();
  return delta;
}

}  // namespace spc
