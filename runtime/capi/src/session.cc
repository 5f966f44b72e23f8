// See session.h. The loop mirrors runtime/engine.py Engine._run/_step/_emit for one
// sequence: prefill in prefill_chunk_size chunks, sample the first token, then per step
// draft up to k tokens by prompt lookup, run the target once over [last] + drafts,
// accept with the library's accept_greedy kernel (greedy) or rejection sampling with a
// one-hot draft distribution (sampled), roll the KV cache back over rejected drafts
// and emit accepted drafts plus the bonus token, stopping at a stop token or the budget.
#include "session.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <string>

#include "drafters/suffix.h"
#include "sampling.h"

namespace spc {

namespace {
double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

size_t FindStop(const std::string& text, const std::vector<std::string>& stop) {
  size_t first = std::string::npos;
  for (const std::string& s : stop) {
    if (!s.empty()) first = std::min(first, text.find(s));
  }
  return first;
}

struct Session::Run {
  std::vector<int32_t> history;  // prompt + emitted tokens; history.back() is not yet in the KV cache
  int64_t budget = 0;
  const Request* request = nullptr;
  const spc_generate_params* params = nullptr;
  Result* result = nullptr;
  std::unique_ptr<StreamDecoder> decoder;  // with a tokenizer
  int finish = SPC_FINISH_NONE;
};

Session::Session(Model* model, const spc_session_config& cfg, Model* draft) : model_(model), cfg_(cfg) {
  if (cfg.speculative_mode != SPC_SPEC_DISABLE && cfg.speculative_mode != SPC_SPEC_NGRAM &&
      cfg.speculative_mode != SPC_SPEC_SMALL_DRAFT && cfg.speculative_mode != SPC_SPEC_SUFFIX) {
    throw std::invalid_argument("unknown speculative_mode " + std::to_string(cfg.speculative_mode) +
                                "; use SPC_SPEC_DISABLE, SPC_SPEC_NGRAM, SPC_SPEC_SMALL_DRAFT or SPC_SPEC_SUFFIX");
  }
  if (cfg.ngram_min < 1 || cfg.ngram_min > cfg.ngram_max) throw std::invalid_argument("ngram sizes need 1 <= min_n <= max_n");
  if (cfg.draft_length < 1) throw std::invalid_argument("draft_length must be >= 1");
  if (cfg.draft_length + 1 > model->config().prefill_chunk_size) {
    throw std::invalid_argument("the token budget per forward (" + std::to_string(model->config().prefill_chunk_size) +
                                ") cannot hold draft_length + 1 tokens; lower draft_length");
  }
  if (cfg.max_total_seq_len < 0) throw std::invalid_argument("max_total_seq_len must be >= 0");
  if (cfg.prefix_cache_max_num_recycling_seqs < 0 || cfg.prefix_cache_max_num_recycling_seqs > 1) {
    throw std::invalid_argument("prefix_cache_max_num_recycling_seqs is 0 (off) or 1: a session holds one sequence");
  }
  int64_t total = cfg.max_total_seq_len ? cfg.max_total_seq_len : model->config().context_window_size;
  int64_t pages = 0;
  model->CreateKVCache(total, &kv_tensor_, &pages);
  kv_ = new PagedKV(pages, model->page_size());
  // the proposer registry of runtime/speculative.py, for the modes the C runtime runs
  if (cfg.speculative_mode == SPC_SPEC_NGRAM) {
    proposer_ = std::make_unique<NGramProposer>(cfg.ngram_min, cfg.ngram_max);
  } else if (cfg.speculative_mode == SPC_SPEC_SUFFIX) {
    proposer_ = std::make_unique<SuffixProposer>();
  } else if (cfg.speculative_mode == SPC_SPEC_SMALL_DRAFT) {
    if (!draft) throw std::invalid_argument("small_draft needs the draft model (spc_session_config.draft_model)");
    proposer_ = std::make_unique<SmallDraftProposer>(draft, *model, total);
  }
}

Session::~Session() { delete kv_; }

int Session::Generate(const Request& request, Result* result) {
  const std::vector<int32_t>& prompt = request.prompt;
  const spc_generate_params& params = request.params;
  int64_t ctx = model_->config().context_window_size;
  if (params.max_tokens <= 0) throw std::invalid_argument("max_tokens must be positive");
  if (!(params.temperature >= 0 && std::isfinite(params.temperature))) {
    throw std::invalid_argument("temperature must be finite and >= 0");
  }
  if (!(params.top_p > 0 && params.top_p <= 1)) throw std::invalid_argument("top_p must be in (0, 1]");
  if (params.top_k < 0) throw std::invalid_argument("top_k must be >= 0");
  if (prompt.empty()) throw std::invalid_argument("the prompt is empty");
  if (static_cast<int64_t>(prompt.size()) >= ctx) {
    throw std::invalid_argument("the prompt has " + std::to_string(prompt.size()) + " tokens but the context window is " +
                                std::to_string(ctx) + "; shorten it or rebuild with gen_config --context-window-size");
  }
  if (!request.stop.empty() && !request.tokenizer) throw std::invalid_argument("stop strings need a tokenizer");
  model_->CheckTokenIds(prompt.data(), prompt.size());
  if (request.tokenizer && request.tokenizer->vocab_size() > model_->vocab_size()) {
    throw IncompatibleError("the tokenizer has " + std::to_string(request.tokenizer->vocab_size()) +
                            " tokens but the model's vocabulary is " + std::to_string(model_->vocab_size()) +
                            ": it belongs to another model");
  }
  *result = Result{};
  result->prompt_token_ids = prompt;
  stats_ = spc_stats{};
  spec_ = SpecMetrics{};
  rng_.seed(params.seed);
  Run run;
  run.history = prompt;
  run.budget = std::min<int64_t>(params.max_tokens, ctx - static_cast<int64_t>(prompt.size()));
  run.request = &request;
  run.params = &params;
  run.result = result;
  if (request.tokenizer) run.decoder = std::make_unique<StreamDecoder>(request.tokenizer);
  size_t cached = TakeKept(prompt);
  try {
    double t0 = Now();
    int64_t chunk = model_->config().prefill_chunk_size;
    Tensor logits;
    for (size_t start = cached; start < prompt.size(); start += chunk) {
      size_t end = std::min(prompt.size(), start + static_cast<size_t>(chunk));
      std::vector<int32_t> piece(prompt.begin() + start, prompt.begin() + end);
      logits = model_->Prefill(*kv_, kv_tensor_, kSeq, piece);
      if (proposer_) proposer_->Prefill(kSeq, piece, static_cast<int64_t>(start));
    }
    int32_t first = Sample(model_->LogitsRow(logits, 0), params, rng_);
    stats_.prefill_tokens = static_cast<int64_t>(prompt.size() - cached);
    stats_.cached_prompt_tokens = static_cast<int64_t>(cached);
    stats_.prefill_seconds = Now() - t0;
    Emit(run, {first}, false);
    while (run.finish == SPC_FINISH_NONE) {
      double s0 = Now();
      Step(run);
      stats_.decode_seconds += Now() - s0;
    }
  } catch (...) {
    Free();
    kept_.clear();
    throw;
  }
  Keep(run);
  stats_.finish_reason = result->finish_reason = run.finish;
  stats_.prefill_tokens_per_s = stats_.prefill_seconds > 0 ? stats_.prefill_tokens / stats_.prefill_seconds : 0.0;
  stats_.decode_tokens_per_s = stats_.decode_seconds > 0 ? stats_.decode_tokens / stats_.decode_seconds : 0.0;
  stats_.draft_tokens = spec_.draft_tokens;
  stats_.accepted_tokens = spec_.accepted_tokens;
  stats_.verify_steps = spec_.verify_steps;
  stats_.plain_steps = spec_.plain_steps;
  stats_.accept_rate = spec_.accept_rate();
  stats_.mean_accepted_length = spec_.mean_accepted_length();
  return run.finish;
}

size_t SharedPrefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  size_t n = std::min(a.size(), b.size()), i = 0;
  while (i < n && a[i] == b[i]) ++i;
  return i;
}

size_t Session::TakeKept(const std::vector<int32_t>& prompt) {
  // runtime/prefix_cache.py PrefixCache.take, for the session's one sequence: the prompt's
  // last token is always prefilled (its logits give the first output token).
  size_t shared = kept_.empty() ? 0 : std::min(SharedPrefix(kept_, prompt), prompt.size() - 1);
  if (kept_.empty() || shared < kMinReuse) {
    if (!kept_.empty()) Free();
    kept_.clear();
    kv_->AddSequence(kSeq);
    if (proposer_) proposer_->AddSequence(kSeq);
    return 0;
  }
  if (proposer_) shared = static_cast<size_t>(proposer_->Resume(kSeq, prompt, static_cast<int64_t>(shared)));
  kv_->PopN(kSeq, kv_->Length(kSeq) - static_cast<int64_t>(shared));
  kept_.clear();
  return shared;
}

void Session::Keep(const Run& run) {
  // runtime/prefix_cache.py PrefixCache.keep: the KV cut to the history less its last token,
  // which no forward has read (a stop may also end the text before the last accepted draft).
  // A generation cut short (cancelled) is not kept, as in Python.
  if (!cfg_.prefix_cache_max_num_recycling_seqs || run.finish == SPC_FINISH_CANCELLED) {
    Free();
    return;
  }
  int64_t n = std::min<int64_t>(kv_->Length(kSeq), static_cast<int64_t>(run.history.size()) - 1);
  kv_->PopN(kSeq, kv_->Length(kSeq) - n);
  kept_.assign(run.history.begin(), run.history.begin() + n);
}

void Session::Free() {
  kv_->RemoveSequence(kSeq);
  if (proposer_) proposer_->RemoveSequence(kSeq);
}

void Session::Step(Run& run) {
  // engine.py _propose: the fixed depth, capped by the tokens one forward takes and the context window
  int64_t room = model_->config().context_window_size - static_cast<int64_t>(run.history.size());
  Draft draft;
  if (proposer_) {
    int64_t k = std::min<int64_t>({cfg_.draft_length, model_->config().prefill_chunk_size - 1, room - 1});
    try {
      draft = proposer_->Propose(kSeq, run.history, k, *run.params, rng_);
    } catch (const KVCacheFull&) {  // the draft model's cache is full: this step verifies no drafts
      draft = Draft{};
    }
  }
  std::vector<int32_t>& drafts = draft.tokens;
  int32_t last = run.history.back();
  Tensor logits;
  if (!drafts.empty()) {
    std::vector<int32_t> chain{last};
    chain.insert(chain.end(), drafts.begin(), drafts.end());
    try {
      logits = model_->ForwardTokens(*kv_, kv_tensor_, kSeq, chain);
    } catch (const KVCacheFull&) {  // the KV cache cannot hold the drafts: verify none of them
      drafts.clear();
    }
  }
  if (drafts.empty()) logits = model_->Decode(*kv_, kv_tensor_, kSeq, last);
  std::vector<int32_t> tokens;
  size_t accepted = 0;
  if (run.params->temperature == 0.0f) {
    // the library's TensorIR kernel: argmax and chain walk on the device
    std::vector<int32_t> chain{last};
    chain.insert(chain.end(), drafts.begin(), drafts.end());
    auto verdict = model_->AcceptGreedyChain(logits, chain);
    accepted = static_cast<size_t>(verdict.first);
    tokens.assign(drafts.begin(), drafts.begin() + accepted);
    tokens.push_back(verdict.second);
  } else {
    // runtime/acceptance.py accept_reference on a chain: accept draft x with probability
    // min(1, p(x) / q(x)); on rejection draw the bonus from norm(max(p - q, 0)). q is the draft's
    // distribution (small_draft sampled it), or one-hot at x (n-gram drafts).
    std::uniform_real_distribution<double> unif(0.0, 1.0);
    for (size_t row = 0;; ++row) {
      std::vector<double> p = ProbsFromLogits(model_->LogitsRow(logits, static_cast<int64_t>(row)), *run.params);
      if (row < drafts.size()) {
        int32_t x = drafts[row];
        const std::vector<double>* q = row < draft.probs.size() ? &draft.probs[row] : nullptr;
        auto q_of = [&](size_t v) { return q ? (*q)[v] : (v == static_cast<size_t>(x) ? 1.0 : 0.0); };
        if (q_of(x) > 0 && unif(rng_) < std::min(1.0, p[x] / q_of(x))) {
          tokens.push_back(x);
          ++accepted;
          continue;
        }
        double total = 0.0;  // the residual's mass, then the residual in place (no vocab-sized copy per row)
        for (size_t v = 0; v < p.size(); ++v) total += std::max(p[v] - q_of(v), 0.0);
        if (total > 0) {  // p == q on the support leaves an empty residual: keep p
          for (size_t v = 0; v < p.size(); ++v) p[v] = std::max(p[v] - q_of(v), 0.0) / total;
        }
      }
      std::discrete_distribution<int32_t> dist(p.begin(), p.end());
      tokens.push_back(dist(rng_));
      break;
    }
  }
  kv_->PopN(kSeq, static_cast<int64_t>(drafts.size() - accepted));
  if (drafts.empty()) {
    spec_.plain_steps += 1;
  } else {
    spec_.RecordVerify(static_cast<int64_t>(drafts.size()), static_cast<int64_t>(accepted),
                       static_cast<int64_t>(tokens.size()));
  }
  Emit(run, tokens, true);
}

void Session::Emit(Run& run, const std::vector<int32_t>& tokens, bool count_decode) {
  // runtime/sequence.py Sequence.emit: stop at a stop token, a stop string or the budget;
  // tokens past a stop are dropped, never shown.
  const auto& stop = model_->config().stop_token_ids;
  std::vector<int32_t>& emitted = run.result->token_ids;
  std::string pending;
  size_t n = 0;
  for (int32_t tok : tokens) {
    if (stop.count(tok) && !run.params->ignore_eos) {
      run.finish = SPC_FINISH_STOP;
      break;
    }
    run.history.push_back(tok);
    emitted.push_back(tok);
    ++n;
    if (run.decoder) {
      std::string delta = run.decoder->Push(&tok, 1);
      const std::string& text = run.decoder->text();
      size_t hit = FindStop(text, run.request->stop);
      if (hit != std::string::npos) {
        size_t past = text.size() - hit;  // bytes of the text from the stop string on
        pending += delta.substr(0, delta.size() > past ? delta.size() - past : 0);
        run.result->text = text.substr(0, hit);
        run.finish = SPC_FINISH_STOP;
        break;
      }
      pending += delta;
      run.result->text = text;
    }
    if (static_cast<int64_t>(emitted.size()) >= run.budget) {
      run.finish = SPC_FINISH_LENGTH;
      break;
    }
  }
  if (count_decode) stats_.decode_tokens += static_cast<int64_t>(n);
  const auto& on_step = run.request->on_step;
  if (n > 0 && on_step && on_step(emitted.data() + emitted.size() - n, n, pending) && run.finish == SPC_FINISH_NONE) {
    run.finish = SPC_FINISH_CANCELLED;
  }
}

}  // namespace spc
