// runtime/drafters/medusa.py in C++: K Medusa heads on the target's last hidden state, drafted
// as the sparse tree of the `max_nodes` likeliest rank paths, a path's probability being the
// product of the heads' *measured* per-rank hit rates (every proposal is scored against the
// tokens committed later). Width 1 is a chain of each head's top-1.
#ifndef SPECCOMPILE_CAPI_DRAFTERS_MEDUSA_H_
#define SPECCOMPILE_CAPI_DRAFTERS_MEDUSA_H_

#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "eagle_heads.h"
#include "proposers.h"

namespace spc {

// eagle_heads.py top_tokens: the `width` likeliest tokens of one logits row (ties: lower id
// first) and their log-probabilities.
std::pair<std::vector<int64_t>, std::vector<double>> TopTokens(const float* row, int64_t n, int width);

class MedusaProposer : public Proposer {
 public:
  // The heads must outlive the proposer.
  MedusaProposer(Model* heads, const Model& target, int tree_width, int max_nodes, double prior_hits = 2.0);
  void AddSequence(int64_t, const std::vector<int32_t>& prompt) override;
  void RemoveSequence(int64_t) override;
  int64_t Resume(int64_t seq_id, const std::vector<int32_t>& prompt, int64_t keep) override;
  void Prefill(int64_t, const std::vector<int32_t>&, int64_t) override {}
  Draft Propose(int64_t seq_id, const std::vector<int32_t>& history, int64_t k, const spc_generate_params& sampling,
                std::mt19937_64& rng, const Plan& plan, int64_t node_limit) override;
  std::string features() const override { return "hidden"; }
  void ObserveHidden(int64_t seq_id, int64_t position, const char* rows, int64_t n, size_t row_bytes) override;
  void OnCommit(int64_t seq_id, const std::vector<int32_t>& history) override;
  bool supports_trees() const override { return true; }
  int64_t forwards() const override { return forwards_; }
  // medusa.py measure: all K heads over r features, plus each head's top-width search.
  std::pair<std::map<int64_t, double>, double> Measure(const std::vector<int64_t>& rows) override;

 private:
  // medusa.py tree: the `budget` likeliest rank paths up to `depth`, parents before children.
  const std::vector<std::vector<int>>& Tree(int depth, int budget);

  Model* heads_;
  int width_, max_nodes_, num_heads_;
  std::vector<int64_t> vocab_ids_;  // row -> target token (empty: the full vocabulary)
  std::vector<double> tries_;                 // [K]
  std::vector<std::vector<double>> hits_;     // [K][width]
  bool live_ = false;
  int64_t last_pos_ = -1;                     // position of the last target feature, and its bytes
  std::vector<char> last_;
  // proposals not yet scored: (first position, per head its top list, or empty once scored)
  std::vector<std::pair<int64_t, std::vector<std::vector<int64_t>>>> proposed_;
  std::vector<double> tree_key_;  // the cached tree's (depth, budget, rounded accuracies)
  std::vector<std::vector<int>> tree_;
  VocabCoverage coverage_;
  int64_t forwards_ = 0;
};

}  // namespace spc

#endif  // SPECCOMPILE_CAPI_DRAFTERS_MEDUSA_H_
