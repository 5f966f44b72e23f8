// A compiled model library plus its converted weights on one device: the C++ twin of
// runtime/model.py. A target (or small draft) model, or a draft head (EAGLE-1, EAGLE-3,
// Medusa: its kind is its _metadata model_type, and its entry points are that kind's). Only the TVM runtime is used (Module loader + relax VM), never the
// compiler. The library's `_metadata` is checked against tensor-cache.json before any
// weight is read, and the entry points are called with exactly the arguments
// runtime/model.py passes (embeddings, [logit positions], KV tensor, the 7 FORWARD_META
// arrays, the packed parameter tuple): the order runtime/contract.py states, which the
// library records in its _metadata and the constructor checks (contract.h).
#ifndef SPECCOMPILE_CAPI_MODEL_H_
#define SPECCOMPILE_CAPI_MODEL_H_

#include <tvm/ffi/container/array.h>
#include <tvm/ffi/extra/json.h>
#include <tvm/ffi/extra/module.h>
#include <tvm/ffi/function.h>

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "kv_cache.h"
#include "tensor_util.h"

namespace spc {

// Error classes, mapped to the C API's error codes.
struct IoError : std::runtime_error {  // missing/unreadable/truncated files
  using std::runtime_error::runtime_error;
};
struct IncompatibleError : std::runtime_error {  // library vs weights vs device mismatch
  using std::runtime_error::runtime_error;
};

// speccompile-config.json (contract::kModelConfigFile) fields the runtime needs.
struct ModelConfig {
  std::string model_type;
  int64_t context_window_size = 0;
  int64_t prefill_chunk_size = 0;
  std::set<int32_t> stop_token_ids;
};

// What Model::Forward gives at every row (flags, combined with |): runtime/model.py forward's outputs.
enum ForwardOutput { kLogits = 1, kHidden = 2, kFeatures = 4 };

struct ForwardOut {
  Tensor logits;    // [n, vocab] (with kLogits)
  Tensor hidden;    // [n, hidden] final-normed hidden states (with kHidden)
  Tensor features;  // [n, 3 * hidden] the feature_layers' outputs, low/mid/high (with kFeatures)
};

class Model {
 public:
  // device: "auto" (the library's own kind, device 0), "cpu", or "<kind>[:<id>]" with kind
  // cuda/opencl/metal/vulkan. The kind's device runtime (device_runtime.h) is loaded
  // before the library, and the parameters and KV cache are allocated on that device.
  Model(const std::string& model_dir, const std::string& lib_path, const std::string& device);

  // A KV tensor able to hold max_total_tokens (rounded up to pages) and its bookkeeping.
  void CreateKVCache(int64_t max_total_tokens, Tensor* tensor, int64_t* num_pages) const;

  // Logits [1, vocab] at the last token of `tokens` appended to seq_id (on the device).
  Tensor Prefill(PagedKV& kv, const Tensor& kv_tensor, int64_t seq_id, const std::vector<int32_t>& tokens);
  // Logits [1, vocab] of one token appended to seq_id.
  Tensor Decode(PagedKV& kv, const Tensor& kv_tensor, int64_t seq_id, int32_t token);
  // Several sequences in one call: one token each (logits [b, vocab]), or each one's tokens
  // appended (logits [b, vocab] at each one's last token).
  Tensor DecodeBatch(PagedKV& kv, const Tensor& kv_tensor, const std::vector<int64_t>& seq_ids,
                     const std::vector<int32_t>& tokens);
  Tensor PrefillBatch(PagedKV& kv, const Tensor& kv_tensor, const std::vector<int64_t>& seq_ids,
                      const std::vector<std::vector<int32_t>>& token_lists);
  // Logits [n, vocab] at every one of `tokens` appended (a chain) to seq_id.
  Tensor ForwardTokens(PagedKV& kv, const Tensor& kv_tensor, int64_t seq_id, const std::vector<int32_t>& tokens);
  // runtime/model.py forward: several tokens of seq_id in one call, the `outputs` asked for
  // (kLogits alone, or kHidden with kFeatures and/or kLogits) at every row. parents null: a
  // chain, appended (roll back with PopN); else a token tree (parents[j] = local parent row,
  // -1 for row 0) written to scratch rows, to be committed with CommitTree.
  ForwardOut Forward(PagedKV& kv, const Tensor& kv_tensor, int64_t seq_id, const std::vector<int32_t>& tokens,
                     const std::vector<int32_t>* parents, int outputs);
  // Hidden states [n, hidden] (device) -> logits [n, vocab]: the kernels the fused forwards end with.
  Tensor GetLogits(const Tensor& hidden);
  // The library's greedy acceptance kernel on device logits for `tokens` = [last] + drafts,
  // parents[j] = local parent row (-1 for row 0). Returns (accepted draft nodes, bonus token).
  std::pair<std::vector<int32_t>, int32_t> AcceptGreedy(const Tensor& logits, const std::vector<int32_t>& tokens,
                                                        const std::vector<int32_t>& parents);
  // Keep the accepted path of a verified tree (rows relative to the committed length: 0 is the
  // last committed token's row): its rows are moved into place.
  void CommitTree(PagedKV& kv, const Tensor& kv_tensor, int64_t seq_id, const std::vector<int32_t>& path);
  // Copy row `row` of device logits [n, vocab] to the host.
  std::vector<float> LogitsRow(const Tensor& logits, int64_t row) const;
  // Every row of a device tensor [n, width] to the host, as raw bytes (n * width * element size).
  static std::vector<char> ToHost(const Tensor& t);
  // Host bytes -> a new device tensor of this shape and dtype.
  Tensor Upload(const void* data, const std::vector<int64_t>& shape, DLDataType dtype) const;
  Tensor Upload(const std::vector<int32_t>& v, const std::vector<int64_t>& shape) const { return ToDevice(v, shape); }

