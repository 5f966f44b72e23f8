// speccompile's OpenCL device runtime for TVM: libspeccompile_opencl.so.
//
// Why it exists: the apache-tvm wheel ships no OpenCL device runtime, so a library that
// `speccompile compile --device opencl` builds could not run anywhere (Android phones,
// Adreno/Mali boards, Intel/AMD GPUs, or a CPU OpenCL device such as PoCL in CI). Loading
// this library into a process that already has libtvm_runtime registers the two things
// TVM looks up by name:
//   device_api.opencl                   the DeviceAPI (buffers, copies, sync, attributes)
//   ffi.Module.load_from_bytes.opencl   the loader of the kernel blob `compile` embeds
// Written against the wheel's tvm-ffi headers and tvm/runtime/device_api.h only.
//
// Conventions it follows (TVM's, since the host code TVM generates relies on them):
// - a tensor's `data` on an OpenCL device is the cl_mem itself; no pointer arithmetic
//   (SupportsDevicePointerArithmeticsOnHost is false), offsets travel as byte_offset or
//   as the kernels' own elem_offset arguments;
// - a kernel is called with its arguments (buffers as handles, scalars), then one integer
//   per launch tag ("blockIdx.x", "threadIdx.y", ...): global size = grid * block.
// Device numbering: every device of every platform, GPUs first, then accelerators, then
// CPUs (so opencl:0 is the GPU where there is one); each device has its own context and
// one in-order queue, which makes every kernel and copy on it ordered.
#ifndef CL_TARGET_OPENCL_VERSION
#define CL_TARGET_OPENCL_VERSION 120
#endif
#include <CL/cl.h>
#include <dlpack/dlpack.h>
#include <tvm/ffi/any.h>
#include <tvm/ffi/container/map.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/module.h>
#include <tvm/ffi/function.h>
#include <tvm/ffi/reflection/registry.h>
#include <tvm/ffi/string.h>
#include <tvm/runtime/device_api.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

#include "blob_reader.h"

namespace speccompile {
namespace opencl {

using tvm::runtime::DeviceAPI;
using tvm::runtime::DeviceAttrKind;
namespace ffi = tvm::ffi;

#define SPC_CL_CHECK(call)                                                                  \
  do {                                                                                      \
    cl_int _err = (call);                                                                   \
    if (_err != CL_SUCCESS)                                                                 \
      TVM_FFI_THROW(RuntimeError) << "OpenCL error " << _err << " (" << ErrorName(_err)     \
                                  << ") in " #call;                                         \
  } while (0)

inline const char* ErrorName(cl_int err) {
  switch (err) {
    case CL_DEVICE_NOT_FOUND: return "CL_DEVICE_NOT_FOUND";
    case CL_MEM_OBJECT_ALLOCATION_FAILURE: return "CL_MEM_OBJECT_ALLOCATION_FAILURE";
    case CL_OUT_OF_RESOURCES: return "CL_OUT_OF_RESOURCES";
    case CL_OUT_OF_HOST_MEMORY: return "CL_OUT_OF_HOST_MEMORY";
    case CL_BUILD_PROGRAM_FAILURE: return "CL_BUILD_PROGRAM_FAILURE";
    case CL_INVALID_VALUE: return "CL_INVALID_VALUE";
    case CL_INVALID_MEM_OBJECT: return "CL_INVALID_MEM_OBJECT";
    case CL_INVALID_KERNEL_ARGS: return "CL_INVALID_KERNEL_ARGS";
    case CL_INVALID_ARG_SIZE: return "CL_INVALID_ARG_SIZE";
    case CL_INVALID_ARG_VALUE: return "CL_INVALID_ARG_VALUE";
    case CL_INVALID_WORK_GROUP_SIZE: return "CL_INVALID_WORK_GROUP_SIZE";
    case CL_INVALID_WORK_ITEM_SIZE: return "CL_INVALID_WORK_ITEM_SIZE";
    case CL_INVALID_GLOBAL_WORK_SIZE: return "CL_INVALID_GLOBAL_WORK_SIZE";
    case CL_INVALID_BUFFER_SIZE: return "CL_INVALID_BUFFER_SIZE";
    case CL_INVALID_KERNEL_NAME: return "CL_INVALID_KERNEL_NAME";
    default: return "see CL/cl.h";
  }
}

/*! One OpenCL device with its own context and in-order queue. */
struct Device {
  cl_platform_id platform = nullptr;
  cl_device_id id = nullptr;
  cl_context context = nullptr;
  cl_command_queue queue = nullptr;
  cl_device_type type = 0;
  std::once_flag open_once;
};

std::string DeviceInfoString(cl_device_id dev, cl_device_info what) {
  size_t size = 0;
  if (clGetDeviceInfo(dev, what, 0, nullptr, &size) != CL_SUCCESS || size == 0) return "";
  std::string out(size, '\0');
  clGetDeviceInfo(dev, what, size, &out[0], nullptr);
  while (!out.empty() && out.back() == '\0') out.pop_back();
  return out;
}

template <typename T>
T DeviceInfo(cl_device_id dev, cl_device_info what) {
  T value{};
  clGetDeviceInfo(dev, what, sizeof(T), &value, nullptr);
  return value;
}

/*! The process's OpenCL devices, found once; contexts and queues are made on first use. */
class Workspace {
 public:
  static Workspace* Global() {
    static Workspace* inst = new Workspace();  // never destroyed: kernels may run at exit
    return inst;
  }

