// See session.h. The loop mirrors runtime/engine.py Engine.prefill/step/_emit for one
// sequence: prefill in prefill_chunk_size chunks, sample the first token, then per step draft
// (a chain of up to k tokens, or a token tree of depth k), run the target once over
// [last] + drafts, accept with the library's accept_greedy kernel (greedy) or recursive
// rejection sampling (sampled), keep the accepted tokens' KV (a chain rolls back, a tree moves
// its accepted path into place), hand a head the features of the committed tokens, and emit
// accepted drafts plus the bonus token, stopping at a stop token, a stop string or the budget.
#include "session.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <string>

#include "costs.h"
#include "drafters/eagle.h"
#include "drafters/medusa.h"
#include "drafters/merged.h"
#include "drafters/suffix.h"
#include "penalties.h"
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

namespace {
// runtime/speculative.py drafter_mode + build: the proposer that drives an additional model, by its kind.
std::unique_ptr<Proposer> BuildDrafter(Model* additional, const Model& target, int64_t kv_tokens,
                                       const spc_session_config& cfg) {
  const std::string& kind = additional->kind();
  if (kind == "eagle" || kind == "eagle3") {
    int64_t depth = std::max<int64_t>(cfg.draft_length, kMaxDepth);
    return std::make_unique<EagleProposer>(
        additional, target, HeadKVTokens(kv_tokens, 1, cfg.spec_tree_width, depth, additional->page_size()),
        cfg.spec_tree_width, cfg.spec_tree_nodes);
  }
  if (kind == "medusa") return std::make_unique<MedusaProposer>(additional, target, cfg.spec_tree_width, cfg.spec_tree_nodes);
  return std::make_unique<SmallDraftProposer>(additional, target, kv_tokens);
}

const char* ModeName(int mode) {
  static const char* kNames[] = {"disable", "ngram", "small_draft", "suffix", "eagle", "medusa"};
  return mode >= 0 && mode <= SPC_SPEC_MEDUSA ? kNames[mode] : "?";
}
}  // namespace

