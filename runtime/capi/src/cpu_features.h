// The C++ twin of runtime/cpu.py: refuse a CPU library whose `_metadata` lists CPU
// features (`cpu_features`, /proc/cpuinfo spelling) the running CPU lacks, before any
// weight is read, with the same message as the Python runtime -- a library built with
// --mcpu sapphirerapids copied to an AVX2 box would otherwise stop with an illegal
// instruction inside a kernel.
#ifndef SPECCOMPILE_CAPI_CPU_FEATURES_H_
#define SPECCOMPILE_CAPI_CPU_FEATURES_H_

#include <tvm/ffi/extra/json.h>

#include <optional>
#include <set>
#include <string>

namespace spc {

// This CPU's features from /proc/cpuinfo ("flags" on x86, "Features" on aarch64), or
// nullopt when they cannot be read. SPECCOMPILE_HOST_CPU_FEATURES (comma or space
// separated) replaces the detection, as in runtime/cpu.py.
std::optional<std::set<std::string>> HostCpuFeatures();

// Throws IncompatibleError when the library (target llvm) needs features this CPU lacks,
// or was built for another CPU architecture. Libraries without `cpu_features` pass.
void CheckCpuFeatures(const tvm::ffi::json::Object& meta, const std::string& lib_path);

}  // namespace spc

#endif  // SPECCOMPILE_CAPI_CPU_FEATURES_H_