  size_t NumDevices() const { return devices_.size(); }
  cl_device_id Id(size_t i) const { return devices_.at(i)->id; }

  /*! The device, its context and queue created on first use; a clear error if absent. */
  Device& Get(int device_id) {
    if (device_id < 0 || static_cast<size_t>(device_id) >= devices_.size()) {
      TVM_FFI_THROW(RuntimeError) << "opencl:" << device_id << " does not exist: this machine has "
                                  << devices_.size() << " OpenCL device(s)"
                                  << (devices_.empty() ? " (install an OpenCL driver; PoCL gives a CPU device: "
                                                         "apt-get install pocl-opencl-icd)"
                                                       : "");
    }
    Device& d = *devices_[device_id];
    std::call_once(d.open_once, [&d]() {
      cl_int err = CL_SUCCESS;
      cl_context_properties props[] = {CL_CONTEXT_PLATFORM,
                                       reinterpret_cast<cl_context_properties>(d.platform), 0};
      d.context = clCreateContext(props, 1, &d.id, nullptr, nullptr, &err);
      SPC_CL_CHECK(err);
      d.queue = clCreateCommandQueue(d.context, d.id, 0, &err);
      SPC_CL_CHECK(err);
    });
    return d;
  }

 private:
  Workspace() {
    cl_uint num_platforms = 0;
    if (clGetPlatformIDs(0, nullptr, &num_platforms) != CL_SUCCESS || num_platforms == 0) return;
    std::vector<cl_platform_id> platforms(num_platforms);
    if (clGetPlatformIDs(num_platforms, platforms.data(), nullptr) != CL_SUCCESS) return;
    // GPUs first, then accelerators, then CPUs: opencl:0 is the GPU where there is one
    for (cl_device_type want : {CL_DEVICE_TYPE_GPU, CL_DEVICE_TYPE_ACCELERATOR, CL_DEVICE_TYPE_CPU}) {
      for (cl_platform_id p : platforms) {
        cl_uint n = 0;
        if (clGetDeviceIDs(p, want, 0, nullptr, &n) != CL_SUCCESS || n == 0) continue;
        std::vector<cl_device_id> ids(n);
        if (clGetDeviceIDs(p, want, n, ids.data(), nullptr) != CL_SUCCESS) continue;
        for (cl_device_id id : ids) {
          auto d = std::make_unique<Device>();
          d->platform = p;
          d->id = id;
          d->type = want;
          devices_.push_back(std::move(d));
        }
      }
    }
  }

  std::vector<std::unique_ptr<Device>> devices_;
};

thread_local int current_device = 0;

/*! SPECCOMPILE_OPENCL_PROFILE=1: every launch waits for its kernel and its time is summed
 * per kernel, printed to stderr at exit (slowest first) -- where a step's time goes. */
struct Profile {
  bool enabled = std::getenv("SPECCOMPILE_OPENCL_PROFILE") != nullptr;
  std::mutex mutex;
  std::map<std::string, std::pair<double, int64_t>> seconds_calls;

