// See model.h. Mirrors runtime/model.py: read_metadata, contract.check_library,
// check_compatible, tile_rows, Model.prefill/decode/forward_tokens/accept_greedy.
#include "model.h"

#include "params_image.h"
#include "threads.h"

#include <algorithm>
#include <cstring>
#include <fstream>

#include "contract.h"
#include "cpu_features.h"
#include "device_runtime.h"
#include "json_util.h"

namespace spc {

namespace fj = tvm::ffi::json;
using tvm::ffi::Any;
using tvm::ffi::Function;
using tvm::ffi::Module;
using tvm::ffi::String;

namespace {

std::string Join(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

std::string JoinNames(const std::vector<std::string>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + v[i];
  return s;
}

// contract.py OPTIONAL_ENTRY_POINTS: whether a library of the entry point's kind has it.
bool Present(const fj::Object& meta, const contract::EntryPoint& ep) {
  if (!*ep.present_if) return true;
  if (!json::Has(meta, ep.present_if)) return false;
  Any v = json::Get(meta, ep.present_if);
  if (v == nullptr) return false;
  if (auto a = v.try_cast<fj::Array>()) return !a->empty();
  if (auto i = v.try_cast<int64_t>()) return *i != 0;
  if (auto b = v.try_cast<bool>()) return *b;
  return true;
}

// runtime/contract.py library_kind.
std::string LibraryKind(const fj::Object& meta) {
  std::string t = json::GetString(meta, "model_type");
  return t == "eagle" || t == "eagle3" || t == "medusa" ? t : "target";
}

// runtime/contract.py check_library, for what the C API uses: the page size is present
// (its value is then used, see kv_cache.h) and every entry point it calls exists and takes
// its arguments in the order Model::Run passes them. Same words as the Python runtime.
void CheckContract(const fj::Object& meta, const std::string& kind, const std::string& lib_path) {
  std::string older = ": it was built by an older speccompile; " + std::string(contract::kRebuild);
  if (!json::Has(meta, contract::kPageSizeKey)) {
    throw IncompatibleError(lib_path + " lacks " + contract::kPageSizeKey + " in its _metadata" + older);
  }
  if (json::GetInt(meta, contract::kPageSizeKey) <= 0) {
    throw IncompatibleError(lib_path + " records a KV page size of " +
                            std::to_string(json::GetInt(meta, contract::kPageSizeKey)) + "; " + contract::kRebuild);
  }
  auto exported = json::Get(meta, contract::kEntryPointsKey).try_cast<fj::Object>();
  if (!exported) {
    throw IncompatibleError(lib_path + " does not record its entry points' arguments" + older);
  }
  for (const contract::EntryPoint& ep : contract::CapiEntryPoints()) {
    if (ep.kind != kind || !Present(meta, ep)) continue;
    if (!json::Has(*exported, ep.name)) {
      throw IncompatibleError(lib_path + " lacks the entry point '" + ep.name + "'" + older);
    }
    std::vector<std::string> takes;
    for (const Any& a : json::GetArray(*exported, ep.name)) takes.push_back(json::AsString(a, ep.name));
    if (takes != ep.args) {
      throw IncompatibleError(lib_path + "'s entry point " + ep.name + " takes (" + JoinNames(takes) +
                              "), this runtime passes (" + JoinNames(ep.args) + "); " + contract::kRebuild);
    }
  }
}

// A device string as the Python runtime reads one (runtime/device.py parse_device, run
// time): "auto" (the library's own kind, device 0), or cpu/cuda/opencl/metal/vulkan with
// an optional ":<id>". The kind is spelled as _metadata's "target" ("llvm" for the CPU).
struct DeviceRequest {
  std::string text, kind;
  int id = 0;
};

DeviceRequest ParseDevice(const std::string& spec) {
  DeviceRequest req;
  req.text = spec;
  std::string name = spec, id;
  auto colon = spec.find(':');
  if (colon != std::string::npos) {
    name = spec.substr(0, colon);
    id = spec.substr(colon + 1);
  }
  static const std::map<std::string, std::string> kinds = {
      {"auto", "auto"}, {"cpu", "llvm"}, {"llvm", "llvm"}, {"cuda", "cuda"},
      {"opencl", "opencl"}, {"metal", "metal"}, {"vulkan", "vulkan"}};
  auto it = kinds.find(name);
  bool bad_id = colon != std::string::npos &&
                (id.empty() || id.size() > 6 || id.find_first_not_of("0123456789") != std::string::npos);
  if (it == kinds.end() || bad_id) {
    throw std::invalid_argument("unknown device '" + spec + "': use auto, cpu, cuda, opencl, metal or vulkan, "
                                "optionally with a device index (cuda:1)");
  }
  req.kind = it->second;
  req.id = id.empty() ? 0 : std::stoi(id);
  if (req.kind == "auto" && colon != std::string::npos) {
    throw std::invalid_argument("device '" + spec + "': auto takes no index (write opencl:1, cuda:1, ...)");
  }
  if (req.kind == "llvm" && req.id != 0) {
    throw std::invalid_argument("device '" + spec + "': the CPU is a single device; write cpu (or cpu:0)");
  }
  return req;
}

// runtime/model.py resolve_device: the library's own kind, at the index asked for; a
// kind other than the library's is refused by name (same words as the Python runtime).
DLDevice ResolveDevice(const DeviceRequest& req, const fj::Object& meta, const std::string& lib_path) {
  std::string target = json::GetString(meta, "target");
  if (req.kind != "auto" && req.kind != target) {
    if (req.kind == "llvm") {
      throw IncompatibleError(lib_path + " was built for " + DeviceHint(meta) + ", not for this CPU; "
                              "compile with --device llvm");
    }
    throw IncompatibleError("device '" + req.text + "': " + lib_path + " was built for " + DeviceHint(meta) +
                            "; run it with device '" + (target == "llvm" ? std::string("cpu") : target) +
                            "' or compile it for " + req.kind);
  }
  static const std::map<std::string, DLDeviceType> types = {
      {"llvm", kDLCPU}, {"cuda", kDLCUDA}, {"opencl", kDLOpenCL}, {"metal", kDLMetal}, {"vulkan", kDLVulkan}};
  auto it = types.find(target);
  if (it == types.end()) {
    throw IncompatibleError(lib_path + " was built for " + DeviceHint(meta) + ", which the C API cannot run on "
                            "(compile for llvm, cuda or opencl)");
  }
  return DLDevice{it->second, req.id};
}

// The runtime of the library's kind must be in the process before its kernels can load.
void PrepareDeviceRuntime(const fj::Object& meta, const std::string& lib_path) {
  try {
    EnsureDeviceRuntime(json::GetString(meta, "target"));
  } catch (const DeviceRuntimeError& e) {
    throw IoError(lib_path + " was built for " + DeviceHint(meta) + ": " + e.what());
  }
}

// runtime/model.py tile_rows: [N, C] -> the same buffer holding [N/tile, C, tile], so the
// CPU GEMV kernels read `tile` output rows per contiguous run (kernels/cpu_matmul.py).
std::vector<char> TileRows(const std::vector<char>& src, int64_t n, int64_t c, int64_t tile, size_t esz) {
  std::vector<char> dst(src.size());
  for (int64_t blk = 0; blk < n / tile; ++blk)
    for (int64_t t = 0; t < tile; ++t)
      for (int64_t j = 0; j < c; ++j)
        std::memcpy(&dst[((blk * c + j) * tile + t) * esz], &src[((blk * tile + t) * c + j) * esz], esz);
  return dst;
}

Module MakeVM(const Module& lib, DLDevice dev) {
  auto load = lib->GetFunction("vm_load_executable");
  if (!load) throw IncompatibleError("the library holds no relax VM executable; build it with `speccompile compile`");
  Module vm = (*load)().cast<Module>();
  Function init = vm->GetFunction("vm_initialization").value();
  constexpr int kPooledAllocator = 2;  // tvm.runtime.vm.VirtualMachine.POOLED_ALLOCATOR
  if (dev.device_type == kDLCPU) {
    init(static_cast<int>(kDLCPU), dev.device_id, kPooledAllocator);
  } else {  // the CPU runs the shape functions, as the Python VirtualMachine sets up
    init(static_cast<int>(dev.device_type), dev.device_id, kPooledAllocator, static_cast<int>(kDLCPU), 0,
         kPooledAllocator);
  }
  return vm;
}

}  // namespace

size_t DTypeBytes(DLDataType t) { return (static_cast<size_t>(t.bits) * t.lanes + 7) / 8; }

DLDataType ParseDType(const std::string& s) {
  struct P { const char* prefix; uint8_t code; };
  static const P kPrefixes[] = {{"bfloat", kDLBfloat}, {"float", kDLFloat}, {"uint", kDLUInt}, {"int", kDLInt}};
  for (const P& p : kPrefixes) {
    size_t len = std::strlen(p.prefix);
    if (s.compare(0, len, p.prefix) == 0 && s.size() > len &&
        s.find_first_not_of("0123456789", len) == std::string::npos) {
      return DLDataType{p.code, static_cast<uint8_t>(std::stoi(s.substr(len))), 1};
    }
  }
  if (s == "bool") return DLDataType{kDLBool, 8, 1};
  throw std::invalid_argument("unsupported dtype '" + s + "'");
}

Model::Model(const std::string& model_dir, const std::string& lib_path, const std::string& device) {
  DeviceRequest request = ParseDevice(device);
  ConfigureThreads();  // before any kernel: TVM's CPU pool reads TVM_NUM_THREADS once, when it is made
  // ---- speccompile-config.json and tensor-cache.json (cheap checks before any dlopen)
  fj::Object index, cfg;
  std::string index_bytes;  // as read: the weights image's key hashes them (params_image.h)
  try {
    cfg = json::AsObject(json::ParseFile(model_dir + "/" + contract::kModelConfigFile), contract::kModelConfigFile);
    index_bytes = json::ReadFile(model_dir + "/" + contract::kTensorCacheFile);
    index = json::AsObject(json::Parse(index_bytes, contract::kTensorCacheFile), contract::kTensorCacheFile);
  } catch (const std::runtime_error& e) {
    throw IoError(std::string(e.what()) + " (convert the weights with `speccompile convert_weight` and "
                  "`speccompile gen_config` into " + model_dir + ")");
  }
  config_.model_type = json::GetString(cfg, "model_type");
  config_.context_window_size = json::GetInt(cfg, "context_window_size");
  config_.prefill_chunk_size = json::Has(cfg, "prefill_chunk_size") ? json::GetInt(cfg, "prefill_chunk_size") : 2048;
  for (int64_t t : json::GetIntOrList(cfg, "stop_token_ids")) config_.stop_token_ids.insert(static_cast<int32_t>(t));
  // ---- the library and its _metadata (read on a CPU VM, as runtime/model.py does)
  const std::string kSystem = "system://";
  std::optional<fj::Object> baked;  // _metadata from the file's bytes, before loading it
  if (lib_path.compare(0, kSystem.size(), kSystem) == 0) {
    // Objects linked into the app (iOS forbids dlopen of app code): the library was
    // compiled as a TVM system library whose symbols register themselves at startup.
    // Its device runtime is normally linked in too (a no-op then); there is no file to
    // read the kind from, so an explicit device names it.
    if (request.kind != "auto" && request.kind != "llvm") {
      try {
        EnsureDeviceRuntime(request.kind);
      } catch (const DeviceRuntimeError& e) {
        throw IoError(e.what());
      }
    }
    auto system_lib = Function::GetGlobal("ffi.SystemLib");
    if (!system_lib) throw IncompatibleError("this TVM runtime has no ffi.SystemLib");
    lib_ = (*system_lib)(String(lib_path.substr(kSystem.size()))).cast<Module>();
  } else {
    if (!std::ifstream(lib_path)) throw IoError("model library " + lib_path + " not found: build it with `speccompile compile`");
    baked = BakedMetadata(lib_path);
    if (baked) {  // refuse what cannot run here before the library is even opened
      ResolveDevice(request, *baked, lib_path);
      CheckCpuFeatures(*baked, lib_path);
      PrepareDeviceRuntime(*baked, lib_path);
    }
    try {
      // dlopen reads a name without '/' as a library to search for, not a file here
      lib_ = Module::LoadFromFile(lib_path.find('/') == std::string::npos ? "./" + lib_path : lib_path);
    } catch (const tvm::ffi::Error& e) {
      throw IoError("cannot load " + lib_path + ": " + e.message());
    }
  }
  Module cpu_vm = MakeVM(*lib_, DLDevice{kDLCPU, 0});
  auto meta_fn = cpu_vm->GetFunction("_metadata");
  if (!meta_fn) throw IncompatibleError(lib_path + " has no speccompile _metadata; it was not built by `speccompile compile`");
  metadata_json_ = std::string((*meta_fn)().cast<String>());
  fj::Object meta = json::AsObject(json::Parse(metadata_json_, "_metadata"), "_metadata");
  // ---- the device: the library's kind (the loaded copy of _metadata is authoritative)
  device_ = ResolveDevice(request, meta, lib_path);
  // ---- without a baked copy (a system library), the checks made before loading happen now:
  // runtime/cpu.py check_cpu_features, and the device runtime (a no-op where linked in)
  if (!baked) {
    CheckCpuFeatures(meta, lib_path);
    PrepareDeviceRuntime(meta, lib_path);
  }
  if (!DeviceExists(device_)) {
    std::string target = json::GetString(meta, "target");
    std::string which = device_.device_id ? target + ":" + std::to_string(device_.device_id) : target;
    std::string hint = target == "opencl" ? " (install an OpenCL driver for it; PoCL gives a CPU device: "
                                            "apt-get install pocl-opencl-icd)"
                       : target == "cuda" ? " (check nvidia-smi and CUDA_VISIBLE_DEVICES)"
                                          : "";
    throw IncompatibleError(lib_path + " was built for " + DeviceHint(meta) + ", but no " + which +
                            " device is visible on this machine" + hint);
  }
  // ---- runtime/contract.py: page size recorded, entry points with the arguments we pass
  kind_ = LibraryKind(meta);
  CheckContract(meta, kind_, lib_path);
  if (json::GetString(meta, "model_type") != config_.model_type) {
    throw IncompatibleError("model library and config disagree on the model type");
  }
  // ---- runtime/model.py check_compatible: refuse a library compiled for other weights
  fj::Object tmeta = json::Has(index, "metadata") ? json::GetObject(index, "metadata") : fj::Object();
  std::string fp = json::GetString(meta, "layout_fingerprint");
  if (!json::Has(tmeta, "layout_fingerprint") || json::GetString(tmeta, "layout_fingerprint") != fp) {
    std::map<std::string, std::pair<std::vector<int64_t>, std::string>> have;
    for (const Any& shard : json::GetArray(index, "records"))
      for (const Any& r : json::GetArray(json::AsObject(shard, "shard"), "records")) {
        fj::Object rec = json::AsObject(r, "record");
        have[json::GetString(rec, "name")] = {json::GetIntList(rec, "shape"), json::GetString(rec, "dtype")};
      }
    std::string detail = "layout fingerprint differs";
    for (const Any& p : json::GetArray(meta, "params")) {
      fj::Object po = json::AsObject(p, "param");
      std::string name = json::GetString(po, "name");
      auto shape = json::GetIntList(po, "shape");
      std::string dtype = json::GetString(po, "dtype");
      auto it = have.find(name);
      if (it == have.end()) { detail = "the library needs " + name + ", absent from the weights"; break; }
      if (it->second.first != shape || it->second.second != dtype) {
        detail = name + ": library expects " + Join(shape) + " " + dtype + ", weights have " +
                 Join(it->second.first) + " " + it->second.second;
        break;
      }
    }
    throw IncompatibleError(lib_path + " was compiled for other weights (" + json::GetString(meta, "model_type") + " " +
                            json::GetString(meta, "quantization") + ") than " + model_dir + ": " + detail +
                            ". Recompile with `speccompile compile <model_dir>/speccompile-config.json`.");
  }
  vm_ = device_.device_type == kDLCPU ? cpu_vm : MakeVM(*lib_, device_);
  vocab_size_ = json::GetInt(meta, "vocab_size");
  num_layers_ = json::GetInt(meta, "num_hidden_layers");
  kv_heads_ = json::GetInt(meta, "num_key_value_heads");
  head_dim_ = json::GetInt(meta, "head_dim");
  page_size_ = json::GetInt(meta, contract::kPageSizeKey);
  dtype_ = ParseDType(json::GetString(meta, "model_dtype"));
  hidden_size_ = json::GetInt(meta, "hidden_size");
  if (kind_ == "target" && json::Has(meta, "feature_layers") && json::Get(meta, "feature_layers") != nullptr) {
    feature_layers_ = json::GetIntList(meta, "feature_layers");
  }
  meta_ = meta;
  lib_path_ = lib_path;
  model_dir_ = model_dir;
  for (const contract::EntryPoint& ep : contract::CapiEntryPoints()) {
    if (ep.kind != kind_ || !Present(meta, ep)) continue;
    auto f = (*vm_)->GetFunction(ep.name);
    if (!f) {
      throw IncompatibleError(lib_path + " lists the entry point '" + ep.name + "' in its _metadata but does not "
                              "export it; recompile it with `speccompile compile`");
    }
    fn_[ep.name] = *f;
  }
  LoadParams(model_dir, index_bytes, index, meta);
}

void Model::LoadParams(const std::string& model_dir, const std::string& index_bytes, const fj::Object& index,
                       const fj::Object& meta) {
  // runtime/model.py _load_params: on the CPU, views of the weights' image where one is valid
  // (mapped, not copied), else copied out of the shards (and, the second time, written as the image)
  std::optional<ParamsImage> image;
  if (device_.device_type == kDLCPU) {
    image.emplace(model_dir, index_bytes, index, meta);
    std::vector<Tensor> views = image->Map();
    if (!views.empty()) {
      params_ = tvm::ffi::Array<Tensor>(views.begin(), views.end());
      weights_from_ = "image";
      return;
    }
  }
  weights_from_ = "shards";
  struct Rec { std::string shard; int64_t offset, nbytes; };
  std::map<std::string, Rec> by_name;
  for (const Any& s : json::GetArray(index, "records")) {
    fj::Object shard = json::AsObject(s, "shard");
    std::string path = json::GetString(shard, "dataPath");
    for (const Any& r : json::GetArray(shard, "records")) {
      fj::Object rec = json::AsObject(r, "record");
      by_name[json::GetString(rec, "name")] = {path, json::GetInt(rec, "byteOffset"), json::GetInt(rec, "nbytes")};
    }
  }
  std::set<std::string> tiled;
  if (json::Has(meta, "tiled_params"))
    for (const Any& t : json::GetArray(meta, "tiled_params")) tiled.insert(json::AsString(t, "tiled_params"));
  int64_t tile = json::Has(meta, "tile") ? json::GetInt(meta, "tile") : 16;
  std::map<std::string, std::ifstream> files;
  std::vector<Tensor> params;
  for (const Any& p : json::GetArray(meta, "params")) {
    fj::Object po = json::AsObject(p, "param");
    std::string name = json::GetString(po, "name");
    std::vector<int64_t> shape = json::GetIntList(po, "shape");
    DLDataType dt = ParseDType(json::GetString(po, "dtype"));
    auto it = by_name.find(name);
    if (it == by_name.end()) throw IoError(model_dir + " lacks parameter " + name);
    const Rec& rec = it->second;
    size_t expect = DTypeBytes(dt);
    for (int64_t d : shape) expect *= static_cast<size_t>(d);
    if (static_cast<size_t>(rec.nbytes) != expect) {
      throw IoError("tensor-cache.json record " + name + " has " + std::to_string(rec.nbytes) + " bytes, its shape needs " +
                    std::to_string(expect) + "; re-run convert_weight");
    }
    std::string path = model_dir + "/" + rec.shard;
    auto f = files.find(rec.shard);
    if (f == files.end()) {
      f = files.emplace(rec.shard, std::ifstream(path, std::ios::binary)).first;
      if (!f->second) throw IoError("shard " + path + " is missing; re-run convert_weight");
    }
    std::vector<char> buf(expect);
    f->second.clear();
    f->second.seekg(rec.offset);
    f->second.read(buf.data(), static_cast<std::streamsize>(expect));
    if (static_cast<size_t>(f->second.gcount()) != expect) {
      throw IoError("shard " + path + " is truncated (" + name + " needs bytes up to " +
                    std::to_string(rec.offset + rec.nbytes) + "); re-run convert_weight");
    }
    if (tiled.count(name)) {
      if (shape.size() != 2 || shape[0] % tile != 0) throw IncompatibleError("cannot tile parameter " + name);
      buf = TileRows(buf, shape[0], shape[1], tile, DTypeBytes(dt));
    }
    Tensor t = EmptyTensor(shape, dt, device_);
    CopyFromBytes(t, buf.data(), buf.size());
    params.push_back(t);
  }
  params_ = tvm::ffi::Array<Tensor>(params.begin(), params.end());
  if (image && image->Wanted()) image->Write(params);  // loaded before: the next process maps them
}

void Model::CreateKVCache(int64_t max_total_tokens, Tensor* tensor, int64_t* num_pages) const {
  *num_pages = (max_total_tokens + page_size_ - 1) / page_size_;
  *tensor = EmptyTensor({num_layers_, 2, *num_pages * page_size_, kv_heads_, head_dim_}, dtype_, device_);
}

void Model::CheckTokenIds(const int32_t* ids, size_t n) const {
  for (size_t i = 0; i < n; ++i)
    if (ids[i] < 0 || ids[i] >= vocab_size_) {
      throw std::invalid_argument("token id " + std::to_string(ids[i]) + " is out of range for vocab size " +
                                  std::to_string(vocab_size_));
    }
}

Tensor Model::ToDevice(const std::vector<int32_t>& v, std::vector<int64_t> shape) const {
  Tensor t = EmptyTensor(shape, DLDataType{kDLInt, 32, 1}, device_);
  if (!v.empty()) CopyFromBytes(t, v.data(), v.size() * sizeof(int32_t));
  return t;
}

std::vector<Tensor> MetaTensors(const Model& model, const ForwardBatch& fb) {
  int64_t n = static_cast<int64_t>(fb.positions.size());
  return {model.Upload(fb.positions, {n}), model.Upload(fb.write_slots, {n}),
          model.Upload(fb.page_table, {fb.pt_rows, fb.pt_cols}), model.Upload(fb.token_seq, {n}),
          model.Upload(fb.token_prefix, {n}), model.Upload(fb.extra_slots, {n, fb.extra_cols}),
          model.Upload(fb.extra_len, {n})};
}

Any Model::Run(const char* name, const std::vector<int32_t>& ids, const Tensor& kv_tensor, const ForwardBatch& fb,
               const Tensor* logit_positions) {
  // ids were range-checked by the caller before the KV cache was touched
  int64_t n = static_cast<int64_t>(ids.size());
  Any emb = fn_["embed"](ToDevice(ids, {n}), params_);
  std::vector<Tensor> m = MetaTensors(*this, fb);
  return logit_positions ? fn_[name](emb, *logit_positions, kv_tensor, m[0], m[1], m[2], m[3], m[4], m[5], m[6], params_)
                         : fn_[name](emb, kv_tensor, m[0], m[1], m[2], m[3], m[4], m[5], m[6], params_);
}

Tensor Model::Prefill(PagedKV& kv, const Tensor& kv_tensor, int64_t seq_id, const std::vector<int32_t>& tokens) {
  CheckTokenIds(tokens.data(), tokens.size());
  ForwardBatch fb = kv.PlanChain({seq_id}, {static_cast<int64_t>(tokens.size())});
  Tensor last = ToDevice({static_cast<int32_t>(tokens.size() - 1)}, {1});
  return Run("prefill", tokens, kv_tensor, fb, &last).cast<Tensor>();
}

Tensor Model::Decode(PagedKV& kv, const Tensor& kv_tensor, int64_t seq_id, int32_t token) {
  CheckTokenIds(&token, 1);
  return Run("decode", {token}, kv_tensor, kv.PlanChain({seq_id}, {1}), nullptr).cast<Tensor>();
}

Tensor Model::DecodeBatch(PagedKV& kv, const Tensor& kv_tensor, const std::vector<int64_t>& seq_ids,
                          const std::vector<int32_t>& tokens) {
  CheckTokenIds(tokens.data(), tokens.size());
  return Run("decode", tokens, kv_tensor, kv.PlanChain(seq_ids, std::vector<int64_t>(seq_ids.size(), 1)), nullptr)
      .cast<Tensor>();
}

Tensor Model::PrefillBatch(PagedKV& kv, const Tensor& kv_tensor, const std::vector<int64_t>& seq_ids,
                           const std::vector<std::vector<int32_t>>& token_lists) {
  std::vector<int32_t> flat, last;
  std::vector<int64_t> counts;
  for (const auto& t : token_lists) {
    flat.insert(flat.end(), t.begin(), t.end());
    counts.push_back(static_cast<int64_t>(t.size()));
    last.push_back(static_cast<int32_t>(flat.size() - 1));
  }
  CheckTokenIds(flat.data(), flat.size());
  ForwardBatch fb = kv.PlanChain(seq_ids, counts);
  Tensor positions = ToDevice(last, {static_cast<int64_t>(last.size())});
  return Run("prefill", flat, kv_tensor, fb, &positions).cast<Tensor>();
}

Tensor Model::ForwardTokens(PagedKV& kv, const Tensor& kv_tensor, int64_t seq_id, const std::vector<int32_t>& tokens) {
  CheckTokenIds(tokens.data(), tokens.size());
  ForwardBatch fb = kv.PlanChain({seq_id}, {static_cast<int64_t>(tokens.size())});
  return Run("forward_tokens", tokens, kv_tensor, fb, nullptr).cast<Tensor>();
}

ForwardOut Model::Forward(PagedKV& kv, const Tensor& kv_tensor, int64_t seq_id, const std::vector<int32_t>& tokens,
                          const std::vector<int32_t>* parents, int outputs) {
  // runtime/model.py OUTPUTS: what one multi-token forward gives, and the entry point that gives it
  const char* entry = outputs == kLogits                          ? "forward_tokens"
                      : outputs == kHidden || outputs == (kHidden | kLogits) ? "forward_tokens_hidden"
                      : outputs == (kHidden | kFeatures) || outputs == (kHidden | kFeatures | kLogits)
                          ? "forward_tokens_features"
                          : nullptr;
  if (!entry) throw std::invalid_argument("a forward gives logits, hidden (+ features) (+ logits)");
  if (!fn_.count(entry)) {
    throw IncompatibleError(lib_path_ + " exports no " + entry + " (it was built before " +
                            ((outputs & kFeatures) ? "EAGLE-3" : "draft head") + " support): " + contract::kRebuild);
  }
  CheckTokenIds(tokens.data(), tokens.size());
  ForwardBatch fb = parents ? kv.PlanTree({seq_id}, {*parents}) : kv.PlanChain({seq_id}, {static_cast<int64_t>(tokens.size())});
  Any out = Run(entry, tokens, kv_tensor, fb, nullptr);
  ForwardOut got;
  if (outputs & kFeatures) {
    auto tuple = out.cast<tvm::ffi::Array<Any>>();
    got.hidden = tuple[0].cast<Tensor>();
    got.features = tuple[1].cast<Tensor>();
  } else if (outputs & kHidden) {
    got.hidden = out.cast<Tensor>();
  } else {
    got.logits = out.cast<Tensor>();
  }
  if ((outputs & kLogits) && (outputs & kHidden)) got.logits = GetLogits(got.hidden);
  return got;
}

Tensor Model::GetLogits(const Tensor& hidden) { return fn_.at("get_logits")(hidden, params_).cast<Tensor>(); }

void Model::CommitTree(PagedKV& kv, const Tensor& kv_tensor, int64_t seq_id, const std::vector<int32_t>& path) {
  auto moves = kv.TreeCommitMoves(seq_id, path);
  if (moves.first.empty()) return;
  int64_t n = static_cast<int64_t>(moves.first.size());
  fn_.at("copy_kv_slots")(kv_tensor, ToDevice(moves.first, {n}), ToDevice(moves.second, {n}));
}

std::vector<char> Model::ToHost(const Tensor& t) {
  const DLTensor* d = t.GetDLTensorPtr();
  size_t bytes = DTypeBytes(d->dtype);
  for (int i = 0; i < d->ndim; ++i) bytes *= static_cast<size_t>(d->shape[i]);
  std::vector<char> out(bytes);
  if (bytes) CopyToBytes(t, out.data(), bytes);
  return out;
}

Tensor Model::Upload(const void* data, const std::vector<int64_t>& shape, DLDataType dtype) const {
  Tensor t = EmptyTensor(shape, dtype, device_);
  size_t bytes = DTypeBytes(dtype);
  for (int64_t d : shape) bytes *= static_cast<size_t>(d);
  if (bytes) CopyFromBytes(t, data, bytes);
  return t;
}

const Function& Model::Fn(const std::string& name) const {
  auto it = fn_.find(name);
  if (it == fn_.end()) throw IncompatibleError(lib_path_ + " exports no " + name + "; " + contract::kRebuild);
  return it->second;
}

Tensor Model::Param(const std::string& name) const {
  int64_t i = 0;
  for (const Any& p : json::GetArray(meta_, "params")) {
    if (json::GetString(json::AsObject(p, "param"), "name") == name) return params_[i];
    ++i;
  }
  throw IncompatibleError(lib_path_ + " has no parameter " + name);
}

std::pair<std::vector<int32_t>, int32_t> Model::AcceptGreedy(const Tensor& logits, const std::vector<int32_t>& tokens,
                                                             const std::vector<int32_t>& parents) {
  int64_t n = static_cast<int64_t>(tokens.size());
  Tensor out = fn_["accept_greedy"](logits, ToDevice(tokens, {n}), ToDevice(parents, {n}),
                                    ToDevice({0, static_cast<int32_t>(n)}, {2}))
                   .cast<Tensor>();
  // [b + 1, n + 2]: per sequence, the accepted count, the bonus token, then the accepted nodes
  std::vector<int32_t> host(static_cast<size_t>(2 * (n + 2)));
  CopyToBytes(out, host.data(), host.size() * sizeof(int32_t));
  return {std::vector<int32_t>(host.begin() + 2, host.begin() + 2 + host[0]), host[1]};
}

std::vector<float> Model::LogitsRow(const Tensor& logits, int64_t row) const {
  int64_t rows = logits.GetDLTensorPtr()->shape[0];
  std::vector<float> all(static_cast<size_t>(rows * vocab_size_));
  CopyToBytes(logits, all.data(), all.size() * sizeof(float));
  return std::vector<float>(all.begin() + row * vocab_size_, all.begin() + (row + 1) * vocab_size_);
}

}  // namespace spc
