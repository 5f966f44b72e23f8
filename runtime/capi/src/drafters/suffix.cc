// See suffix.h.
#include "suffix.h"

#include <algorithm>
#include <cmath>

#include "../costs.h"

namespace spc {

uint64_t SuffixIndex::Key(const int32_t* context, size_t n) {
  uint64_t h = 0x9e3779b97f4a7c15ULL ^ n;  // the length is part of the key: "a b" is not "b"
  for (size_t i = 0; i < n; ++i) {
    h ^= static_cast<uint32_t>(context[i]) + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
  }
  return h;
}

void SuffixIndex::Extend(const int32_t* tokens, size_t count) {
  for (size_t t = 0; t < count; ++t) {
    int32_t tok = tokens[t];
    size_t end = tokens_.size();
    for (size_t n = 1; n <= std::min<size_t>(max_n_, end); ++n) {
      auto& succ = next_[Key(tokens_.data() + end - n, n)];
      auto it = std::find_if(succ.begin(), succ.end(), [&](const auto& s) { return s.first == tok; });
      if (it == succ.end()) {
        succ.emplace_back(tok, 1);
      } else {
        ++it->second;
      }
    }
    tokens_.push_back(tok);
  }
}

std::pair<int, const std::vector<std::pair<int32_t, int64_t>>*> SuffixIndex::Match(
    const std::vector<int32_t>& context) const {
  for (size_t n = std::min<size_t>(max_n_, context.size()); n >= 1; --n) {
    auto it = next_.find(Key(context.data() + context.size() - n, n));
    if (it != next_.end() && !it->second.empty()) return {static_cast<int>(n), &it->second};
  }
  return {0, nullptr};
}

int64_t SuffixProposer::Resume(int64_t, const std::vector<int32_t>&, int64_t keep) {
  index_ = SuffixIndex();  // Propose indexes the new prompt (the kept text is the earlier request's)
  return keep;
}

double SuffixConfidence(int64_t count, int64_t total, int n) {
  return static_cast<double>(count + 1) / static_cast<double>(total + 2) * (1.0 - std::pow(0.5, n));
}

std::vector<std::pair<int32_t, double>> SuffixProposer::Continuations(const SuffixIndex& index,
                                                                      const std::vector<int32_t>& context) const {
  auto match = index.Match(context);
  if (!match.second) return {};
  const auto& succ = *match.second;
  int64_t total = 0;
  for (const auto& s : succ) total += s.second;
  // heapq.nlargest by count: ties keep the order the tokens first followed the context
  std::vector<size_t> order(succ.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return succ[a].second > succ[b].second; });
  std::vector<std::pair<int32_t, double>> best;
  for (size_t i = 0; i < order.size() && static_cast<int>(i) < width_; ++i) {
    best.emplace_back(succ[order[i]].first, SuffixConfidence(succ[order[i]].second, total, match.first));
  }
  return best;
}

Draft SuffixProposer::Propose(int64_t, const std::vector<int32_t>& history, int64_t k, const spc_generate_params&,
                              std::mt19937_64&, const Plan&, int64_t node_limit) {
  if (history.size() > index_.size()) index_.Extend(history.data() + index_.size(), history.size() - index_.size());
  return Tree(index_, history, k, std::min<int64_t>(max_nodes_, node_limit > 0 ? node_limit : max_nodes_));
}

std::pair<std::map<int64_t, double>, double> SuffixProposer::Measure(const std::vector<int64_t>& rows) {
  SuffixIndex seq;
  std::vector<int32_t> text(512);
  for (int64_t i = 0; i < 512; ++i) text[i] = static_cast<int32_t>(i * 7919 % 211);
  seq.Extend(text.data(), text.size());
  double one = TimeMin([&] { Tree(seq, text, 8, 64); }, 3);
  std::map<int64_t, double> table;
  for (int64_t r : rows) table[r] = static_cast<double>(r) * one;
  return {table, 0.0};
}

Draft SuffixProposer::Tree(const SuffixIndex& index, const std::vector<int32_t>& history, int64_t k,
                           int64_t budget) const {
  // suffix.py _tree: best-first by path confidence; the candidate with the highest product of
  // confidences along its path joins next (ties: the earlier candidate), then its own
  // continuations become candidates, up to depth k and the node budget
  Draft draft;
  if (k <= 0 || budget <= 0) return draft;
  std::vector<int32_t> tail(history.end() - std::min<size_t>(history.size(), SuffixIndex::kMaxMatch), history.end());
  struct Candidate {
    double key;  // -P * c
    int64_t order;
    int32_t parent;
    std::vector<int32_t> path;
    int32_t tok;
    double c;
  };
  auto later = [](const Candidate& a, const Candidate& b) { return a.key != b.key ? a.key > b.key : a.order > b.order; };
  std::vector<Candidate> heap;
  int64_t order = 0;
  auto push = [&](int32_t parent, const std::vector<int32_t>& path, double p) {
    std::vector<int32_t> context = tail;
    context.insert(context.end(), path.begin(), path.end());
    if (context.size() > SuffixIndex::kMaxMatch) context.erase(context.begin(), context.end() - SuffixIndex::kMaxMatch);
    for (const auto& tc : Continuations(index, context)) {
      heap.push_back(Candidate{-p * tc.second, order++, parent, path, tc.first, tc.second});
      std::push_heap(heap.begin(), heap.end(), later);
    }
  };
  push(-1, {}, 1.0);
  std::vector<int32_t> parents;
  while (!heap.empty() && static_cast<int64_t>(draft.tokens.size()) < budget) {
    std::pop_heap(heap.begin(), heap.end(), later);
    Candidate c = std::move(heap.back());
    heap.pop_back();
    draft.tokens.push_back(c.tok);
    parents.push_back(c.parent);
    draft.conf.push_back(c.c);
    if (static_cast<int64_t>(c.path.size()) + 1 < k) {
      std::vector<int32_t> path = c.path;
      path.push_back(c.tok);
      push(static_cast<int32_t>(draft.tokens.size()) - 1, path, -c.key);
    }
  }
  bool chain = true;
  for (size_t i = 0; i < parents.size(); ++i) chain = chain && parents[i] == static_cast<int32_t>(i) - 1;
  if (!chain) draft.parents = parents;
  return draft;
}

}  // namespace spc