Session::Session(Model* model, const spc_session_config& cfg, Model* additional) : model_(model), cfg_(cfg) {
  int mode = cfg.speculative_mode;
  if (mode < SPC_SPEC_DISABLE || mode > SPC_SPEC_MEDUSA) {
    throw std::invalid_argument("unknown speculative_mode " + std::to_string(mode) +
                                "; use SPC_SPEC_DISABLE, _NGRAM, _SMALL_DRAFT, _SUFFIX, _EAGLE or _MEDUSA");
  }
  if (cfg.ngram_min < 1 || cfg.ngram_min > cfg.ngram_max) throw std::invalid_argument("ngram sizes need 1 <= min_n <= max_n");
  if (cfg.draft_length < 0) throw std::invalid_argument("draft_length must be >= 0 (0 = adaptive)");
  if (cfg.draft_length + 1 > model->config().prefill_chunk_size) {
    throw std::invalid_argument("the token budget per forward (" + std::to_string(model->config().prefill_chunk_size) +
                                ") cannot hold draft_length + 1 tokens; lower draft_length");
  }
  if (cfg.spec_tree_width < 1) throw std::invalid_argument("spec_tree_width must be >= 1 (1 = chain)");
  if (cfg.spec_tree_nodes < 1 || cfg.spec_tree_nodes > kMaxTreeNodes) {
    throw std::invalid_argument("spec_tree_nodes must be in 1.." + std::to_string(kMaxTreeNodes));
  }
  bool trees = mode == SPC_SPEC_SUFFIX || mode == SPC_SPEC_EAGLE || mode == SPC_SPEC_MEDUSA;
  if ((cfg.spec_tree_width != 1 || cfg.spec_tree_nodes != 64) && !trees) {
    throw std::invalid_argument("spec_tree_width/spec_tree_nodes apply to the suffix, eagle and medusa modes");
  }
  if (cfg.max_total_seq_len < 0) throw std::invalid_argument("max_total_seq_len must be >= 0");
  if (cfg.prefix_cache_max_num_recycling_seqs < 0 || cfg.prefix_cache_max_num_recycling_seqs > 1) {
    throw std::invalid_argument("prefix_cache_max_num_recycling_seqs is 0 (off) or 1: a session holds one sequence");
  }
  // runtime/speculative.py check: which modes take an additional model, and which need one
  bool needs = mode == SPC_SPEC_SMALL_DRAFT || mode == SPC_SPEC_EAGLE || mode == SPC_SPEC_MEDUSA;
  if (needs && !additional) {
    const char* what = mode == SPC_SPEC_SMALL_DRAFT ? "the draft model" : mode == SPC_SPEC_EAGLE ? "its EAGLE head"
                                                                                                   : "its Medusa heads";
    throw std::invalid_argument(std::string(ModeName(mode)) + " needs " + what + " (spc_session_config.draft_model)");
  }
  if (additional && !needs && mode != SPC_SPEC_SUFFIX) {
    throw std::invalid_argument(std::string("speculative_mode ") + ModeName(mode) + " drafts without a model: "
                                "draft_model is for the small_draft, eagle, medusa and suffix modes");
  }
  if (mode == SPC_SPEC_SMALL_DRAFT && additional->kind() != "target") {
    throw IncompatibleError(additional->lib_path() + " is a " + additional->kind() + " head; small_draft needs a draft "
                            "model (use SPC_SPEC_" + (additional->kind() == "medusa" ? "MEDUSA" : "EAGLE") + ")");
  }
  if (mode == SPC_SPEC_EAGLE) CheckHead(*additional, *model, {"eagle", "eagle3"}, "eagle");
  if (mode == SPC_SPEC_MEDUSA) CheckHead(*additional, *model, {"medusa"}, "medusa");
  int64_t total = cfg.max_total_seq_len ? cfg.max_total_seq_len : model->config().context_window_size;
  int64_t pages = 0;
  model->CreateKVCache(total, &kv_tensor_, &pages);
  kv_ = new PagedKV(pages, model->page_size());
  // the proposer registry of runtime/speculative.py; the suffix index merges with a drafter when one is given
  if (mode == SPC_SPEC_NGRAM) {
    proposer_ = std::make_unique<NGramProposer>(cfg.ngram_min, cfg.ngram_max);
  } else if (mode == SPC_SPEC_SUFFIX) {
    auto index = std::make_unique<SuffixProposer>(cfg.spec_tree_width, cfg.spec_tree_nodes);
    if (additional) {
      proposer_ = std::make_unique<MergedProposer>(std::move(index), BuildDrafter(additional, *model, total, cfg));
    } else {
      proposer_ = std::move(index);
    }
  } else if (needs) {
    proposer_ = BuildDrafter(additional, *model, total, cfg);
  }
  std::string features = proposer_ ? proposer_->features() : "";
  features_ = features == "layers" ? (kHidden | kFeatures) : features == "hidden" ? kHidden : 0;
  if (!proposer_) return;
  // engine.py: the costs, read from the profile this host keeps (the Python runtime's too) or
  // measured now on scratch sequences; what earlier processes learned of the acceptance, when
  // they ran these very weights; then a fixed draft length or the adaptive one
  // a library linked into the app (system://prefix) has no file to digest: its _metadata names it
  auto identity = [](const Model& m) {
    return m.lib_path().compare(0, 9, "system://") == 0 ? m.lib_path() + "\n" + m.metadata_json() : m.lib_path();
  };
  std::vector<std::string> libs{identity(*model)}, dirs{model->model_dir()};
  if (additional) {
    libs.push_back(identity(*additional));
    dirs.push_back(additional->model_dir());
  }
  int64_t max_rows = model->config().prefill_chunk_size;
  std::vector<int64_t> rows;
  for (int64_t r : kTargetRows)
    if (r <= max_rows) rows.push_back(r);
  std::string path = ProfilePath(libs, std::string(ModeName(mode)) + "|w" + std::to_string(cfg.spec_tree_width),
                                 "rows<=" + std::to_string(*std::max_element(rows.begin(), rows.end())));
  if (auto loaded = CostModel::Load(path)) {
    cost_ = std::make_unique<CostModel>(std::move(*loaded));
  } else {
    CostTable target(MeasureTarget(*model, *kv_, kv_tensor_, rows, features_, kProfileSeconds));
    auto draft = proposer_->Measure(std::vector<int64_t>(std::begin(kDraftRows), std::end(kDraftRows)));
    cost_ = std::make_unique<CostModel>(target, CostTable(draft.first), draft.second, path);
    cost_->Save();
  }
  std::string key = WeightsKey(dirs);
  if (cost_->acceptance_of != key) {  // learned with other weights: start from the prior
    cost_->acceptance.reset();
    cost_->acceptance_of = key;
  }
  AcceptanceModel acceptance;
  if (cfg.draft_length == 0) acceptance.Restore(cost_->acceptance);
  policy_ = std::make_unique<Policy>(cost_.get(), std::move(acceptance), cfg.draft_length);
}

