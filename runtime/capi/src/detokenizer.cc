// See detokenizer.h.
#include "detokenizer.h"

#include <stdexcept>

#include "json_util.h"
#include "model.h"

namespace spc {

namespace fj = tvm::ffi::json;
using tvm::ffi::Any;

namespace {

// GPT-2 bytes_to_unicode, inverted: code point -> byte. Printable Latin-1 bytes map to
// themselves; the other 68 bytes were shifted to code points 256.. in byte order.
std::unordered_map<uint32_t, uint8_t> UnicodeToBytes() {
  std::unordered_map<uint32_t, uint8_t> inv;
  auto printable = [](int b) { return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF); };
  uint32_t shifted = 0;
  for (int b = 0; b < 256; ++b) inv[printable(b) ? static_cast<uint32_t>(b) : 256 + shifted++] = static_cast<uint8_t>(b);
  return inv;
}

// UTF-8 -> code points; false on malformed input.
bool CodePoints(const std::string& s, std::vector<uint32_t>* out) {
  for (size_t i = 0; i < s.size();) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    int len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    if (len == 0 || i + len > s.size()) return false;
    uint32_t cp = len == 1 ? c : c & (0x7F >> len);
    for (int k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
    out->push_back(cp);
    i += len;
  }
  return true;
}

std::string ByteLevelDecode(const std::string& token, const std::unordered_map<uint32_t, uint8_t>& inv) {
  std::vector<uint32_t> cps;
  if (!CodePoints(token, &cps)) return token;
  std::string out;
  for (uint32_t cp : cps) {
    auto it = inv.find(cp);
    if (it == inv.end()) return token;  // as HF: a token with an unmapped char keeps its bytes
    out.push_back(static_cast<char>(it->second));
  }
  return out;
}

}  // namespace

Detokenizer::Detokenizer(const std::string& path) {
  fj::Object tok;
  try {
    tok = json::AsObject(json::ParseFile(path), path);
  } catch (const std::runtime_error& e) {
    throw IoError(e.what());
  }
  if (!json::Has(tok, "decoder") || json::GetString(json::GetObject(tok, "decoder"), "type") != "ByteLevel") {
    throw IncompatibleError(path + " does not use the ByteLevel decoder; only byte-level BPE vocabularies "
                            "(GPT-2 style, e.g. SmolLM2, Qwen2, Llama 3) can be detokenized by the C API");
  }
  auto inv = UnicodeToBytes();
  auto put = [&](int64_t id, std::string bytes, bool special) {
    if (id < 0) return;
    if (static_cast<size_t>(id) >= bytes_.size()) {
      bytes_.resize(id + 1);
      special_.resize(id + 1, false);
    }
    bytes_[id] = std::move(bytes);
    special_[id] = special;
  };
  fj::Object vocab = json::GetObject(json::GetObject(tok, "model"), "vocab");
  for (const auto& kv : vocab) {
    std::string s = json::AsString(kv.first, "vocab key");
    put(json::AsInt(kv.second, "vocab id"), ByteLevelDecode(s, inv), false);
  }
  if (json::Has(tok, "added_tokens")) {
    for (const Any& a : json::GetArray(tok, "added_tokens")) {
      fj::Object at = json::AsObject(a, "added token");
      bool special = json::Has(at, "special") && json::Get(at, "special").cast<bool>();
      put(json::GetInt(at, "id"), ByteLevelDecode(json::GetString(at, "content"), inv), special);
    }
  }
}

std::string Detokenizer::Decode(const int32_t* ids, size_t n, bool skip_special) const {
  std::string out;
  for (size_t i = 0; i < n; ++i) {
    if (ids[i] < 0 || static_cast<size_t>(ids[i]) >= bytes_.size()) {
      throw std::invalid_argument("token id " + std::to_string(ids[i]) + " is not in the vocabulary");
    }
    if (skip_special && special_[ids[i]]) continue;
    out += bytes_[ids[i]];
  }
  return out;
}

}  // namespace spc
