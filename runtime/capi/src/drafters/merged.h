// runtime/drafters/merged.py in C++: one draft per step from the suffix index and a drafter (a
// draft model, or an EAGLE or Medusa head), merged into one token tree: the default mode when
// an additional model is given. The index drafts first (host work only); the drafter then sees
// the step's plan as source 1 (its own calibration); the two drafts are merged as a trie, a node
// proposed by both carrying the source whose calibrated acceptance is higher, and cut to the
// node budget by path probability.
#ifndef SPECCOMPILE_CAPI_DRAFTERS_MERGED_H_
#define SPECCOMPILE_CAPI_DRAFTERS_MERGED_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "proposers.h"
#include "suffix.h"

namespace spc {

constexpr int kIndexSource = 0, kDrafterSource = 1;  // merged.py INDEX, DRAFTER

// merged.py merge: the index's draft `own` and the drafter's `other` as one draft of at most
// `budget` nodes, each node tagged with its source; predict(conf, source) is a node's acceptance.
Draft Merge(Draft own, Draft other, int64_t budget, const std::function<double(double, int)>& predict);

class MergedProposer : public Proposer {
 public:
  MergedProposer(std::unique_ptr<SuffixProposer> index, std::unique_ptr<Proposer> drafter)
      : index_(std::move(index)), drafter_(std::move(drafter)) {}
  void AddSequence(int64_t seq_id, const std::vector<int32_t>& prompt) override {
    index_->AddSequence(seq_id, prompt);
    drafter_->AddSequence(seq_id, prompt);
  }
  void RemoveSequence(int64_t seq_id) override {
    index_->RemoveSequence(seq_id);
    drafter_->RemoveSequence(seq_id);
  }
  int64_t Resume(int64_t seq_id, const std::vector<int32_t>& prompt, int64_t keep) override {
    return std::min(index_->Resume(seq_id, prompt, keep), drafter_->Resume(seq_id, prompt, keep));
  }
  void Prefill(int64_t seq_id, const std::vector<int32_t>& chunk, int64_t start) override {
    drafter_->Prefill(seq_id, chunk, start);
  }
  Draft Propose(int64_t seq_id, const std::vector<int32_t>& history, int64_t k, const spc_generate_params& sampling,
                std::mt19937_64& rng, const Plan& plan, int64_t node_limit) override;
  std::string features() const override { return drafter_->features(); }
  void ObserveHidden(int64_t seq_id, int64_t position, const char* rows, int64_t n, size_t row_bytes) override {
    drafter_->ObserveHidden(seq_id, position, rows, n, row_bytes);
  }
  void OnCommit(int64_t seq_id, const std::vector<int32_t>& history) override {
    index_->OnCommit(seq_id, history);
    drafter_->OnCommit(seq_id, history);
  }
  bool supports_trees() const override { return true; }
  bool free_drafts() const override { return true; }  // the index's
  int64_t forwards() const override { return drafter_->forwards(); }
  // The drafter's forwards are what a plan prices per draft forward; the index's host time
  // (microseconds) is charged to each step as it is spent.
  std::pair<std::map<int64_t, double>, double> Measure(const std::vector<int64_t>& rows) override {
    return drafter_->Measure(rows);
  }

 private:
  std::unique_ptr<SuffixProposer> index_;
  std::unique_ptr<Proposer> drafter_;
};

}  // namespace spc

#endif  // SPECCOMPILE_CAPI_DRAFTERS_MERGED_H_
