// One generation session: a model's KV cache, the n-gram proposer and the decode loop
// of runtime/engine.py (single sequence). Plain decoding is the same loop with no drafts.
#ifndef SPECCOMPILE_CAPI_SESSION_H_
#define SPECCOMPILE_CAPI_SESSION_H_

#include <cstdint>
#include <functional>
#include <random>
#include <vector>

#include "kv_cache.h"
#include "model.h"
#include "speccompile.h"

namespace spc {

// runtime/proposers.py NGramProposer.lookup: the latest earlier occurrence of the
// longest suffix n-gram (max_n down to min_n) of `history`; the tokens that followed it.
std::vector<int32_t> NGramLookup(const std::vector<int32_t>& history, int min_n, int max_n, int64_t k);

// runtime/sampling.py probs_from_logits (float64): temperature, top-k, then top-p.
std::vector<double> ProbsFromLogits(const std::vector<float>& logits, const spc_generate_params& p);

class Session {
 public:
  Session(Model* model, const spc_session_config& cfg);
  ~Session();

  // Returns the finish reason; tokens go to `emitted` and through `on_tokens`
  // (return true from on_tokens to cancel).
  int Generate(const std::vector<int32_t>& prompt, const spc_generate_params& params,
               const std::function<bool(const int32_t*, size_t)>& on_tokens, std::vector<int32_t>* emitted);
  const spc_stats& stats() const { return stats_; }

 private:
  struct Run;
  int32_t Sample(const std::vector<float>& logits, const spc_generate_params& p);
  void Step(Run& run);
  void Emit(Run& run, const std::vector<int32_t>& tokens, bool count_decode);

  Model* model_;
  spc_session_config cfg_;
  Tensor kv_tensor_;
  PagedKV* kv_ = nullptr;
  std::mt19937_64 rng_;
  spc_stats stats_{};
  static constexpr int64_t kSeq = 0;  // the session's one sequence id in its KV cache
};

}  // namespace spc

#endif  // SPECCOMPILE_CAPI_SESSION_H_
