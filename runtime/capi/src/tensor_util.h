// Device tensors through the TVM runtime's registered functions.
//
// The wheel ships an incomplete set of TVM C++ headers (tvm/runtime/tensor.h includes
// tvm/support/io.h, which is not shipped), so instead of the C++ Tensor class we call
// the same global functions the Python runtime uses (runtime.TVMTensorAllocWithScope,
// runtime.TVMTensorCopyFromBytes/ToBytes), through tvm-ffi only. They are registered by
// libtvm_runtime when it is loaded, which works identically for CPU and GPU devices.
#ifndef SPECCOMPILE_CAPI_TENSOR_UTIL_H_
#define SPECCOMPILE_CAPI_TENSOR_UTIL_H_

#include <tvm/ffi/container/shape.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/function.h>
#include <tvm/ffi/optional.h>
#include <tvm/ffi/string.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace spc {

using tvm::ffi::Tensor;

inline const tvm::ffi::Function& RuntimeFunction(const char* name) {
  struct Cache {
    tvm::ffi::Function alloc, from, to;
  };
  static const Cache cache = [] {
    auto get = [](const char* n) {
      auto f = tvm::ffi::Function::GetGlobal(n);
      if (!f) {
        throw std::runtime_error(std::string("the TVM runtime lacks ") + n +
                                 "; link libtvm_runtime (not only libtvm_ffi)");
      }
      return *f;
    };
    return Cache{get("runtime.TVMTensorAllocWithScope"), get("runtime.TVMTensorCopyFromBytes"),
                 get("runtime.TVMTensorCopyToBytes")};
  }();
  std::string n(name);
  return n == "alloc" ? cache.alloc : n == "from" ? cache.from : cache.to;
}

inline Tensor EmptyTensor(const std::vector<int64_t>& shape, DLDataType dtype, DLDevice dev) {
  return RuntimeFunction("alloc")(tvm::ffi::Shape(shape), dtype, dev, tvm::ffi::Optional<tvm::ffi::String>())
      .cast<Tensor>();
}

inline void CopyFromBytes(const Tensor& t, const void* data, size_t nbytes) {
  RuntimeFunction("from")(t, const_cast<void*>(data), static_cast<int64_t>(nbytes));
}

inline void CopyToBytes(const Tensor& t, void* data, size_t nbytes) {
  RuntimeFunction("to")(t, data, static_cast<int64_t>(nbytes));
}

}  // namespace spc

#endif  // SPECCOMPILE_CAPI_TENSOR_UTIL_H_
