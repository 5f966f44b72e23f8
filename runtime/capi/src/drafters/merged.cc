// See merged.h.
#include "merged.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <numeric>
#include <utility>

namespace spc {

namespace {
double Seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

namespace {
// merged.py _tagged: every node's source, and a confidence (1.0 where the proposer gave none).
Draft Tagged(Draft d, int source) {
  if (d.conf.empty()) d.conf.assign(d.size(), 1.0);
  d.source.assign(d.size(), source);
  return d;
}

double Expected(const Draft& d, const std::function<double(double, int)>& predict) {
  auto probs = NodeProbs(d.ParentList(), d.conf, d.source, predict).first;
  return std::accumulate(probs.begin(), probs.end(), 0.0);
}
}  // namespace

Draft Merge(Draft own, Draft other, int64_t budget, const std::function<double(double, int)>& predict) {
  own = Tagged(std::move(own), kIndexSource);
  other = Tagged(std::move(other), kDrafterSource);
  if (!other.size()) return own;
  if (!own.size()) return other;
  if (!other.probs.empty()) {  // sampled draft tokens: one source's draft, the likelier
    return Expected(other, predict) > Expected(own, predict) ? other : own;
  }
  Draft merged;
  std::map<std::pair<int32_t, int32_t>, int32_t> at;  // (merged parent, token) -> merged node
  for (const Draft* d : {&own, &other}) {
    std::vector<int32_t> local, parents = d->ParentList();
    for (size_t j = 0; j < d->size(); ++j) {
      std::pair<int32_t, int32_t> key{parents[j] >= 0 ? local[parents[j]] : -1, d->tokens[j]};
      auto it = at.find(key);
      int32_t m;
      if (it == at.end()) {
        m = at[key] = static_cast<int32_t>(merged.size());
        merged.tokens.push_back(d->tokens[j]);
        merged.parents.push_back(key.first);
        merged.conf.push_back(d->conf[j]);
        merged.source.push_back(d->source[j]);
      } else {
        m = it->second;
        if (predict(d->conf[j], d->source[j]) > predict(merged.conf[m], merged.source[m])) {
          merged.conf[m] = d->conf[j];
          merged.source[m] = d->source[j];
        }
      }
      local.push_back(m);
    }
  }
  if (static_cast<int64_t>(merged.size()) > budget) {  // the likeliest nodes: a child is never likelier than its parent
    auto pd = NodeProbs(merged.parents, merged.conf, merged.source, predict);
    std::vector<int32_t> keep(merged.size());
    std::iota(keep.begin(), keep.end(), 0);
    std::sort(keep.begin(), keep.end(), [&](int32_t a, int32_t b) {
      if (pd.first[a] != pd.first[b]) return pd.first[a] > pd.first[b];
      if (pd.second[a] != pd.second[b]) return pd.second[a] < pd.second[b];
      return a < b;
    });
    keep.resize(budget);
    std::sort(keep.begin(), keep.end());
    merged = merged.Subset(keep);
  }
  bool chain = true;
  for (size_t j = 0; j < merged.parents.size(); ++j) chain = chain && merged.parents[j] == static_cast<int32_t>(j) - 1;
  if (chain) merged.parents.clear();
  return merged;
}

Draft MergedProposer::Propose(int64_t seq_id, const std::vector<int32_t>& history, int64_t k,
                              const spc_generate_params& sampling, std::mt19937_64& rng, const Plan& plan,
                              int64_t node_limit) {
  double t0 = Seconds();
  Draft own = index_->Propose(seq_id, history, k, sampling, rng, plan, node_limit);
  // the index's nodes join the step's plan; what its depth-1 nodes cover of the next token
  // lowers what the drafter's first forward can add
  auto pd = NodeProbs(own.ParentList(), own.conf, own.source, [&](double c, int) { return plan.step->p(c, seq_id, kIndexSource); });
  plan.Drafted(pd.first);
  double covered = 0.0;
  for (size_t j = 0; j < pd.first.size(); ++j)
    if (pd.second[j] == 1) covered += pd.first[j];
  plan.Spent(Seconds() - t0);
  Plan drafter_plan = plan;
  drafter_plan.source = kDrafterSource;  // merged.py SourcePlan: its nodes priced by its own calibration
  drafter_plan.covered = std::min(1.0, covered);
  Draft other = drafter_->Propose(seq_id, history, k, sampling, rng, drafter_plan, node_limit);
  int64_t budget = std::min<int64_t>(index_->max_nodes(), node_limit > 0 ? node_limit : index_->max_nodes());
  StepPlan* step = plan.step;
  return Merge(std::move(own), std::move(other), budget, [step, seq_id](double c, int src) { return step->p(c, seq_id, src); });
}

}  // namespace spc
