// speccompile's Vulkan device runtime for TVM: libspeccompile_vulkan.so.
//
// Why it exists: the apache-tvm wheel ships no Vulkan runtime, and TVM's own one binds buffers
// through descriptor sets built for its SPIR-V codegen. speccompile emits GLSL whose kernels
// reach every buffer through a 64-bit device address (GL_EXT_buffer_reference), so a kernel's
// arguments are one push-constant block and no descriptor set exists at all. Loading this
// library into a process that already has libtvm_runtime registers what TVM looks up by name:
//   device_api.vulkan                   the DeviceAPI (buffers, copies, sync, attributes)
//   ffi.Module.load_from_bytes.vulkan   the loader of the kernel blob `compile` embeds
// plus speccompile.vulkan.{module_create, device_names, device_info}.
// Written against the wheel's tvm-ffi headers and tvm/runtime/device_api.h only.
//
// Conventions it follows (TVM's, since the host code TVM generates relies on them):
// - a tensor's `data` on a Vulkan device is a Buffer* (vulkan_device.h); no pointer arithmetic
//   on the host (SupportsDevicePointerArithmeticsOnHost is false); a DLTensor's byte_offset
//   is added to the device address a kernel receives;
// - a kernel is called with its arguments (buffers as handles, scalars), then one integer per
//   launch parameter ("blockIdx.x", "threadIdx.y", ...): the work-group count is the grid.
// Device numbering: GPUs first (discrete, integrated, virtual), then others, CPU devices last.
// Kernels are recorded into a per-device batch submitted only when the host needs the results
// (a copy, StreamSync): see vulkan_device.cc.
#include <dlpack/dlpack.h>
#include <tvm/ffi/any.h>
#include <tvm/ffi/container/array.h>
#include <tvm/ffi/container/map.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/json.h>
#include <tvm/ffi/extra/module.h>
#include <tvm/ffi/function.h>
#include <tvm/ffi/reflection/registry.h>
#include <tvm/ffi/string.h>
#include <tvm/runtime/device_api.h>

#include <cstdint>
#include <cstring>
#include <mutex>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

#include "kernel_blob.h"
#include "vulkan_device.h"

namespace speccompile {
namespace vulkan {

using tvm::runtime::DeviceAPI;
using tvm::runtime::DeviceAttrKind;
namespace ffi = tvm::ffi;

thread_local int current_device = 0;

class VulkanDeviceAPI final : public DeviceAPI {
 public:
  static VulkanDeviceAPI* Global() {
    static VulkanDeviceAPI* inst = new VulkanDeviceAPI();
    return inst;
  }

  void SetDevice(DLDevice dev) final { current_device = dev.device_id; }

  void GetAttr(DLDevice dev, DeviceAttrKind kind, ffi::Any* rv) final {
    Workspace* ws = Workspace::Global();
    if (kind == tvm::runtime::kExist) {  // never an error: tvm.device("vulkan", n).exist asks it
      *rv = static_cast<int>(dev.device_id >= 0 && static_cast<size_t>(dev.device_id) < ws->NumDevices());
      return;
    }
    const Caps& c = ws->caps(dev.device_id);  // read without opening the device
    const VkPhysicalDeviceLimits& l = c.limits;
    switch (kind) {
      case tvm::runtime::kMaxThreadsPerBlock:
        *rv = static_cast<int64_t>(l.maxComputeWorkGroupInvocations);
        break;
      case tvm::runtime::kWarpSize:  // kernels from the emitter assume no subgroup width
        *rv = 1;
        break;
      case tvm::runtime::kMaxSharedMemoryPerBlock:
        *rv = static_cast<int64_t>(l.maxComputeSharedMemorySize);
        break;
      case tvm::runtime::kComputeVersion:
      case tvm::runtime::kApiVersion:
        *rv = ffi::String(VersionString(c.api_version, false));
        break;
      case tvm::runtime::kDeviceName:
        *rv = ffi::String(c.name);
        break;
      case tvm::runtime::kMaxThreadDimensions: {
        std::ostringstream os;
        os << "[" << l.maxComputeWorkGroupSize[0] << ", " << l.maxComputeWorkGroupSize[1] << ", "
           << l.maxComputeWorkGroupSize[2] << "]";
        *rv = ffi::String(os.str());
        break;
      }
      case tvm::runtime::kMaxRegistersPerBlock:  // Vulkan does not say
        *rv = 0;
        break;
      case tvm::runtime::kDriverVersion:
        *rv = ffi::String(VersionString(c.driver_version, true));
        break;
      case tvm::runtime::kTotalGlobalMemory:
        *rv = static_cast<int64_t>(c.device_local_bytes);
        break;
      default:  // clock rate, compute units, ...: Vulkan does not expose them; left unset as TVM does
        break;
    }
  }

