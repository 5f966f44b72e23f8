// Token ids -> UTF-8 bytes for byte-level BPE vocabularies (GPT-2 style tokenizer.json).
//
// Apps tokenize with their platform's tokenizer; this exists so that C programs can
// print text. It follows HF tokenizers' ByteLevel decoder: each token string is mapped
// character by character back through the GPT-2 bytes-to-unicode table (a token with a
// character outside the table keeps its own UTF-8 bytes), added tokens come from
// `added_tokens`, and special ones are skipped on request.
#ifndef SPECCOMPILE_CAPI_DETOKENIZER_H_
#define SPECCOMPILE_CAPI_DETOKENIZER_H_

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

namespace spc {

class Detokenizer {
 public:
  explicit Detokenizer(const std::string& tokenizer_json_path);
  std::string Decode(const int32_t* ids, size_t n, bool skip_special) const;

 private:
  std::vector<std::string> bytes_;  // id -> decoded bytes ("" for unknown ids)
  std::vector<bool> special_;
};

}  // namespace spc

#endif  // SPECCOMPILE_CAPI_DETOKENIZER_H_
