// See acceptance.h.
#include "acceptance.h"

namespace spc {

std::vector<int32_t> Draft::ParentList() const {
  if (is_tree()) return parents;
  std::vector<int32_t> p(tokens.size());
  for (size_t j = 0; j < p.size(); ++j) p[j] = static_cast<int32_t>(j) - 1;
  return p;
}

Draft Draft::Subset(const std::vector<int32_t>& nodes) const {
  if (nodes.size() == size()) return *this;
  std::vector<int32_t> local(size(), -1), par = ParentList();
  for (size_t i = 0; i < nodes.size(); ++i) local[nodes[i]] = static_cast<int32_t>(i);
  Draft d;
  for (int32_t n : nodes) {
    d.tokens.push_back(tokens[n]);
    if (is_tree()) d.parents.push_back(par[n] >= 0 ? local[par[n]] : -1);
    if (!probs.empty()) d.probs.push_back(probs[n]);
    if (!conf.empty()) d.conf.push_back(conf[n]);
    if (!source.empty()) d.source.push_back(source[n]);
  }
  return d;
}

std::vector<int32_t> Draft::VerifyParents() const {
  std::vector<int32_t> v{-1};
  for (int32_t p : ParentList()) v.push_back(p + 1);
  return v;
}

}  // namespace spc
