// runtime/chat_format.py in C++: see chat_format.h.
#include "chat_format.h"

#include <cstdint>
#include <stdexcept>

#include "json_util.h"
#include "model.h"

namespace spc {
namespace {

constexpr int64_t kFormatVersion = 1;  // runtime/chat_format.py FORMAT_VERSION

// The code points Python's str.isspace() accepts (all of them: checked against Python).
bool IsPythonSpace(uint32_t c) {
  return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

// The code point that starts at text[i] and its length in bytes; a malformed sequence reads as
// one byte that is not whitespace (JSON strings are valid UTF-8, so only a caller's bad text).
uint32_t Decode(const std::string& text, size_t i, size_t* len) {
  auto b = static_cast<unsigned char>(text[i]);
  size_t n = b < 0x80 ? 1 : (b >> 5) == 0x6 ? 2 : (b >> 4) == 0xe ? 3 : (b >> 3) == 0x1e ? 4 : 0;
  if (n == 0 || i + n > text.size()) {
    *len = 1;
    return 0xfffd;
  }
  uint32_t c = n == 1 ? b : b & (0x7f >> n);
  for (size_t k = 1; k < n; ++k) {
    auto cont = static_cast<unsigned char>(text[i + k]);
    if ((cont & 0xc0) != 0x80) {
      *len = 1;
      return 0xfffd;
    }
    c = (c << 6) | (cont & 0x3f);
  }
  *len = n;
  return c;
}

std::string RenderContent(ChatFormat::Content mode, const std::string& text) {
  switch (mode) {
    case ChatFormat::Content::kTrim: return TrimPythonWhitespace(text);
    case ChatFormat::Content::kJson: return JsonQuote(text);
    default: return text;
  }
}

ChatFormat::Piece ReadPiece(const tvm::ffi::json::Object& o, const std::string& what) {
  ChatFormat::Piece p{json::GetString(o, "begin"), json::GetString(o, "end")};
  std::string mode = json::Has(o, "content") ? json::GetString(o, "content") : "raw";
  if (mode == "trim") {
    p.content = ChatFormat::Content::kTrim;
  } else if (mode == "json") {
    p.content = ChatFormat::Content::kJson;
  } else if (mode != "raw") {
    throw std::runtime_error(what + " has content mode '" + mode + "', not one of raw, trim, json");
  }
  return p;
}

}  // namespace

std::string TrimPythonWhitespace(const std::string& text) {
  size_t begin = 0, len = 0;
  while (begin < text.size() && IsPythonSpace(Decode(text, begin, &len))) begin += len;
  size_t end = text.size();
  while (end > begin) {
    size_t start = end - 1;  // back to the first byte of the last code point
    while (start > begin && end - start < 4 && (static_cast<unsigned char>(text[start]) & 0xc0) == 0x80) --start;
    if (!IsPythonSpace(Decode(text, start, &len)) || start + len != end) break;
    end = start;
  }
  return text.substr(begin, end - begin);
}

std::string JsonQuote(const std::string& text) {
  static const char* kHex = "0123456789abcdef";
  std::string out = "\"";
  for (char ch : text) {
    switch (ch) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (static_cast<unsigned char>(ch) < 0x20) {
          out += "\\u00";
          out += kHex[(ch >> 4) & 0xf];
          out += kHex[ch & 0xf];
        } else {
          out += ch;  // ensure_ascii=False: everything else, UTF-8 included, as it is
        }
    }
  }
  return out + "\"";
}

ChatFormat ChatFormat::FromConfig(const tvm::ffi::json::Object& config) {
  if (!json::Has(config, "chat_format")) {
    std::string why = json::Has(config, "chat_format_error")
                          ? " (" + json::AsString(json::Get(config, "chat_format_error"), "chat_format_error") + ")"
                          : "";
    throw IncompatibleError("speccompile-config.json has no chat_format: the config predates chat formats or its chat "
                            "template could not be expressed as one" + why +
                            "; rerun `speccompile gen_config`, or pass raw text");
  }
  ChatFormat f;
  try {
    auto fmt = json::GetObject(config, "chat_format");
    if (json::GetInt(fmt, "version") != kFormatVersion) {
      throw std::runtime_error("version " + std::to_string(json::GetInt(fmt, "version")) + " is not " +
                               std::to_string(kFormatVersion));
    }
    f.prefix_ = json::GetString(fmt, "prefix");
    f.default_system_ = json::GetString(fmt, "default_system");
    f.generation_prompt_ = json::GetString(fmt, "generation_prompt");
    f.closing_ = json::Has(fmt, "closing") ? json::GetString(fmt, "closing") : "";
    for (const auto& kv : json::GetObject(fmt, "roles")) {
      std::string role = json::AsString(kv.first, "a role name");
      f.roles_[role] = ReadPiece(json::AsObject(kv.second, "role " + role), "role " + role);
    }
    if (json::Has(fmt, "later_system")) f.later_system_ = ReadPiece(json::GetObject(fmt, "later_system"), "later_system");
    if (json::Has(fmt, "tool_group")) {
      auto g = json::GetObject(fmt, "tool_group");
      f.tool_group_ = std::make_pair(json::GetString(g, "begin"), json::GetString(g, "end"));
    }
  } catch (const std::runtime_error& e) {
    throw IncompatibleError(std::string("speccompile-config.json's chat_format cannot be read: ") + e.what() +
                            "; rerun `speccompile gen_config`, or pass raw text");
  }
  return f;
}

std::string ChatFormat::Render(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const {
  if (messages.empty()) throw std::invalid_argument("the conversation has no messages");
  std::string out = prefix_;
  if (messages[0].role != "system") out += default_system_;
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string& role = messages[i].role;
    const Piece* piece = nullptr;
    if (role == "system" && i > 0) {
      if (!later_system_) {
        throw std::invalid_argument("message " + std::to_string(i) +
                                    " is a system message, which this model's template accepts only as the first message");
      }
      piece = &*later_system_;
    } else if (auto it = roles_.find(role); it != roles_.end()) {
      piece = &it->second;
    } else {
      std::string known;
      for (const auto& kv : roles_) known += (known.empty() ? "" : ", ") + kv.first;
      throw std::invalid_argument("message " + std::to_string(i) + " has role '" + role +
                                  "', which this model's template does not render (it renders " + known + ")");
    }
    bool in_group = tool_group_ && role == "tool";
    if (in_group && (i == 0 || messages[i - 1].role != "tool")) out += tool_group_->first;
    out += piece->begin;
    out += RenderContent(piece->content, messages[i].content);
    out += piece->end;
    if (in_group && (i + 1 == messages.size() || messages[i + 1].role != "tool")) out += tool_group_->second;
  }
  return out + (add_generation_prompt ? generation_prompt_ : closing_);
}

}  // namespace spc
