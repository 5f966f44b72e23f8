// The Vulkan instance, devices, buffers and the batch of recorded work (see vulkan_device.h).
//
// The batch: kernels and device-to-device copies are recorded into one command buffer, a
// full memory barrier between consecutive commands (TVM's host code assumes stream order:
// each kernel sees what the previous one wrote), and submitted only when the host must see
// or change memory (a host copy, StreamSync) or when too much freed memory waits for it.
// Since every submit is waited for, one command buffer, one fence and one argument ring per
// device suffice; what the recorded commands reference (freed buffers, destroyed pipelines)
// is released when the batch completes.
#include "vulkan_device.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <sstream>

namespace speccompile {
namespace vulkan {

namespace {
constexpr size_t kStagingMax = 64u << 20;        // a larger host copy goes through in chunks
constexpr size_t kRingChunk = 1u << 20;          // argument blocks of "indirect" kernels
constexpr size_t kRingAlign = 256;               // any buffer_reference_align the emitter picks
constexpr size_t kDeferredFlushBytes = 256u << 20;  // freed memory a batch may hold back

const VkAccessFlags kWriteAccess = VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT;
const VkAccessFlags kAnyAccess = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT |
                                 VK_ACCESS_TRANSFER_READ_BIT | VK_ACCESS_TRANSFER_WRITE_BIT;
const VkPipelineStageFlags kWorkStages = VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT;

int TypeRank(VkPhysicalDeviceType t) {  // GPUs first, CPU devices last
  switch (t) {
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: return 0;
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: return 1;
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU: return 2;
    case VK_PHYSICAL_DEVICE_TYPE_CPU: return 4;
    default: return 3;
  }
}

/*! SPECCOMPILE_VULKAN_HIDE_FEATURES=float16,int8,...: report those "needs" features as absent,
 * so a test on a device that has everything (lavapipe) can see the refusal a weaker device gives. */
void HideFeatures(Caps* c) {
  const char* env = std::getenv("SPECCOMPILE_VULKAN_HIDE_FEATURES");
  if (env == nullptr) return;
  std::string s = std::string(",") + env + ",";
  auto hidden = [&s](const char* n) { return s.find(std::string(",") + n + ",") != std::string::npos; };
  if (hidden("float16")) c->float16 = false;
  if (hidden("int8")) c->int8 = false;
  if (hidden("int16")) c->int16 = false;
  if (hidden("int64")) c->int64 = false;
  if (hidden("storage16")) c->storage16 = c->uniform16 = c->push16 = false;
  if (hidden("storage8")) c->storage8 = c->uniform8 = c->push8 = false;
  if (hidden("bufferDeviceAddress")) c->buffer_device_address = false;
}

Caps QueryCaps(const InstanceFns& f, VkPhysicalDevice pd) {
  Caps c;
  VkPhysicalDeviceProperties props;
  f.vkGetPhysicalDeviceProperties(pd, &props);
  c.name = props.deviceName;
  c.type = props.deviceType;
  c.api_version = props.apiVersion;
  c.driver_version = props.driverVersion;
  c.limits = props.limits;
  VkPhysicalDeviceMemoryProperties mem;
  f.vkGetPhysicalDeviceMemoryProperties(pd, &mem);
  for (uint32_t i = 0; i < mem.memoryHeapCount; ++i) {
    if (mem.memoryHeaps[i].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT) c.device_local_bytes += mem.memoryHeaps[i].size;
  }
  if (c.api_version < VK_API_VERSION_1_1) return c;  // the *2 queries and everything optional need 1.1
  VkPhysicalDeviceSubgroupProperties sub{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES};
  VkPhysicalDeviceMaintenance3Properties m3{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MAINTENANCE_3_PROPERTIES, &sub};
  VkPhysicalDeviceProperties2 p2{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, &m3};
  f.vkGetPhysicalDeviceProperties2(pd, &p2);
  c.subgroup_size = std::max<uint32_t>(1, sub.subgroupSize);
  c.max_allocation = m3.maxMemoryAllocationSize;
  VkPhysicalDeviceVulkan12Features f12{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES};
  VkPhysicalDeviceVulkan11Features f11{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES, &f12};
  VkPhysicalDeviceFeatures2 f2{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2};
  // the Vulkan11/12 feature structs may only be chained on a 1.2 device
  if (c.api_version >= VK_API_VERSION_1_2) f2.pNext = &f11;
  f.vkGetPhysicalDeviceFeatures2(pd, &f2);
  c.int16 = f2.features.shaderInt16;
  c.int64 = f2.features.shaderInt64;
  c.storage16 = f11.storageBuffer16BitAccess;
  c.uniform16 = f11.uniformAndStorageBuffer16BitAccess;
  c.push16 = f11.storagePushConstant16;
  c.float16 = f12.shaderFloat16;
  c.int8 = f12.shaderInt8;
  c.storage8 = f12.storageBuffer8BitAccess;
  c.uniform8 = f12.uniformAndStorageBuffer8BitAccess;
  c.push8 = f12.storagePushConstant8;
  c.buffer_device_address = f12.bufferDeviceAddress;
  HideFeatures(&c);
  return c;
}
}  // namespace

const char* ResultName(VkResult r) {
  switch (r) {
    case VK_SUCCESS: return "VK_SUCCESS";
    case VK_NOT_READY: return "VK_NOT_READY";
    case VK_TIMEOUT: return "VK_TIMEOUT";
    case VK_ERROR_OUT_OF_HOST_MEMORY: return "VK_ERROR_OUT_OF_HOST_MEMORY";
    case VK_ERROR_OUT_OF_DEVICE_MEMORY: return "VK_ERROR_OUT_OF_DEVICE_MEMORY";
    case VK_ERROR_INITIALIZATION_FAILED: return "VK_ERROR_INITIALIZATION_FAILED";
    case VK_ERROR_DEVICE_LOST: return "VK_ERROR_DEVICE_LOST";
    case VK_ERROR_MEMORY_MAP_FAILED: return "VK_ERROR_MEMORY_MAP_FAILED";
    case VK_ERROR_LAYER_NOT_PRESENT: return "VK_ERROR_LAYER_NOT_PRESENT";
    case VK_ERROR_EXTENSION_NOT_PRESENT: return "VK_ERROR_EXTENSION_NOT_PRESENT";
    case VK_ERROR_FEATURE_NOT_PRESENT: return "VK_ERROR_FEATURE_NOT_PRESENT";
    case VK_ERROR_INCOMPATIBLE_DRIVER: return "VK_ERROR_INCOMPATIBLE_DRIVER";
    case VK_ERROR_TOO_MANY_OBJECTS: return "VK_ERROR_TOO_MANY_OBJECTS";
    case VK_ERROR_INVALID_SHADER_NV: return "VK_ERROR_INVALID_SHADER_NV";
    case VK_ERROR_UNKNOWN: return "VK_ERROR_UNKNOWN";
    default: return "a VkResult, see vulkan_core.h";
  }
}

const char* DeviceTypeName(VkPhysicalDeviceType type) {
  switch (type) {
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: return "discrete_gpu";
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: return "integrated_gpu";
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU: return "virtual_gpu";
    case VK_PHYSICAL_DEVICE_TYPE_CPU: return "cpu";
    default: return "other";
  }
}

std::string VersionString(uint32_t v, bool patch) {
  std::ostringstream os;
  os << VK_API_VERSION_MAJOR(v) << "." << VK_API_VERSION_MINOR(v);
  if (patch) os << "." << VK_API_VERSION_PATCH(v);
  return os.str();
}

// ---------------------------------------------------------------------------------------------
// Workspace

Workspace* Workspace::Global() {
  static Workspace* inst = new Workspace();  // never destroyed: kernels may run at exit
  return inst;
}

Workspace::Workspace() {
  const char* env = std::getenv("SPECCOMPILE_VULKAN_LOADER");  // a loader outside the library path
  std::string name = env != nullptr && *env ? env : "libvulkan.so.1";
  loader_ = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (loader_ == nullptr) {
    error_ = "no Vulkan loader (" + name + "): apt-get install libvulkan1 mesa-vulkan-drivers (a CPU device: lavapipe)";
    return;
  }
  auto gipa = reinterpret_cast<PFN_vkGetInstanceProcAddr>(dlsym(loader_, "vkGetInstanceProcAddr"));
  if (gipa == nullptr) {
    error_ = name + " has no vkGetInstanceProcAddr: it is not a Vulkan loader; reinstall libvulkan1";
    return;
  }
  auto create = reinterpret_cast<PFN_vkCreateInstance>(gipa(VK_NULL_HANDLE, "vkCreateInstance"));
  auto version_of = reinterpret_cast<PFN_vkEnumerateInstanceVersion>(gipa(VK_NULL_HANDLE, "vkEnumerateInstanceVersion"));
  uint32_t version = VK_API_VERSION_1_0;
  if (version_of != nullptr) version_of(&version);
  if (create == nullptr || version < VK_API_VERSION_1_1) {
    error_ = "the Vulkan loader " + name + " is version " + VersionString(version, true) +
             "; this runtime needs a Vulkan 1.2 loader and driver: update libvulkan1";
    return;
  }
  // without XDG_RUNTIME_DIR the loader and some drivers print errors on every start
  if (std::getenv("XDG_RUNTIME_DIR") == nullptr) {
    const char* tmp = std::getenv("TMPDIR");
    std::string tmpl = std::string(tmp != nullptr && *tmp ? tmp : "/tmp") + "/speccompile-xdg-XXXXXX";
    if (mkdtemp(&tmpl[0]) != nullptr) setenv("XDG_RUNTIME_DIR", tmpl.c_str(), 0);
  }
  VkApplicationInfo app{VK_STRUCTURE_TYPE_APPLICATION_INFO};
  app.pApplicationName = "speccompile";
  app.pEngineName = "speccompile";
  app.apiVersion = VK_API_VERSION_1_3;  // the highest this runtime uses; a 1.1+ loader accepts any
  VkInstanceCreateInfo ici{VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO};
  ici.pApplicationInfo = &app;
  VkResult r = create(&ici, nullptr, &instance_);
  if (r != VK_SUCCESS) {
    error_ = std::string("cannot create a Vulkan instance (") + ResultName(r) +
             "): no working Vulkan driver; apt-get install mesa-vulkan-drivers (a CPU device: lavapipe)";
    return;
  }
#define SPC_VK_LOAD(f) ifn_.f = reinterpret_cast<PFN_##f>(gipa(instance_, #f));
  SPC_VK_INSTANCE_FUNCS(SPC_VK_LOAD)
#undef SPC_VK_LOAD
  if (ifn_.vkGetPhysicalDeviceFeatures2 == nullptr || ifn_.vkCreateDevice == nullptr) {
    error_ = "the Vulkan loader " + name + " lacks Vulkan 1.1 entry points: update libvulkan1";
    return;
  }
  uint32_t n = 0;
  ifn_.vkEnumeratePhysicalDevices(instance_, &n, nullptr);
  std::vector<VkPhysicalDevice> phys(n);
  if (n) ifn_.vkEnumeratePhysicalDevices(instance_, &n, phys.data());
  phys.resize(n);
  std::vector<std::pair<VkPhysicalDevice, Caps>> found;
  for (VkPhysicalDevice pd : phys) found.emplace_back(pd, QueryCaps(ifn_, pd));
  std::stable_sort(found.begin(), found.end(),
                   [](const auto& a, const auto& b) { return TypeRank(a.second.type) < TypeRank(b.second.type); });
  for (auto& f : found) {
    devices_.push_back(std::make_unique<Device>(static_cast<int>(devices_.size()), f.first, f.second));
    open_once_.push_back(std::make_unique<std::once_flag>());
  }
}

void Workspace::Check(int device_id) const {
  if (device_id < 0 || static_cast<size_t>(device_id) >= devices_.size()) {
    std::ostringstream os;
    if (!error_.empty()) {
      os << error_;
    } else {
      os << "this machine has " << devices_.size() << " Vulkan device(s)";
      if (devices_.empty()) os << " (install a Vulkan driver; a CPU device: apt-get install mesa-vulkan-drivers)";
    }
    TVM_FFI_THROW(RuntimeError) << "vulkan:" << device_id << " does not exist: " << os.str();
  }
}

Device& Workspace::Get(int device_id) {
  Check(device_id);
  Device& d = *devices_[device_id];
  const Caps& c = d.caps();
  if (c.api_version < VK_API_VERSION_1_2) {
    TVM_FFI_THROW(RuntimeError) << "vulkan:" << device_id << " (" << c.name << ") supports Vulkan "
                                << VersionString(c.api_version, false) << "; this runtime needs Vulkan 1.2 (buffer "
                                << "device addresses): update its driver or use another device";
  }
  if (!c.buffer_device_address) {
    TVM_FFI_THROW(RuntimeError) << "vulkan:" << device_id << " (" << c.name << ") lacks bufferDeviceAddress, through "
                                << "which every kernel reaches its buffers: update its driver or use another "
                                << "device (a CPU device: lavapipe, apt-get install mesa-vulkan-drivers)";
  }
  std::call_once(*open_once_[device_id], [this, &d]() { d.Open(ifn_); });
  return d;
}

void Workspace::Register(Buffer* buf) {
  std::lock_guard<std::mutex> lock(registry_mutex_);
  registry_.insert(buf);
}

void Workspace::Unregister(Buffer* buf) {
  std::lock_guard<std::mutex> lock(registry_mutex_);
  registry_.erase(buf);
}

Buffer* Workspace::Lookup(const void* handle) {
  std::lock_guard<std::mutex> lock(registry_mutex_);
  return registry_.count(handle) ? const_cast<Buffer*>(static_cast<const Buffer*>(handle)) : nullptr;
}

// ---------------------------------------------------------------------------------------------
// Device

void Device::Open(const InstanceFns& ifn) {
  uint32_t n = 0;
  ifn.vkGetPhysicalDeviceQueueFamilyProperties(phys_, &n, nullptr);
  std::vector<VkQueueFamilyProperties> families(n);
  ifn.vkGetPhysicalDeviceQueueFamilyProperties(phys_, &n, families.data());
  uint32_t family = n;
  for (uint32_t i = 0; i < n && family == n; ++i) {
    if (families[i].queueFlags & VK_QUEUE_COMPUTE_BIT) family = i;
  }
  if (family == n) {
    TVM_FFI_THROW(RuntimeError) << "vulkan:" << id_ << " (" << caps_.name << ") has no compute queue";
  }
  float priority = 1.0f;
  VkDeviceQueueCreateInfo qci{VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO};
  qci.queueFamilyIndex = family;
  qci.queueCount = 1;
  qci.pQueuePriorities = &priority;
  // every optional feature a kernel may declare in "needs" is enabled where present
  VkPhysicalDeviceVulkan12Features f12{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES};
  f12.bufferDeviceAddress = VK_TRUE;
  f12.shaderFloat16 = caps_.float16;
  f12.shaderInt8 = caps_.int8;
  f12.storageBuffer8BitAccess = caps_.storage8;
  f12.uniformAndStorageBuffer8BitAccess = caps_.uniform8;
  f12.storagePushConstant8 = caps_.push8;
  VkPhysicalDeviceVulkan11Features f11{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES, &f12};
  f11.storageBuffer16BitAccess = caps_.storage16;
  f11.uniformAndStorageBuffer16BitAccess = caps_.uniform16;
  f11.storagePushConstant16 = caps_.push16;
  VkPhysicalDeviceFeatures2 f2{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, &f11};
  f2.features.shaderInt16 = caps_.int16;
  f2.features.shaderInt64 = caps_.int64;
  VkDeviceCreateInfo dci{VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO, &f2};
  dci.queueCreateInfoCount = 1;
  dci.pQueueCreateInfos = &qci;
  VkResult r = ifn.vkCreateDevice(phys_, &dci, nullptr, &device_);
  if (r != VK_SUCCESS) {
    TVM_FFI_THROW(RuntimeError) << "vulkan:" << id_ << " (" << caps_.name << "): vkCreateDevice failed ("
                                << ResultName(r) << "); its driver may be broken: reinstall it";
  }
#define SPC_VK_LOAD(f)                                                                              \
  fn_.f = reinterpret_cast<PFN_##f>(ifn.vkGetDeviceProcAddr(device_, #f));                         \
  if (fn_.f == nullptr)                                                                             \
    TVM_FFI_THROW(RuntimeError) << "vulkan:" << id_ << " (" << caps_.name << "): the driver lacks " #f;
  SPC_VK_DEVICE_FUNCS(SPC_VK_LOAD)
#undef SPC_VK_LOAD
  fn_.vkGetDeviceQueue(device_, family, 0, &queue_);
  ifn.vkGetPhysicalDeviceMemoryProperties(phys_, &mem_props_);
  VkPipelineCacheCreateInfo pcci{VK_STRUCTURE_TYPE_PIPELINE_CACHE_CREATE_INFO};
  SPC_VK_CHECK(fn_.vkCreatePipelineCache(device_, &pcci, nullptr, &pipeline_cache_));
  VkCommandPoolCreateInfo cpci{VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO};
  cpci.queueFamilyIndex = family;
  SPC_VK_CHECK(fn_.vkCreateCommandPool(device_, &cpci, nullptr, &pool_));
  VkCommandBufferAllocateInfo cbai{VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO};
  cbai.commandPool = pool_;
  cbai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
  cbai.commandBufferCount = 1;
  SPC_VK_CHECK(fn_.vkAllocateCommandBuffers(device_, &cbai, &cmd_));
  VkFenceCreateInfo fci{VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
  SPC_VK_CHECK(fn_.vkCreateFence(device_, &fci, nullptr, &fence_));
  // SPECCOMPILE_VULKAN_FORCE_STAGING=1: never map data buffers, so the staging path a discrete
  // GPU takes is exercised on a device whose memory is all host visible (lavapipe, iGPUs)
  const char* env = std::getenv("SPECCOMPILE_VULKAN_FORCE_STAGING");
  force_staging_ = env != nullptr && *env && std::string(env) != "0";
}

Buffer* Device::Create(size_t nbytes, VkBufferUsageFlags usage, bool host_visible) {
  const VkDeviceSize size = std::max<size_t>(nbytes, 4);  // a zero-sized VkBuffer is invalid
  VkBufferCreateInfo bci{VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO};
  bci.size = size;
  bci.usage = usage | VK_BUFFER_USAGE_SHADER_DEVICE_ADDRESS_BIT;
  bci.sharingMode = VK_SHARING_MODE_EXCLUSIVE;
  VkBuffer buffer = VK_NULL_HANDLE;
  SPC_VK_CHECK(fn_.vkCreateBuffer(device_, &bci, nullptr, &buffer));
  VkMemoryRequirements req;
  fn_.vkGetBufferMemoryRequirements(device_, buffer, &req);
  // memory types best first: data buffers want DEVICE_LOCAL (on a discrete GPU not the small
  // host-visible BAR window; on a UMA device one the host maps, so copies need no staging);
  // staging and argument rings must be HOST_VISIBLE|HOST_COHERENT
  const VkMemoryPropertyFlags hv = VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
  const bool discrete = caps_.type == VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU;
  std::vector<std::pair<int, uint32_t>> order;
  for (uint32_t i = 0; i < mem_props_.memoryTypeCount; ++i) {
    const VkMemoryPropertyFlags f = mem_props_.memoryTypes[i].propertyFlags;
    const bool local = f & VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT, mappable = (f & hv) == hv;
    if (!(req.memoryTypeBits & (1u << i)) || (host_visible && !mappable)) continue;
    if (mem_props_.memoryHeaps[mem_props_.memoryTypes[i].heapIndex].size < req.size) continue;
    int score = host_visible ? 1 + local + 2 * bool(f & VK_MEMORY_PROPERTY_HOST_CACHED_BIT)
                             : (local ? (discrete ? (mappable ? 2 : 3) : (mappable ? 3 : 2)) : 1);
    order.emplace_back(-score, i);
  }
  std::stable_sort(order.begin(), order.end());
  VkMemoryAllocateFlagsInfo flags{VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_FLAGS_INFO};
  flags.flags = VK_MEMORY_ALLOCATE_DEVICE_ADDRESS_BIT;
  VkMemoryAllocateInfo mai{VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO, &flags};
  mai.allocationSize = req.size;
  VkDeviceMemory memory = VK_NULL_HANDLE;
  VkResult r = VK_ERROR_OUT_OF_DEVICE_MEMORY;
  uint32_t type = 0;
  for (auto& o : order) {  // out of one heap: the next type may live in another
    mai.memoryTypeIndex = type = o.second;
    r = fn_.vkAllocateMemory(device_, &mai, nullptr, &memory);
    if (r == VK_SUCCESS || (r != VK_ERROR_OUT_OF_DEVICE_MEMORY && r != VK_ERROR_OUT_OF_HOST_MEMORY)) break;
  }
  if (r != VK_SUCCESS) {
    fn_.vkDestroyBuffer(device_, buffer, nullptr);
    TVM_FFI_THROW(RuntimeError) << "vulkan:" << id_ << " (" << caps_.name << "): cannot allocate " << nbytes
                                << " bytes (" << ResultName(r) << ")"
                                << (order.empty() ? ": no memory type fits" : ": out of memory");
  }
  auto* buf = new Buffer();
  buf->buffer = buffer;
  buf->memory = memory;
  buf->size = nbytes;
  buf->device_id = id_;
  VkResult bind = fn_.vkBindBufferMemory(device_, buffer, memory, 0);
  const bool mappable = (mem_props_.memoryTypes[type].propertyFlags & hv) == hv;
  void* ptr = nullptr;
  if (bind == VK_SUCCESS && mappable && (host_visible || !force_staging_)) {
    bind = fn_.vkMapMemory(device_, memory, 0, VK_WHOLE_SIZE, 0, &ptr);
    buf->mapped = static_cast<char*>(ptr);
  }
  if (bind != VK_SUCCESS) {
    Destroy(buf);
    TVM_FFI_THROW(RuntimeError) << "vulkan:" << id_ << ": binding or mapping a buffer failed (" << ResultName(bind) << ")";
  }
  VkBufferDeviceAddressInfo ai{VK_STRUCTURE_TYPE_BUFFER_DEVICE_ADDRESS_INFO};
  ai.buffer = buffer;
  buf->address = fn_.vkGetBufferDeviceAddress(device_, &ai);
  return buf;
}

void Device::Destroy(Buffer* buf) {
  fn_.vkDestroyBuffer(device_, buf->buffer, nullptr);
  fn_.vkFreeMemory(device_, buf->memory, nullptr);  // unmaps it too
  delete buf;
}

Buffer* Device::Alloc(size_t nbytes) {
  if (caps_.max_allocation && nbytes > caps_.max_allocation) {
    TVM_FFI_THROW(RuntimeError) << "vulkan:" << id_ << " (" << caps_.name << "): cannot allocate " << nbytes
                                << " bytes in one buffer, the device's maxMemoryAllocationSize is "
                                << caps_.max_allocation << ": use a smaller batch or context length";
  }
  Buffer* buf = Create(nbytes, VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT |
                                   VK_BUFFER_USAGE_TRANSFER_DST_BIT, false);
  Workspace::Global()->Register(buf);
  return buf;
}

void Device::Free(Buffer* buf) {
  Workspace::Global()->Unregister(buf);
  std::lock_guard<std::mutex> lock(mutex_);
  if (!recording_) return Destroy(buf);
  deferred_bytes_ += buf->size;
  on_complete_.push_back([this, buf]() { Destroy(buf); });
  if (deferred_bytes_ <= kDeferredFlushBytes) return;
  try {  // FreeDataSpace runs in tensor destructors: the error waits for the next submit
    FlushLocked();
  } catch (const std::exception& e) {
    failed_ = e.what();
  }
}

Buffer* Device::AllocWorkspace(size_t nbytes) {
  {  // a pooled buffer is reused at once: stream order makes its earlier users finish first
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = workspace_pool_.lower_bound(nbytes);
    if (it != workspace_pool_.end() && it->first <= 2 * nbytes + 4096) {
      Buffer* buf = it->second;
      workspace_pool_.erase(it);
      return buf;
    }
  }
  return Alloc(nbytes);
}

void Device::FreeWorkspace(Buffer* buf) {
  std::lock_guard<std::mutex> lock(mutex_);
  workspace_pool_.emplace(buf->size, buf);
}

void Device::BeginCommand() {
  if (!recording_) {
    VkCommandBufferBeginInfo bi{VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
    bi.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
    SPC_VK_CHECK(fn_.vkBeginCommandBuffer(cmd_, &bi));
    recording_ = true;
    commands_ = 0;
    return;
  }
  // what earlier kernels and copies wrote is seen by the next command (stream order)
  VkMemoryBarrier mb{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
  mb.srcAccessMask = kWriteAccess;
  mb.dstAccessMask = kAnyAccess;
  fn_.vkCmdPipelineBarrier(cmd_, kWorkStages, kWorkStages, 0, 1, &mb, 0, nullptr, 0, nullptr);
}

void Device::Dispatch(VkPipeline pipeline, VkPipelineLayout layout, const std::vector<uint8_t>& args,
                      uint32_t push_bytes, bool indirect, const uint32_t groups[3]) {
  std::lock_guard<std::mutex> lock(mutex_);
  VkDeviceAddress block = 0;
  if (indirect) {  // the block lives in this batch's ring until the submit completes
    const size_t need = (args.size() + kRingAlign - 1) / kRingAlign * kRingAlign;
    while (ring_index_ < ring_.size() && ring_used_ + need > ring_[ring_index_]->size) {
      ++ring_index_;
      ring_used_ = 0;
    }
    if (ring_index_ == ring_.size()) {
      ring_.push_back(Create(std::max(kRingChunk, need), VK_BUFFER_USAGE_STORAGE_BUFFER_BIT, true));
    }
    Buffer* chunk = ring_[ring_index_];
    std::memcpy(chunk->mapped + ring_used_, args.data(), args.size());
    block = chunk->address + ring_used_;
    ring_used_ += need;
  }
  BeginCommand();
  fn_.vkCmdBindPipeline(cmd_, VK_PIPELINE_BIND_POINT_COMPUTE, pipeline);
  if (indirect) {
    fn_.vkCmdPushConstants(cmd_, layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, sizeof(block), &block);
  } else if (push_bytes > 0) {
    fn_.vkCmdPushConstants(cmd_, layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, push_bytes, args.data());
  }
  fn_.vkCmdDispatch(cmd_, groups[0], groups[1], groups[2]);
  ++commands_;
}

namespace {
void CheckRange(const Buffer* buf, size_t offset, size_t size, const char* what) {
  if (offset > buf->size || size > buf->size - offset) {
    TVM_FFI_THROW(RuntimeError) << "a Vulkan copy " << what << " bytes [" << offset << ", " << offset + size
                                << ") of a " << buf->size << "-byte buffer: out of range";
  }
}
}  // namespace

void Device::CopyDeviceToDevice(Buffer* from, size_t from_offset, Buffer* to, size_t to_offset, size_t size) {
  CheckRange(from, from_offset, size, "reads");
  CheckRange(to, to_offset, size, "writes");
  std::lock_guard<std::mutex> lock(mutex_);
  BeginCommand();
  VkBufferCopy region{from_offset, to_offset, size};
  fn_.vkCmdCopyBuffer(cmd_, from->buffer, to->buffer, 1, &region);
  ++commands_;
}

void Device::EnsureStaging(size_t nbytes) {
  if (staging_ != nullptr && staging_->size >= nbytes) return;
  // no recorded command uses the old one: every staged copy is flushed before returning
  if (staging_ != nullptr) Destroy(staging_);
  staging_ = nullptr;
  staging_ = Create(std::max<size_t>(nbytes, 1u << 20),
                    VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT, true);
}

void Device::CopyToDevice(const char* host, Buffer* to, size_t offset, size_t size) {
  CheckRange(to, offset, size, "writes");
  std::lock_guard<std::mutex> lock(mutex_);
  if (to->mapped != nullptr) {  // after the recorded kernels that may still read the old contents
    FlushLocked();
    std::memcpy(to->mapped + offset, host, size);
    return;
  }
  for (size_t done = 0; done < size;) {  // the copy rides on the batch's submit
    const size_t n = std::min(size - done, kStagingMax);
    EnsureStaging(n);
    std::memcpy(staging_->mapped, host + done, n);
    BeginCommand();
    VkBufferCopy region{0, offset + done, n};
    fn_.vkCmdCopyBuffer(cmd_, staging_->buffer, to->buffer, 1, &region);
    ++commands_;
    FlushLocked();
    done += n;
  }
}

void Device::CopyToHost(Buffer* from, size_t offset, char* host, size_t size) {
  CheckRange(from, offset, size, "reads");
  std::lock_guard<std::mutex> lock(mutex_);
  if (from->mapped != nullptr) {
    FlushLocked();
    std::memcpy(host, from->mapped + offset, size);
    return;
  }
  for (size_t done = 0; done < size;) {
    const size_t n = std::min(size - done, kStagingMax);
    EnsureStaging(n);
    BeginCommand();
    VkBufferCopy region{offset + done, 0, n};
    fn_.vkCmdCopyBuffer(cmd_, from->buffer, staging_->buffer, 1, &region);
    ++commands_;
    FlushLocked();
    std::memcpy(host + done, staging_->mapped, n);
    done += n;
  }
}

void Device::Flush() {
  std::lock_guard<std::mutex> lock(mutex_);
  FlushLocked();
}

void Device::FlushLocked() {
  if (!failed_.empty()) {  // a submit made by Free failed: the results the host waits for are lost
    std::string why;
    why.swap(failed_);
    TVM_FFI_THROW(RuntimeError) << why;
  }
  if (!recording_) return;
  // make every write of the batch visible to the host once the fence signals
  VkMemoryBarrier mb{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
  mb.srcAccessMask = kWriteAccess;
  mb.dstAccessMask = VK_ACCESS_HOST_READ_BIT;
  fn_.vkCmdPipelineBarrier(cmd_, kWorkStages, VK_PIPELINE_STAGE_HOST_BIT, 0, 1, &mb, 0, nullptr, 0, nullptr);
  const size_t commands = commands_;
  VkResult r = fn_.vkEndCommandBuffer(cmd_);
  const char* step = "vkEndCommandBuffer";
  if (r == VK_SUCCESS) {
    VkSubmitInfo si{VK_STRUCTURE_TYPE_SUBMIT_INFO};
    si.commandBufferCount = 1;
    si.pCommandBuffers = &cmd_;
    r = fn_.vkQueueSubmit(queue_, 1, &si, fence_);
    step = "vkQueueSubmit";
    if (r == VK_SUCCESS) {
      r = fn_.vkWaitForFences(device_, 1, &fence_, VK_TRUE, UINT64_MAX);
      step = "vkWaitForFences";
      fn_.vkResetFences(device_, 1, &fence_);
    }
  }
  fn_.vkResetCommandPool(device_, pool_, 0);
  recording_ = false;
  commands_ = 0;
  ring_index_ = ring_used_ = 0;
  deferred_bytes_ = 0;
  std::vector<std::function<void()>> done;
  done.swap(on_complete_);
  for (auto& f : done) f();
  if (r != VK_SUCCESS) {
    TVM_FFI_THROW(RuntimeError) << "vulkan:" << id_ << " (" << caps_.name << "): running " << commands
                                << " recorded kernels/copies failed in " << step << " (" << ResultName(r)
                                << "); a kernel may have read or written out of bounds";
  }
}

void Device::Release(std::function<void()> release) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (recording_) {
    on_complete_.push_back(std::move(release));
  } else {
    release();
  }
}

}  // namespace vulkan
}  // namespace speccompile
