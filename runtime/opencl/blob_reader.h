// The kernel blob `speccompile compile --device opencl` embeds in a library, read and written.
//
// TVM's codegen saves a device module as (all integers little endian, lengths as uint64):
//   string format ("cl": OpenCL C source)
//   uint64 n, then n times: string key, FunctionInfo
//       FunctionInfo = string name; uint64 k, k x DLDataType (code u8, bits u8, lanes u16);
//                      uint64 t, t x string launch tag; uint64 e, e x int32 extra tag
//   string source
// The layout is pinned by tests/runtime/test_opencl.py against what the installed TVM writes.
#pragma once

#include <dlpack/dlpack.h>
#include <tvm/ffi/error.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <vector>

namespace speccompile {
namespace opencl {

/*! One launch-size argument: which grid (block) or work-group (thread) dimension it sets. */
struct LaunchTag {
  enum Kind { kBlock, kThread, kDynSharedMemory } kind;
  int dim;
  std::string text;

  static LaunchTag Parse(const std::string& text) {
    if (text == "tir.use_dyn_shared_memory") return {kDynSharedMemory, 0, text};
    const bool block = text.rfind("blockIdx.", 0) == 0, thread = text.rfind("threadIdx.", 0) == 0;
    const char axis = text.empty() ? '\0' : text.back();
    if (!(block || thread) || axis < 'x' || axis > 'z') {
      TVM_FFI_THROW(RuntimeError) << "unknown kernel launch tag \"" << text << "\" in an OpenCL library";
    }
    return {block ? kBlock : kThread, axis - 'x', text};
  }
};

struct KernelInfo {
  std::string name;
  std::vector<DLDataType> arg_types;
  std::vector<LaunchTag> launch_tags;
  std::vector<int32_t> extra_tags;
};

struct KernelBlob {
  std::string format;
  std::map<std::string, KernelInfo> functions;
  std::string source;

  static KernelBlob Parse(const std::string& data) {
    Reader r{data};
    KernelBlob blob;
    blob.format = r.String();
    uint64_t n = r.U64();
    for (uint64_t i = 0; i < n; ++i) {
      std::string key = r.String();
      KernelInfo info;
      info.name = r.String();
      uint64_t k = r.Count(4);
      for (uint64_t j = 0; j < k; ++j) {
        DLDataType t;
        t.code = r.Pod<uint8_t>();
        t.bits = r.Pod<uint8_t>();
        t.lanes = r.Pod<uint16_t>();
        info.arg_types.push_back(t);
      }
      uint64_t tags = r.Count(8);
      for (uint64_t j = 0; j < tags; ++j) info.launch_tags.push_back(LaunchTag::Parse(r.String()));
      uint64_t extra = r.Count(4);
      for (uint64_t j = 0; j < extra; ++j) info.extra_tags.push_back(r.Pod<int32_t>());
      blob.functions.emplace(std::move(key), std::move(info));
    }
    blob.source = r.String();
    if (r.at != data.size()) {
      TVM_FFI_THROW(RuntimeError) << "the OpenCL kernel blob has " << data.size() - r.at
                                  << " unread bytes: it was written by a TVM whose format this runtime "
                                     "does not know; rebuild the library with `speccompile compile`";
    }
    return blob;
  }

  std::string Serialize() const {
    std::string out;
    auto u64 = [&out](uint64_t v) { out.append(reinterpret_cast<const char*>(&v), 8); };
    auto str = [&](const std::string& s) { u64(s.size()); out += s; };
    str(format);
    u64(functions.size());
    for (const auto& kv : functions) {
      str(kv.first);
      str(kv.second.name);
      u64(kv.second.arg_types.size());
      for (const DLDataType& t : kv.second.arg_types) out.append(reinterpret_cast<const char*>(&t), 4);
      u64(kv.second.launch_tags.size());
      for (const LaunchTag& t : kv.second.launch_tags) str(t.text);
      u64(kv.second.extra_tags.size());
      for (int32_t e : kv.second.extra_tags) out.append(reinterpret_cast<const char*>(&e), 4);
    }
    str(source);
    return out;
  }

 private:
  struct Reader {
    const std::string& data;
    size_t at = 0;

    void Need(uint64_t n) {
      if (n > data.size() - at) {
        TVM_FFI_THROW(RuntimeError) << "the OpenCL kernel blob ends early (byte " << at << " of " << data.size()
                                    << "): the library is damaged or from another TVM; rebuild it";
      }
    }
    template <typename T>
    T Pod() {
      Need(sizeof(T));
      T v;
      std::memcpy(&v, data.data() + at, sizeof(T));
      at += sizeof(T);
      return v;
    }
    uint64_t U64() { return Pod<uint64_t>(); }
    uint64_t Count(uint64_t min_item_bytes) {  // a count whose items must fit in what is left
      uint64_t n = U64();
      Need(n * min_item_bytes);
      return n;
    }
    std::string String() {
      uint64_t n = U64();
      Need(n);
      std::string s = data.substr(at, n);
      at += n;
      return s;
    }
  };
};

}  // namespace opencl
}  // namespace speccompile