  void* AllocDataSpace(DLDevice dev, size_t nbytes, size_t alignment, DLDataType type_hint) final {
    return Workspace::Global()->Get(dev.device_id).Alloc(nbytes);
  }

  void FreeDataSpace(DLDevice dev, void* ptr) final {
    Workspace* ws = Workspace::Global();
    Buffer* buf = ws->Lookup(ptr);
    if (buf != nullptr) ws->Get(buf->device_id).Free(buf);  // (null or not ours: nothing to free)
  }

  void* AllocWorkspace(DLDevice dev, size_t nbytes, DLDataType type_hint) final {
    return Workspace::Global()->Get(dev.device_id).AllocWorkspace(nbytes);
  }

  void FreeWorkspace(DLDevice dev, void* ptr) final {
    Workspace* ws = Workspace::Global();
    Buffer* buf = ws->Lookup(ptr);
    if (buf != nullptr) ws->Get(buf->device_id).FreeWorkspace(buf);
  }

  void StreamSync(DLDevice dev, TVMStreamHandle stream) final { Workspace::Global()->Get(dev.device_id).Flush(); }

 protected:
  void CopyDataFromTo(const void* from, size_t from_offset, void* to, size_t to_offset, size_t size,
                      DLDevice dev_from, DLDevice dev_to, DLDataType type_hint, TVMStreamHandle stream) final {
    if (size == 0) return;
    const bool from_vk = dev_from.device_type == kDLVulkan, to_vk = dev_to.device_type == kDLVulkan;
    Buffer* src = from_vk ? Resolve(from, "source") : nullptr;
    Buffer* dst = to_vk ? Resolve(to, "destination") : nullptr;
    Workspace* ws = Workspace::Global();
    if (src && dst && src->device_id == dst->device_id) {  // recorded into the batch: no wait
      ws->Get(src->device_id).CopyDeviceToDevice(src, from_offset, dst, to_offset, size);
    } else if (src && dst) {  // two devices: through the host
      std::vector<char> host(size);
      ws->Get(src->device_id).CopyToHost(src, from_offset, host.data(), size);
      ws->Get(dst->device_id).CopyToDevice(host.data(), dst, to_offset, size);
    } else if (src) {  // synchronous: the caller reads the host memory right after
      ws->Get(src->device_id).CopyToHost(src, from_offset, static_cast<char*>(to) + to_offset, size);
    } else if (dst) {  // synchronous: the host memory may be freed as soon as we return
      ws->Get(dst->device_id).CopyToDevice(static_cast<const char*>(from) + from_offset, dst, to_offset, size);
    } else {
      TVM_FFI_THROW(RuntimeError) << "the Vulkan device API was asked to copy between two non-Vulkan devices";
    }
  }

