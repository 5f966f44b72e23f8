// runtime/drafters/suffix.py in C++: drafts that continue the current text as the text so far
// continued it. SuffixIndex counts every continuation of every context of 1..max_n tokens of
// the sequence; SuffixProposer drafts the most frequent continuation, token by token, from the
// longest context that has one. Chains only (spec_tree_width 1, the default); a session's
// sequence has no tenant, so there is no store of earlier requests (as `speccompile generate`).
#ifndef SPECCOMPILE_CAPI_DRAFTERS_SUFFIX_H_
#define SPECCOMPILE_CAPI_DRAFTERS_SUFFIX_H_

#include <cstdint>
#include <unordered_map>
#include <utility>
#include <vector>

#include "proposers.h"

namespace spc {

class SuffixIndex {
 public:
  static constexpr int kMaxMatch = 8;  // suffix.py MAX_MATCH

  explicit SuffixIndex(int max_n = kMaxMatch) : max_n_(max_n) {}
  size_t size() const { return tokens_.size(); }
  // Append tokens, counting each after its 1..max_n preceding tokens.
  void Extend(const int32_t* tokens, size_t n);
  // (n, successor counts in first-seen order) of the longest suffix of `context` (up to max_n
  // tokens) seen with a continuation; n = 0 when none.
  std::pair<int, const std::vector<std::pair<int32_t, int64_t>>*> Match(const std::vector<int32_t>& context) const;

 private:
  static uint64_t Key(const int32_t* context, size_t n);
  int max_n_;
  std::vector<int32_t> tokens_;
  // hash(context) -> (token, count) in the order the tokens first followed it. Two contexts
  // whose hashes collide merely draft a wrong token, which verification rejects (as in Python).
  std::unordered_map<uint64_t, std::vector<std::pair<int32_t, int64_t>>> next_;
};

class SuffixProposer : public Proposer {
 public:
  void AddSequence(int64_t) override { index_ = SuffixIndex(); }
  void RemoveSequence(int64_t) override { index_ = SuffixIndex(); }
  // A new request's index over its prompt (suffix.py resume).
  int64_t Resume(int64_t, const std::vector<int32_t>& prompt, int64_t keep) override;
  void Prefill(int64_t, const std::vector<int32_t>&, int64_t) override {}
  Draft Propose(int64_t seq_id, const std::vector<int32_t>& history, int64_t k, const spc_generate_params&,
                std::mt19937_64&) override;

 private:
  SuffixIndex index_;
};

}  // namespace spc

#endif  // SPECCOMPILE_CAPI_DRAFTERS_SUFFIX_H_
