// The kernel blob `speccompile compile --device vulkan` embeds in a library, read (and kept
// verbatim: SaveToBytes returns it unchanged). The interface with the GLSL emitter:
//   bytes 0..7  "SPCVK001"
//   u64 LE H    the header's length in bytes
//   H bytes     UTF-8 JSON header: {"version": 1, "functions": [{name, args, arg_bytes, indirect,
//               launch_params, workgroup_size, shared_bytes, needs, spirv_offset, spirv_size}]}
//   payload     SPIR-V modules (entry point "main"), each at a 4-byte aligned payload offset
// Every buffer is reached through its 64-bit device address written into the argument block,
// which is the push-constant range, or (indirect) a buffer whose address is pushed instead.
#pragma once

#include <tvm/ffi/container/array.h>
#include <tvm/ffi/container/map.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/json.h>
#include <tvm/ffi/string.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace speccompile {
namespace vulkan {

#define SPC_BLOB_FAIL TVM_FFI_THROW(RuntimeError) << "the Vulkan kernel blob is invalid: "

/*! One argument the host passes before the launch parameters. */
struct ArgSpec {
  enum Kind { kBuffer, kInt32, kUInt32, kFloat32, kInt64, kUInt64 } kind;
  uint32_t offset;  // in the argument block
  uint32_t Bytes() const { return kind == kBuffer || kind == kInt64 || kind == kUInt64 ? 8 : 4; }
};

/*! The optional device features a kernel may need, as the header names them. */
enum Need : uint32_t { kFloat16 = 1, kInt8 = 2, kInt16 = 4, kInt64Need = 8, kStorage16 = 16, kStorage8 = 32 };

struct FunctionInfo {
  std::string name;
  std::vector<ArgSpec> args;
  uint32_t arg_bytes = 0;
  bool indirect = false;
  std::vector<std::pair<bool, int>> launch;  // (is threadIdx, axis) per trailing launch value
  uint32_t workgroup[3] = {1, 1, 1};
  uint64_t shared_bytes = 0;
  uint32_t needs = 0;
  size_t spirv_offset = 0, spirv_size = 0;  // absolute, in the blob
};

struct KernelBlob {
  std::string bytes;   // the blob as given
  std::string header;  // its JSON header
  std::map<std::string, FunctionInfo> functions;