 private:
  static Buffer* Resolve(const void* handle, const char* what) {
    Buffer* buf = Workspace::Global()->Lookup(handle);
    if (buf == nullptr) {
      TVM_FFI_THROW(RuntimeError) << "the " << what << " of a Vulkan copy (" << handle << ") is not a buffer "
                                  << "this runtime allocated (freed already, or another runtime's)";
    }
    return buf;
  }
};

/*! Why `info` cannot run on a device ("" when it can). */
std::string Incompatibility(const Caps& c, int device_id, const FunctionInfo& info) {
  struct Feature {
    uint32_t need;
    bool have;
    const char* what;
    const char* vk;
    const char* fix;
  };
  const char* f32 = "compile with q4f32_1 or q0f32 for this device";
  const Feature features[] = {
      {kFloat16, c.float16, "computes in float16", "shaderFloat16", f32},
      {kStorage16, c.storage16, "stores 16-bit values in buffers", "storageBuffer16BitAccess", f32},
      {kInt8, c.int8, "computes in 8-bit integers", "shaderInt8", f32},
      {kStorage8, c.storage8, "stores 8-bit values in buffers", "storageBuffer8BitAccess", f32},
      {kInt16, c.int16, "computes in 16-bit integers", "shaderInt16", f32},
      {kInt64Need, c.int64, "computes in 64-bit integers", "shaderInt64", "use another Vulkan device"},
  };
  std::ostringstream os;
  const std::string dev = "vulkan:" + std::to_string(device_id) + " (" + c.name + ")";
  for (const Feature& f : features) {
    if ((info.needs & f.need) && !f.have) {
      os << "the library " << f.what << ", which " << dev << " does not support (" << f.vk << "): " << f.fix;
      return os.str();
    }
  }
  const VkPhysicalDeviceLimits& l = c.limits;
  const uint64_t invocations = uint64_t(info.workgroup[0]) * info.workgroup[1] * info.workgroup[2];
  if (info.shared_bytes > l.maxComputeSharedMemorySize) {
    os << "kernel " << info.name << " declares " << info.shared_bytes << " bytes of workgroup memory; " << dev
       << " allows " << l.maxComputeSharedMemorySize << " (maxComputeSharedMemorySize): rebuild the library for this "
       << "device's limits";
  } else if (invocations > l.maxComputeWorkGroupInvocations || info.workgroup[0] > l.maxComputeWorkGroupSize[0] ||
             info.workgroup[1] > l.maxComputeWorkGroupSize[1] || info.workgroup[2] > l.maxComputeWorkGroupSize[2]) {
    os << "kernel " << info.name << " has work groups of " << info.workgroup[0] << "x" << info.workgroup[1] << "x"
       << info.workgroup[2] << "; " << dev << " allows " << l.maxComputeWorkGroupInvocations << " invocations, at most "
       << l.maxComputeWorkGroupSize[0] << "x" << l.maxComputeWorkGroupSize[1] << "x" << l.maxComputeWorkGroupSize[2]
       << ": rebuild the library for this device's limits";
  } else if (!info.indirect && info.arg_bytes > l.maxPushConstantsSize) {
    os << "kernel " << info.name << " passes " << info.arg_bytes << " bytes of arguments as push constants; " << dev
       << " allows " << l.maxPushConstantsSize << " (maxPushConstantsSize): rebuild the library for this device";
  }
  return os.str();
}

/*! The kernels of one library; pipelines made per device on a function's first call. */
class VulkanModule final : public ffi::ModuleObj {
 public:
  explicit VulkanModule(KernelBlob blob) : blob_(std::move(blob)) {}

  ~VulkanModule() {
    for (auto& kv : devices_) {
      Device* d = kv.second.device;
      for (auto& p : kv.second.pipelines) {
        Pipeline pipe = p.second;  // a pending batch may still dispatch it
        d->Release([d, pipe]() {
          d->fn().vkDestroyPipeline(d->handle(), pipe.pipeline, nullptr);
          d->fn().vkDestroyPipelineLayout(d->handle(), pipe.layout, nullptr);
        });
      }
    }
  }

  const char* kind() const final { return "vulkan"; }
  int GetPropertyMask() const final { return ffi::Module::kBinarySerializable | ffi::Module::kRunnable; }
  ffi::Bytes SaveToBytes() const final { return ffi::Bytes(blob_.bytes); }
  ffi::String InspectSource(const ffi::String& format) const final { return ffi::String(blob_.header); }

  ffi::Optional<ffi::Function> GetFunction(const ffi::String& name) final {
    auto it = blob_.functions.find(std::string(name));
    if (it == blob_.functions.end()) return std::nullopt;
    const FunctionInfo* info = &it->second;
    ffi::ObjectPtr<VulkanModule> self =
        ffi::details::ObjectUnsafe::ObjectPtrFromUnowned<VulkanModule>(static_cast<ffi::Object*>(this));
    return ffi::Function::FromPacked([self, info](ffi::PackedArgs args, ffi::Any* rv) { self->Launch(*info, args); });
  }

