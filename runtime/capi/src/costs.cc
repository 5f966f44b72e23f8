// See costs.h: the tables and the model (the measuring and the cache key: cost_profile.cc); the
// arithmetic follows runtime/costs.py line for line.
#include "costs.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "json_util.h"

namespace spc {

namespace fj = tvm::ffi::json;
using tvm::ffi::Any;

namespace {
// costs.py _monotone: the non-decreasing sequence closest to values in least squares.
std::vector<double> Monotone(const std::vector<double>& values) {
  std::vector<std::pair<double, double>> blocks;  // (sum, count)
  for (double v : values) {
    blocks.emplace_back(v, 1.0);
    while (blocks.size() > 1 &&
           blocks[blocks.size() - 2].first / blocks[blocks.size() - 2].second > blocks.back().first / blocks.back().second) {
      auto last = blocks.back();
      blocks.pop_back();
      blocks.back().first += last.first;
      blocks.back().second += last.second;
    }
  }
  std::vector<double> out;
  for (const auto& b : blocks)
    for (int i = 0; i < static_cast<int>(b.second); ++i) out.push_back(b.first / b.second);
  return out;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2.0;
}


std::map<int64_t, double> TableOf(const fj::Object& o) {
  std::map<int64_t, double> out;
  for (const auto& kv : o) out[std::stoll(std::string(kv.first.cast<tvm::ffi::String>()))] = kv.second.cast<double>();
  return out;
}
}  // namespace

double FSum(const std::vector<double>& values) {
  // Shewchuk's exact partials, rounded once at the end (CPython's math.fsum)
  std::vector<double> partials;
  for (double x : values) {
    size_t i = 0;
    for (double y : partials) {
      if (std::fabs(x) < std::fabs(y)) std::swap(x, y);
      double hi = x + y, lo = y - (hi - x);
      if (lo != 0.0) partials[i++] = lo;
      x = hi;
    }
    partials.resize(i);
    if (x != 0.0) partials.push_back(x);
  }
  double hi = 0.0;
  if (!partials.empty()) {
    size_t n = partials.size();
    hi = partials[--n];
    double lo = 0.0;
    while (n > 0) {
      double x = hi, y = partials[--n];
      hi = x + y;
      double yr = hi - x;
      lo = y - yr;
      if (lo != 0.0) break;
    }
    if (n > 0 && ((lo < 0.0 && partials[n - 1] < 0.0) || (lo > 0.0 && partials[n - 1] > 0.0))) {
      double y = lo * 2.0, x = hi + y, yr = x - hi;
      if (y == yr) hi = x;
    }
  }
  return hi;
}

CostTable::CostTable(const std::map<int64_t, double>& seconds) {
  if (seconds.empty()) throw std::invalid_argument("a cost table needs at least one measured row count");
  std::vector<double> values;
  for (const auto& kv : seconds) values.push_back(kv.second);
  std::vector<double> mono = Monotone(values);
  size_t i = 0;
  for (const auto& kv : seconds) seconds_[kv.first] = mono[i++];
}

double CostTable::operator()(int64_t rows) const {
  auto m = memo_.find(rows);
  if (m != memo_.end()) return m->second;
  double out;
  auto first = seconds_.begin();
  if (rows <= first->first) {
    out = first->second;
  } else {
    auto hi = seconds_.lower_bound(rows);
    if (hi != seconds_.end()) {
      auto lo = std::prev(hi);
      double a = lo->second, b = hi->second;
      out = a + (b - a) * static_cast<double>(rows - lo->first) / static_cast<double>(hi->first - lo->first);
    } else if (seconds_.size() == 1) {
      out = first->second * static_cast<double>(rows) / static_cast<double>(first->first);
    } else {
      auto b = std::prev(seconds_.end()), a = std::prev(b);
      double slope = (b->second - a->second) / static_cast<double>(b->first - a->first);
      out = b->second + slope * static_cast<double>(rows - b->first);
    }
  }
  memo_[rows] = out;
  return out;
}

fj::Object CostTable::ToJson() const {
  fj::Object o;
  for (const auto& kv : seconds_) o.Set(tvm::ffi::String(std::to_string(kv.first)), kv.second);
  return o;
}

CostModel::CostModel(CostTable target, CostTable draft, double catch_up_per_token, std::string path)
    : target_(std::move(target)), draft_(std::move(draft)), catch_up_per_token_(catch_up_per_token),
      path_(std::move(path)) {}

void CostModel::ObserveTarget(int64_t rows, double seconds) {
  double predicted = target_(rows);
  if (predicted <= 0 || seconds <= 0) return;
  ratios_.push_back(seconds / predicted);
  if (ratios_.size() > kPaceWindow) ratios_.erase(ratios_.begin(), ratios_.end() - kPaceWindow);
  pace = Median(ratios_);
  if (ratios_.size() < kPaceWindow) return;
  std::vector<double> logs;
  for (double r : ratios_) logs.push_back(std::log(r));
  double relative = seconds / predicted / std::exp(FSum(logs) / static_cast<double>(logs.size()));
  auto it = seen_.find(rows);
  std::pair<double, int64_t> have = it == seen_.end() ? std::make_pair(relative, int64_t{0}) : it->second;
  seen_[rows] = {(1 - kRefresh) * have.first + kRefresh * relative, have.second + 1};
}

void CostModel::ObserveDraft(double seconds, double priced) {
  if (priced <= 0 || seconds <= 0) return;
  draft_ratios_.push_back(seconds / priced);
  if (draft_ratios_.size() > kPaceWindow) draft_ratios_.erase(draft_ratios_.begin(), draft_ratios_.end() - kPaceWindow);
  draft_overhead = std::min(std::max(Median(draft_ratios_), 0.5), 20.0);
}

CostTable CostModel::Refreshed() const {
  std::map<int64_t, double> seen;
  for (const auto& kv : seen_)
    if (kv.second.second >= 8) seen[kv.first] = kv.second.first;
  if (!seen.count(1) || seen.size() < 2) return target_;
  std::map<int64_t, double> merged = target_.seconds();
  for (const auto& kv : seen) merged[kv.first] = target_(kv.first) * kv.second / seen[1];
  return CostTable(merged);
}

fj::Object CostModel::ToJson() const {
  fj::Object o;
  o.Set("target", Refreshed().ToJson());
  o.Set("draft", draft_.ToJson());
  o.Set("catch_up_per_token", catch_up_per_token_);
  if (acceptance) {
    o.Set("acceptance", *acceptance);
  } else {
    o.Set("acceptance", nullptr);
  }
  if (acceptance_of.empty()) {
    o.Set("acceptance_of", nullptr);
  } else {
    o.Set("acceptance_of", tvm::ffi::String(acceptance_of));
  }
  return o;
}

void CostModel::Save() const {
  if (path_.empty()) return;
  try {
    std::string dir = path_.substr(0, path_.rfind('/'));
    for (size_t at = dir.find('/', 1); at != std::string::npos; at = dir.find('/', at + 1)) {  // mkdir -p
      ::mkdir(dir.substr(0, at).c_str(), 0755);
    }
    ::mkdir(dir.c_str(), 0755);
    std::string tmp = path_ + ".tmp" + std::to_string(::getpid());
    {
      std::ofstream f(tmp, std::ios::binary);
      f << std::string(fj::Stringify(ToJson(), 1));
      if (!f) return;
    }
    std::rename(tmp.c_str(), path_.c_str());
  } catch (...) {
  }
}

std::optional<CostModel> CostModel::Load(const std::string& path) {
  try {
    fj::Object data = json::AsObject(json::Parse(json::ReadFile(path), path), path);
    double per_token = json::Has(data, "catch_up_per_token") ? json::Get(data, "catch_up_per_token").cast<double>() : 0.0;
    CostModel cost(CostTable(TableOf(json::GetObject(data, "target"))), CostTable(TableOf(json::GetObject(data, "draft"))),
                   per_token, path);
    if (json::Has(data, "acceptance")) {
      if (auto a = json::Get(data, "acceptance").try_cast<fj::Object>()) cost.acceptance = *a;
    }
    if (json::Has(data, "acceptance_of")) {
      if (auto s = json::Get(data, "acceptance_of").try_cast<tvm::ffi::String>()) cost.acceptance_of = std::string(*s);
    }
    return cost;
  } catch (...) {
    return std::nullopt;  // absent or unreadable: measure again
  }
}

}  // namespace spc
