// Small typed accessors over tvm-ffi's JSON parser (tvm/ffi/extra/json.h).
//
// tvm-ffi already ships a JSON parser in libtvm_ffi, so we reuse it instead of
// writing our own: objects come back as Map<Any, Any>, arrays as Array<Any>,
// numbers as int64 or double. These helpers turn a missing key or a wrong type
// into an exception that names the key, which the C API reports via spc_last_error().
#ifndef SPECCOMPILE_CAPI_JSON_UTIL_H_
#define SPECCOMPILE_CAPI_JSON_UTIL_H_

#include <tvm/ffi/extra/json.h>

#include <cstdint>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace spc {
namespace json {

using tvm::ffi::Any;
namespace fj = tvm::ffi::json;

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(path + " not found or not readable");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline Any Parse(const std::string& text, const std::string& what) {
  tvm::ffi::String err;
  Any v = fj::Parse(tvm::ffi::String(text), &err);
  if (!err.empty()) throw std::runtime_error(what + " is not valid JSON: " + std::string(err));
  return v;
}

inline Any ParseFile(const std::string& path) { return Parse(ReadFile(path), path); }

inline fj::Object AsObject(const Any& v, const std::string& what) {
  auto o = v.try_cast<fj::Object>();
  if (!o) throw std::runtime_error(what + " is not a JSON object");
  return *o;
}

inline fj::Array AsArray(const Any& v, const std::string& what) {
  auto a = v.try_cast<fj::Array>();
  if (!a) throw std::runtime_error(what + " is not a JSON array");
  return *a;
}

inline bool Has(const fj::Object& o, const char* key) {
  auto it = o.find(Any(tvm::ffi::String(key)));
  return it != o.end() && (*it).second != nullptr;
}

inline Any Get(const fj::Object& o, const char* key) {
  auto it = o.find(Any(tvm::ffi::String(key)));
  if (it == o.end()) throw std::runtime_error(std::string("missing JSON key '") + key + "'");
  return (*it).second;
}

inline int64_t AsInt(const Any& v, const std::string& what) {
  if (auto i = v.as<int64_t>()) return *i;
  if (auto d = v.as<double>()) return static_cast<int64_t>(*d);
  throw std::runtime_error(what + " is not an integer");
}

inline std::string AsString(const Any& v, const std::string& what) {
  auto s = v.try_cast<tvm::ffi::String>();
  if (!s) throw std::runtime_error(what + " is not a string");
  return std::string(*s);
}

inline int64_t GetInt(const fj::Object& o, const char* key) { return AsInt(Get(o, key), key); }
inline std::string GetString(const fj::Object& o, const char* key) { return AsString(Get(o, key), key); }
inline fj::Object GetObject(const fj::Object& o, const char* key) { return AsObject(Get(o, key), key); }
inline fj::Array GetArray(const fj::Object& o, const char* key) { return AsArray(Get(o, key), key); }

inline std::vector<int64_t> GetIntList(const fj::Object& o, const char* key) {
  std::vector<int64_t> out;
  for (const Any& v : GetArray(o, key)) out.push_back(AsInt(v, key));
  return out;
}

// An integer or a list of integers (e.g. eos_token_id); absent or null gives {}.
inline std::vector<int64_t> GetIntOrList(const fj::Object& o, const char* key) {
  if (!Has(o, key)) return {};
  Any v = Get(o, key);
  if (v.try_cast<fj::Array>()) return GetIntList(o, key);
  return {AsInt(v, key)};
}

}  // namespace json
}  // namespace spc

#endif  // SPECCOMPILE_CAPI_JSON_UTIL_H_
