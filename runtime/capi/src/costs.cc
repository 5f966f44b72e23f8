// See costs.h; the arithmetic follows runtime/costs.py line for line.
#include "costs.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "json_util.h"
#include "params_image.h"
#include "threads.h"

namespace spc {

namespace fj = tvm::ffi::json;
using tvm::ffi::Any;

namespace {
double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

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

std::string ReadAll(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw IoError("cannot read " + path);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
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
    fj::Object data = json::AsObject(json::Parse(ReadAll(path), path), path);
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

double TimeMin(const std::function<void()>& fn, int repeat, double budget) {
  fn();
  double best = 1e300, spent = 0.0;
  for (int i = 0; i < repeat; ++i) {
    double t0 = Now();
    fn();
    double dt = Now() - t0;
    best = std::min(best, dt);
    spent += dt;
    if (budget >= 0 && spent >= budget) break;
  }
  return best;
}

std::map<int64_t, double> MeasureTarget(Model& model, PagedKV& kv, const Tensor& kv_tensor,
                                        const std::vector<int64_t>& rows, int features, double budget) {
  const int64_t sid = -1;
  kv.AddSequence(sid);
  std::map<int64_t, double> out;
  try {
    std::vector<int32_t> prefix(16);
    for (int i = 0; i < 16; ++i) prefix[i] = i;
    model.Prefill(kv, kv_tensor, sid, prefix);
    auto forward = [&](int64_t r) {
      std::vector<int32_t> tokens(r), parents(r);
      for (int64_t j = 0; j < r; ++j) {
        tokens[j] = static_cast<int32_t>(16 + j);
        parents[j] = static_cast<int32_t>(j - 1);
      }
      Tensor logits;
      if (features) {
        ForwardOut o = model.Forward(kv, kv_tensor, sid, tokens, nullptr, features | kLogits);
        Model::ToHost((features & kFeatures) ? o.features : o.hidden);
        logits = o.logits;
      } else if (r == 1) {
        logits = model.Decode(kv, kv_tensor, sid, tokens[0]);
      } else {
        logits = model.ForwardTokens(kv, kv_tensor, sid, tokens);
      }
      model.AcceptGreedy(logits, tokens, parents);
      kv.PopN(sid, r);
    };
    double t0 = Now();
    for (size_t i = 0; i < rows.size(); ++i) {
      if (budget >= 0 && static_cast<int>(i) >= kCoreRows && Now() - t0 >= budget) break;
      int64_t r = rows[i];
      out[r] = TimeMin([&] { forward(r); }, 3, budget >= 0 ? kTimedSeconds : -1.0);
    }
  } catch (...) {
    kv.RemoveSequence(sid);
    throw;
  }
  kv.RemoveSequence(sid);
  return out;
}

std::string HostFingerprint() {
  std::string cpu;
  std::ifstream f("/proc/cpuinfo");
  for (std::string line; std::getline(f, line);) {
    if (line.rfind("model name", 0) == 0) {
      std::string v = line.substr(line.find(':') + 1);
      size_t a = v.find_first_not_of(" \t"), b = v.find_last_not_of(" \t\r");
      cpu = a == std::string::npos ? "" : v.substr(a, b - a + 1);
      break;
    }
  }
  if (cpu.empty()) {  // platform.processor() or platform.machine()
#if defined(__aarch64__)
    cpu = "aarch64";
#elif defined(__x86_64__)
    cpu = "x86_64";
#else
    cpu = "unknown";
#endif
  }
  int chosen = UserThreads();
  int threads = chosen >= 0 ? chosen : PhysicalCores();  // threads.py thread_count
  return cpu + "|threads=" + std::to_string(threads) + "|cpus=" + std::to_string(::sysconf(_SC_NPROCESSORS_ONLN));
}

std::string WeightsKey(const std::vector<std::string>& model_dirs) {
  std::string all;
  for (const std::string& d : model_dirs) {
    std::string index = d + "/tensor-cache.json";
    try {
      all += ReadAll(index);
    } catch (const IoError&) {
      char resolved[4096];
      all += ::realpath(d.c_str(), resolved) ? std::string(resolved) : d;
    }
  }
  return Sha256Hex(all).substr(0, 20);
}

std::string ProfilePath(const std::vector<std::string>& libraries, const std::string& mode, const std::string& extra) {
  std::string all;
  for (const std::string& lib : libraries) {
    std::string bytes = ReadAll(lib);
    all += Sha256Hex(std::to_string(bytes.size()) + bytes);  // costs.py _file_digest
  }
  all += mode + "|" + extra + "|" + HostFingerprint() + "|v" + std::to_string(kProfileFormat);
  return CacheRoot() + "/costs/" + Sha256Hex(all).substr(0, 20) + ".json";
}

}  // namespace spc
