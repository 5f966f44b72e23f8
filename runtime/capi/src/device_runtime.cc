// See device_runtime.h. Mirrors runtime/device_runtime.py (ensure_device_runtime,
// cudart_candidates, runtime_candidates) and runtime/model.py (baked_metadata,
// _device_hint); keep the file names, the order and the messages in step with them.
#include "device_runtime.h"

#include <tvm/ffi/function.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <vector>

#if !defined(_WIN32)
#include <dlfcn.h>
#endif

#include "json_util.h"

// Baked in by CMakeLists.txt: the folder of the libtvm_runtime this library was linked
// against (where the wheel keeps libtvm_runtime_cuda.so), and the OpenCL and Vulkan runtimes
// that `make install` builds in this checkout (empty: none; cross builds turn them off).
#ifndef SPC_TVM_LIB_DIR
#define SPC_TVM_LIB_DIR ""
#endif
#ifndef SPC_OPENCL_RUNTIME_PATH
#define SPC_OPENCL_RUNTIME_PATH ""
#endif
#ifndef SPC_VULKAN_RUNTIME_PATH
#define SPC_VULKAN_RUNTIME_PATH ""
#endif

namespace spc {

namespace fj = tvm::ffi::json;

namespace {

constexpr const char* kCudaRuntime = "libtvm_runtime_cuda.so";
constexpr const char* kOpenCLRuntime = "libspeccompile_opencl.so";
constexpr const char* kCudart = "libcudart.so.13";  // what the wheel's libtvm_runtime_cuda.so was linked against
constexpr const char* kOpenCLRuntimeEnv = "SPECCOMPILE_OPENCL_RUNTIME";
constexpr size_t kMaxMetadataBytes = size_t(8) << 20;  // as runtime/model.py: the JSON is far smaller

bool FileExists(const std::string& path) { return !path.empty() && static_cast<bool>(std::ifstream(path)); }

bool Registered(const std::string& name) { return tvm::ffi::Function::GetGlobal(name).has_value(); }

// dlopen with RTLD_NOW | RTLD_GLOBAL, as ctypes.CDLL(mode=RTLD_GLOBAL) on the Python side:
// the runtime's symbols must be visible to what loads after it, and its static
// initializers are what register the loader and device API. Never closed.
bool LoadGlobal(const std::string& name, std::string* err) {
#if defined(_WIN32)
  *err = "device runtimes are loaded with dlopen, which this platform lacks";
  return false;
#else
  if (dlopen(name.c_str(), RTLD_NOW | RTLD_GLOBAL)) return true;
  const char* e = dlerror();
  *err = e ? e : "dlopen failed";
  return false;
#endif
}

// A plain-name dlopen whose failure is the file itself not being found (rather than
// one of its dependencies): glibc's message then starts with the name we asked for.
bool NotFound(const std::string& name, const std::string& err) {
  return err.compare(0, name.size() + 1, name + ":") == 0 && err.find("No such file") != std::string::npos;
}

std::string Getenv(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

// runtime/device_runtime.py cudart_candidates, after the dynamic linker's own search: a
// CUDA toolkit. (The NVIDIA pip wheels on sys.path are a Python-only place.)
std::vector<std::string> CudartCandidates() {
  std::vector<std::string> out;
  for (const std::string& root : {Getenv("CUDA_HOME"), Getenv("CUDA_PATH"), std::string("/usr/local/cuda")}) {
    if (root.empty()) continue;
    for (const char* sub : {"/lib64/", "/targets/x86_64-linux/lib/", "/targets/sbsa-linux/lib/"}) {
      std::string p = root + sub + kCudart;
      if (FileExists(p)) out.push_back(p);
    }
  }
  return out;
}

void EnsureCuda() {
  // The wheel's CUDA runtime sits beside the libtvm_runtime we were linked against; a
  // plain name is tried next, which dlopen resolves through this library's RUNPATH too.
  std::string lib = std::string(SPC_TVM_LIB_DIR) + "/" + kCudaRuntime;
  if (!FileExists(lib)) lib = kCudaRuntime;
  std::string err;
  if (!LoadGlobal("libcuda.so.1", &err)) {
    throw DeviceRuntimeError("a cuda library needs the NVIDIA driver (libcuda.so.1), which is not on this machine: "
                             "run it where an NVIDIA GPU and its driver are");
  }
  bool cudart = LoadGlobal(kCudart, &err);
  for (const std::string& path : CudartCandidates()) {
    if (cudart) break;
    cudart = LoadGlobal(path, &err);
  }
  if (!cudart) {
    throw DeviceRuntimeError(std::string("a cuda library needs the CUDA 13 runtime (") + kCudart +
                             "), which is not on this machine's library path: install the CUDA 13 toolkit or "
                             "`pip install nvidia-cuda-runtime` (cu13), or add its lib folder to LD_LIBRARY_PATH "
                             "(CUDA_HOME is searched too)");
  }
  if (!LoadGlobal(lib, &err)) {
    if (lib == kCudaRuntime && NotFound(lib, err)) {
      throw DeviceRuntimeError(std::string("this TVM installation has no CUDA runtime (") + SPC_TVM_LIB_DIR + "/" +
                               kCudaRuntime + " is missing): install the apache-tvm wheel speccompile depends on "
                               "and rebuild the C API against it");
    }
    throw DeviceRuntimeError("cannot load TVM's CUDA runtime " + lib + ": " + err);
  }
}

// Our own device runtimes (runtime/opencl, runtime/vulkan): the file, the variable that
// overrides where it is, the path baked in for this checkout, and how `make` builds it.
struct OwnRuntime {
  const char* kind;
  const char* file;
  const char* env;
  const char* baked;
  const char* what;
};

const OwnRuntime& Own(const std::string& kind) {
  static const OwnRuntime kOpenCL{"opencl", kOpenCLRuntime, kOpenCLRuntimeEnv, SPC_OPENCL_RUNTIME_PATH, "OpenCL"};
  static const OwnRuntime kVulkan{"vulkan", "libspeccompile_vulkan.so", "SPECCOMPILE_VULKAN_RUNTIME",
                                  SPC_VULKAN_RUNTIME_PATH, "Vulkan"};
  return kind == "opencl" ? kOpenCL : kVulkan;
}

[[noreturn]] void OwnLoadFailed(const std::string& lib, const std::string& err) {
  std::string hint = err.find("libOpenCL") != std::string::npos
                         ? " (the OpenCL ICD loader is missing: apt-get install ocl-icd-libopencl1, plus a driver such "
                           "as pocl-opencl-icd)"
                         : "";
  throw DeviceRuntimeError("cannot load " + lib + ": " + err + hint);
}

void EnsureOwn(const OwnRuntime& r) {
  std::string err;
  std::string needs = std::string("an ") + r.kind + " library needs speccompile's " + r.what + " runtime (" + r.file + ")";
  // An explicit override is taken at its word: silently falling back to another build
  // would hide the mistake (and run code other than the one asked for).
  std::string env = Getenv(r.env);
  if (!env.empty()) {
    if (!FileExists(env)) {
      throw DeviceRuntimeError(needs + ", but " + r.env + " names " + env + ", which does not exist: point it at the " +
                               r.file + " that `make " + r.kind + "` builds (build/" + r.kind + "/), or unset it");
    }
    if (!LoadGlobal(env, &err)) OwnLoadFailed(env, err);
    return;
  }
  std::string baked = r.baked;
  if (FileExists(baked)) {
    if (!LoadGlobal(baked, &err)) OwnLoadFailed(baked, err);
    return;
  }
  if (LoadGlobal(r.file, &err)) return;  // an installed copy on the library path
  if (!NotFound(r.file, err)) OwnLoadFailed(r.file, err);
  std::string looked = (baked.empty() ? std::string() : baked + ", ") + r.file + " on the library path";
  throw DeviceRuntimeError(needs + ", not built here: run `make install` (or `make " + r.kind + "`), or set " + r.env +
                           "; looked in " + looked);
}

}  // namespace

std::optional<fj::Object> BakedMetadata(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  size_t at = data.find("{\"speccompile_version\"");
  if (at == std::string::npos) return std::nullopt;
  // The end of the object: match braces outside strings (json.JSONDecoder.raw_decode's job).
  size_t end = std::min(data.size(), at + kMaxMetadataBytes);
  int depth = 0;
  bool in_string = false, escaped = false;
  for (size_t i = at; i < end; ++i) {
    char c = data[i];
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{') {
      ++depth;
    } else if (c == '}' && --depth == 0) {
      try {
        return json::AsObject(json::Parse(data.substr(at, i + 1 - at), "_metadata"), "_metadata");
      } catch (const std::exception&) {
        return std::nullopt;
      }
    }
  }
  return std::nullopt;
}

std::string DeviceHint(const fj::Object& meta) {
  auto str = [&](const char* key) {
    auto s = json::Has(meta, key) ? json::Get(meta, key).try_cast<tvm::ffi::String>() : std::nullopt;
    return s ? std::string(*s) : std::string();
  };
  std::string kind = str("target").empty() ? "?" : str("target");
  std::string detail;
  if (json::Has(meta, "cuda_archs")) {
    if (auto archs = json::Get(meta, "cuda_archs").try_cast<fj::Array>()) {
      for (const tvm::ffi::Any& a : *archs) {
        auto s = a.try_cast<tvm::ffi::String>();
        if (s) detail += (detail.empty() ? "" : ", ") + std::string(*s);
      }
    }
  }
  if (detail.empty() && !str("mcpu").empty()) detail = "-mcpu " + str("mcpu");
  std::string device = str("device").empty() ? kind : str("device");
  return device + " (" + kind + (detail.empty() ? "" : ", " + detail) + ")";
}

void EnsureDeviceRuntime(const std::string& kind) {
  if (kind == "llvm") return;
  if (Registered("ffi.Module.load_from_bytes." + kind) && Registered("device_api." + kind)) return;
  if (kind == "cuda") {
    EnsureCuda();
  } else if (kind == "opencl" || kind == "vulkan") {
    EnsureOwn(Own(kind));
  } else {
    throw DeviceRuntimeError("speccompile has no " + kind + " device runtime: libraries built for " + kind +
                             " cannot run through it (compile for llvm, cuda, opencl or vulkan)");
  }
  if (!Registered("ffi.Module.load_from_bytes." + kind)) {
    throw DeviceRuntimeError("the " + kind + " runtime loaded but registered no " + kind + " module loader");
  }
}

bool DeviceExists(DLDevice dev) {
  if (dev.device_type == kDLCPU) return true;
  auto attr = tvm::ffi::Function::GetGlobal("runtime.GetDeviceAttr");
  if (!attr) return true;  // cannot ask: let the first allocation report it
  constexpr int kExist = 0;  // tvm::runtime::DeviceAttrKind::kExist
  tvm::ffi::Any r = (*attr)(static_cast<int>(dev.device_type), dev.device_id, kExist);
  auto v = r.try_cast<int64_t>();
  return v && *v != 0;
}

}  // namespace spc
