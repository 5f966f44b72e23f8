// See proposers.h.
#include "proposers.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "../costs.h"
#include "../sampling.h"

namespace spc {

namespace {
double Seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

Draft NGramLookup(const std::vector<int32_t>& history, int min_n, int max_n, int64_t k) {
  Draft d;
  int64_t n_tok = static_cast<int64_t>(history.size());
  if (k <= 0 || n_tok < min_n + 1) return d;
  for (int64_t n = std::min<int64_t>(max_n, n_tok - 1); n >= min_n; --n) {
    const int32_t* suffix = history.data() + n_tok - n;
    // windows ending before the suffix itself (start + n <= n_tok - 1); the latest match drafts
    std::vector<int64_t> hits;
    for (int64_t start = 0; start + n <= n_tok - 1; ++start) {
      if (std::equal(suffix, suffix + n, history.data() + start)) hits.push_back(start);
    }
    if (hits.empty()) continue;
    int64_t from = hits.back() + n, to = std::min(n_tok, from + k);
    d.tokens.assign(history.begin() + from, history.begin() + to);
    int64_t agree = 1;  // every earlier occurrence's next token that is the first draft, smoothed
    for (int64_t h : hits) agree += history[h + n] == d.tokens[0];
    double rate = static_cast<double>(agree) / static_cast<double>(hits.size() + 2);
    for (size_t i = 0; i < d.tokens.size(); ++i) d.conf.push_back(rate * (1 - std::pow(0.5, n + static_cast<int64_t>(i))));
    return d;
  }
  return d;
}

std::pair<std::map<int64_t, double>, double> NGramProposer::Measure(const std::vector<int64_t>& rows) {
  std::vector<int32_t> history(512);
  for (int64_t i = 0; i < 512; ++i) history[i] = static_cast<int32_t>(i * 7919 % 997);
  double one = TimeMin([&] { NGramLookup(history, min_n_, max_n_, 8); }, 3);
  std::map<int64_t, double> table;
  for (int64_t r : rows) table[r] = static_cast<double>(r) * one;
  return {table, 0.0};
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

void SmallDraftProposer::AddSequence(int64_t seq_id, const std::vector<int32_t>&) {
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
                                  const spc_generate_params& sampling, std::mt19937_64& rng, const Plan& plan, int64_t) {
  Draft draft;
  if (k <= 0) return draft;
  OnCommit(seq_id, history);
  if (static_cast<int64_t>(history.size() - cached_.size()) > kMaxBacklog) return draft;
  std::vector<int32_t> pending(history.begin() + static_cast<int64_t>(cached_.size()), history.end());
  if (!plan.ShouldDraft(1, {{1.0, plan.first()}}, static_cast<int64_t>(pending.size()) - 1)) return draft;
  double t0 = Seconds();
  Tensor logits = model_->Prefill(*kv_, kv_tensor_, seq_id, pending);  // KVCacheFull: the step verifies none
  ++forwards_;
  cached_.insert(cached_.end(), pending.begin(), pending.end());
  double path = 1.0;  // P of the last drafted node
  while (true) {
    std::vector<float> row = model_->LogitsRow(logits, 0);
    auto picked = Pick(row, sampling, rng);
    double conf = PickedConfidence(row, picked.first, picked.second);
    draft.tokens.push_back(picked.first);
    draft.conf.push_back(conf);
    if (!picked.second.empty()) draft.probs.push_back(std::move(picked.second));
    path *= plan.p(conf);
    plan.Spent(Seconds() - t0);
    plan.Drafted({path});
    if (static_cast<int64_t>(draft.tokens.size()) >= k || !plan.ShouldDraft(1, {{path, plan.p(conf)}})) break;
    t0 = Seconds();
    logits = model_->Decode(*kv_, kv_tensor_, seq_id, draft.tokens.back());
    ++forwards_;
    cached_.push_back(draft.tokens.back());
  }
  return draft;
}

std::pair<std::map<int64_t, double>, double> SmallDraftProposer::Measure(const std::vector<int64_t>& rows) {
  // proposers.py measure: r scratch sequences decoding one token each, the pick on the host;
  // and a 32-token catch-up against a one-row step
  int64_t most = *std::max_element(rows.begin(), rows.end());
  std::vector<int64_t> scratch;
  for (int64_t i = 0; i < most; ++i) scratch.push_back(-1 - i);
  for (int64_t s : scratch) kv_->AddSequence(s);
  std::map<int64_t, double> table;
  double per_token = 0.0;
  try {
    model_->PrefillBatch(*kv_, kv_tensor_, scratch, std::vector<std::vector<int32_t>>(scratch.size(), {0, 1, 2, 3}));
    spc_generate_params greedy{};
    std::mt19937_64 rng(0);
    for (int64_t r : rows) {
      std::vector<int64_t> ids(scratch.begin(), scratch.begin() + r);
      table[r] = TimeMin([&] {
        Tensor logits = model_->DecodeBatch(*kv_, kv_tensor_, ids, std::vector<int32_t>(r, 5));
        std::vector<char> host = Model::ToHost(logits);
        const float* rows_f = reinterpret_cast<const float*>(host.data());
        for (int64_t j = 0; j < r; ++j) {
          std::vector<float> row(rows_f + j * model_->vocab_size(), rows_f + (j + 1) * model_->vocab_size());
          auto picked = Pick(row, greedy, rng);
          PickedConfidence(row, picked.first, picked.second);
        }
        for (int64_t s : ids) kv_->PopN(s, 1);
      });
    }
    std::vector<int32_t> tokens(32);
    for (int i = 0; i < 32; ++i) tokens[i] = 6 + i;
    double catch_up = TimeMin([&] {
      model_->Prefill(*kv_, kv_tensor_, scratch[0], tokens);
      kv_->PopN(scratch[0], 32);
    });
    per_token = std::max(catch_up - table[*std::min_element(rows.begin(), rows.end())], 0.0) / 31;
  } catch (...) {
    for (int64_t s : scratch) kv_->RemoveSequence(s);
    throw;
  }
  for (int64_t s : scratch) kv_->RemoveSequence(s);
  return {table, per_token};
}

}  // namespace spc
