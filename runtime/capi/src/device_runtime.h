// The TVM device runtime a compiled library needs, loaded before the library is: the C++
// twin of runtime/device_runtime.py (same file names, same search order, same messages).
//
// Why. A cuda or opencl library's kernels are a blob that TVM hands to a loader
// registered by name (`ffi.Module.load_from_bytes.<kind>`), and its buffers come from a
// device API (`device_api.<kind>`). Neither is in libtvm_runtime, the only TVM library
// the C API links: cuda's live in the wheel's libtvm_runtime_cuda.so, opencl's in our
// own libspeccompile_opencl.so (runtime/opencl). Loading the model library without them
// fails deep inside TVM, so the C API reads the library's kind from the `_metadata` JSON
// baked into its bytes, dlopens the matching runtime first, and names what is missing
// when it cannot.
#ifndef SPECCOMPILE_CAPI_DEVICE_RUNTIME_H_
#define SPECCOMPILE_CAPI_DEVICE_RUNTIME_H_

#include <dlpack/dlpack.h>
#include <tvm/ffi/extra/json.h>

#include <optional>
#include <stdexcept>
#include <string>

namespace spc {

// A device runtime piece that is missing or does not load; the message says how to get it.
// Model reports it as an IoError prefixed with what the library was built for.
struct DeviceRuntimeError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// runtime/model.py baked_metadata: the `_metadata` JSON found verbatim in the file's
// bytes (`{"speccompile_version"...`), without loading the library; nullopt when the
// file holds none (not built by speccompile, or unreadable). Parsing errors also give
// nullopt: the authoritative copy is read from the loaded library afterwards.
std::optional<tvm::ffi::json::Object> BakedMetadata(const std::string& path);

// runtime/model.py _device_hint: "opencl (opencl)", "cuda (cuda, sm_89)",
// "cpu (llvm, -mcpu znver3)" -- what a library was built for, for error messages.
std::string DeviceHint(const tvm::ffi::json::Object& meta);

// Make this process able to load and run a library built for `kind` ("llvm", "cuda",
// "opencl", ...): nothing for llvm or when the kind's loader and device API are already
// registered (a TVM runtime built with them, as on Android/iOS); otherwise dlopen the
// runtime with RTLD_NOW | RTLD_GLOBAL (kept loaded for the life of the process).
// Throws DeviceRuntimeError naming the missing file and how to get it.
void EnsureDeviceRuntime(const std::string& kind);

// tvm.runtime.Device.exist: whether the (loaded) device API sees this device.
bool DeviceExists(DLDevice dev);

}  // namespace spc

#endif  // SPECCOMPILE_CAPI_DEVICE_RUNTIME_H_
