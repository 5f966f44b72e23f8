// runtime/acceptance.py's Draft in C++: what a proposer hands the step -- a chain or a token
// tree -- and what the plan and the acceptance read of it. (The acceptance rule itself is the
// library's accept_greedy kernel, and Session::Accept's rejection sampling for T > 0.)
#ifndef SPECCOMPILE_CAPI_ACCEPTANCE_H_
#define SPECCOMPILE_CAPI_ACCEPTANCE_H_

#include <cstddef>
#include <cstdint>
#include <vector>

namespace spc {

// runtime/acceptance.py Draft: the tokens; their local parents (empty: a chain); per token the
// draft's distribution q when it sampled them (empty: deterministic, q one-hot at its token);
// the proposer's confidence in each (empty: none given) and which source drafted it
// (adaptive.py SOURCES; empty: all 0).
struct Draft {
  std::vector<int32_t> tokens;
  std::vector<std::vector<double>> probs;
  std::vector<int32_t> parents;
  std::vector<double> conf;
  std::vector<int32_t> source;

  size_t size() const { return tokens.size(); }
  bool is_tree() const { return !parents.empty(); }
  // Every node's parent (-1: a child of the last committed token), for a chain too.
  std::vector<int32_t> ParentList() const;
  // The draft restricted to `nodes` (parent-closed, ascending), renumbered in order.
  Draft Subset(const std::vector<int32_t>& nodes) const;
  // Parents for the verify forward of [last] + nodes (node j -> row j + 1).
  std::vector<int32_t> VerifyParents() const;
};

}  // namespace spc

#endif  // SPECCOMPILE_CAPI_ACCEPTANCE_H_