Session::~Session() { delete kv_; }

int Session::Generate(const Request& request, Result* result) {
  const std::vector<int32_t>& prompt = request.prompt;
  spc_generate_params params = request.params;
  params.logit_bias_tokens = request.logit_bias_tokens.data();
  params.logit_bias = request.logit_bias.data();
  params.n_logit_bias = std::min(request.logit_bias_tokens.size(), request.logit_bias.size());
  int64_t ctx = model_->config().context_window_size;
  if (params.max_tokens <= 0) throw std::invalid_argument("max_tokens must be positive");
  if (!(params.temperature >= 0 && std::isfinite(params.temperature))) {
    throw std::invalid_argument("temperature must be finite and >= 0");
  }
  if (!(params.top_p > 0 && params.top_p <= 1)) throw std::invalid_argument("top_p must be in (0, 1]");
  if (params.top_k < 0) throw std::invalid_argument("top_k must be >= 0");
  CheckAdjustments(params, model_->vocab_size());
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
      if (features_) {  // a head reads every prompt token's features; get_logits finishes the last row
        ForwardOut out = model_->Forward(*kv_, kv_tensor_, kSeq, piece, nullptr, features_);
        std::vector<char> hidden = Model::ToHost(out.hidden);
        size_t row = hidden.size() / piece.size();
        logits = model_->GetLogits(model_->Upload(hidden.data() + (piece.size() - 1) * row,
                                                  {1, model_->hidden_size()}, model_->dtype()));
        std::vector<int32_t> rows(piece.size());
        std::iota(rows.begin(), rows.end(), 0);
        Observe(static_cast<int64_t>(start), out, rows);
      } else {
        logits = model_->Prefill(*kv_, kv_tensor_, kSeq, piece);
      }
      // a draft model prefills along when drafting can win back what its prefill costs over what
      // the sequence is expected to emit (engine.py prefill); heads and indexes have no prefill cost
      if (proposer_ && policy_->DraftPrefillPays(static_cast<int64_t>(prompt.size()),
                                                 policy_->ExpectedOutput(run.budget, 0), 1, kSeq) &&
          policy_->ExpectsDrafting({kSeq})) {
        proposer_->Prefill(kSeq, piece, static_cast<int64_t>(start));
      }
    }
    std::vector<float> row = model_->LogitsRow(logits, 0);
    if (AdjustsLogits(params)) AdjustRows(row.data(), model_->vocab_size(), params, prompt, prompt.size(), {{}});
    int32_t first = Sample(row, params, rng_);
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
  if (policy_ && policy_->fixed_k == 0) policy_->Save();  // what this generation taught, for the next process
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
    if (proposer_) {
      proposer_->AddSequence(kSeq, prompt);
      policy_->acceptance.NewPrompt(kSeq);
    }
    return 0;
  }
  if (proposer_) {
    shared = static_cast<size_t>(proposer_->Resume(kSeq, prompt, static_cast<int64_t>(shared)));
    policy_->acceptance.NewPrompt(kSeq);
  }
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
  if (policy_) policy_->acceptance.Forget(kSeq);
}

void Session::Free() {
  kv_->RemoveSequence(kSeq);
  if (proposer_) {
    proposer_->RemoveSequence(kSeq);
    policy_->acceptance.Forget(kSeq);
  }
}

void Session::Observe(int64_t position, const ForwardOut& out, const std::vector<int32_t>& rows) {
  const Tensor& t = (features_ & kFeatures) ? out.features : out.hidden;
  std::vector<char> host = Model::ToHost(t);
  const DLTensor* d = t.GetDLTensorPtr();
  size_t row_bytes = host.size() / static_cast<size_t>(d->shape[0]);
  std::vector<char> picked;
  for (int32_t r : rows) picked.insert(picked.end(), host.begin() + r * row_bytes, host.begin() + (r + 1) * row_bytes);
  proposer_->ObserveHidden(kSeq, position, picked.data(), static_cast<int64_t>(rows.size()), row_bytes);
}

