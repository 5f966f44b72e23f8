// See adaptive.h; the arithmetic is adaptive.py's, in float64, in the same order.
#include "adaptive.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "json_util.h"

namespace spc {

AcceptanceModel::AcceptanceModel(double first_prior) : first_prior_(first_prior) {
  for (int b = 0; b < kBins; ++b) prior_[b] = std::min(0.99, std::max(0.01, (b + 0.5) / kBins));
}

int AcceptanceModel::Bin(double conf) {
  return std::min(kBins - 1, std::max(0, static_cast<int>(conf * kBins)));
}

PromptState AcceptanceModel::Seeded() const {
  double keep = std::min(1.0, kFirstPriorTrials / std::max(first_trials_, 1e-9));
  PromptState st;
  st.first_hits = first_hits_ * keep;
  st.first_trials = first_trials_ * keep;
  return st;
}

PromptState& AcceptanceModel::StateOf(int64_t seq) {
  auto it = prompts_.find(seq);
  if (it == prompts_.end()) it = prompts_.emplace(seq, Seeded()).first;
  return it->second;
}

double AcceptanceModel::Calibrated(double conf, int source) const {
  int b = Bin(conf);
  return (prior_[b] * kPriorTrials + hits_[source][b]) / (kPriorTrials + trials_[source][b]);
}

double AcceptanceModel::Local(int64_t seq, int source) {
  const PromptState& st = StateOf(seq);
  return std::min(kLocalMax, (st.local_hits[source] + kLocalPrior) / (st.local_expected[source] + kLocalPrior));
}

double AcceptanceModel::Predict(double conf, int64_t seq, int source) {
  return std::min(0.99, Calibrated(conf, source) * Local(seq, source));
}

void AcceptanceModel::Observe(const std::vector<double>& conf, const std::vector<int32_t>& parents,
                              const std::vector<int32_t>& path, int64_t seq, const std::vector<int32_t>& sources) {
  PromptState& st = StateOf(seq);
  auto on_path = [&](int32_t j) { return std::find(path.begin(), path.end(), j) != path.end(); };
  for (size_t j = 0; j < conf.size(); ++j) {
    int32_t p = parents[j];
    if (p >= 0 && !on_path(p)) continue;  // not tried: its parent was rejected
    int src = sources.empty() ? 0 : sources[j];
    double hit = on_path(static_cast<int32_t>(j)) ? 1.0 : 0.0;
    st.local_hits[src] = kLocalDecay * st.local_hits[src] + hit;
    st.local_expected[src] = kLocalDecay * st.local_expected[src] + Calibrated(conf[j], src);
    int b = Bin(conf[j]);
    for (int k = 0; k < kBins; ++k) {
      hits_[src][k] *= kDecay;
      trials_[src][k] *= kDecay;
    }
    hits_[src][b] += hit;
    trials_[src][b] += 1.0;
  }
  FirstEvidence(st, path.empty() ? 0.0 : 1.0);
  st.backoff = path.empty() ? std::min(2 * st.backoff, kMaxBackoff) : 1.0;
}

void AcceptanceModel::FirstEvidence(PromptState& st, double hit) {
  st.first_hits = kFirstDecay * st.first_hits + hit;
  st.first_trials = kFirstDecay * st.first_trials + 1.0;
  first_hits_ = kFirstDecay * first_hits_ + hit;
  first_trials_ = kFirstDecay * first_trials_ + 1.0;
}

void AcceptanceModel::ObserveUnverified(double p, int64_t seq) {
  PromptState& st = StateOf(seq);
  FirstEvidence(st, p);
  st.backoff = std::min(2 * st.backoff, kMaxBackoff);
}

void AcceptanceModel::NewPrompt(int64_t seq) { prompts_[seq] = Seeded(); }

double AcceptanceModel::First(int64_t seq) {
  const PromptState& st = StateOf(seq);
  return (first_prior_ * kFirstPriorTrials + st.first_hits) / (kFirstPriorTrials + st.first_trials);
}

void AcceptanceModel::Relax(int64_t seq) {
  PromptState& st = StateOf(seq);
  double decay = std::pow(kFirstPlainDecay, 1.0 / st.backoff);
  st.first_hits *= decay;
  st.first_trials *= decay;
  for (int s = 0; s < kSources; ++s) {
    st.local_hits[s] *= decay;
    st.local_expected[s] *= decay;
  }
}

std::pair<std::vector<double>, std::vector<int32_t>> NodeProbs(const std::vector<int32_t>& parents,
                                                               const std::vector<double>& conf,
                                                               const std::vector<int32_t>& sources,
                                                               const std::function<double(double, int)>& predict) {
  std::vector<double> probs;
  std::vector<int32_t> depths;
  for (size_t j = 0; j < parents.size(); ++j) {
    double a = predict(conf.empty() ? 1.0 : conf[j], sources.empty() ? 0 : sources[j]);
    int32_t p = parents[j];
    probs.push_back(p < 0 ? a : probs[p] * a);
    depths.push_back(p < 0 ? 1 : depths[p] + 1);
  }
  return {probs, depths};
}

// ------------------------------------------------------------- the learned state
namespace fj = tvm::ffi::json;

fj::Object AcceptanceModel::State() const {
  auto grid = [](const std::array<std::array<double, kBins>, kSources>& g) {
    fj::Array rows;
    for (const auto& r : g) {
      fj::Array row;
      for (double v : r) row.push_back(v);
      rows.push_back(row);
    }
    return rows;
  };
  fj::Object o;
  o.Set("hits", grid(hits_));
  o.Set("trials", grid(trials_));
  o.Set("first_hits", first_hits_);
  o.Set("first_trials", first_trials_);
  return o;
}

AcceptanceModel& AcceptanceModel::Restore(const std::optional<fj::Object>& state) {
  if (!state) return *this;
  try {
    auto read = [&](const char* key) {  // [SOURCES][BINS], or one curve [BINS] (source 0's)
      std::array<std::array<double, kBins>, kSources> out{};
      fj::Array rows = json::GetArray(*state, key);
      bool flat = rows.size() == kBins && !rows[0].try_cast<fj::Array>();
      if (!flat && rows.size() != kSources) throw std::invalid_argument("shape");
      for (int s = 0; s < (flat ? 1 : kSources); ++s) {
        fj::Array row = flat ? rows : rows[s].cast<fj::Array>();
        if (row.size() != kBins) throw std::invalid_argument("shape");
        for (int b = 0; b < kBins; ++b) out[s][b] = row[b].cast<double>();
      }
      return out;
    };
    auto hits = read("hits"), trials = read("trials");
    for (int s = 0; s < kSources; ++s)
      for (int b = 0; b < kBins; ++b)
        if (!(hits[s][b] >= 0 && hits[s][b] <= trials[s][b])) return *this;
    double fh = json::Get(*state, "first_hits").cast<double>(), ft = json::Get(*state, "first_trials").cast<double>();
    for (int s = 0; s < kSources; ++s)
      for (int b = 0; b < kBins; ++b) {
        double keep = std::min(1.0, kRestoredTrials / std::max(trials[s][b], 1e-9));
        hits_[s][b] = hits[s][b] * keep;
        trials_[s][b] = trials[s][b] * keep;
      }
    first_hits_ = 0.5 * fh;
    first_trials_ = 0.5 * ft;
    prompts_.clear();
  } catch (...) {  // a malformed state is ignored
  }
  return *this;
}

// ------------------------------------------------------------------ StepPlan
StepPlan::StepPlan(Policy* policy, int64_t batch, std::vector<int64_t> seq_ids)
    : policy_(policy), batch_(batch), seq_ids_(std::move(seq_ids)), fixed_(policy->fixed_k > 0) {
  off = !fixed_ && policy->GuardOff(batch);
  plain_rate_ = static_cast<double>(batch) / policy->PlainStepTime(batch);
}

double StepPlan::p(double conf, int64_t seq, int source) const { return policy_->acceptance.Predict(conf, seq, source); }

double StepPlan::first(int64_t seq) const { return policy_->acceptance.First(seq); }

std::tuple<double, double, int64_t> StepPlan::Best(std::vector<double> probs, double extra) const {
  // nodes in order of P while each pays for its row at the step's rate (or plain decoding's)
  const CostModel& cost = *policy_->cost;
  double e = static_cast<double>(batch_);
  int64_t rows = batch_;
  double t = sunk_ + extra + policy_->host + cost.target(rows);
  std::sort(probs.begin(), probs.end(), std::greater<double>());
  for (double p : probs) {
    double dt = cost.marginal(rows);
    if (p / dt <= std::max(e / t, plain_rate_)) break;
    e += p;
    rows += 1;
    t += dt;
  }
  return {e, t, rows};
}

bool StepPlan::ShouldDraft(int64_t rows, const std::vector<std::pair<double, double>>& expansions,
                           int64_t catch_up_tokens, bool free) {
  if (fixed_) return true;
  if (off || expansions.empty()) return false;
  const CostModel& cost = *policy_->cost;
  auto [e0, t0, r0] = Best(probs_);
  (void)r0;
  double bar = std::max(e0 / t0, plain_rate_);
  std::vector<double> probs = probs_;
  double extra = kCatchUpAmortized * cost.catch_up(catch_up_tokens);
  std::vector<std::pair<double, double>> runs = expansions;
  for (int j = 1; j <= kLookahead; ++j) {
    for (auto& r : runs) r.first = r.first * r.second;
    for (const auto& r : runs)
      if (r.first >= 1e-3) probs.push_back(r.first);
    auto [e, t, n] = Best(probs, extra + (free ? 0.0 : j * cost.draft(rows)));
    (void)n;
    if (e / t > bar * (1 + 1e-9)) {
      priced_ += (cost.catch_up(catch_up_tokens) + cost.draft(rows)) / cost.draft_overhead;
      return true;
    }
  }
  return false;
}

std::vector<Draft> StepPlan::Select(const std::vector<Draft>& drafts) {
  bool any = false;
  for (const Draft& d : drafts) any = any || d.size();
  if (fixed_ || !any) return drafts;
  if (off) return std::vector<Draft>(drafts.size());
  struct Node {
    double p;
    int32_t depth;
    size_t seq, node;
  };
  std::vector<Node> nodes;  // every sequence's nodes compete for the batch's rows
  for (size_t i = 0; i < drafts.size(); ++i) {
    int64_t sid = seq_ids_[i];
    auto pd = NodeProbs(drafts[i].ParentList(), drafts[i].conf, drafts[i].source,
                        [&](double c, int src) { return p(c, sid, src); });
    for (size_t j = 0; j < drafts[i].size(); ++j) nodes.push_back({pd.first[j], pd.second[j], i, j});
  }
  std::stable_sort(nodes.begin(), nodes.end(), [](const Node& a, const Node& b) {
    return a.p != b.p ? a.p > b.p : a.depth < b.depth;
  });
  std::vector<std::vector<int32_t>> keep(drafts.size());
  auto [e, t, rows] = Best({});
  const CostModel& cost = *policy_->cost;
  for (const Node& n : nodes) {
    int32_t parent = drafts[n.seq].ParentList()[n.node];
    double dt = cost.marginal(rows);
    if (n.p / dt <= std::max(e / t, plain_rate_)) break;
    auto& k = keep[n.seq];
    if (parent >= 0 && std::find(k.begin(), k.end(), parent) == k.end()) continue;
    k.push_back(static_cast<int32_t>(n.node));
    e += n.p;
    rows += 1;
    t += dt;
  }
  std::vector<Draft> out;
  for (size_t i = 0; i < drafts.size(); ++i) {
    if (drafts[i].size() && keep[i].empty()) {  // drafted, none worth a row: evidence for the first-token estimate
      double best = 0.0;
      for (const Node& n : nodes)
        if (n.seq == i && n.depth == 1) best = std::max(best, n.p);
      policy_->acceptance.ObserveUnverified(best, seq_ids_[i]);
    }
    std::sort(keep[i].begin(), keep[i].end());
    out.push_back(drafts[i].Subset(keep[i]));
  }
  return out;
}

// -------------------------------------------------------------------- Policy
int64_t StepRecord::rows() const {
  int64_t n = 0;
  for (const Draft* d : drafts) n += static_cast<int64_t>(d->size()) + 1;
  return n;
}

bool StepRecord::drafted() const {
  for (const Draft* d : drafts)
    if (d->size()) return true;
  return false;
}

Policy::Policy(CostModel* cost_model, AcceptanceModel acceptance_model, int64_t fixed)
    : cost(cost_model), acceptance(std::move(acceptance_model)), fixed_k(fixed) {
  try {
    if (cost->acceptance && json::Has(*cost->acceptance, "saved")) {
      for (const auto& kv : json::GetObject(*cost->acceptance, "saved")) {
        fj::Array v = kv.second.cast<fj::Array>();
        double sec = v[0].cast<double>(), tok = v[1].cast<double>();
        double keep = std::min(1.0, kSavedMin / std::max(tok, 1e-9));
        saved_[std::stoll(std::string(kv.first.cast<tvm::ffi::String>()))] = {sec * keep, tok * keep};
      }
    }
  } catch (...) {
    saved_.clear();
  }
}

bool Policy::Hopeless(int64_t batch, bool free_drafts) {
  if (fixed_k > 0) return false;
  auto key = std::make_tuple(batch, static_cast<int64_t>(std::nearbyint(std::log(std::max(cost->pace, 1e-9)) * 20)),
                             free_drafts);
  auto it = hopeless_.find(key);
  if (it != hopeless_.end()) return it->second;
  StepPlan plan = NewPlan(batch, std::vector<int64_t>(batch, 0));
  plan.off = false;
  bool out = !plan.ShouldDraft(batch, std::vector<std::pair<double, double>>(batch, {1.0, 1.0}), 0, free_drafts);
  hopeless_[key] = out;
  return out;
}

void Policy::Save() {
  fj::Object state = acceptance.State();
  fj::Object saved;
  for (const auto& kv : saved_) saved.Set(tvm::ffi::String(std::to_string(kv.first)), fj::Array{kv.second[0], kv.second[1]});
  state.Set("saved", saved);
  cost->acceptance = state;
  cost->Save();
}

bool Policy::GuardOff(int64_t batch) const {
  auto it = off_until_.find(batch);
  if (it == off_until_.end()) return false;
  return steps < it->second.first && clock < it->second.second;
}

bool Policy::ExpectsDrafting(const std::vector<int64_t>& seq_ids) {
  int64_t batch = static_cast<int64_t>(seq_ids.size());
  if (Hopeless(batch)) return false;
  std::vector<std::pair<double, double>> first;
  for (int64_t s : seq_ids) first.emplace_back(1.0, acceptance.First(s));
  return NewPlan(batch, seq_ids).ShouldDraft(batch, first);
}

double Policy::SavingPerToken(int64_t batch, int64_t seq) {
  auto it = saved_.find(batch);
  if (it != saved_.end() && it->second[1] >= kSavedMin) return std::max(it->second[0] / it->second[1], 0.0);
  double a = acceptance.First(seq), plain = PlainStepTime(batch);
  double best = plain, tokens = 1.0;
  for (int depth = 1; depth <= kMaxDepth; ++depth) {
    tokens += std::pow(a, depth);
    double step = host + cost->target(batch * (depth + 1)) + depth * cost->draft(batch);
    best = std::min(best, step / tokens);
  }
  return plain - best;
}

void Policy::ObserveOutput(int64_t emitted) {
  outputs_ = {kOutputDecay * outputs_[0] + static_cast<double>(emitted), kOutputDecay * outputs_[1] + 1.0};
}

double Policy::ExpectedOutput(int64_t budget, int64_t emitted) const {
  if (outputs_[1] < 1.0) return static_cast<double>(budget);
  return std::min(static_cast<double>(budget), std::max(outputs_[0] / outputs_[1] - static_cast<double>(emitted), 1.0));
}

bool Policy::DraftPrefillPays(int64_t prompt_tokens, double output_tokens, int64_t batch, int64_t seq) {
  double c = cost->catch_up(prompt_tokens);
  return c <= 0.0 || fixed_k > 0 || output_tokens * SavingPerToken(batch, seq) > c;
}

void Policy::Observe(const StepRecord& step, const StepPlan* plan) {
  cost->ObserveTarget(step.rows(), step.target_seconds);
  if (plan && step.draft_forwards) cost->ObserveDraft(step.draft_seconds, plan->priced());
  bool any = false;
  for (size_t i = 0; i < step.drafts.size(); ++i) {
    if (!step.speculative[i]) continue;
    any = true;
    const Draft& d = *step.drafts[i];
    if (d.size()) {
      if (!d.conf.empty()) acceptance.Observe(d.conf, d.ParentList(), step.paths[i], step.seq_ids[i], d.source);
    } else {
      acceptance.Relax(step.seq_ids[i]);
    }
  }
  if (any) {
    int64_t tokens = std::accumulate(step.emitted.begin(), step.emitted.end(), int64_t{0});
    ObserveStep(step.batch(), step.drafted(), tokens, step.seconds(), step.forward_seconds());
  }
}

void Policy::ObserveStep(int64_t batch, bool drafted, int64_t tokens, double seconds, double forward_seconds) {
  steps += 1;
  clock += seconds;
  if (steps % kSaveEvery == 0) Save();
  host += 0.1 * (std::max(seconds - forward_seconds, 0.0) - host);
  if (!drafted || fixed_k > 0) {
    auto it = saved_.find(batch);
    if (it != saved_.end()) it->second = {kSavedDecay * it->second[0], kSavedDecay * it->second[1]};
    return;
  }
  double per = static_cast<double>(tokens) / static_cast<double>(batch);
  auto& sv = saved_[batch];
  sv[0] = kSavedDecay * sv[0] + per * PlainStepTime(batch) - seconds;
  sv[1] = kSavedDecay * sv[1] + per;
  auto& window = speedups_[batch];
  window.push_back(static_cast<double>(tokens) * PlainStepTime(batch) /
                   (static_cast<double>(batch) * std::max(seconds, 1e-9)));
  if (window.size() > kGuardWindow) window.erase(window.begin(), window.end() - kGuardWindow);
  if (window.size() < kGuardMin) return;
  double sum = 0.0;
  for (double x : window) sum += x;
  double n = static_cast<double>(window.size()), mean = sum / n, sq = 0.0;
  for (double x : window) sq += (x - mean) * (x - mean);
  double sd = std::sqrt(sq / (n - 1));
  if (mean + 2.0 * sd / std::sqrt(n) < 1.0) {  // measurably slower than plain
    auto c = cooldown_.find(batch);
    int64_t wait = (c == cooldown_.end() ? kCooldownMin / 2 : c->second) * 2;
    cooldown_[batch] = std::min<int64_t>(wait, kCooldownMax);
    off_until_[batch] = {steps + cooldown_[batch], clock + kCooldownSeconds};
    window.clear();
  } else if (window.size() >= kGuardWindow && mean >= 1.0) {
    cooldown_.erase(batch);  // drafting pays again: a later trip starts short
  }
}

}  // namespace spc
