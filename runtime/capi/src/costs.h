// runtime/costs.py in C++: what forwards cost on this machine, known before the first decode
// step. A profile (the target's seconds per row count, the proposer's per draft forward, and
// what the acceptance model learned) is measured once per (libraries, mode, host, threads) and
// kept in $SPECCOMPILE_CACHE/costs/ under the very key the Python runtime uses, so the two
// runtimes share it: whichever loads a model first measures, the other reads. One pace factor,
// moved by real forwards, scales the tables (the machine's clock drifts; the ratios hold).
#ifndef SPECCOMPILE_CAPI_COSTS_H_
#define SPECCOMPILE_CAPI_COSTS_H_

#include <tvm/ffi/extra/json.h>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kv_cache.h"
#include "model.h"

namespace spc {

constexpr int kPaceWindow = 15;
constexpr int64_t kTargetRows[] = {1, 2, 4, 8, 16, 32, 3, 6, 12, 24, 5, 10};  // costs.py TARGET_ROWS
constexpr int kCoreRows = 4;
constexpr double kProfileSeconds = 1.0, kTimedSeconds = 0.15, kRefresh = 0.1;
constexpr int64_t kDraftRows[] = {1, 2, 3, 4, 6, 8};
constexpr int kProfileFormat = 2;

// costs.py CostTable: seconds of one forward per row count, monotone, linear between counts.
class CostTable {
 public:
  CostTable() = default;
  explicit CostTable(const std::map<int64_t, double>& seconds);
  double operator()(int64_t rows) const;
  const std::map<int64_t, double>& seconds() const { return seconds_; }
  tvm::ffi::json::Object ToJson() const;

 private:
  std::map<int64_t, double> seconds_;
  mutable std::map<int64_t, double> memo_;
};

// costs.py CostModel: the tables at the machine's current pace.
class CostModel {
 public:
  CostModel(CostTable target, CostTable draft, double catch_up_per_token, std::string path);
  double target(int64_t rows) const { return pace * target_(rows); }
  double draft(int64_t rows) const { return rows > 0 ? pace * draft_overhead * draft_(rows) : 0.0; }
  double catch_up(int64_t tokens) const {
    return pace * draft_overhead * catch_up_per_token_ * static_cast<double>(std::max<int64_t>(tokens, 0));
  }
  double marginal(int64_t rows) const { return std::max(target(rows + 1) - target(rows), 0.01 * target(1)); }
  void ObserveTarget(int64_t rows, double seconds);
  void ObserveDraft(double seconds, double priced);
  CostTable Refreshed() const;
  tvm::ffi::json::Object ToJson() const;
  void Save() const;  // best effort
  static std::optional<CostModel> Load(const std::string& path);

  double pace = 1.0;
  double draft_overhead = 1.0;
  std::optional<tvm::ffi::json::Object> acceptance;  // what the acceptance model learned (adaptive.h)
  std::string acceptance_of;                         // ...with which weights (WeightsKey)

 private:
  CostTable target_, draft_;
  double catch_up_per_token_;
  std::string path_;
  std::vector<double> ratios_, draft_ratios_;
  std::map<int64_t, std::pair<double, int64_t>> seen_;  // rows -> (EMA of seconds / table / pace, count)
};

// costs.py time_min: best of `repeat` timed calls after one untimed call; with budget >= 0,
// fewer once the timed calls add up to that many seconds.
double TimeMin(const std::function<void()>& fn, int repeat = 3, double budget = -1.0);

// costs.py measure_target: a target forward plus greedy verification over r rows of a scratch
// sequence, through the calls a decode step makes (features: ForwardOutput flags the proposer reads).
std::map<int64_t, double> MeasureTarget(Model& model, PagedKV& kv, const Tensor& kv_tensor,
                                        const std::vector<int64_t>& rows, int features, double budget);

// costs.py host_fingerprint, weights_key and profile_path (the same strings, the same hashes).
std::string HostFingerprint();
std::string WeightsKey(const std::vector<std::string>& model_dirs);
std::string ProfilePath(const std::vector<std::string>& libraries, const std::string& mode, const std::string& extra);

// The exactly rounded sum of Python's math.fsum (statistics.fmean divides it by the count).
double FSum(const std::vector<double>& values);

}  // namespace spc

#endif  // SPECCOMPILE_CAPI_COSTS_H_
