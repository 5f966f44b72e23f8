// The Vulkan side of libspeccompile_vulkan.so: the loader, the devices, buffers and the batch
// of recorded work. vulkan_runtime.cc puts TVM's DeviceAPI and Module on top of it.
//
// Why the loader is opened by hand (VK_NO_PROTOTYPES, dlopen of libvulkan.so.1, every entry
// point through vkGetInstanceProcAddr / vkGetDeviceProcAddr): a compile machine without a
// Vulkan loader still loads this library, creates kernel modules and serializes them; only a
// device use needs the loader, and its absence is then a clear error rather than a failed
// dlopen of the whole library.
#pragma once

#ifndef VK_NO_PROTOTYPES
#define VK_NO_PROTOTYPES
#endif
#include <vulkan/vulkan.h>

#include <tvm/ffi/error.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_set>
#include <vector>

namespace speccompile {
namespace vulkan {

// Entry points resolved with vkGetInstanceProcAddr(instance, ...).
#define SPC_VK_INSTANCE_FUNCS(X)                                                                   \
  X(vkDestroyInstance)                                                                             \
  X(vkEnumeratePhysicalDevices)                                                                    \
  X(vkGetPhysicalDeviceProperties)                                                                 \
  X(vkGetPhysicalDeviceProperties2)                                                                \
  X(vkGetPhysicalDeviceFeatures2)                                                                  \
  X(vkGetPhysicalDeviceQueueFamilyProperties)                                                      \
  X(vkGetPhysicalDeviceMemoryProperties)                                                           \
  X(vkCreateDevice)                                                                                \
  X(vkGetDeviceProcAddr)

// Entry points resolved per device with vkGetDeviceProcAddr (no loader dispatch on the hot path).
#define SPC_VK_DEVICE_FUNCS(X)                                                                     \
  X(vkDestroyDevice)                                                                               \
  X(vkGetDeviceQueue)                                                                              \
  X(vkCreateBuffer)                                                                                \
  X(vkDestroyBuffer)                                                                               \
  X(vkGetBufferMemoryRequirements)                                                                 \
  X(vkAllocateMemory)                                                                              \
  X(vkFreeMemory)                                                                                  \
  X(vkBindBufferMemory)                                                                            \
  X(vkMapMemory)                                                                                   \
  X(vkGetBufferDeviceAddress)                                                                      \
  X(vkCreateCommandPool)                                                                           \
  X(vkResetCommandPool)                                                                            \
  X(vkAllocateCommandBuffers)                                                                      \
  X(vkBeginCommandBuffer)                                                                          \
  X(vkEndCommandBuffer)                                                                            \
  X(vkCmdPipelineBarrier)                                                                          \
  X(vkCmdCopyBuffer)                                                                               \
  X(vkCmdBindPipeline)                                                                             \
  X(vkCmdPushConstants)                                                                            \
  X(vkCmdDispatch)                                                                                 \
  X(vkQueueSubmit)                                                                                 \
  X(vkCreateFence)                                                                                 \
  X(vkWaitForFences)                                                                               \
  X(vkResetFences)                                                                                 \
  X(vkCreateShaderModule)                                                                          \
  X(vkDestroyShaderModule)                                                                         \
  X(vkCreatePipelineLayout)                                                                        \
  X(vkDestroyPipelineLayout)                                                                       \
  X(vkCreateComputePipelines)                                                                      \
  X(vkDestroyPipeline)                                                                             \
  X(vkCreatePipelineCache)

struct InstanceFns {
#define SPC_VK_DECLARE(f) PFN_##f f = nullptr;
  SPC_VK_INSTANCE_FUNCS(SPC_VK_DECLARE)
};

struct DeviceFns {
  SPC_VK_DEVICE_FUNCS(SPC_VK_DECLARE)
#undef SPC_VK_DECLARE
};

const char* ResultName(VkResult r);

#define SPC_VK_CHECK(call)                                                                         \
  do {                                                                                             \
    VkResult _res = (call);                                                                        \
    if (_res != VK_SUCCESS)                                                                        \
      TVM_FFI_THROW(RuntimeError) << "Vulkan error " << ::speccompile::vulkan::ResultName(_res)   \
                                  << " in " #call;                                                 \
  } while (0)

/*! What a physical device offers, read without opening it (device_info, GetAttr, checks). */
struct Caps {
  std::string name;
  VkPhysicalDeviceType type = VK_PHYSICAL_DEVICE_TYPE_OTHER;
  uint32_t api_version = 0, driver_version = 0, subgroup_size = 1;
  VkPhysicalDeviceLimits limits{};
  uint64_t max_allocation = 0, device_local_bytes = 0;
  // the optional features this runtime enables where present (see Device::Open)
  bool float16 = false, int8 = false, int16 = false, int64 = false;
  bool storage16 = false, storage8 = false, uniform16 = false, uniform8 = false;
  bool push16 = false, push8 = false, buffer_device_address = false;
};

const char* DeviceTypeName(VkPhysicalDeviceType type);
std::string VersionString(uint32_t v, bool patch);

/*! A tensor's `data` on a Vulkan device points to one of these. */
struct Buffer {
  VkBuffer buffer = VK_NULL_HANDLE;
  VkDeviceMemory memory = VK_NULL_HANDLE;
  VkDeviceSize size = 0;           // what was asked for (the allocation may be larger)
  VkDeviceAddress address = 0;     // vkGetBufferDeviceAddress: what kernels receive
  char* mapped = nullptr;          // persistent host map when the memory is HOST_VISIBLE|COHERENT
  int device_id = 0;
};

/*! One opened logical device: one compute queue, one batch of recorded work. */
class Device {
 public:
  Device(int id, VkPhysicalDevice phys, const Caps& caps) : id_(id), phys_(phys), caps_(caps) {}
  void Open(const InstanceFns& ifn);

