// See params_image.h; runtime/params_image.py says why and when an image is written.
#include "params_image.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <stdexcept>

#include "json_util.h"
#include "model.h"

namespace spc {

namespace fj = tvm::ffi::json;
using tvm::ffi::Any;

// ------------------------------------------------------------------ SHA-256 (FIPS 180-4)
namespace {

constexpr uint32_t kRound[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

inline uint32_t Rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

void Compress(uint32_t h[8], const unsigned char* block) {
  uint32_t w[64];
  for (int i = 0; i < 16; ++i) {
    w[i] = (uint32_t(block[4 * i]) << 24) | (uint32_t(block[4 * i + 1]) << 16) | (uint32_t(block[4 * i + 2]) << 8) |
           uint32_t(block[4 * i + 3]);
  }
  for (int i = 16; i < 64; ++i) {
    uint32_t s0 = Rotr(w[i - 15], 7) ^ Rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
    uint32_t s1 = Rotr(w[i - 2], 17) ^ Rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
    w[i] = w[i - 16] + s0 + w[i - 7] + s1;
  }
  uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], k = h[7];
  for (int i = 0; i < 64; ++i) {
    uint32_t t1 = k + (Rotr(e, 6) ^ Rotr(e, 11) ^ Rotr(e, 25)) + ((e & f) ^ (~e & g)) + kRound[i] + w[i];
    uint32_t t2 = (Rotr(a, 2) ^ Rotr(a, 13) ^ Rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
    k = g, g = f, f = e, e = d + t1, d = c, c = b, b = a, a = t1 + t2;
  }
  h[0] += a, h[1] += b, h[2] += c, h[3] += d, h[4] += e, h[5] += f, h[6] += g, h[7] += k;
}

}  // namespace

std::string Sha256Hex(const std::string& bytes) {
  uint32_t h[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  std::string msg = bytes;
  uint64_t bits = static_cast<uint64_t>(bytes.size()) * 8;
  msg.push_back(static_cast<char>(0x80));
  while (msg.size() % 64 != 56) msg.push_back('\0');
  for (int i = 7; i >= 0; --i) msg.push_back(static_cast<char>((bits >> (8 * i)) & 0xff));
  for (size_t i = 0; i < msg.size(); i += 64) Compress(h, reinterpret_cast<const unsigned char*>(msg.data() + i));
  char out[65];
  for (int i = 0; i < 8; ++i) std::snprintf(out + 8 * i, 9, "%08x", h[i]);
  return std::string(out, 64);
}

// ------------------------------------------------------------------ the image
std::string CacheRoot() {  // runtime/tensor_cache.py cache_root
  if (const char* env = std::getenv("SPECCOMPILE_CACHE")) return env;
  const char* home = std::getenv("HOME");
  return std::string(home ? home : ".") + "/.cache/speccompile";
}

namespace {

// A read-only mapping shared by the tensors that view it; unmapped with the last of them.
struct Mapping {
  void* base = nullptr;
  size_t size = 0;
  ~Mapping() {
    if (base) munmap(base, size);
  }
};

// A tensor's "allocation": a place in the mapping (tvm-ffi's NDAlloc protocol).
struct ImageView {
  std::shared_ptr<Mapping> map;
  size_t offset;
  void AllocData(DLTensor* t) { t->data = static_cast<char*>(map->base) + offset; }
  void FreeData(DLTensor* t) { t->data = nullptr; }
};

bool Alive(const std::string& pid) {
  char* end = nullptr;
  long p = std::strtol(pid.c_str(), &end, 10);
  if (pid.empty() || *end || p <= 0) return false;
  return kill(static_cast<pid_t>(p), 0) == 0 || errno == EPERM;
}

}  // namespace

ParamsImage::ParamsImage(const std::string& model_dir, const std::string& index_bytes, const fj::Object& index,
                         const fj::Object& meta) {
  // params_image.py image_path: the tensor-cache.json bytes, each shard's size, mtime and inode,
  // the library's parameters (names, dtypes, shapes), which are tiled and the tile
  std::string key = "v" + std::to_string(kFormat) + index_bytes;
  for (const Any& s : json::GetArray(index, "records")) {
    std::string shard = json::GetString(json::AsObject(s, "shard"), "dataPath");
    struct stat st {};
    if (stat((model_dir + "/" + shard).c_str(), &st) != 0) throw IoError("shard " + model_dir + "/" + shard + " is missing");
    int64_t mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000LL + st.st_mtim.tv_nsec;
    key += shard + ":" + std::to_string(st.st_size) + ":" + std::to_string(mtime_ns) + ":" + std::to_string(st.st_ino) + ";";
  }
  size_t at = 0;
  for (const Any& p : json::GetArray(meta, "params")) {
    fj::Object po = json::AsObject(p, "param");
    Param param{json::GetString(po, "name"), json::GetIntList(po, "shape"), ParseDType(json::GetString(po, "dtype")), 0, at};
    std::string dims;
    param.nbytes = (param.dtype.bits * param.dtype.lanes + 7) / 8;
    for (int64_t d : param.shape) {
      param.nbytes *= static_cast<size_t>(d);
      dims += (dims.empty() ? "" : ",") + std::to_string(d);
    }
    key += param.name + ":" + json::GetString(po, "dtype") + ":" + dims + ";";
    at += (param.nbytes + kPage - 1) / kPage * kPage;
    params_.push_back(std::move(param));
  }
  size_ = at;
  std::vector<std::string> tiled;
  if (json::Has(meta, "tiled_params")) {
    for (const Any& t : json::GetArray(meta, "tiled_params")) tiled.push_back(json::AsString(t, "tiled_params"));
  }
  std::sort(tiled.begin(), tiled.end());
  std::string names;
  for (const std::string& t : tiled) names += (names.empty() ? "" : ",") + t;
  key += "tiled:" + names + ";tile:" + std::to_string(json::Has(meta, "tile") ? json::GetInt(meta, "tile") : 16);
  char real[PATH_MAX];
  std::string resolved = realpath(model_dir.c_str(), real) ? real : model_dir;
  dir_key_ = Sha256Hex(resolved).substr(0, 16);
  path_ = CacheRoot() + "/params/" + dir_key_ + "-" + Sha256Hex(key).substr(0, 24) + ".bin";
}

std::vector<tvm::ffi::Tensor> ParamsImage::Map() const {
  int fd = open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return {};
  struct stat st {};
  auto map = std::make_shared<Mapping>();
  if (fstat(fd, &st) == 0 && static_cast<size_t>(st.st_size) == size_ && size_ > 0) {
    void* base = mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);  // copy-on-write, as numpy's "c"
    if (base != MAP_FAILED) map->base = base, map->size = size_;
  }
  close(fd);
  if (!map->base) return {};
  std::vector<tvm::ffi::Tensor> out;
  for (const Param& p : params_) {
    out.push_back(tvm::ffi::Tensor::FromNDAlloc(ImageView{map, p.offset}, tvm::ffi::ShapeView(p.shape.data(), p.shape.size()), p.dtype,
                                                DLDevice{kDLCPU, 0}));
  }
  return out;
}

bool ParamsImage::Wanted() const {
  std::string seen = path_.substr(0, path_.size() - 4) + ".seen";
  if (access(seen.c_str(), F_OK) == 0) return true;
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path_).parent_path(), ec);
  int fd = open(seen.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  if (fd >= 0) close(fd);
  return false;
}

bool ParamsImage::Write(const std::vector<tvm::ffi::Tensor>& tensors) const {
  namespace fs = std::filesystem;
  if (tensors.size() != params_.size()) return false;
  std::string stem = fs::path(path_).stem().string();
  std::string tmp = fs::path(path_).parent_path().string() + "/" + stem + "." + std::to_string(getpid()) + ".tmp";
  std::error_code ec;
  fs::create_directories(fs::path(path_).parent_path(), ec);
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  bool ok = fd >= 0;
  for (size_t i = 0; ok && i < params_.size(); ++i) {
    const DLTensor* t = tensors[i].GetDLTensorPtr();
    const char* data = static_cast<const char*>(t->data) + t->byte_offset;
    ok = t->device.device_type == kDLCPU &&
         pwrite(fd, data, params_[i].nbytes, static_cast<off_t>(params_[i].offset)) ==
             static_cast<ssize_t>(params_[i].nbytes);
  }
  ok = ok && ftruncate(fd, static_cast<off_t>(size_)) == 0 && fsync(fd) == 0;
  if (fd >= 0) close(fd);
  if (!ok || std::rename(tmp.c_str(), path_.c_str()) != 0) {
    unlink(tmp.c_str());
    return false;
  }
  // earlier images of this model folder, and dead writers' files
  for (const auto& entry : fs::directory_iterator(fs::path(path_).parent_path(), ec)) {
    std::string name = entry.path().filename().string();
    if (name.rfind(dir_key_ + "-", 0) != 0 || entry.path().stem().string() == stem) continue;
    std::string ext = entry.path().extension().string();
    std::string writer = entry.path().stem().extension().string();  // ".<pid>" of "<stem>.<pid>.tmp"
    if (ext == ".bin" || ext == ".seen" || (ext == ".tmp" && !Alive(writer.empty() ? "" : writer.substr(1)))) {
      fs::remove(entry.path(), ec);
    }
  }
  return true;
}

}  // namespace spc