  // A head's (or the target's) bound entry point; throws IncompatibleError naming it when the library lacks it.
  const tvm::ffi::Function& Fn(const std::string& name) const;
  bool Has(const std::string& name) const { return fn_.count(name) != 0; }
  const tvm::ffi::Array<Tensor>& params() const { return params_; }
  // A parameter by its _metadata name (e.g. a head's d2t), or throws.
  Tensor Param(const std::string& name) const;
  const tvm::ffi::json::Object& meta() const { return meta_; }
  // runtime/contract.py library_kind: "target", "eagle", "eagle3" or "medusa".
  const std::string& kind() const { return kind_; }
  const std::string& lib_path() const { return lib_path_; }
  const std::string& model_dir() const { return model_dir_; }
  int64_t hidden_size() const { return hidden_size_; }
  DLDataType dtype() const { return dtype_; }
  // The decoder layers forward's features come from (empty: the library exports none).
  const std::vector<int64_t>& feature_layers() const { return feature_layers_; }

  // Refuses out-of-range ids: the embedding kernel does not bounds-check.
  void CheckTokenIds(const int32_t* ids, size_t n) const;

  int64_t vocab_size() const { return vocab_size_; }
  // Tokens per KV page, as the library's attention kernel was compiled (_metadata kv_page_size).
  int64_t page_size() const { return page_size_; }
  const ModelConfig& config() const { return config_; }
  const std::string& metadata_json() const { return metadata_json_; }
  DLDevice device() const { return device_; }
  // Where this load read the weights: "image" (the mapped weights image) or "shards" (copied).
  const std::string& weights_from() const { return weights_from_; }

 private:
  Tensor ToDevice(const std::vector<int32_t>& v, std::vector<int64_t> shape) const;
  tvm::ffi::Any Run(const char* name, const std::vector<int32_t>& ids, const Tensor& kv_tensor, const ForwardBatch& fb,
                    const Tensor* logit_positions);
  void LoadParams(const std::string& model_dir, const std::string& index_bytes, const tvm::ffi::json::Object& index,
                  const tvm::ffi::json::Object& meta);

  DLDevice device_{kDLCPU, 0};
  ModelConfig config_;
  std::string metadata_json_, weights_from_, kind_, lib_path_, model_dir_;
  tvm::ffi::json::Object meta_;
  int64_t vocab_size_ = 0, num_layers_ = 0, kv_heads_ = 0, head_dim_ = 0, page_size_ = 0, hidden_size_ = 0;
  std::vector<int64_t> feature_layers_;
  DLDataType dtype_{kDLFloat, 32, 1};
  std::optional<tvm::ffi::Module> lib_, vm_;  // not default-constructible; set once loaded
  tvm::ffi::Array<Tensor> params_;
  std::map<std::string, tvm::ffi::Function> fn_;
};

// "float32" -> DLDataType; throws on anything unknown.
DLDataType ParseDType(const std::string& s);
// Bytes of one element.
size_t DTypeBytes(DLDataType t);
// A forward's batch metadata (the 7 FORWARD_META arrays) as device tensors, in contract order.
std::vector<Tensor> MetaTensors(const Model& model, const ForwardBatch& fb);

}  // namespace spc

#endif  // SPECCOMPILE_CAPI_MODEL_H_