  const Caps& caps() const { return caps_; }
  const DeviceFns& fn() const { return fn_; }
  VkDevice handle() const { return device_; }
  VkPipelineCache pipeline_cache() const { return pipeline_cache_; }
  int id() const { return id_; }

  Buffer* Alloc(size_t nbytes);
  /*! Destroyed now, or when the batch that may use it completes. */
  void Free(Buffer* buf);
  Buffer* AllocWorkspace(size_t nbytes);
  void FreeWorkspace(Buffer* buf);

  /*! Records a dispatch into the batch; `args` becomes the push constants, or (indirect) is
   * copied into the batch's host-visible ring and its address is pushed instead. */
  void Dispatch(VkPipeline pipeline, VkPipelineLayout layout, const std::vector<uint8_t>& args,
                uint32_t push_bytes, bool indirect, const uint32_t groups[3]);
  void CopyDeviceToDevice(Buffer* from, size_t from_offset, Buffer* to, size_t to_offset, size_t size);
  void CopyToDevice(const char* host, Buffer* to, size_t offset, size_t size);
  void CopyToHost(Buffer* from, size_t offset, char* host, size_t size);
  /*! Submits the batch and waits for it; no-op when nothing is recorded. */
  void Flush();
  /*! Runs `release` now, or after the batch completes if work is recorded (which may use what
   * it releases: a buffer, a pipeline). */
  void Release(std::function<void()> release);

 private:
  Buffer* Create(size_t nbytes, VkBufferUsageFlags usage, bool host_visible);
  void Destroy(Buffer* buf);
  void BeginCommand();  // under mutex_: starts the batch or puts a barrier after the last command
  void FlushLocked();
  void EnsureStaging(size_t nbytes);

  int id_;
  VkPhysicalDevice phys_;
  Caps caps_;
  DeviceFns fn_;
  VkPhysicalDeviceMemoryProperties mem_props_{};
  VkDevice device_ = VK_NULL_HANDLE;
  VkQueue queue_ = VK_NULL_HANDLE;
  VkPipelineCache pipeline_cache_ = VK_NULL_HANDLE;
  VkCommandPool pool_ = VK_NULL_HANDLE;
  VkCommandBuffer cmd_ = VK_NULL_HANDLE;
  VkFence fence_ = VK_NULL_HANDLE;
  bool force_staging_ = false;

  std::mutex mutex_;  // the batch, the ring, staging, the workspace pool
  bool recording_ = false;
  size_t commands_ = 0;
  std::vector<std::function<void()>> on_complete_;
  size_t deferred_bytes_ = 0;
  std::string failed_;  // a failed submit's error, raised by the next FlushLocked
  Buffer* staging_ = nullptr;
  std::vector<Buffer*> ring_;  // per-batch argument blocks of "indirect" kernels
  size_t ring_index_ = 0, ring_used_ = 0;
  std::multimap<size_t, Buffer*> workspace_pool_;
};

/*! The process's Vulkan instance and devices, found on first use; devices opened on first use. */
class Workspace {
 public:
  static Workspace* Global();

  size_t NumDevices() const { return devices_.size(); }
  /*! Throws the "vulkan:N does not exist" error (saying why: no loader, no driver) if it does not. */
  void Check(int device_id) const;
  const Caps& caps(int device_id) const {
    Check(device_id);
    return devices_[device_id]->caps();
  }
  /*! Why there are no devices ("" when the instance was created). */
  const std::string& error() const { return error_; }
  /*! The device, opened on first use; a clear error if absent or unusable. */
  Device& Get(int device_id);

  void Register(Buffer* buf);
  void Unregister(Buffer* buf);
  /*! The buffer a handle names, or nullptr when it names none of ours. */
  Buffer* Lookup(const void* handle);

 private:
  Workspace();

  std::string error_;
  void* loader_ = nullptr;
  VkInstance instance_ = VK_NULL_HANDLE;
  InstanceFns ifn_;
  std::vector<std::unique_ptr<Device>> devices_;
  std::vector<std::unique_ptr<std::once_flag>> open_once_;
  std::mutex registry_mutex_;
  std::unordered_set<const void*> registry_;
};

}  // namespace vulkan
}  // namespace speccompile
