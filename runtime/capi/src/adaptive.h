// runtime/adaptive.py in C++: how much to draft. The same three parts, the same arithmetic:
// - AcceptanceModel: a draft token's acceptance predicted from the proposer's confidence
//   through a calibration curve learned from every verified node, corrected per sequence (a
//   token tree's shape follows it at a fixed draft length too);
// - StepPlan: per decode step, whether the next draft forward can raise the step's expected
//   rate (tokens / seconds, from the measured costs: costs.h) above what it has and above plain
//   decoding, and which drafted nodes are worth their verify rows;
// - Policy: makes the plans, learns from each step (costs, calibration) and keeps the guard
//   that switches drafting off at a batch size whose drafting steps were measurably slower.
// tests/runtime/test_capi_policy.py replays steps Python recorded into both and holds every
// decision equal.
#ifndef SPECCOMPILE_CAPI_ADAPTIVE_H_
#define SPECCOMPILE_CAPI_ADAPTIVE_H_

#include <tvm/ffi/extra/json.h>

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <tuple>
#include <utility>
#include <vector>

#include "acceptance.h"
#include "costs.h"

namespace spc {

constexpr int kBins = 10;           // adaptive.py BINS
constexpr int kSources = 2;         // SOURCES: a merged draft's index nodes (0) and its drafter's (1)
constexpr double kPriorTrials = 4.0;
constexpr double kDecay = 0.998;
constexpr double kFirstDecay = 0.95, kFirstPlainDecay = 0.97, kFirstPriorTrials = 2.0;
constexpr double kMaxBackoff = 16;
constexpr double kLocalDecay = 0.8, kLocalPrior = 1.0, kLocalMax = 2.0;
constexpr int kMaxDepth = 8;        // MAX_DEPTH
constexpr double kRestoredTrials = 20.0;
constexpr double kCatchUpAmortized = 1.0 / 8;
constexpr int kLookahead = 8;
constexpr int kGuardWindow = 24, kGuardMin = 8;
constexpr double kSavedDecay = 0.98, kSavedMin = 8.0;
constexpr int kCooldownMin = 32, kCooldownMax = 1024;
constexpr double kCooldownSeconds = 10.0;
constexpr int kSaveEvery = 256;
constexpr double kOutputDecay = 0.95;

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
  // What an earlier process learned (the cost profile's "acceptance"), and this model's state for the next.
  AcceptanceModel& Restore(const std::optional<tvm::ffi::json::Object>& state);
  tvm::ffi::json::Object State() const;

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

class Policy;

// adaptive.py StepPlan: the drafting budget of one decode step for `batch` sequences.
class StepPlan {
 public:
  StepPlan(Policy* policy, int64_t batch, std::vector<int64_t> seq_ids);
  double p(double conf, int64_t seq, int source = 0) const;
  double first(int64_t seq) const;
  // Whether to run a draft forward over `rows` rows extending these nodes: (P of the node,
  // predicted acceptance of its best child); catch_up_tokens: rows the draft builds first.
  bool ShouldDraft(int64_t rows, const std::vector<std::pair<double, double>>& expansions, int64_t catch_up_tokens = 0,
                   bool free = false);
  void Drafted(const std::vector<double>& probs) { probs_.insert(probs_.end(), probs.begin(), probs.end()); }
  void Spent(double seconds) { sunk_ += seconds; }
  // Each draft cut to the nodes worth verifying (parents before children).
  std::vector<Draft> Select(const std::vector<Draft>& drafts);
  double priced() const { return priced_; }
  bool fixed() const { return fixed_; }
  bool off = false;

 private:
  std::tuple<double, double, int64_t> Best(std::vector<double> probs, double extra = 0.0) const;
  Policy* policy_;
  int64_t batch_;
  std::vector<int64_t> seq_ids_;
  bool fixed_;
  double sunk_ = 0.0, priced_ = 0.0, plain_rate_;
  std::vector<double> probs_;
};

// What a proposer sees of the step's plan: its nodes priced as `source` (a merged draft's
// drafter is source 1, and its first-token value is what the index's draft leaves
// uncovered: merged.py SourcePlan), for the sequence it drafts for.
struct Plan {
  StepPlan* step = nullptr;
  int64_t seq = 0;
  int source = 0;
  double covered = 0.0;
  double p(double conf) const { return step->p(conf, seq, source); }
  double first() const { return step->first(seq) * (1.0 - covered); }
  bool ShouldDraft(int64_t rows, const std::vector<std::pair<double, double>>& expansions, int64_t catch_up_tokens = 0,
                   bool free = false) const {
    return step->ShouldDraft(rows, expansions, catch_up_tokens, free);
  }
  void Drafted(const std::vector<double>& probs) const { step->Drafted(probs); }
  void Spent(double seconds) const { step->Spent(seconds); }
};

// metrics.py StepRecord, as the policy reads it.
struct StepRecord {
  std::vector<const Draft*> drafts;             // as verified, per sequence
  std::vector<std::vector<int32_t>> paths;      // accepted nodes per sequence
  std::vector<int64_t> emitted;                 // tokens each sequence kept
  std::vector<bool> speculative;
  int64_t draft_forwards = 0;
  double draft_seconds = 0, target_seconds = 0, other_seconds = 0;
  std::vector<int64_t> seq_ids;
  int64_t batch() const { return static_cast<int64_t>(drafts.size()); }
  int64_t rows() const;
  bool drafted() const;
  double forward_seconds() const { return draft_seconds + target_seconds; }
  double seconds() const { return draft_seconds + target_seconds + other_seconds; }
};

// adaptive.py Policy: the draft-length policy of one engine (fixed_k > 0: a fixed length).
class Policy {
 public:
  Policy(CostModel* cost, AcceptanceModel acceptance, int64_t fixed_k = 0);
  StepPlan NewPlan(int64_t batch, const std::vector<int64_t>& seq_ids) { return StepPlan(this, batch, seq_ids); }
  bool Hopeless(int64_t batch, bool free_drafts = false);
  void Save();
  double PlainStepTime(int64_t batch) const { return host + cost->target(batch); }
  bool GuardOff(int64_t batch) const;
  bool ExpectsDrafting(const std::vector<int64_t>& seq_ids);
  double SavingPerToken(int64_t batch, int64_t seq);
  void ObserveOutput(int64_t emitted);
  double ExpectedOutput(int64_t budget, int64_t emitted) const;
  bool DraftPrefillPays(int64_t prompt_tokens, double output_tokens, int64_t batch, int64_t seq);
  void Observe(const StepRecord& step, const StepPlan* plan);
  void ObserveStep(int64_t batch, bool drafted, int64_t tokens, double seconds, double forward_seconds);

  CostModel* cost;
  AcceptanceModel acceptance;
  int64_t fixed_k;  // 0: adaptive
  double host = 0.0;
  int64_t steps = 0;
  double clock = 0.0;

 private:
  std::map<int64_t, std::vector<double>> speedups_;
  std::map<int64_t, std::pair<int64_t, double>> off_until_;
  std::map<int64_t, int64_t> cooldown_;
  std::map<std::tuple<int64_t, int64_t, bool>, bool> hopeless_;
  std::map<int64_t, std::array<double, 2>> saved_;
  std::array<double, 2> outputs_{0.0, 0.0};
};

}  // namespace spc

#endif  // SPECCOMPILE_CAPI_ADAPTIVE_H_
