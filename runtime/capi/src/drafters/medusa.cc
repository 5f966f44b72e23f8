// See medusa.h.
#include "medusa.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <queue>
#include <stdexcept>

#include "../costs.h"
#include "../json_util.h"
#include "eagle.h"
#include "eagle_heads.h"

namespace spc {

namespace {
double Seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

std::pair<std::vector<int64_t>, std::vector<double>> TopTokens(const float* row, int64_t n, int width) {
  std::vector<int64_t> idx;
  if (width == 1) {
    idx.push_back(std::max_element(row, row + n) - row);  // the first maximum, as numpy argmax
  } else {
    idx.resize(n);
    std::iota(idx.begin(), idx.end(), 0);
    int64_t w = std::min<int64_t>(width, n);
    std::partial_sort(idx.begin(), idx.begin() + w, idx.end(),
                      [&](int64_t a, int64_t b) { return row[a] != row[b] ? row[a] > row[b] : a < b; });
    idx.resize(w);
  }
  double m = *std::max_element(row, row + n), sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += std::exp(static_cast<double>(row[i]) - m);
  double lse = m + std::log(sum);
  std::vector<double> logp;
  for (int64_t i : idx) logp.push_back(static_cast<double>(row[i]) - lse);
  return {idx, logp};
}

MedusaProposer::MedusaProposer(Model* heads, const Model& target, int tree_width, int max_nodes, double prior_hits)
    : heads_(heads), width_(tree_width), max_nodes_(max_nodes), coverage_({}) {
  if (tree_width < 1) throw std::invalid_argument("--spec-tree-width must be >= 1 (1 = chain)");
  if (max_nodes < 1 || max_nodes > kMaxTreeNodes) {
    throw std::invalid_argument("--spec-tree-nodes must be in 1.." + std::to_string(kMaxTreeNodes));
  }
  CheckHead(*heads, target, {"medusa"}, "medusa");
  vocab_ids_ = DraftVocabIds(*heads, target.vocab_size(), "Medusa");
  coverage_ = VocabCoverage(vocab_ids_);
  num_heads_ = static_cast<int>(json::GetInt(heads->meta(), "medusa_num_heads"));
  // a prior that decays with depth and rank seeds the tree before any data
  tries_.assign(num_heads_, prior_hits * 4);
  for (int j = 0; j < num_heads_; ++j) {
    std::vector<double> row;
    for (int r = 0; r < tree_width; ++r) row.push_back(prior_hits * 4 * std::pow(0.5, j + 1) / ((r + 1) * (r + 1)));
    hits_.push_back(row);
  }
}

void MedusaProposer::AddSequence(int64_t, const std::vector<int32_t>& prompt) {
  proposed_.clear();
  live_ = true;
  coverage_.Add(prompt);
}

void MedusaProposer::RemoveSequence(int64_t) {
  last_pos_ = -1;
  last_.clear();
  proposed_.clear();
  live_ = false;
}

int64_t MedusaProposer::Resume(int64_t seq_id, const std::vector<int32_t>& prompt, int64_t keep) {
  // the heads read the last committed token's feature, which the prefill of the prompt's tail sends again
  RemoveSequence(seq_id);
  AddSequence(seq_id, prompt);
  return keep;
}

void MedusaProposer::ObserveHidden(int64_t, int64_t position, const char* rows, int64_t n, size_t row_bytes) {
  if (!live_ || n == 0) return;
  last_pos_ = position + n - 1;
  last_.assign(rows + (n - 1) * row_bytes, rows + n * row_bytes);
}

void MedusaProposer::OnCommit(int64_t, const std::vector<int32_t>& history) {
  // score earlier proposals against the tokens now committed
  std::vector<std::pair<int64_t, std::vector<std::vector<int64_t>>>> keep;
  for (auto& [first, tops] : proposed_) {
    bool done = true;
    for (size_t j = 0; j < tops.size(); ++j) {
      if (tops[j].empty()) continue;
      int64_t pos = first + static_cast<int64_t>(j);
      if (pos >= static_cast<int64_t>(history.size())) {
        done = false;
        continue;
      }
      tries_[j] += 1;
      auto it = std::find(tops[j].begin(), tops[j].end(), history[pos]);
      if (it != tops[j].end()) hits_[j][it - tops[j].begin()] += 1;
      tops[j].clear();
    }
    if (!done) keep.emplace_back(first, std::move(tops));
  }
  proposed_ = std::move(keep);
}

const std::vector<std::vector<int>>& MedusaProposer::Tree(int depth, int budget) {
  std::vector<std::vector<double>> acc(num_heads_, std::vector<double>(width_));
  std::vector<double> key{static_cast<double>(depth), static_cast<double>(budget)};
  for (int j = 0; j < num_heads_; ++j)
    for (int r = 0; r < width_; ++r) {
      acc[j][r] = hits_[j][r] / tries_[j];
      key.push_back(std::nearbyint(acc[j][r] * 1000.0) / 1000.0);  // np.round(acc, 3): the cache's key
    }
  if (!tree_.empty() && key == tree_key_) return tree_;
  // heapq over (-P, path): ties go to the smaller path
  using Entry = std::pair<double, std::vector<int>>;
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> heap;
  for (int r = 0; r < width_; ++r) heap.push({-acc[0][r], {r}});
  std::vector<std::vector<int>> paths;
  while (!heap.empty() && static_cast<int>(paths.size()) < budget) {
    Entry e = heap.top();
    heap.pop();
    paths.push_back(e.second);
    if (static_cast<int>(e.second.size()) < depth) {
      for (int r = 0; r < width_; ++r) {
        std::vector<int> p = e.second;
        p.push_back(r);
        heap.push({e.first * acc[e.second.size()][r], p});
      }
    }
  }
  std::sort(paths.begin(), paths.end(), [](const std::vector<int>& a, const std::vector<int>& b) {
    return a.size() != b.size() ? a.size() < b.size() : a < b;
  });
  tree_key_ = key;
  tree_ = paths;
  return tree_;
}

Draft MedusaProposer::Propose(int64_t, const std::vector<int32_t>& history, int64_t k, const spc_generate_params&,
                              std::mt19937_64&, const Plan& plan, int64_t node_limit) {
  Draft draft;
  if (k <= 0 || last_pos_ < 0) return draft;
  if (!plan.ShouldDraft(1, {coverage_.FirstToken(history, plan.first())})) return draft;
  if (last_pos_ != static_cast<int64_t>(history.size()) - 2) {
    throw std::runtime_error("Medusa: the last feature is at position " + std::to_string(last_pos_) + ", " +
                             std::to_string(history.size() - 2) + " expected");
  }
  double t0 = Seconds();
  int64_t hidden = heads_->hidden_size();
  Tensor feats = heads_->Upload(last_.data(), {1, hidden}, heads_->dtype());
  Tensor logits = heads_->Fn("medusa_heads")(feats, heads_->params()).cast<Tensor>();  // [K, 1, vocab]
  ++forwards_;
  const DLTensor* t = logits.GetDLTensorPtr();
  int64_t vocab = t->shape[2];
  std::vector<char> raw = Model::ToHost(logits);
  const float* rows = reinterpret_cast<const float*>(raw.data());
  int budget = static_cast<int>(std::min<int64_t>(max_nodes_, node_limit > 0 ? node_limit : max_nodes_));
  int depth = static_cast<int>(std::min<int64_t>(k, num_heads_));
  std::vector<std::vector<int64_t>> tops;
  std::vector<std::vector<double>> confs;
  for (int j = 0; j < depth; ++j) {
    auto top = TopTokens(rows + j * vocab, vocab, width_);  // the head's softmax probability: confidence
    std::vector<double> c;
    for (double lp : top.second) c.push_back(std::exp(lp));
    if (!vocab_ids_.empty())
      for (auto& id : top.first) id = vocab_ids_[id];
    tops.push_back(top.first);
    confs.push_back(c);
  }
  const auto& paths = Tree(depth, budget);
  std::vector<int32_t> parents;
  for (const auto& p : paths) {
    draft.tokens.push_back(static_cast<int32_t>(tops[p.size() - 1][p.back()]));
    draft.conf.push_back(confs[p.size() - 1][p.back()]);
    int32_t parent = -1;
    if (p.size() > 1) {
      std::vector<int> up(p.begin(), p.end() - 1);
      parent = static_cast<int32_t>(std::find(paths.begin(), paths.end(), up) - paths.begin());
    }
    parents.push_back(parent);
  }
  if (width_ > 1) draft.parents = parents;
  proposed_.emplace_back(static_cast<int64_t>(history.size()), tops);  // head j proposed position len + j
  plan.Spent(Seconds() - t0);
  return draft;
}

std::pair<std::map<int64_t, double>, double> MedusaProposer::Measure(const std::vector<int64_t>& rows) {
  int64_t most = *std::max_element(rows.begin(), rows.end()), hidden = heads_->hidden_size();
  std::vector<char> zeros(static_cast<size_t>(most * hidden) * DTypeBytes(heads_->dtype()), 0);
  std::map<int64_t, double> table;
  for (int64_t r : rows) {
    table[r] = TimeMin([&] {
      Tensor feats = heads_->Upload(zeros.data(), {r, hidden}, heads_->dtype());
      Tensor logits = heads_->Fn("medusa_heads")(feats, heads_->params()).cast<Tensor>();  // [K, r, vocab]
      int64_t vocab = logits.GetDLTensorPtr()->shape[2];
      std::vector<char> raw = Model::ToHost(logits);
      const float* all = reinterpret_cast<const float*>(raw.data());
      for (int64_t j = 0; j < num_heads_; ++j)
        for (int64_t row = 0; row < r; ++row) TopTokens(all + (j * r + row) * vocab, vocab, width_);
    });
  }
  return {table, 0.0};
}

}  // namespace spc