  /*! At load: refuse a library that no device of this machine can run (each device is checked
   * again at its first call). Nothing to check without a loader or devices (a compile machine). */
  void CheckSomeDeviceRuns() const {
    Workspace* ws = Workspace::Global();
    std::string first;
    for (size_t i = 0; i < ws->NumDevices(); ++i) {
      std::string why;
      for (const auto& kv : blob_.functions) {
        why = Incompatibility(ws->caps(static_cast<int>(i)), static_cast<int>(i), kv.second);
        if (!why.empty()) break;
      }
      if (why.empty()) return;
      if (first.empty()) first = why;
    }
    if (!first.empty()) TVM_FFI_THROW(RuntimeError) << first;
  }

 private:
  struct Pipeline {
    VkPipeline pipeline = VK_NULL_HANDLE;
    VkPipelineLayout layout = VK_NULL_HANDLE;
  };
  struct PerDevice {
    Device* device = nullptr;
    std::unordered_map<std::string, Pipeline> pipelines;
  };

  static uint32_t PushBytes(const FunctionInfo& info) { return info.indirect ? 8 : (info.arg_bytes + 3) / 4 * 4; }

  /*! The function's pipeline on `d`, created (and checked against the device) on first use. */
  Pipeline GetPipeline(Device& d, const FunctionInfo& info) {
    std::lock_guard<std::mutex> lock(mutex_);
    PerDevice& per = devices_[d.id()];
    per.device = &d;
    auto it = per.pipelines.find(info.name);
    if (it != per.pipelines.end()) return it->second;
    std::string why = Incompatibility(d.caps(), d.id(), info);
    if (!why.empty()) TVM_FFI_THROW(RuntimeError) << why;
    const DeviceFns& fn = d.fn();
    // the payload's 4-byte alignment is relative to the payload: copy to aligned words
    std::vector<uint32_t> code(info.spirv_size / 4);
    std::memcpy(code.data(), blob_.bytes.data() + info.spirv_offset, info.spirv_size);
    VkShaderModuleCreateInfo smci{VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO};
    smci.codeSize = info.spirv_size;
    smci.pCode = code.data();
    VkShaderModule shader = VK_NULL_HANDLE;
    VkResult r = fn.vkCreateShaderModule(d.handle(), &smci, nullptr, &shader);
    Pipeline p;
    if (r == VK_SUCCESS) {
      VkPushConstantRange range{VK_SHADER_STAGE_COMPUTE_BIT, 0, PushBytes(info)};
      VkPipelineLayoutCreateInfo plci{VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO};
      plci.pushConstantRangeCount = range.size ? 1 : 0;
      plci.pPushConstantRanges = &range;
      r = fn.vkCreatePipelineLayout(d.handle(), &plci, nullptr, &p.layout);
    }
    if (r == VK_SUCCESS) {
      VkComputePipelineCreateInfo cpci{VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO};
      cpci.stage.sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO;
      cpci.stage.stage = VK_SHADER_STAGE_COMPUTE_BIT;
      cpci.stage.module = shader;
      cpci.stage.pName = "main";
      cpci.layout = p.layout;
      r = fn.vkCreateComputePipelines(d.handle(), d.pipeline_cache(), 1, &cpci, nullptr, &p.pipeline);
    }
    if (shader != VK_NULL_HANDLE) fn.vkDestroyShaderModule(d.handle(), shader, nullptr);
    if (r != VK_SUCCESS) {
      if (p.layout != VK_NULL_HANDLE) fn.vkDestroyPipelineLayout(d.handle(), p.layout, nullptr);
      TVM_FFI_THROW(RuntimeError) << "the Vulkan driver of vulkan:" << d.id() << " (" << d.caps().name
                                  << ") rejected kernel " << info.name << " (" << ResultName(r)
                                  << "): its SPIR-V may use a feature the device lacks; rebuild the library for it";
    }
    per.pipelines.emplace(info.name, p);
    return p;
  }