  static Profile* Global() {
    static Profile* inst = new Profile();
    return inst;
  }
  void Add(const std::string& name, double seconds) {
    std::lock_guard<std::mutex> lock(mutex);
    auto& e = seconds_calls[name];
    e.first += seconds;
    e.second += 1;
  }
  ~Profile() = default;
};

struct ProfileReport {
  ~ProfileReport() {
    Profile* prof = Profile::Global();
    if (!prof->enabled) return;
    std::vector<std::pair<double, std::string>> rows;
    double total = 0;
    for (auto& kv : prof->seconds_calls) {
      rows.push_back({kv.second.first, kv.first});
      total += kv.second.first;
    }
    std::sort(rows.rbegin(), rows.rend());
    std::fprintf(stderr, "OpenCL kernel time, %.3f s in all:\n", total);
    for (auto& r : rows) {
      auto& e = prof->seconds_calls[r.second];
      std::fprintf(stderr, "%10.3f ms %8lld calls %8.3f ms/call  %s\n", r.first * 1e3, (long long)e.second,
                   r.first * 1e3 / e.second, r.second.c_str());
    }
  }
} profile_report;

class OpenCLDeviceAPI final : public DeviceAPI {
 public:
  static OpenCLDeviceAPI* Global() {
    static OpenCLDeviceAPI* inst = new OpenCLDeviceAPI();
    return inst;
  }

  void SetDevice(DLDevice dev) final { current_device = dev.device_id; }

  void GetAttr(DLDevice dev, DeviceAttrKind kind, ffi::Any* rv) final {
    Workspace* ws = Workspace::Global();
    if (kind == tvm::runtime::kExist) {
      *rv = static_cast<int>(dev.device_id >= 0 && static_cast<size_t>(dev.device_id) < ws->NumDevices());
      return;
    }
    cl_device_id id = ws->Get(dev.device_id).id;
    switch (kind) {
      case tvm::runtime::kMaxThreadsPerBlock:
        *rv = static_cast<int64_t>(DeviceInfo<size_t>(id, CL_DEVICE_MAX_WORK_GROUP_SIZE));
        break;
      case tvm::runtime::kWarpSize:  // OpenCL 1.2 has no subgroups to rely on
        *rv = 1;
        break;
      case tvm::runtime::kMaxSharedMemoryPerBlock:
        *rv = static_cast<int64_t>(DeviceInfo<cl_ulong>(id, CL_DEVICE_LOCAL_MEM_SIZE));
        break;
      case tvm::runtime::kComputeVersion:
      case tvm::runtime::kApiVersion:
        *rv = ffi::String(DeviceInfoString(id, CL_DEVICE_VERSION));
        break;
      case tvm::runtime::kDeviceName:
        *rv = ffi::String(DeviceInfoString(id, CL_DEVICE_NAME));
        break;
      case tvm::runtime::kMaxClockRate:
        *rv = static_cast<int64_t>(DeviceInfo<cl_uint>(id, CL_DEVICE_MAX_CLOCK_FREQUENCY)) * 1000;
        break;
      case tvm::runtime::kMultiProcessorCount:
        *rv = static_cast<int64_t>(DeviceInfo<cl_uint>(id, CL_DEVICE_MAX_COMPUTE_UNITS));
        break;
      case tvm::runtime::kMaxThreadDimensions: {
        std::array<size_t, 3> dims{};
        clGetDeviceInfo(id, CL_DEVICE_MAX_WORK_ITEM_SIZES, sizeof(dims), dims.data(), nullptr);
        std::ostringstream os;
        os << "[" << dims[0] << ", " << dims[1] << ", " << dims[2] << "]";
        *rv = ffi::String(os.str());
        break;
      }
      case tvm::runtime::kDriverVersion:
        *rv = ffi::String(DeviceInfoString(id, CL_DRIVER_VERSION));
        break;
      case tvm::runtime::kTotalGlobalMemory:
        *rv = static_cast<int64_t>(DeviceInfo<cl_ulong>(id, CL_DEVICE_GLOBAL_MEM_SIZE));
        break;
      default:  // not known for OpenCL: left unset, as TVM's own runtimes do
        break;
    }
  }

