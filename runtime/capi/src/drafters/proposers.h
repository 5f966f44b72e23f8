// Where drafts come from: the C++ twin of runtime/drafters/proposers.py (the Proposer protocol,
// NGramProposer, SmallDraftProposer), for the session's one sequence. Same names, same
// decisions: at a fixed draft length each proposes the tokens the Python proposer proposes
// (tests/runtime/test_capi_drafts.py and test_capi_heads.py hold the per-request draft and
// acceptance counts equal). The heads live beside it: eagle.h, medusa.h; merged.h merges the
// suffix index (suffix.h) with any of them.
#ifndef SPECCOMPILE_CAPI_PROPOSERS_H_
#define SPECCOMPILE_CAPI_PROPOSERS_H_

#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include <map>
#include <string>
#include <utility>

#include "../acceptance.h"
#include "../adaptive.h"
#include "../kv_cache.h"
#include "../model.h"
#include "speccompile.h"

namespace spc {

class Proposer {
 public:
  virtual ~Proposer() = default;
  // A new sequence whose prompt is `prompt`.
  virtual void AddSequence(int64_t seq_id, const std::vector<int32_t>& prompt) = 0;
  virtual void RemoveSequence(int64_t seq_id) = 0;
  // The prefix cache took a kept sequence over: roll back to `keep` tokens of `prompt`;
  // returns how many of them this proposer's state still covers.
  virtual int64_t Resume(int64_t seq_id, const std::vector<int32_t>& prompt, int64_t keep) = 0;
  // A prompt chunk the target prefilled at `start` (the draft model prefills it too).
  virtual void Prefill(int64_t seq_id, const std::vector<int32_t>& chunk, int64_t start) = 0;
  // Up to k draft tokens (a chain of k, or a tree of depth k and at most node_limit nodes)
  // continuing `history` (whose last token the target has not read yet); plan prices nodes.
  virtual Draft Propose(int64_t seq_id, const std::vector<int32_t>& history, int64_t k,
                        const spc_generate_params& sampling, std::mt19937_64& rng, const Plan& plan,
                        int64_t node_limit) = 0;
  // The target features this proposer reads: "" none, "hidden" (the final-normed hidden
  // states), "layers" (an EAGLE-3 head's low/mid/high layer outputs).
  virtual std::string features() const { return ""; }
  // Target features of the committed tokens at position.. (rows of `row_bytes` each, in order).
  virtual void ObserveHidden(int64_t, int64_t, const char*, int64_t, size_t) {}
  // The sequence's history after a step committed tokens.
  virtual void OnCommit(int64_t, const std::vector<int32_t>&) {}
  // Whether it drafts token trees (then a tree of one branch is sent as a chain).
  virtual bool supports_trees() const { return false; }
  // Whether some of its drafts cost no forward (an index's): only verify rows can make it hopeless.
  virtual bool free_drafts() const { return false; }
  // Draft forwards run so far (the step counts its own from the difference).
  virtual int64_t forwards() const { return 0; }
  // What its drafting costs (costs.py's proposer.measure): seconds of one draft forward over r
  // rows for each r, and of one more committed token it must catch up on.
  virtual std::pair<std::map<int64_t, double>, double> Measure(const std::vector<int64_t>& rows) = 0;
};

// runtime/drafters/proposers.py NGramProposer.lookup: the latest earlier occurrence of the longest
// suffix n-gram (max_n down to min_n) of `history`; the tokens that followed it, each with its
// confidence (how often the suffix was followed by the first of them, smoothed, discounted by
// the match length the token rests on).
Draft NGramLookup(const std::vector<int32_t>& history, int min_n, int max_n, int64_t k);

class NGramProposer : public Proposer {
 public:
  NGramProposer(int min_n, int max_n) : min_n_(min_n), max_n_(max_n) {}
  void AddSequence(int64_t, const std::vector<int32_t>&) override {}
  void RemoveSequence(int64_t) override {}
  int64_t Resume(int64_t, const std::vector<int32_t>&, int64_t keep) override { return keep; }
  void Prefill(int64_t, const std::vector<int32_t>&, int64_t) override {}
  Draft Propose(int64_t, const std::vector<int32_t>& history, int64_t k, const spc_generate_params&,
                std::mt19937_64&, const Plan&, int64_t) override {
    return NGramLookup(history, min_n_, max_n_, k);
  }
  std::pair<std::map<int64_t, double>, double> Measure(const std::vector<int64_t>& rows) override;

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
  void AddSequence(int64_t seq_id, const std::vector<int32_t>& prompt) override;
  void RemoveSequence(int64_t seq_id) override;
  int64_t Resume(int64_t seq_id, const std::vector<int32_t>& prompt, int64_t keep) override;
  void Prefill(int64_t seq_id, const std::vector<int32_t>& chunk, int64_t start) override;
  Draft Propose(int64_t seq_id, const std::vector<int32_t>& history, int64_t k, const spc_generate_params& sampling,
                std::mt19937_64& rng, const Plan& plan, int64_t node_limit) override;
  int64_t forwards() const override { return forwards_; }
  std::pair<std::map<int64_t, double>, double> Measure(const std::vector<int64_t>& rows) override;

 private:
  // Keep the longest prefix of the draft's cache that agrees with the committed history.
  void OnCommit(int64_t seq_id, const std::vector<int32_t>& history);

  Model* model_;
  Tensor kv_tensor_;
  std::unique_ptr<PagedKV> kv_;
  std::vector<int32_t> cached_;  // tokens in the draft's KV cache (the session has one sequence)
  int64_t forwards_ = 0;
};

}  // namespace spc

#endif  // SPECCOMPILE_CAPI_PROPOSERS_H_