std::pair<Draft, int64_t> Session::Propose(Run& run, std::optional<StepPlan>* plan) {
  // engine.py _propose: the depth is fixed or up to kMaxDepth, capped by the tokens one forward
  // takes and the context window; the plan keeps the nodes worth their verify rows
  if (!proposer_) return {Draft{}, 0};
  int64_t room = model_->config().context_window_size - static_cast<int64_t>(run.history.size());
  int64_t limit = model_->config().prefill_chunk_size - 1;
  int64_t k = std::min<int64_t>({policy_->fixed_k > 0 ? policy_->fixed_k : kMaxDepth, limit, room - 1});
  if (k <= 0 || policy_->Hopeless(1, proposer_->free_drafts())) return {Draft{}, 0};
  plan->emplace(policy_->NewPlan(1, {kSeq}));
  int64_t before = proposer_->forwards();
  Draft draft;
  try {
    draft = (*plan)->Select({proposer_->Propose(kSeq, run.history, k, *run.params, rng_, Plan{&**plan, kSeq}, limit)})[0];
  } catch (const KVCacheFull&) {  // the draft's cache is full: this step verifies no drafts
    draft = Draft{};
  }
  return {draft, proposer_->forwards() - before};
}

ForwardOut Session::Verify(Run& run, Draft& draft) {
  // engine.py _forward: one target forward over [last] + drafts (a tree's rows are scratch rows);
  // a proposer that reads features gets the forward that returns them, logits from get_logits
  std::vector<int32_t> tokens{run.history.back()};
  tokens.insert(tokens.end(), draft.tokens.begin(), draft.tokens.end());
  try {
    if (features_) {
      std::vector<int32_t> parents = draft.VerifyParents();
      return model_->Forward(*kv_, kv_tensor_, kSeq, tokens, draft.is_tree() ? &parents : nullptr, features_ | kLogits);
    }
    ForwardOut out;
    if (draft.tokens.empty()) {
      out.logits = model_->Decode(*kv_, kv_tensor_, kSeq, tokens[0]);
    } else {
      std::vector<int32_t> parents = draft.VerifyParents();
      out = model_->Forward(*kv_, kv_tensor_, kSeq, tokens, draft.is_tree() ? &parents : nullptr, kLogits);
    }
    return out;
  } catch (const KVCacheFull&) {  // the KV cache cannot hold the drafts: verify none of them
    if (draft.tokens.empty()) throw;
    draft = Draft{};
    return Verify(run, draft);
  }
}

std::pair<std::vector<int32_t>, int32_t> Session::Accept(Run& run, const Draft& draft, const Tensor& verified) {
  Tensor logits = verified;
  if (AdjustsLogits(*run.params)) {  // penalties.py adjust_step: each row as of its own prefix
    std::vector<char> rows = Model::ToHost(verified);
    int64_t vocab = model_->vocab_size(), n = static_cast<int64_t>(draft.size()) + 1;
    AdjustRows(reinterpret_cast<float*>(rows.data()), vocab, *run.params, run.history,
               run.result->prompt_token_ids.size(), NodePaths(draft, static_cast<size_t>(n)));
    logits = model_->Upload(rows.data(), {n, vocab}, DLDataType{kDLFloat, 32, 1});
  }
  std::vector<int32_t> tokens{run.history.back()};
  tokens.insert(tokens.end(), draft.tokens.begin(), draft.tokens.end());
  std::vector<int32_t> parents = draft.VerifyParents();
  if (run.params->temperature == 0.0f) return model_->AcceptGreedy(logits, tokens, parents);  // the library's kernel
  // runtime/acceptance.py accept_reference: from the root, try each node's children in order and
  // accept child x with probability min(1, p(x) / q(x)); after a rejection p becomes
  // norm(max(p - q, 0)) before the next sibling. q is the draft's distribution (small_draft
  // sampled it), or one-hot at x (every other proposer). The bonus is drawn from the final p.
  std::vector<char> host = Model::ToHost(logits);
  int64_t vocab = model_->vocab_size();
  auto row_logits = [&](int32_t node) {
    const float* r = reinterpret_cast<const float*>(host.data()) + static_cast<int64_t>(node + 1) * vocab;
    return std::vector<float>(r, r + vocab);
  };
  std::vector<int32_t> par = draft.ParentList(), path;
  std::uniform_real_distribution<double> unif(0.0, 1.0);
  int32_t node = -1;
  while (true) {
    std::vector<double> p = ProbsFromLogits(row_logits(node), *run.params);
    int32_t accepted = -1;
    for (size_t c = 0; c < draft.size(); ++c) {
      if (par[c] != node) continue;
      int32_t x = draft.tokens[c];
      const std::vector<double>* q = c < draft.probs.size() ? &draft.probs[c] : nullptr;
      auto q_of = [&](size_t v) { return q ? (*q)[v] : (v == static_cast<size_t>(x) ? 1.0 : 0.0); };
      if (q_of(x) > 0 && unif(rng_) < std::min(1.0, p[x] / q_of(x))) {
        accepted = static_cast<int32_t>(c);
        break;
      }
      double total = 0.0;  // the residual's mass, then the residual in place (no vocab-sized copy)
      for (size_t v = 0; v < p.size(); ++v) total += std::max(p[v] - q_of(v), 0.0);
      if (total <= 0) {  // p == q on the support: fall back to p's mass elsewhere
        p = ProbsFromLogits(row_logits(node), *run.params);
        break;
      }
      for (size_t v = 0; v < p.size(); ++v) p[v] = std::max(p[v] - q_of(v), 0.0) / total;
    }
    if (accepted < 0) {
      std::discrete_distribution<int32_t> dist(p.begin(), p.end());
      return {path, dist(rng_)};
    }
    path.push_back(accepted);
    node = accepted;
  }
}

