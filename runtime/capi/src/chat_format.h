// The chat format gen_config records in speccompile-config.json ("chat_format"): the C++ twin
// of runtime/chat_format.py, which documents every key. The C API has no Jinja engine, so a
// conversation is rendered by joining fixed pieces around the message texts; gen_config only
// records a format after checking it renders like the model's Jinja template
// (speccompile/compiler/chat_format.py). Same names, same rendering, same error words.
#ifndef SPECCOMPILE_CAPI_CHAT_FORMAT_H_
#define SPECCOMPILE_CAPI_CHAT_FORMAT_H_

#include <tvm/ffi/extra/json.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace spc {

struct ChatMessage {
  std::string role, content;
};

class ChatFormat {
 public:
  // What the template does to a message's text: "raw", "trim" (Jinja's | trim) or "json" (| tojson).
  enum class Content { kRaw, kTrim, kJson };
  struct Piece {
    std::string begin, end;
    Content content = Content::kRaw;
  };

  // From the parsed speccompile-config.json object; throws IncompatibleError (model.h) when it
  // has no usable "chat_format" (the config predates it, or the template could not be expressed:
  // its "chat_format_error" is quoted).
  static ChatFormat FromConfig(const tvm::ffi::json::Object& config);

  // The conversation as the model's chat template renders it; throws std::invalid_argument with
  // ChatFormatError's words (an empty conversation, a role the format lacks, a system message
  // after the first where the template cannot place one).
  std::string Render(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const;

 private:
  std::string prefix_, default_system_, generation_prompt_, closing_;
  std::map<std::string, Piece> roles_;
  std::optional<Piece> later_system_;
  std::optional<std::pair<std::string, std::string>> tool_group_;  // begin, end
};

// Python's str.strip() on UTF-8 text: strips the code points str.isspace() accepts (Jinja's trim).
std::string TrimPythonWhitespace(const std::string& text);
// Python's json.dumps(text, ensure_ascii=False) (runtime/tokenizer.py's tojson filter).
std::string JsonQuote(const std::string& text);

}  // namespace spc

#endif  // SPECCOMPILE_CAPI_CHAT_FORMAT_H_