  void* AllocDataSpace(DLDevice dev, size_t nbytes, size_t alignment, DLDataType type_hint) final {
    Device& d = Workspace::Global()->Get(dev.device_id);
    cl_int err = CL_SUCCESS;
    // a zero-byte buffer is invalid in OpenCL; kernels never touch it, so 4 bytes stand in
    cl_mem mem = clCreateBuffer(d.context, CL_MEM_READ_WRITE, nbytes == 0 ? 4 : nbytes, nullptr, &err);
    if (err != CL_SUCCESS) {
      TVM_FFI_THROW(RuntimeError) << "opencl:" << dev.device_id << ": cannot allocate " << nbytes
                                  << " bytes (OpenCL error " << err << ", " << ErrorName(err) << ")";
    }
    return mem;
  }

  void FreeDataSpace(DLDevice dev, void* ptr) final {
    if (ptr != nullptr) clReleaseMemObject(static_cast<cl_mem>(ptr));
  }

  void StreamSync(DLDevice dev, TVMStreamHandle stream) final {
    SPC_CL_CHECK(clFinish(Workspace::Global()->Get(dev.device_id).queue));
  }

 protected:
  void CopyDataFromTo(const void* from, size_t from_offset, void* to, size_t to_offset, size_t size,
                      DLDevice dev_from, DLDevice dev_to, DLDataType type_hint,
                      TVMStreamHandle stream) final {
    if (size == 0) return;
    bool from_cl = dev_from.device_type == kDLOpenCL, to_cl = dev_to.device_type == kDLOpenCL;
    Workspace* ws = Workspace::Global();
    if (from_cl && to_cl && dev_from.device_id == dev_to.device_id) {
      Device& d = ws->Get(dev_from.device_id);
      SPC_CL_CHECK(clEnqueueCopyBuffer(d.queue, static_cast<cl_mem>(const_cast<void*>(from)),
                                       static_cast<cl_mem>(to), from_offset, to_offset, size, 0, nullptr,
                                       nullptr));
    } else if (from_cl && to_cl) {  // two devices, two contexts: through the host
      std::vector<char> host(size);
      SPC_CL_CHECK(clEnqueueReadBuffer(ws->Get(dev_from.device_id).queue,
                                       static_cast<cl_mem>(const_cast<void*>(from)), CL_TRUE, from_offset,
                                       size, host.data(), 0, nullptr, nullptr));
      SPC_CL_CHECK(clEnqueueWriteBuffer(ws->Get(dev_to.device_id).queue, static_cast<cl_mem>(to), CL_TRUE,
                                        to_offset, size, host.data(), 0, nullptr, nullptr));
    } else if (from_cl) {  // blocking: the caller reads the host memory right after
      SPC_CL_CHECK(clEnqueueReadBuffer(ws->Get(dev_from.device_id).queue,
                                       static_cast<cl_mem>(const_cast<void*>(from)), CL_TRUE, from_offset,
                                       size, static_cast<char*>(to) + to_offset, 0, nullptr, nullptr));
    } else if (to_cl) {  // blocking: the host memory may be freed as soon as we return
      SPC_CL_CHECK(clEnqueueWriteBuffer(ws->Get(dev_to.device_id).queue, static_cast<cl_mem>(to), CL_TRUE,
                                        to_offset, size, static_cast<const char*>(from) + from_offset, 0,
                                        nullptr, nullptr));
    } else {
      TVM_FFI_THROW(RuntimeError) << "the OpenCL device API was asked to copy between two non-OpenCL devices";
    }
  }
};

/*! The kernels of one library on every device they were built for. */
class OpenCLModule final : public ffi::ModuleObj {
 public:
  explicit OpenCLModule(KernelBlob blob) : blob_(std::move(blob)) {}

  ~OpenCLModule() {
    for (auto& kv : programs_) {
      for (auto& k : kv.second.kernels) clReleaseKernel(k.second);
      clReleaseProgram(kv.second.program);
    }
  }

  const char* kind() const final { return "opencl"; }
  int GetPropertyMask() const final { return ffi::Module::kBinarySerializable | ffi::Module::kRunnable; }
  ffi::Bytes SaveToBytes() const final { return ffi::Bytes(blob_.Serialize()); }
  ffi::String InspectSource(const ffi::String& format) const final { return ffi::String(blob_.source); }

