// Where drafts come from: the C++ twin of runtime/drafters/proposers.py (NGramProposer,
// SmallDraftProposer), for the session's one sequence. Same names, same decisions: at a fixed
// draft length each proposes the tokens the Python proposer proposes (tests/runtime/
// test_capi_drafts.py holds the per-request draft and acceptance counts equal).
#ifndef SPECCOMPILE_CAPI_PROPOSERS_H_
#define SPECCOMPILE_CAPI_PROPOSERS_H_

#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "../kv_cache.h"
#include "../model.h"
#include "speccompile.h"

namespace spc {

// runtime/acceptance.py Draft, as a chain: the tokens, and per token the draft's distribution
// q when it sampled them (empty: a deterministic draft, q one-hot at its token).
struct Draft {
  std::vector<int32_t> tokens;
  std::vector<std::vector<double>> probs;
};

class Proposer {
 public:
  virtual ~Proposer() = default;
  virtual void AddSequence(int64_t seq_id) = 0;
  virtual void RemoveSequence(int64_t seq_id) = 0;
  // The prefix cache took a kept sequence over: roll back to `keep` tokens of `prompt`;
  // returns how many of them this proposer's state still covers.
  virtual int64_t Resume(int64_t seq_id, const std::vector<int32_t>& prompt, int64_t keep) = 0;
  // A prompt chunk the target prefilled at `start` (the draft model prefills it too).
  virtual void Prefill(int64_t seq_id, const std::vector<int32_t>& chunk, int64_t start) = 0;
  // Up to k draft tokens continuing `history` (whose last token the target has not read yet).
  virtual Draft Propose(int64_t seq_id, const std::vector<int32_t>& history, int64_t k,
                        const spc_generate_params& sampling, std::mt19937_64& rng) = 0;
};

// runtime/drafters/proposers.py NGramProposer.lookup: the latest earlier occurrence of the longest
// suffix n-gram (max_n down to min_n) of `history`; the tokens that followed it.
std::vector<int32_t> NGramLookup(const std::vector<int32_t>& history, int min_n, int max_n, int64_t k);

class NGramProposer : public Proposer {
 public:
  NGramProposer(int min_n, int max_n) : min_n_(min_n), max_n_(max_n) {}
  void AddSequence(int64_t) override {}
  void RemoveSequence(int64_t) override {}
  int64_t Resume(int64_t, const std::vector<int32_t>&, int64_t keep) override { return keep; }
  void Prefill(int64_t, const std::vector<int32_t>&, int64_t) override {}
  Draft Propose(int64_t, const std::vector<int32_t>& history, int64_t k, const spc_generate_params&,
                std::mt19937_64&) override {
    return Draft{NGramLookup(history, min_n_, max_n_, k), {}};
  }

 private:
  int min_n_, max_n_;
};

// runtime/drafters/proposers.py SmallDraftProposer: a smaller model with the target's vocabulary drafts
// token by token. Its KV cache holds a prefix of the committed history (`cached_`); a proposal
// first feeds what it has not seen (the last token, or more after a plain stretch), then drafts.
class SmallDraftProposer : public Proposer {
 public:
  static constexpr int64_t kMaxBacklog = 256;  // proposers.py MAX_BACKLOG (one sequence: all of it)

  // `draft` must outlive the proposer; its vocabulary must be the target's.
  SmallDraftProposer(Model* draft, const Model& target, int64_t max_total_tokens);
  void AddSequence(int64_t seq_id) override;
  void RemoveSequence(int64_t seq_id) override;
  int64_t Resume(int64_t seq_id, const std::vector<int32_t>& prompt, int64_t keep) override;
  void Prefill(int64_t seq_id, const std::vector<int32_t>& chunk, int64_t start) override;
  Draft Propose(int64_t seq_id, const std::vector<int32_t>& history, int64_t k, const spc_generate_params& sampling,
                std::mt19937_64& rng) override;

 private:
  // Keep the longest prefix of the draft's cache that agrees with the committed history.
  void OnCommit(int64_t seq_id, const std::vector<int32_t>& history);

  Model* model_;
  Tensor kv_tensor_;
  std::unique_ptr<PagedKV> kv_;
  std::vector<int32_t> cached_;  // tokens in the draft's KV cache (the session has one sequence)
};

}  // namespace spc

#endif  // SPECCOMPILE_CAPI_PROPOSERS_H_
