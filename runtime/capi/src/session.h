// One generation session: a model's KV cache, the mode's proposer and the decode loop of
// runtime/engine.py (single sequence). Plain decoding is the same loop with no drafts.
#ifndef SPECCOMPILE_CAPI_SESSION_H_
#define SPECCOMPILE_CAPI_SESSION_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "adaptive.h"
#include "kv_cache.h"
#include "model.h"
#include "drafters/proposers.h"
#include "metrics.h"
#include "speccompile.h"
#include "tokenizer.h"

namespace spc {

// How many leading tokens a and b have in common (prefix_cache.py shared_prefix).
size_t SharedPrefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b);

// runtime/sequence.py find_stop: where the earliest stop string begins in text, or npos.
size_t FindStop(const std::string& text, const std::vector<std::string>& stop);

// One generation: runtime/engine.py generate's arguments.
struct Request {
  std::vector<int32_t> prompt;
  spc_generate_params params{};
  std::vector<std::string> stop;          // stop strings: matched on the text, so they need a tokenizer
  std::vector<int32_t> logit_bias_tokens;  // params' logit bias, copied (params' pointers are not kept)
  std::vector<float> logit_bias;
  const Tokenizer* tokenizer = nullptr;   // text out (deltas and the final text); null: ids only
  // After each step: its tokens and its text delta; returning true cancels the generation.
  std::function<bool(const int32_t*, size_t, const std::string&)> on_step;
};

// runtime/sequence.py GenerationResult.
struct Result {
  std::vector<int32_t> prompt_token_ids;
  std::vector<int32_t> token_ids;
  std::string text;  // the streamed text, cut before a stop string
  int finish_reason = SPC_FINISH_NONE;
};

class Session {
 public:
  // additional: the draft model or head the mode drafts with (it must outlive the session), else null.
  Session(Model* model, const spc_session_config& cfg, Model* additional = nullptr);
  ~Session();

  // Returns the finish reason.
  int Generate(const Request& request, Result* result);
  const spc_stats& stats() const { return stats_; }

 private:
  struct Run;
  // The prefix cache (runtime/prefix_cache.py) for the session's one sequence: the last
  // generation's KV is kept, and a prompt sharing at least kMinReuse leading tokens with it
  // prefills only the rest. Returns the prompt tokens whose KV is reused.
  size_t TakeKept(const std::vector<int32_t>& prompt);
  void Keep(const Run& run);
  void Free();  // the sequence's KV and its proposer's state
  void Step(Run& run);
  // engine.py _propose/_forward/_accept/_commit for the session's sequence.
  // (the draft as the plan keeps it, draft forwards run); plan: the step's, when it drafted
  std::pair<Draft, int64_t> Propose(Run& run, std::optional<StepPlan>* plan);
  ForwardOut Verify(Run& run, Draft& draft);
  std::pair<std::vector<int32_t>, int32_t> Accept(Run& run, const Draft& draft, const Tensor& logits);
  void Commit(Run& run, const Draft& draft, const std::vector<int32_t>& path, const ForwardOut& out);
  // Hand the target's features of rows `rows` of out (the proposer's kind) to the proposer.
  void Observe(int64_t position, const ForwardOut& out, const std::vector<int32_t>& rows);
  // Returns the tokens kept (a stop, EOS or the budget may cut them).
  int64_t Emit(Run& run, const std::vector<int32_t>& tokens, bool count_decode);

  Model* model_;
  spc_session_config cfg_;
  Tensor kv_tensor_;
  PagedKV* kv_ = nullptr;
  std::unique_ptr<Proposer> proposer_;  // null: plain decoding
  int features_ = 0;                    // what the target's forwards return for the proposer (ForwardOutput flags)
  std::unique_ptr<CostModel> cost_;     // with a proposer: what forwards cost here (costs.h)
  std::unique_ptr<Policy> policy_;      // ...and how much to draft (adaptive.h)
  std::mt19937_64 rng_;
  spc_stats stats_{};
  SpecMetrics spec_;  // the current generation's speculation counts (runtime/metrics.py)
  std::vector<int32_t> kept_;  // the tokens the kept sequence's KV holds (empty: none kept)
  static constexpr int64_t kSeq = 0;  // the session's one sequence id in its KV cache
  static constexpr size_t kMinReuse = 16;  // prefix_cache.py MIN_REUSE
};

}  // namespace spc

#endif  // SPECCOMPILE_CAPI_SESSION_H_
