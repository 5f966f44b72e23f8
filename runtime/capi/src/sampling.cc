// See sampling.h.
#include "sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace spc {

std::vector<double> ProbsFromLogits(const std::vector<float>& logits, const spc_generate_params& p) {
  size_t v = logits.size();
  std::vector<double> z(v);
  for (size_t i = 0; i < v; ++i) z[i] = static_cast<double>(logits[i]) / p.temperature;
  if (p.top_k > 0 && static_cast<size_t>(p.top_k) < v) {
    std::vector<double> sorted(z);
    std::nth_element(sorted.begin(), sorted.begin() + (p.top_k - 1), sorted.end(), std::greater<double>());
    double kth = sorted[p.top_k - 1];
    for (double& x : z)
      if (x < kth) x = -std::numeric_limits<double>::infinity();
  }
  double mx = *std::max_element(z.begin(), z.end());
  std::vector<double> prob(v);
  double sum = 0;
  for (size_t i = 0; i < v; ++i) sum += (prob[i] = std::exp(z[i] - mx));
  for (double& x : prob) x /= sum;
  if (p.top_p < 1.0f) {  // keep the smallest prefix (by descending probability) reaching top_p
    std::vector<size_t> order(v);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return prob[a] > prob[b]; });
    std::vector<double> kept(v, 0.0);
    double cum = 0, total = 0;
    for (size_t idx : order) {
      if (cum < p.top_p) {
        kept[idx] = prob[idx];
        total += prob[idx];
      }
      cum += prob[idx];
    }
    for (double& x : kept) x /= total;
    prob.swap(kept);
  }
  return prob;
}

int32_t Sample(const std::vector<float>& logits, const spc_generate_params& p, std::mt19937_64& rng) {
  if (p.temperature == 0.0f) {  // first index of the maximum, as numpy argmax
    return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  }
  std::vector<double> prob = ProbsFromLogits(logits, p);
  std::discrete_distribution<int32_t> dist(prob.begin(), prob.end());
  return dist(rng);
}

std::pair<int32_t, std::vector<double>> Pick(const std::vector<float>& logits, const spc_generate_params& p,
                                             std::mt19937_64& rng) {
  if (p.temperature == 0.0f) return {Sample(logits, p, rng), {}};
  std::vector<double> q = ProbsFromLogits(logits, p);
  std::discrete_distribution<int32_t> dist(q.begin(), q.end());
  int32_t tok = dist(rng);
  return {tok, std::move(q)};
}

double PickedConfidence(const std::vector<float>& logits, int32_t token, const std::vector<double>& q) {
  if (!q.empty()) return q[token];
  float z = 0.0f;
  for (float l : logits) z += std::exp(l - logits[token]);
  return static_cast<double>(1.0f / z);
}

}  // namespace spc
