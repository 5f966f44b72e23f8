// See proposers.h.
#include "proposers.h"

#include <algorithm>

#include "../sampling.h"

namespace spc {

std::vector<int32_t> Draft::ParentList() const {
  if (is_tree()) return parents;
  std::vector<int32_t> p(tokens.size());
  for (size_t j = 0; j < p.size(); ++j) p[j] = static_cast<int32_t>(j) - 1;
  return p;
}

Draft Draft::Subset(const std::vector<int32_t>& nodes) const {
  if (nodes.size() == size()) return *this;
  std::vector<int32_t> local(size(), -1), par = ParentList();
  for (size_t i = 0; i < nodes.size(); ++i) local[nodes[i]] = static_cast<int32_t>(i);
  Draft d;
  for (int32_t n : nodes) {
    d.tokens.push_back(tokens[n]);
    if (is_tree()) d.parents.push_back(par[n] >= 0 ? local[par[n]] : -1);
    if (!probs.empty()) d.probs.push_back(probs[n]);
    if (!conf.empty()) d.conf.push_back(conf[n]);
    if (!source.empty()) d.source.push_back(source[n]);
  }
  return d;
}

std::vector<int32_t> Draft::VerifyParents() const {
  std::vector<int32_t> v{-1};
  for (int32_t p : ParentList()) v.push_back(p + 1);
  return v;
}

std::vector<int32_t> NGramLookup(const std::vector<int32_t>& history, int min_n, int max_n, int64_t k) {
  int64_t n_tok = static_cast<int64_t>(history.size());
  if (k <= 0 || n_tok < min_n + 1) return {};
  for (int64_t n = std::min<int64_t>(max_n, n_tok - 1); n >= min_n; --n) {
    const int32_t* suffix = history.data() + n_tok - n;
    // windows ending before the suffix itself (start + n <= n_tok - 1); latest match first
    for (int64_t start = n_tok - 1 - n; start >= 0; --start) {
      if (std::equal(suffix, suffix + n, history.data() + start)) {
        int64_t from = start + n, to = std::min(n_tok, from + k);
        return std::vector<int32_t>(history.begin() + from, history.begin() + to);
      }
    }
  }
  return {};
}

SmallDraftProposer::SmallDraftProposer(Model* draft, const Model& target, int64_t max_total_tokens) : model_(draft) {
  if (draft->vocab_size() != target.vocab_size()) {
    throw IncompatibleError("the draft library's vocab size " + std::to_string(draft->vocab_size()) +
                            " differs from the target's " + std::to_string(target.vocab_size()) +
                            "; small_draft needs a draft model with the same vocabulary");
  }
  int64_t pages = 0;
  model_->CreateKVCache(max_total_tokens, &kv_tensor_, &pages);
  kv_ = std::make_unique<PagedKV>(pages, model_->page_size());
}

void SmallDraftProposer::AddSequence(int64_t seq_id) {
  kv_->AddSequence(seq_id);
  cached_.clear();
}

void SmallDraftProposer::RemoveSequence(int64_t seq_id) {
  kv_->RemoveSequence(seq_id);
  cached_.clear();
}

int64_t SmallDraftProposer::Resume(int64_t seq_id, const std::vector<int32_t>& prompt, int64_t keep) {
  OnCommit(seq_id, std::vector<int32_t>(prompt.begin(), prompt.begin() + keep));
  return keep;  // it prefills (or catches up on) the rest from tokens alone
}

void SmallDraftProposer::OnCommit(int64_t seq_id, const std::vector<int32_t>& history) {
  size_t agreed = 0, limit = std::min(cached_.size(), history.size());
  while (agreed < limit && cached_[agreed] == history[agreed]) ++agreed;
  kv_->PopN(seq_id, static_cast<int64_t>(cached_.size() - agreed));
  cached_.resize(agreed);
}

void SmallDraftProposer::Prefill(int64_t seq_id, const std::vector<int32_t>& chunk, int64_t start) {
  // only when the draft holds everything before the chunk; otherwise it catches up when it drafts
  if (static_cast<int64_t>(cached_.size()) != start) return;
  try {
    model_->Prefill(*kv_, kv_tensor_, seq_id, chunk);
  } catch (const KVCacheFull&) {
    return;  // nothing was written; Propose catches up later
  }
  cached_.insert(cached_.end(), chunk.begin(), chunk.end());
}

Draft SmallDraftProposer::Propose(int64_t seq_id, const std::vector<int32_t>& history, int64_t k,
                                  const spc_generate_params& sampling, std::mt19937_64& rng, const Plan&, int64_t) {
  Draft draft;
  if (k <= 0) return draft;
  OnCommit(seq_id, history);
  if (static_cast<int64_t>(history.size() - cached_.size()) > kMaxBacklog) return draft;
  std::vector<int32_t> pending(history.begin() + static_cast<int64_t>(cached_.size()), history.end());
  Tensor logits = model_->Prefill(*kv_, kv_tensor_, seq_id, pending);  // KVCacheFull: the step verifies none
  cached_.insert(cached_.end(), pending.begin(), pending.end());
  while (true) {
    std::vector<float> row = model_->LogitsRow(logits, 0);
    auto picked = Pick(row, sampling, rng);
    draft.tokens.push_back(picked.first);
    draft.conf.push_back(PickedConfidence(row, picked.first, picked.second));
    if (!picked.second.empty()) draft.probs.push_back(std::move(picked.second));
    if (static_cast<int64_t>(draft.tokens.size()) >= k) break;
    logits = model_->Decode(*kv_, kv_tensor_, seq_id, draft.tokens.back());
    cached_.push_back(draft.tokens.back());
  }
  return draft;
}

}  // namespace spc
