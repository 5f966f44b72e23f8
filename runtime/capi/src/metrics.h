// runtime/metrics.py in C++: the speculation metrics, defined once and twinned. The C API's
// spc_stats report them with Python's definitions (tests/runtime/test_capi_drafts.py holds the
// two runtimes' figures equal for the same requests).
#ifndef SPECCOMPILE_CAPI_METRICS_H_
#define SPECCOMPILE_CAPI_METRICS_H_

#include <cstdint>

namespace spc {

// Draft tokens the target accepted, over those it verified (0 when none were).
inline double AcceptRate(int64_t accepted_tokens, int64_t draft_tokens) {
  return draft_tokens ? static_cast<double>(accepted_tokens) / static_cast<double>(draft_tokens) : 0.0;
}

// Tokens emitted per verify step, counting the bonus token (a fully accepted k-chain scores k + 1).
inline double MeanAcceptedLength(int64_t emitted_in_verify, int64_t verify_steps) {
  return verify_steps ? static_cast<double>(emitted_in_verify) / static_cast<double>(verify_steps) : 0.0;
}

// metrics.py SpecMetrics: the counts of one generation's decode steps.
struct SpecMetrics {
  int64_t draft_tokens = 0, accepted_tokens = 0;
  int64_t verify_steps = 0;       // target forwards that verified at least one draft token
  int64_t plain_steps = 0;        // target forwards with no draft
  int64_t emitted_in_verify = 0;  // tokens emitted by verify steps, bonus included

  void RecordVerify(int64_t drafted, int64_t accepted, int64_t emitted) {
    verify_steps += 1;
    draft_tokens += drafted;
    accepted_tokens += accepted;
    emitted_in_verify += emitted;
  }
  double accept_rate() const { return AcceptRate(accepted_tokens, draft_tokens); }
  double mean_accepted_length() const { return MeanAcceptedLength(emitted_in_verify, verify_steps); }
};

}  // namespace spc

#endif  // SPECCOMPILE_CAPI_METRICS_H_