  static KernelBlob Parse(std::string data) {
    namespace ffi = tvm::ffi;
    KernelBlob blob;
    blob.bytes = std::move(data);
    const std::string& d = blob.bytes;
    if (d.size() < 16 || d.compare(0, 8, "SPCVK001") != 0) {
      SPC_BLOB_FAIL << "it does not start with \"SPCVK001\" (" << d.size() << " bytes): the library is damaged or "
             << "was built by another speccompile; rebuild it with `speccompile compile --device vulkan`";
    }
    uint64_t h = 0;
    std::memcpy(&h, d.data() + 8, 8);
    if (h > d.size() - 16) SPC_BLOB_FAIL << "its header length " << h << " runs past its " << d.size() << " bytes";
    blob.header = d.substr(16, h);
    const size_t payload = 16 + h;
    ffi::String err;
    ffi::Any root = ffi::json::Parse(ffi::String(blob.header), &err);
    if (err.size()) SPC_BLOB_FAIL << "its JSON header does not parse: " << std::string(err);
    auto top = Obj(root, "the header");
    if (Int(top, "version", "the header") != 1) {
      SPC_BLOB_FAIL << "it is version " << Int(top, "version", "the header") << "; this runtime reads version 1: "
             << "update libspeccompile_vulkan.so or rebuild the library";
    }
    for (const ffi::Any& f : Arr(Get(top, "functions", "the header"), "functions")) {
      auto fo = Obj(f, "a function");
      FunctionInfo info;
      info.name = Str(Get(fo, "name", "a function"), "name");
      const std::string where = "function " + info.name;
      const char* w = where.c_str();
      info.arg_bytes = static_cast<uint32_t>(Int(fo, "arg_bytes", w, 0, 1 << 20));
      info.indirect = Get(fo, "indirect", w).cast<bool>();
      for (const ffi::Any& a : Arr(Get(fo, "args", w), "args")) {
        auto ao = Obj(a, w);
        std::string kind = Str(Get(ao, "kind", w), "kind");
        ArgSpec spec{ArgSpec::kBuffer, static_cast<uint32_t>(Int(ao, "offset", w, 0, info.arg_bytes))};
        if (kind == "scalar") {
          static const std::map<std::string, ArgSpec::Kind> kinds = {
              {"int32", ArgSpec::kInt32}, {"uint32", ArgSpec::kUInt32}, {"float32", ArgSpec::kFloat32},
              {"int64", ArgSpec::kInt64}, {"uint64", ArgSpec::kUInt64}};
          std::string dtype = Str(Get(ao, "dtype", w), "dtype");
          auto it = kinds.find(dtype);
          if (it == kinds.end()) SPC_BLOB_FAIL << where << " has a scalar of dtype " << dtype << ", which this runtime cannot pass";
          spec.kind = it->second;
        } else if (kind != "buffer") {
          SPC_BLOB_FAIL << where << " has an argument of kind \"" << kind << "\" (known: buffer, scalar)";
        }
        if (spec.offset + spec.Bytes() > info.arg_bytes) {
          SPC_BLOB_FAIL << where << ": an argument at offset " << spec.offset << " ends past arg_bytes " << info.arg_bytes;
        }
        info.args.push_back(spec);
      }
      bool seen[2][3] = {{false, false, false}, {false, false, false}};
      for (const ffi::Any& p : Arr(Get(fo, "launch_params", w), "launch_params")) {
        std::string tag = Str(p, "launch_params");
        const bool block = tag.rfind("blockIdx.", 0) == 0, thread = tag.rfind("threadIdx.", 0) == 0;
        const int axis = tag.size() ? tag.back() - 'x' : -1;
        if (!(block || thread) || tag.size() != (block ? 10u : 11u) || axis < 0 || axis > 2 || seen[thread][axis]) {
          SPC_BLOB_FAIL << where << " has the launch parameter \"" << tag << "\" (known: blockIdx.x/y/z, threadIdx.x/y/z, "
                 << "each once)";
        }
        seen[thread][axis] = true;
        info.launch.emplace_back(thread, axis);
      }
      ffi::Array<ffi::Any> wg = Arr(Get(fo, "workgroup_size", w), "workgroup_size");
      if (wg.size() != 3) SPC_BLOB_FAIL << where << ": workgroup_size has " << wg.size() << " entries, not 3";
      for (int i = 0; i < 3; ++i) info.workgroup[i] = static_cast<uint32_t>(IntOf(wg[i], w, 1, 1 << 16));
      info.shared_bytes = static_cast<uint64_t>(Int(fo, "shared_bytes", w, 0, int64_t(1) << 40));
      static const std::map<std::string, uint32_t> needs = {{"float16", kFloat16},     {"int8", kInt8},
                                                            {"int16", kInt16},         {"int64", kInt64Need},
                                                            {"storage16", kStorage16}, {"storage8", kStorage8}};
      for (const ffi::Any& n : Arr(Get(fo, "needs", w), "needs")) {
        std::string need = Str(n, "needs");
        auto it = needs.find(need);
        if (it == needs.end()) {
          SPC_BLOB_FAIL << where << " needs \"" << need << "\", a feature this runtime does not know: update "
                 << "libspeccompile_vulkan.so to the speccompile that built the library";
        }
        info.needs |= it->second;
      }
      const int64_t off = Int(fo, "spirv_offset", w, 0, int64_t(d.size()));
      const int64_t size = Int(fo, "spirv_size", w, 20, int64_t(d.size()));
      if (off % 4 || size % 4 || static_cast<uint64_t>(off + size) > d.size() - payload) {
        SPC_BLOB_FAIL << where << ": its SPIR-V [" << off << ", " << off + size << ") is unaligned or runs past the "
               << d.size() - payload << "-byte payload";
      }
      info.spirv_offset = payload + off;
      info.spirv_size = size;
      uint32_t magic = 0;
      std::memcpy(&magic, d.data() + info.spirv_offset, 4);
      if (magic != 0x07230203u) SPC_BLOB_FAIL << where << ": its SPIR-V does not start with the SPIR-V magic number";
      if (!blob.functions.emplace(info.name, info).second) SPC_BLOB_FAIL << "it defines " << where << " twice";
    }
    return blob;
  }

 private:
  using Object = tvm::ffi::Map<tvm::ffi::Any, tvm::ffi::Any>;

  static Object Obj(const tvm::ffi::Any& v, const char* what) {
    auto o = v.try_cast<Object>();
    if (!o) SPC_BLOB_FAIL << what << " is not a JSON object";
    return *o;
  }
  static tvm::ffi::Array<tvm::ffi::Any> Arr(const tvm::ffi::Any& v, const char* what) {
    auto a = v.try_cast<tvm::ffi::Array<tvm::ffi::Any>>();
    if (!a) SPC_BLOB_FAIL << "\"" << what << "\" is not a JSON array";
    return *a;
  }
  static std::string Str(const tvm::ffi::Any& v, const char* what) {
    auto s = v.try_cast<tvm::ffi::String>();
    if (!s) SPC_BLOB_FAIL << "\"" << what << "\" is not a string";
    return std::string(*s);
  }
  static tvm::ffi::Any Get(const Object& o, const char* key, const char* where) {
    auto it = o.find(tvm::ffi::String(key));
    if (it == o.end()) SPC_BLOB_FAIL << where << " has no \"" << key << "\"";
    return (*it).second;
  }
  static int64_t IntOf(const tvm::ffi::Any& v, const char* where, int64_t lo, int64_t hi) {
    if (v.type_index() != tvm::ffi::TypeIndex::kTVMFFIInt) SPC_BLOB_FAIL << where << ": a value that must be an integer is not";
    int64_t x = v.cast<int64_t>();
    if (x < lo || x > hi) SPC_BLOB_FAIL << where << ": the value " << x << " is outside [" << lo << ", " << hi << "]";
    return x;
  }
  static int64_t Int(const Object& o, const char* key, const char* where, int64_t lo = INT64_MIN,
                     int64_t hi = INT64_MAX) {
    std::string w = std::string(where) + " \"" + key + "\"";
    return IntOf(Get(o, key, where), w.c_str(), lo, hi);
  }
};

}  // namespace vulkan
}  // namespace speccompile