void Session::Commit(Run& run, const Draft& draft, const std::vector<int32_t>& path, const ForwardOut& out) {
  // engine.py _commit: a chain rolls back what was rejected, a tree moves its accepted path into
  // place; a proposer that reads features gets those of the last committed token and the accepted drafts
  std::vector<int32_t> rows{0};
  for (int32_t j : path) rows.push_back(j + 1);
  if (draft.is_tree()) {
    model_->CommitTree(*kv_, kv_tensor_, kSeq, rows);
  } else {
    kv_->PopN(kSeq, static_cast<int64_t>(draft.size() - path.size()));
  }
  if (features_) Observe(static_cast<int64_t>(run.history.size()) - 1, out, rows);
}

void Session::Step(Run& run) {
  double t0 = Now();
  std::optional<StepPlan> plan;
  auto [draft, draft_forwards] = Propose(run, &plan);
  double t1 = Now();
  ForwardOut out = Verify(run, draft);
  auto verdict = Accept(run, draft, out.logits);
  double t2 = Now();
  const std::vector<int32_t>& path = verdict.first;
  Commit(run, draft, path, out);
  std::vector<int32_t> tokens;
  for (int32_t j : path) tokens.push_back(draft.tokens[j]);
  tokens.push_back(verdict.second);
  int64_t emitted = Emit(run, tokens, true);
  if (proposer_ && run.finish == SPC_FINISH_NONE) proposer_->OnCommit(kSeq, run.history);
  if (draft.tokens.empty()) {
    spec_.plain_steps += 1;
  } else {
    spec_.RecordVerify(static_cast<int64_t>(draft.size()), static_cast<int64_t>(path.size()),
                       static_cast<int64_t>(tokens.size()));
  }
  if (policy_) {  // engine.py: plain steps too, they keep the target's pace current
    StepRecord record;
    record.drafts = {&draft};
    record.paths = {path};
    record.emitted = {emitted};
    record.speculative = {true};
    record.draft_forwards = draft_forwards;
    record.draft_seconds = t1 - t0;
    record.target_seconds = t2 - t1;
    record.other_seconds = Now() - t2;
    record.seq_ids = {kSeq};
    policy_->Observe(record, plan ? &*plan : nullptr);
  }
}

int64_t Session::Emit(Run& run, const std::vector<int32_t>& tokens, bool count_decode) {
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
  if (run.finish != SPC_FINISH_NONE && policy_) policy_->ObserveOutput(static_cast<int64_t>(emitted.size()));
  if (n > 0 && on_step && on_step(emitted.data() + emitted.size() - n, n, pending) && run.finish == SPC_FINISH_NONE) {
    run.finish = SPC_FINISH_CANCELLED;
  }
  return static_cast<int64_t>(n);
}

}  // namespace spc
