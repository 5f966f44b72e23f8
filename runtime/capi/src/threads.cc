// See threads.h.
#include "threads.h"

#include <sched.h>

#include <cctype>
#include <cstdlib>
#include <fstream>
#include <set>
#include <string>
#include <thread>
#include <utility>

namespace spc {

int PhysicalCores() {
  std::set<std::pair<std::string, std::string>> cores;
  cpu_set_t set;
  CPU_ZERO(&set);
  bool affinity = sched_getaffinity(0, sizeof(set), &set) == 0;
  int n = affinity ? CPU_SETSIZE : static_cast<int>(std::thread::hardware_concurrency());
  for (int cpu = 0; cpu < n; ++cpu) {
    if (affinity && !CPU_ISSET(cpu, &set)) continue;
    std::string topo = "/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/topology/";
    std::ifstream package(topo + "physical_package_id"), core(topo + "core_id");
    std::string p, c;
    if (package >> p && core >> c) {
      cores.emplace(p, c);
    } else {
      cores.emplace("cpu", std::to_string(cpu));  // no topology (hidden): count the CPU itself
    }
  }
  return cores.empty() ? 1 : static_cast<int>(cores.size());
}

int UserThreads() {
  for (const char* var : {"TVM_NUM_THREADS", "OMP_NUM_THREADS"}) {  // TVM's pool honours the first one set
    const char* v = std::getenv(var);
    if (!v) continue;
    std::string s(v);
    size_t a = s.find_first_not_of(" \t"), b = s.find_last_not_of(" \t");
    if (a == std::string::npos) continue;
    s = s.substr(a, b - a + 1);
    bool digits = !s.empty();
    for (char ch : s) digits = digits && std::isdigit(static_cast<unsigned char>(ch));
    if (digits) return std::atoi(s.c_str());
  }
  return -1;
}

int ConfigureThreads() {
  int chosen = UserThreads();
  if (chosen >= 0) return chosen;
  int n = PhysicalCores();
  setenv("TVM_NUM_THREADS", std::to_string(n).c_str(), 0);
  return n;
}

}  // namespace spc
