// runtime/drafters/suffix.py in C++: drafts that continue the current text as the text so far
// continued it. SuffixIndex counts every continuation of every context of 1..max_n tokens of
// the sequence; SuffixProposer grows a tree best-first by path confidence from the longest
// context that has continuations (`tree_width` of them per node; width 1, the default, is a
// chain of the most frequent ones). A session's sequence has no tenant, so there is no store of
// earlier requests (as `speccompile generate`).
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

// suffix.py confidence: a continuation seen `count` of `total` times after an n-token context.
double SuffixConfidence(int64_t count, int64_t total, int n);

class SuffixProposer : public Proposer {
 public:
  explicit SuffixProposer(int tree_width = 1, int max_nodes = 64) : width_(tree_width), max_nodes_(max_nodes) {}
  void AddSequence(int64_t, const std::vector<int32_t>&) override { index_ = SuffixIndex(); }
  void RemoveSequence(int64_t) override { index_ = SuffixIndex(); }
  // A new request's index over its prompt (suffix.py resume).
  int64_t Resume(int64_t, const std::vector<int32_t>& prompt, int64_t keep) override;
  void Prefill(int64_t, const std::vector<int32_t>&, int64_t) override {}
  Draft Propose(int64_t seq_id, const std::vector<int32_t>& history, int64_t k, const spc_generate_params&,
                std::mt19937_64&, const Plan&, int64_t node_limit) override;
  bool supports_trees() const override { return true; }
  bool free_drafts() const override { return true; }
  // suffix.py measure: host seconds of drafting r sequences (a 512-token text with repeats).
  std::pair<std::map<int64_t, double>, double> Measure(const std::vector<int64_t>& rows) override;
  int max_nodes() const { return max_nodes_; }

 private:
  // suffix.py _tree over this index.
  Draft Tree(const SuffixIndex& index, const std::vector<int32_t>& history, int64_t depth, int64_t budget) const;
  // suffix.py _continuations: the `width` likeliest next tokens after tail + path, with confidences.
  std::vector<std::pair<int32_t, double>> Continuations(const SuffixIndex& index,
                                                        const std::vector<int32_t>& context) const;
  SuffixIndex index_;
  int width_, max_nodes_;
};

}  // namespace spc

#endif  // SPECCOMPILE_CAPI_DRAFTERS_SUFFIX_H_
