// See cpu_features.h. Mirrors runtime/cpu.py: host_cpu_features, suggest_mcpu,
// check_cpu_features (keep the messages identical).
#include "cpu_features.h"

#include <sys/utsname.h>

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <utility>
#include <vector>

#include "json_util.h"
#include "model.h"

namespace spc {

namespace {

std::set<std::string> SplitWords(std::string text) {
  for (char& c : text)
    if (c == ',') c = ' ';
  std::istringstream in(text);
  std::set<std::string> out;
  for (std::string w; in >> w;) out.insert(w);
  return out;
}

// "x86_64" / "aarch64" from a triple or `uname -m` (runtime/cpu.py cpu_arch).
std::string CpuArch(const std::string& triple) {
  std::string arch = triple.substr(0, triple.find('-'));
  for (char& c : arch) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (arch == "x86_64" || arch == "amd64" || arch == "x86-64") return "x86_64";
  if (arch == "aarch64" || arch == "arm64" || arch == "arm64e") return "aarch64";
  return arch;
}

std::string HostArch() {
  utsname u{};
  return uname(&u) == 0 ? CpuArch(u.machine) : "unknown";
}

// x86-64 psABI levels in /proc/cpuinfo spelling, newest first (runtime/cpu.py X86_LEVELS).
const std::vector<std::pair<std::string, std::vector<std::string>>>& X86Levels() {
  static const std::vector<std::pair<std::string, std::vector<std::string>>> levels = {
      {"x86-64-v4", {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}},
      {"x86-64-v3", {"avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe"}},
      {"x86-64-v2", {"cx16", "lahf_lm", "popcnt", "sse4_1", "sse4_2", "ssse3", "pni"}},
  };
  return levels;
}

std::string SuggestMcpu(const std::set<std::string>& host, const std::string& arch) {
  if (arch != "x86_64") return "--mcpu generic";
  const auto& levels = X86Levels();
  for (size_t i = 0; i < levels.size(); ++i) {
    bool ok = true;
    for (size_t j = i; j < levels.size() && ok; ++j)
      for (const std::string& f : levels[j].second) ok = ok && host.count(f);
    if (!ok) continue;
    if (levels[i].first == "x86-64-v4" && host.count("avx512_vnni"))
      return "--device \"llvm -mcpu=x86-64-v4 -mattr=+avx512vnni\"";
    return "--mcpu " + levels[i].first;
  }
  return "--mcpu x86-64";
}

std::string OptString(const tvm::ffi::json::Object& meta, const char* key, const std::string& fallback) {
  return json::Has(meta, key) ? json::GetString(meta, key) : fallback;
}

}  // namespace

std::optional<std::set<std::string>> HostCpuFeatures() {
  if (const char* forced = std::getenv("SPECCOMPILE_HOST_CPU_FEATURES")) return SplitWords(forced);
  std::ifstream in("/proc/cpuinfo");
  if (!in) return std::nullopt;
  for (std::string line; std::getline(in, line);) {
    auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string key = line.substr(0, colon);
    key.erase(key.find_last_not_of(" \t") + 1);
    if (key == "flags" || key == "Features") return SplitWords(line.substr(colon + 1));
  }
  return std::nullopt;
}

void CheckCpuFeatures(const tvm::ffi::json::Object& meta, const std::string& lib_path) {
  if (!json::Has(meta, "cpu_features") || OptString(meta, "target", "") != "llvm") return;
  std::vector<std::string> needed;
  for (const tvm::ffi::Any& f : json::GetArray(meta, "cpu_features")) needed.push_back(json::AsString(f, "cpu_features"));
  if (needed.empty()) return;
  std::string mcpu = OptString(meta, "mcpu", "generic");
  std::string here = HostArch();
  std::string lib_arch = CpuArch(OptString(meta, "mtriple", here));
  if (lib_arch != here) {
    throw IncompatibleError(lib_path + " was built for " + lib_arch + " CPUs (-mcpu " + mcpu + "), and this machine is " +
                            here + ": compile it here with `speccompile compile <model_dir>/speccompile-config.json "
                            "--device llvm -o " + lib_path + "`");
  }
  auto host = HostCpuFeatures();
  if (!host) {
    std::fprintf(stderr, "speccompile: warning: cannot read this CPU's features (no /proc/cpuinfo), so the check that "
                         "it has what %s was compiled for is skipped; set SPECCOMPILE_HOST_CPU_FEATURES to enable it\n",
                 lib_path.c_str());
    return;
  }
  std::string missing;
  for (const std::string& f : needed)
    if (!host->count(f)) missing += (missing.empty() ? "" : ", ") + f;
  if (missing.empty()) return;
  throw IncompatibleError(lib_path + " was compiled for -mcpu " + mcpu + " and uses CPU features this machine lacks: " +
                          missing + "; running it would stop with an illegal instruction. Rebuild it for a CPU this "
                          "machine supports -- rebuild with: speccompile compile <model_dir>/speccompile-config.json " +
                          SuggestMcpu(*host, here) + " -o " + lib_path +
                          " (or compile on this machine with --device llvm and no --mcpu: the default is the CPU you "
                          "build on)");
}

}  // namespace spc
