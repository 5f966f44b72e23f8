// runtime/penalties.py in C++: a request's changes to the target's logits (repetition,
// frequency and presence penalties, logit bias, min-p), applied to each verify row as of its
// own prefix -- the committed history plus the draft path to that row's node -- so greedy
// speculation equals plain greedy decoding with every control, and rejection sampling draws
// from the adjusted distribution. The same float32 operations in the same order as numpy's
// (this file is compiled without floating-point contraction: numpy rounds each product).
#ifndef SPECCOMPILE_CAPI_PENALTIES_H_
#define SPECCOMPILE_CAPI_PENALTIES_H_

#include <cstdint>
#include <vector>

#include "acceptance.h"
#include "speccompile.h"

namespace spc {

// SamplingParams.adjusts_logits: whether the request changes logits before sampling.
bool AdjustsLogits(const spc_generate_params& p);

// Ranges (sampling.py's options) and token ids below the vocabulary (penalties.py check_ids);
// throws std::invalid_argument naming the field.
void CheckAdjustments(const spc_generate_params& p, int64_t vocab_size);

// node_paths: the draft tokens before each of the first `rows` verify rows ({} for row 0).
std::vector<std::vector<int32_t>> NodePaths(const Draft& draft, size_t rows);

// penalize + min_p_filter on one sequence's rows [paths.size(), vocab] (row-major, in place):
// `history` is prompt + output (its first n_prompt tokens the prompt).
void AdjustRows(float* rows, int64_t vocab, const spc_generate_params& p, const std::vector<int32_t>& history,
                size_t n_prompt, const std::vector<std::vector<int32_t>>& paths);

}  // namespace spc

#endif  // SPECCOMPILE_CAPI_PENALTIES_H_