  ffi::Optional<ffi::Function> GetFunction(const ffi::String& name) final {
    auto it = blob_.functions.find(std::string(name));
    if (it == blob_.functions.end()) return std::nullopt;
    const KernelInfo* info = &it->second;
    ffi::ObjectPtr<OpenCLModule> self = ffi::details::ObjectUnsafe::ObjectPtrFromUnowned<OpenCLModule>(static_cast<ffi::Object*>(this));
    return ffi::Function::FromPacked([self, info](ffi::PackedArgs args, ffi::Any* rv) {
      self->Launch(*info, args);
    });
  }

 private:
  struct Program {
    cl_program program = nullptr;
    std::unordered_map<std::string, cl_kernel> kernels;
  };

  /*! The program built for a device (once), with the named kernel created (once). */
  cl_kernel Kernel(int device_id, const std::string& name) {
    Device& d = Workspace::Global()->Get(device_id);
    Program& p = programs_[device_id];
    if (p.program == nullptr) {
      const char* src = blob_.source.c_str();
      size_t len = blob_.source.size();
      cl_int err = CL_SUCCESS;
      cl_program prog = clCreateProgramWithSource(d.context, 1, &src, &len, &err);
      SPC_CL_CHECK(err);
      err = clBuildProgram(prog, 1, &d.id, "", nullptr, nullptr);
      if (err != CL_SUCCESS) {
        std::string log;
        size_t size = 0;
        clGetProgramBuildInfo(prog, d.id, CL_PROGRAM_BUILD_LOG, 0, nullptr, &size);
        log.resize(size);
        if (size) clGetProgramBuildInfo(prog, d.id, CL_PROGRAM_BUILD_LOG, size, &log[0], nullptr);
        clReleaseProgram(prog);
        if (blob_.source.find("cl_khr_fp16") != std::string::npos &&
            DeviceInfoString(d.id, CL_DEVICE_EXTENSIONS).find("cl_khr_fp16") == std::string::npos) {
          TVM_FFI_THROW(RuntimeError) << "this library computes in fp16, which the OpenCL device "
                                      << DeviceInfoString(d.id, CL_DEVICE_NAME) << " does not support (no "
                                      << "cl_khr_fp16): compile the model with an f32 quantization (q4f32_1, "
                                      << "q0f32) for this device";
        }
        TVM_FFI_THROW(RuntimeError) << "the OpenCL compiler of " << DeviceInfoString(d.id, CL_DEVICE_NAME)
                                    << " rejected this library's kernels (error " << err << "):\n"
                                    << log.substr(0, 8000);
      }
      p.program = prog;
    }
    auto it = p.kernels.find(name);
    if (it != p.kernels.end()) return it->second;
    cl_int err = CL_SUCCESS;
    cl_kernel k = clCreateKernel(p.program, name.c_str(), &err);
    SPC_CL_CHECK(err);
    p.kernels.emplace(name, k);
    return k;
  }

