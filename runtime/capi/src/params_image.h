// runtime/params_image.py in C++: a model's CPU weights as one file a process maps instead of
// copying them out of the shards. The same file, found by the same key, so that the Python
// runtime and an app embedding the C API share one image of a model: either may write it (the
// second process that loads the same weights and library layout does), both map it.
#ifndef SPECCOMPILE_CAPI_PARAMS_IMAGE_H_
#define SPECCOMPILE_CAPI_PARAMS_IMAGE_H_

#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/extra/json.h>

#include <cstdint>
#include <string>
#include <vector>

namespace spc {

// SHA-256 of bytes, as lowercase hex (hashlib.sha256(...).hexdigest()).
std::string Sha256Hex(const std::string& bytes);
// runtime/tensor_cache.py cache_root: $SPECCOMPILE_CACHE, else ~/.cache/speccompile.
std::string CacheRoot();

class ParamsImage {
 public:
  struct Param {
    std::string name;
    std::vector<int64_t> shape;
    DLDataType dtype;
    size_t nbytes, offset;  // offsets at PAGE boundaries, in the library's order
  };

  // index_bytes: tensor-cache.json as read; meta: the library's _metadata (its params, tiling).
  ParamsImage(const std::string& model_dir, const std::string& index_bytes, const tvm::ffi::json::Object& index,
              const tvm::ffi::json::Object& meta);
  const std::string& path() const { return path_; }
  const std::vector<Param>& params() const { return params_; }

  // Views of the mapped image (copy-on-write), one CPU tensor per parameter, or empty when
  // there is no image of the expected size.
  std::vector<tvm::ffi::Tensor> Map() const;
  // Whether to write the image now: an earlier process loaded the same weights (its marker is
  // there); else leave the marker. Best effort.
  bool Wanted() const;
  // Write the parameters (CPU tensors, tiled as the kernels read them), synced and renamed into
  // place; older images of the model folder are removed. Best effort: false if it failed.
  bool Write(const std::vector<tvm::ffi::Tensor>& params) const;

  static constexpr int kFormat = 2;  // params_image.py FORMAT
  static constexpr size_t kPage = 4096;

 private:
  std::string path_, dir_key_;
  std::vector<Param> params_;
  size_t size_ = 0;  // the file's size
};

}  // namespace spc

#endif  // SPECCOMPILE_CAPI_PARAMS_IMAGE_H_
