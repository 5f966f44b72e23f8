// See adaptive.h; the arithmetic is adaptive.py's, in float64, in the same order.
#include "adaptive.h"

#include <algorithm>
#include <cmath>

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

}  // namespace spc