  void Launch(const KernelInfo& info, ffi::PackedArgs args) {
    const size_t n_args = info.arg_types.size(), n_tags = info.launch_tags.size();
    if (static_cast<size_t>(args.size()) != n_args + n_tags) {
      TVM_FFI_THROW(RuntimeError) << "kernel " << info.name << " takes " << n_args << " arguments and " << n_tags
                                  << " launch sizes, called with " << args.size();
    }
    size_t grid[3] = {1, 1, 1}, block[3] = {1, 1, 1};
    for (size_t j = 0; j < n_tags; ++j) {
      int64_t v = args[n_args + j].cast<int64_t>();
      const LaunchTag& tag = info.launch_tags[j];
      if (tag.kind == LaunchTag::kDynSharedMemory) {
        if (v != 0) TVM_FFI_THROW(RuntimeError) << "kernel " << info.name << " asks for dynamic local memory, "
                                                   "which OpenCL C kernels from TVM never declare";
        continue;
      }
      (tag.kind == LaunchTag::kBlock ? grid : block)[tag.dim] = static_cast<size_t>(v);
    }
    if (grid[0] * grid[1] * grid[2] == 0) return;  // an empty launch: nothing to compute
    int device_id = current_device;
    std::lock_guard<std::mutex> lock(mutex_);  // cl_kernel arguments are per kernel object
    cl_kernel k = Kernel(device_id, info.name);
    for (size_t i = 0; i < n_args; ++i) {
      const DLDataType t = info.arg_types[i];
      cl_int err;
      if (t.code == kDLOpaqueHandle) {
        void* ptr = args[i].cast<void*>();
        cl_mem mem = static_cast<cl_mem>(ptr);
        err = clSetKernelArg(k, i, sizeof(cl_mem), ptr == nullptr ? nullptr : &mem);
      } else if (t.code == kDLFloat && t.bits == 32) {
        float v = static_cast<float>(args[i].cast<double>());
        err = clSetKernelArg(k, i, sizeof(v), &v);
      } else if (t.code == kDLFloat && t.bits == 64) {
        double v = args[i].cast<double>();
        err = clSetKernelArg(k, i, sizeof(v), &v);
      } else if ((t.code == kDLInt || t.code == kDLUInt || t.code == kDLBool) && t.bits <= 64) {
        int64_t v = args[i].cast<int64_t>();  // little endian: the low bytes are the narrow value
        size_t bytes = t.bits <= 8 ? 1 : t.bits / 8;
        err = clSetKernelArg(k, i, bytes, &v);
      } else {
        TVM_FFI_THROW(RuntimeError) << "kernel " << info.name << " argument " << i << " has a type ("
                                    << int(t.code) << ", " << int(t.bits) << " bits) the OpenCL runtime cannot pass";
      }
      if (err != CL_SUCCESS) {
        TVM_FFI_THROW(RuntimeError) << "kernel " << info.name << " argument " << i << ": OpenCL error " << err
                                    << " (" << ErrorName(err) << ")";
      }
    }
    size_t global[3] = {grid[0] * block[0], grid[1] * block[1], grid[2] * block[2]};
    Device& d = Workspace::Global()->Get(device_id);
    Profile* prof = Profile::Global();
    auto start = prof->enabled ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point();
    cl_int err = clEnqueueNDRangeKernel(d.queue, k, 3, nullptr, global, block, 0, nullptr, nullptr);
    if (prof->enabled && err == CL_SUCCESS) {
      clFinish(d.queue);
      prof->Add(info.name, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    if (err != CL_SUCCESS) {
      TVM_FFI_THROW(RuntimeError) << "launching kernel " << info.name << " on " << DeviceInfoString(d.id, CL_DEVICE_NAME)
                                  << " (grid " << grid[0] << "x" << grid[1] << "x" << grid[2] << ", block "
                                  << block[0] << "x" << block[1] << "x" << block[2] << "): OpenCL error " << err
                                  << " (" << ErrorName(err) << ")";
    }
  }

  KernelBlob blob_;
  std::mutex mutex_;
  std::unordered_map<int, Program> programs_;
};

ffi::Module LoadFromBytes(const ffi::Bytes& bytes) {
  KernelBlob blob = KernelBlob::Parse(std::string(bytes.data(), bytes.size()));
  if (blob.format != "cl") {
    TVM_FFI_THROW(RuntimeError) << "this OpenCL runtime runs OpenCL C source kernels (format \"cl\"), "
                                << "not precompiled \"" << blob.format << "\" binaries";
  }
  return ffi::Module(ffi::make_object<OpenCLModule>(std::move(blob)));
}

TVM_FFI_STATIC_INIT_BLOCK() {
  namespace refl = tvm::ffi::reflection;
  refl::GlobalDef()
      .def_packed("device_api.opencl",
                  [](ffi::PackedArgs args, ffi::Any* rv) {
                    *rv = static_cast<void*>(static_cast<DeviceAPI*>(OpenCLDeviceAPI::Global()));
                  })
      .def("ffi.Module.load_from_bytes.opencl", LoadFromBytes)
      .def("speccompile.opencl.device_extensions",
           [](int device_id) {
             Workspace* ws = Workspace::Global();
             if (device_id < 0 || static_cast<size_t>(device_id) >= ws->NumDevices()) return ffi::String("");
             return ffi::String(DeviceInfoString(ws->Id(device_id), CL_DEVICE_EXTENSIONS));
           })
      .def("speccompile.opencl.device_names", []() {
        ffi::Array<ffi::String> names;
        Workspace* ws = Workspace::Global();
        for (size_t i = 0; i < ws->NumDevices(); ++i) {
          names.push_back(ffi::String(DeviceInfoString(ws->Id(i), CL_DEVICE_NAME)));
        }
        return names;
      });
}

}  // namespace opencl
}  // namespace speccompile
