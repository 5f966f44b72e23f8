// Text <-> token ids for byte-level BPE vocabularies (tokenizer.json), as HF `tokenizers`
// computes them: SmolLM2, Qwen2 / Qwen2.5 / Qwen3 and Llama 3 use this family.
//
// Encode(text) equals Python's `Tokenizer.encode(text, add_special_tokens=False).ids`, which
// is what the Python engine feeds the model (runtime/generation.py encode_prompt); the twin
// test tests/runtime/test_capi_tokenizer.py holds the two equal on thousands of strings.
// The pipeline is HF's, step for step:
//   1. added tokens (special or not, matched on the raw text: leftmost, then longest);
//   2. the normalizer on the text between them (none, or NFC);
//   3. the pre-tokenizer splits (the byte-level regex of GPT-2, Qwen2 or Llama 3, Digits);
//   4. each piece's UTF-8 bytes through GPT-2's byte-to-character table, then BPE merges by rank.
// A tokenizer.json using anything else (WordPiece, SentencePiece-style Metaspace, an unknown
// regex) is refused at load with IncompatibleError naming the part, never tokenized wrongly.
#ifndef SPECCOMPILE_CAPI_TOKENIZER_H_
#define SPECCOMPILE_CAPI_TOKENIZER_H_

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

namespace spc {

class Tokenizer {
 public:
  explicit Tokenizer(const std::string& tokenizer_json_path);

  // Throws std::invalid_argument for text that is not valid UTF-8.
  std::vector<int32_t> Encode(const std::string& text) const;
  // The token ids' bytes, as HF's ByteLevel decoder joins them (special added tokens skipped on
  // request). `lossy`: malformed UTF-8 (a character cut between tokens) becomes U+FFFD, as
  // Python's decode gives it; otherwise the raw bytes are kept, for streaming.
  std::string Decode(const int32_t* ids, size_t n, bool skip_special, bool lossy = true) const;
  int32_t vocab_size() const { return static_cast<int32_t>(bytes_.size()); }
  // The id of a token's exact text (an added token such as "<|im_end|>"), or -1.
  int32_t TokenId(const std::string& token) const;

  // One regex the pre-tokenizer splits with (HF's Split with behavior Isolated, or the
  // ByteLevel pre-tokenizer's own): the three patterns byte-level vocabularies use.
  enum class Pattern { kGpt2, kQwen2, kLlama3 };
  struct PreStep {
    enum Kind { kRegex, kDigits } kind;
    Pattern pattern;        // kRegex
    bool individual_digits;  // kDigits
  };
  struct Added {
    std::string content;
    std::u32string chars;  // content as code points, what the text is matched against
    int32_t id;
    bool special, normalized, lstrip, rstrip;
  };

 private:
  void Bpe(const std::string& piece_bytes, std::vector<int32_t>* out) const;
  void EncodeSegment(const std::u32string& text, std::vector<int32_t>* out) const;
  // Added tokens with this `normalized` flag split `text`; what lies between goes on down the pipeline.
  void SplitAdded(const std::u32string& text, bool normalized, std::vector<int32_t>* out) const;

  std::unordered_map<std::string, int32_t> vocab_;  // byte-mapped token text -> id
  // (left id << 32 | right id) -> (rank, merged id)
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges_;
  int32_t byte_id_[256];  // the one-character token of each byte
  bool ignore_merges_ = false;
  bool nfc_ = false;
  std::vector<PreStep> steps_;
  std::vector<Added> added_;
  std::vector<std::string> bytes_;  // id -> the bytes it decodes to
  std::vector<bool> special_;
};

// runtime/tokenizer.py StreamDecoder: a growing token list into text deltas that never split a
// UTF-8 character. Only a short window is decoded per push (the tokens since the last emitted
// text plus kContext before them, for context-dependent spacing), so each push costs the same.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer* tokenizer, bool skip_special = true)
      : tok_(tokenizer), skip_(skip_special) {}
  std::string Push(const int32_t* ids, size_t n);
  const std::string& text() const { return text_; }

 private:
  static constexpr size_t kContext = 4;
  const Tokenizer* tok_;
  bool skip_;
  std::vector<int32_t> ids_;
  std::string text_;
  size_t start_ = 0;  // ids_[start_:] have not all been turned into text yet
};

}  // namespace spc

#endif  // SPECCOMPILE_CAPI_TOKENIZER_H_
