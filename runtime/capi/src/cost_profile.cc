// costs.py's measuring and its cache key, for costs.h: timed forwards of the real model on
// scratch sequences, and the host, weights and profile fingerprints.
#include <limits.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <sstream>

#include "costs.h"
#include "json_util.h"
#include "params_image.h"
#include "threads.h"

namespace spc {

namespace {
double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

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
      all += json::ReadFile(index);
    } catch (const std::runtime_error&) {
      char resolved[4096];
      all += ::realpath(d.c_str(), resolved) ? std::string(resolved) : d;
    }
  }
  return Sha256Hex(all).substr(0, 20);
}

std::string ProfilePath(const std::vector<std::string>& libraries, const std::string& mode, const std::string& extra) {
  std::string all;
  for (const std::string& lib : libraries) {
    if (lib.compare(0, 9, "system://") == 0) {  // linked into the app: no file; the caller's
      all += Sha256Hex(lib);                      // text names it (prefix + _metadata)
      continue;
    }
    std::string bytes = json::ReadFile(lib);
    all += Sha256Hex(std::to_string(bytes.size()) + bytes);  // costs.py _file_digest
  }
  all += mode + "|" + extra + "|" + HostFingerprint() + "|v" + std::to_string(kProfileFormat);
  return CacheRoot() + "/costs/" + Sha256Hex(all).substr(0, 20) + ".json";
}

}  // namespace spc
