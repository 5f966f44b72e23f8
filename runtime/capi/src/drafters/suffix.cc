// See suffix.h.
#include "suffix.h"

#include <algorithm>

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

Draft SuffixProposer::Propose(int64_t, const std::vector<int32_t>& history, int64_t k, const spc_generate_params&,
                              std::mt19937_64&) {
  // suffix.py _tree with one continuation per node: the most frequent continuation (the first
  // seen on a tie, as heapq.nlargest keeps them) of the longest matching context, token by token
  Draft draft;
  if (history.size() > index_.size()) index_.Extend(history.data() + index_.size(), history.size() - index_.size());
  std::vector<int32_t> context(history.end() - std::min<size_t>(history.size(), SuffixIndex::kMaxMatch), history.end());
  while (static_cast<int64_t>(draft.tokens.size()) < k) {
    auto match = index_.Match(context);
    if (!match.second) break;
    auto best = std::max_element(match.second->begin(), match.second->end(),
                                 [](const auto& a, const auto& b) { return a.second < b.second; });  // first max
    draft.tokens.push_back(best->first);
    context.push_back(best->first);
    if (context.size() > SuffixIndex::kMaxMatch) context.erase(context.begin());
  }
  return draft;
}

}  // namespace spc
