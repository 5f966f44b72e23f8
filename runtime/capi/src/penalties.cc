// runtime/penalties.py's twin (see penalties.h); tests/runtime/test_capi_penalties.py holds the
// two equal (tokens under every control, chains and trees).
#include "penalties.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <stdexcept>
#include <string>

namespace spc {

namespace {
// 0 (a zero-initialised struct) is off, as 1 is
float Repetition(const spc_generate_params& p) { return p.repetition_penalty == 0.0f ? 1.0f : p.repetition_penalty; }
}  // namespace

bool AdjustsLogits(const spc_generate_params& p) {
  return p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f || Repetition(p) != 1.0f ||
         p.n_logit_bias > 0 || (p.min_p != 0.0f && p.temperature != 0.0f);
}

void CheckAdjustments(const spc_generate_params& p, int64_t vocab_size) {
  auto in = [](float v, float lo, float hi) { return std::isfinite(v) && v >= lo && v <= hi; };
  if (!in(p.min_p, 0.0f, 1.0f)) throw std::invalid_argument("min_p must be in [0, 1]");
  if (!in(p.frequency_penalty, -2.0f, 2.0f)) throw std::invalid_argument("frequency_penalty must be in [-2, 2]");
  if (!in(p.presence_penalty, -2.0f, 2.0f)) throw std::invalid_argument("presence_penalty must be in [-2, 2]");
  if (!in(p.repetition_penalty, 0.0f, 10.0f)) throw std::invalid_argument("repetition_penalty must be in (0, 10] (0: off)");
  if (p.n_logit_bias && (!p.logit_bias_tokens || !p.logit_bias)) {
    throw std::invalid_argument("n_logit_bias is set but logit_bias_tokens or logit_bias is NULL");
  }
  for (size_t i = 0; i < p.n_logit_bias; ++i) {
    int32_t t = p.logit_bias_tokens[i];
    if (t < 0 || t >= vocab_size) {
      throw std::invalid_argument("logit_bias names token " + std::to_string(t) + ", and the model's vocabulary has " +
                                  std::to_string(vocab_size) + " tokens (ids 0.." + std::to_string(vocab_size - 1) + ")");
    }
    if (!in(p.logit_bias[i], -100.0f, 100.0f)) throw std::invalid_argument("logit_bias values must be in [-100, 100]");
  }
}

std::vector<std::vector<int32_t>> NodePaths(const Draft& draft, size_t rows) {
  std::vector<std::vector<int32_t>> paths{{}};
  std::vector<int32_t> parents = draft.ParentList();
  for (size_t j = 0; j + 1 < rows && j < parents.size(); ++j) {
    std::vector<int32_t> path = parents[j] >= 0 ? paths[parents[j] + 1] : std::vector<int32_t>{};
    path.push_back(draft.tokens[j]);
    paths.push_back(std::move(path));
  }
  return paths;
}

void AdjustRows(float* rows, int64_t vocab, const spc_generate_params& p, const std::vector<int32_t>& history,
                size_t n_prompt, const std::vector<std::vector<int32_t>>& paths) {
  // sampling.py parse_logit_bias: one bias per token (the last given), added in token order
  std::map<int32_t, float> bias;
  for (size_t i = 0; i < p.n_logit_bias; ++i) bias[p.logit_bias_tokens[i]] = p.logit_bias[i];
  std::map<int32_t, int64_t> output;  // the output's token counts
  for (size_t i = n_prompt; i < history.size(); ++i) ++output[history[i]];
  bool counted = p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f;
  for (size_t r = 0; r < paths.size(); ++r) {
    float* row = rows + static_cast<int64_t>(r) * vocab;
    const std::vector<int32_t>& path = paths[r];
    float rep = Repetition(p);
    if (rep != 1.0f) {  // every token of the prompt, the output and the path, once
      std::vector<int32_t> seen(history.begin(), history.end());
      seen.insert(seen.end(), path.begin(), path.end());
      std::sort(seen.begin(), seen.end());
      seen.erase(std::unique(seen.begin(), seen.end()), seen.end());
      for (int32_t t : seen) {
        float v = row[t];
        row[t] = v > 0 ? v / rep : v * rep;
      }
    }
    if (counted) {
      std::map<int32_t, int64_t> counts = output;
      for (int32_t t : path) ++counts[t];
      for (const auto& [t, c] : counts) {
        float freq = p.frequency_penalty * static_cast<float>(c);
        float pres = p.presence_penalty * (c > 0 ? 1.0f : 0.0f);
        row[t] -= freq + pres;
      }
    }
    for (const auto& [t, b] : bias) row[t] += b;
    if (p.min_p != 0.0f && p.temperature != 0.0f) {  // penalties.py min_p_filter
      float cut = *std::max_element(row, row + vocab) +
                  static_cast<float>(static_cast<double>(p.temperature) * std::log(static_cast<double>(p.min_p)));
      for (int64_t v = 0; v < vocab; ++v) {
        if (row[v] < cut) row[v] = -std::numeric_limits<float>::infinity();
      }
    }
  }
}

}  // namespace spc