  /*! A buffer argument's device address (and the device it lives on). */
  static VkDeviceAddress BufferAddress(const FunctionInfo& info, size_t i, ffi::AnyView arg, int* device_id) {
    const void* handle = nullptr;
    uint64_t byte_offset = 0;
    const int32_t type = arg.type_index();
    if (type == ffi::TypeIndex::kTVMFFIOpaquePtr || type == ffi::TypeIndex::kTVMFFINone) {
      handle = arg.cast<void*>();
    } else if (auto t = arg.try_cast<DLTensor*>()) {  // a tensor passed directly (tests, tools)
      if ((*t)->device.device_type != kDLVulkan) {
        TVM_FFI_THROW(RuntimeError) << "argument " << i << " of kernel " << info.name << " is a tensor on device type "
                                    << (*t)->device.device_type << ", not on a Vulkan device";
      }
      handle = (*t)->data;
      byte_offset = (*t)->byte_offset;
    } else {
      TVM_FFI_THROW(RuntimeError) << "argument " << i << " of kernel " << info.name << " must be a Vulkan buffer "
                                  << "handle or tensor, not " << arg.GetTypeKey();
    }
    Buffer* buf = Workspace::Global()->Lookup(handle);
    if (buf == nullptr) {
      TVM_FFI_THROW(RuntimeError) << "argument " << i << " of kernel " << info.name << " ("
                                  << (handle ? "" : "null, ") << handle << ") is not a live buffer of this Vulkan "
                                  << "runtime: it was freed, or the tensor lives on another device";
    }
    if (*device_id >= 0 && *device_id != buf->device_id) {
      TVM_FFI_THROW(RuntimeError) << "kernel " << info.name << " is given buffers on vulkan:" << *device_id
                                  << " and vulkan:" << buf->device_id << "; all must be on one device";
    }
    *device_id = buf->device_id;
    return buf->address + byte_offset;
  }

  void Launch(const FunctionInfo& info, ffi::PackedArgs args) {
    const size_t n_args = info.args.size(), n_launch = info.launch.size();
    if (static_cast<size_t>(args.size()) != n_args + n_launch) {
      TVM_FFI_THROW(RuntimeError) << "kernel " << info.name << " takes " << n_args << " arguments and " << n_launch
                                  << " launch sizes, called with " << args.size();
    }
    uint32_t groups[3] = {1, 1, 1};
    for (size_t j = 0; j < n_launch; ++j) {
      auto v = args[n_args + j].try_cast<int64_t>();
      const bool thread = info.launch[j].first;
      const int axis = info.launch[j].second;
      const char* tag = thread ? "threadIdx." : "blockIdx.";
      if (!v || *v < 0 || *v > UINT32_MAX) {
        TVM_FFI_THROW(RuntimeError) << "kernel " << info.name << ": launch value " << tag << char('x' + axis)
                                    << " must be a non-negative 32-bit integer";
      }
      if (thread && static_cast<uint64_t>(*v) != info.workgroup[axis]) {
        TVM_FFI_THROW(RuntimeError) << "kernel " << info.name << " is launched with " << tag << char('x' + axis)
                                    << " = " << *v << ", but its shader's local_size_" << char('x' + axis) << " is "
                                    << info.workgroup[axis] << ": the library's host code and kernels disagree; "
                                    << "rebuild it";
      }
      if (!thread) groups[axis] = static_cast<uint32_t>(*v);
    }
    std::vector<uint8_t> block((info.arg_bytes + 3) / 4 * 4, 0);
    int device_id = -1;
    for (size_t i = 0; i < n_args; ++i) {
      const ArgSpec& spec = info.args[i];
      uint8_t* at = block.data() + spec.offset;
      if (spec.kind == ArgSpec::kBuffer) {
        VkDeviceAddress addr = BufferAddress(info, i, args[i], &device_id);
        std::memcpy(at, &addr, 8);
        continue;
      }
      if (spec.kind == ArgSpec::kFloat32) {
        auto v = args[i].try_cast<double>();
        if (!v) TVM_FFI_THROW(RuntimeError) << "argument " << i << " of kernel " << info.name << " must be a number";
        float f = static_cast<float>(*v);
        std::memcpy(at, &f, 4);
        continue;
      }
      auto v = args[i].try_cast<int64_t>();
      if (!v) {
        TVM_FFI_THROW(RuntimeError) << "argument " << i << " of kernel " << info.name << " must be an integer, not "
                                    << args[i].GetTypeKey();
      }
      std::memcpy(at, &*v, spec.Bytes());  // little endian: the low bytes are the narrow value
    }
    Workspace* ws = Workspace::Global();
    Device& d = ws->Get(device_id >= 0 ? device_id : current_device);
    const uint32_t* max_groups = d.caps().limits.maxComputeWorkGroupCount;
    for (int k = 0; k < 3; ++k) {
      if (groups[k] > max_groups[k]) {
        TVM_FFI_THROW(RuntimeError) << "kernel " << info.name << " is launched with blockIdx." << char('x' + k)
                                    << " = " << groups[k] << " work groups; vulkan:" << d.id() << " ("
                                    << d.caps().name << ") allows " << max_groups[k]
                                    << " (maxComputeWorkGroupCount): rebuild the library for this device";
      }
    }
    Pipeline p = GetPipeline(d, info);
    if (groups[0] == 0 || groups[1] == 0 || groups[2] == 0) return;  // an empty launch: nothing to compute
    d.Dispatch(p.pipeline, p.layout, block, PushBytes(info), info.indirect, groups);
  }

