// runtime/sampling.py in C++: the target's distribution under the request's sampling settings,
// and drawing from it. The same float64 arithmetic as Python's, so that greedy steps agree
// exactly and sampled steps follow the same distribution (the generators differ: mt19937_64
// here, numpy's PCG64 there).
#ifndef SPECCOMPILE_CAPI_SAMPLING_H_
#define SPECCOMPILE_CAPI_SAMPLING_H_

#include <cstdint>
#include <random>
#include <vector>

#include "speccompile.h"

namespace spc {

// probs_from_logits (float64): temperature, top-k, then top-p.
std::vector<double> ProbsFromLogits(const std::vector<float>& logits, const spc_generate_params& p);

// A token from logits: the first maximum at temperature 0 (numpy argmax), else a draw.
int32_t Sample(const std::vector<float>& logits, const spc_generate_params& p, std::mt19937_64& rng);

// runtime/drafters/proposers.py pick: (token, q) with q the distribution it was drawn from, empty when greedy.
std::pair<int32_t, std::vector<double>> Pick(const std::vector<float>& logits, const spc_generate_params& p,
                                             std::mt19937_64& rng);

// proposers.py pick's confidence: the draft's probability of the token it picked (q[token]
// when it sampled; greedy: the softmax at its argmax, in float32 as numpy computes it).
double PickedConfidence(const std::vector<float>& logits, int32_t token, const std::vector<double>& q);

}  // namespace spc

#endif  // SPECCOMPILE_CAPI_SAMPLING_H_
