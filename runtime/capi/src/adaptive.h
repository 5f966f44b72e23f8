// runtime/adaptive.py in C++ (the part a fixed draft length uses): the AcceptanceModel, which
// predicts a draft token's acceptance from the proposer's confidence through a calibration
// curve learned from every verified node, corrected per sequence; and node_probs. A token
// tree's shape follows these predictions (an EAGLE tree expands its likeliest candidates, a
// merged draft keeps its likeliest nodes), so the C runtime learns exactly what Python learns
// from the same verdicts, and drafts the same trees (tests/runtime/test_capi_heads.py).
#ifndef SPECCOMPILE_CAPI_ADAPTIVE_H_
#define SPECCOMPILE_CAPI_ADAPTIVE_H_

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <utility>
#include <vector>

namespace spc {

constexpr int kBins = 10;           // adaptive.py BINS
constexpr int kSources = 2;         // SOURCES: a merged draft's index nodes (0) and its drafter's (1)
constexpr double kPriorTrials = 4.0;
constexpr double kDecay = 0.998;
constexpr double kFirstDecay = 0.95, kFirstPlainDecay = 0.97, kFirstPriorTrials = 2.0;
constexpr double kMaxBackoff = 16;
constexpr double kLocalDecay = 0.8, kLocalPrior = 1.0, kLocalMax = 2.0;
constexpr int kMaxDepth = 8;        // MAX_DEPTH

// adaptive.py PromptState: one sequence's own evidence.
struct PromptState {
  double first_hits = 0.0, first_trials = 0.0;
  double backoff = 1.0;
  std::array<double, kSources> local_hits{}, local_expected{};
};

class AcceptanceModel {
 public:
  explicit AcceptanceModel(double first_prior = 0.7);
  double Calibrated(double conf, int source = 0) const;
  double Local(int64_t seq, int source = 0);
  double Predict(double conf, int64_t seq, int source = 0);
  // One verified draft of sequence seq: conf, parents, the accepted path, each node's source.
  void Observe(const std::vector<double>& conf, const std::vector<int32_t>& parents, const std::vector<int32_t>& path,
               int64_t seq, const std::vector<int32_t>& sources);
  void ObserveUnverified(double p, int64_t seq);
  void NewPrompt(int64_t seq);
  void Forget(int64_t seq) { prompts_.erase(seq); }
  double First(int64_t seq);
  void Relax(int64_t seq);

 private:
  static int Bin(double conf);
  PromptState& StateOf(int64_t seq);
  PromptState Seeded() const;
  void FirstEvidence(PromptState& st, double hit);

  std::array<double, kBins> prior_{};
  std::array<std::array<double, kBins>, kSources> hits_{}, trials_{};
  double first_prior_;
  double first_hits_ = 0.0, first_trials_ = 0.0;
  std::map<int64_t, PromptState> prompts_;
};

// adaptive.py node_probs: (path probability, depth) of every node of a draft from its per-node
// confidences; predict(conf, source) is a node's acceptance.
std::pair<std::vector<double>, std::vector<int32_t>> NodeProbs(const std::vector<int32_t>& parents,
                                                               const std::vector<double>& conf,
                                                               const std::vector<int32_t>& sources,
                                                               const std::function<double(double, int)>& predict);

// What a proposer asks of the step's plan at a fixed draft length (adaptive.py StepPlan.p): a
// node's predicted acceptance, for the source it drafts as (a merged draft's drafter sees
// source 1: merged.py SourcePlan).
struct Plan {
  AcceptanceModel* acceptance = nullptr;
  int64_t seq = 0;
  int source = 0;
  double p(double conf) const { return acceptance->Predict(conf, seq, source); }
};

}  // namespace spc

#endif  // SPECCOMPILE_CAPI_ADAPTIVE_H_