  KernelBlob blob_;
  std::mutex mutex_;
  std::unordered_map<int, PerDevice> devices_;
};

ffi::Module CreateModule(const ffi::Bytes& bytes) {
  return ffi::Module(ffi::make_object<VulkanModule>(KernelBlob::Parse(std::string(bytes.data(), bytes.size()))));
}

ffi::Module LoadFromBytes(const ffi::Bytes& bytes) {
  ffi::Module m = CreateModule(bytes);
  static_cast<const VulkanModule*>(m.get())->CheckSomeDeviceRuns();
  return m;
}

ffi::String DeviceInfo(int device_id) {
  const Caps& c = Workspace::Global()->caps(device_id);
  const VkPhysicalDeviceLimits& l = c.limits;
  ffi::Map<ffi::String, ffi::Any> m;
  m.Set("name", ffi::String(c.name));
  m.Set("deviceType", ffi::String(DeviceTypeName(c.type)));
  m.Set("apiVersion", ffi::String(VersionString(c.api_version, true)));
  m.Set("driverVersion", ffi::String(VersionString(c.driver_version, true)));
  m.Set("subgroupSize", static_cast<int64_t>(c.subgroup_size));
  m.Set("maxComputeSharedMemorySize", static_cast<int64_t>(l.maxComputeSharedMemorySize));
  m.Set("maxComputeWorkGroupInvocations", static_cast<int64_t>(l.maxComputeWorkGroupInvocations));
  ffi::Array<int64_t> size, count;
  for (int k = 0; k < 3; ++k) {
    size.push_back(l.maxComputeWorkGroupSize[k]);
    count.push_back(l.maxComputeWorkGroupCount[k]);
  }
  m.Set("maxComputeWorkGroupSize", size);
  m.Set("maxComputeWorkGroupCount", count);
  m.Set("maxPushConstantsSize", static_cast<int64_t>(l.maxPushConstantsSize));
  m.Set("maxStorageBufferRange", static_cast<int64_t>(l.maxStorageBufferRange));
  m.Set("maxMemoryAllocationSize", static_cast<int64_t>(c.max_allocation));
  m.Set("deviceLocalMemory", static_cast<int64_t>(c.device_local_bytes));
  m.Set("shaderFloat16", c.float16);
  m.Set("shaderInt8", c.int8);
  m.Set("shaderInt16", c.int16);
  m.Set("shaderInt64", c.int64);
  m.Set("storageBuffer16BitAccess", c.storage16);
  m.Set("storageBuffer8BitAccess", c.storage8);
  m.Set("bufferDeviceAddress", c.buffer_device_address);
  return ffi::json::Stringify(m);
}

TVM_FFI_STATIC_INIT_BLOCK() {
  namespace refl = tvm::ffi::reflection;
  refl::GlobalDef()
      .def_packed("device_api.vulkan",
                  [](ffi::PackedArgs args, ffi::Any* rv) {
                    *rv = static_cast<void*>(static_cast<DeviceAPI*>(VulkanDeviceAPI::Global()));
                  })
      .def("ffi.Module.load_from_bytes.vulkan", LoadFromBytes)
      .def("speccompile.vulkan.module_create", CreateModule)
      .def("speccompile.vulkan.device_info", DeviceInfo)
      .def("speccompile.vulkan.device_names", []() {
        ffi::Array<ffi::String> names;
        Workspace* ws = Workspace::Global();
        for (size_t i = 0; i < ws->NumDevices(); ++i) names.push_back(ffi::String(ws->caps(static_cast<int>(i)).name));
        return names;
      });
}

}  // namespace vulkan
}  // namespace speccompile
