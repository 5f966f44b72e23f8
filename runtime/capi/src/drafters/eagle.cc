// See eagle.h.
#include "eagle.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <stdexcept>

#include "../costs.h"

namespace spc {

namespace {
double Seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

std::vector<int32_t> DraftTree::Add(const std::vector<int32_t>& parents, const HeadOut& out, const Plan& plan) {
  std::vector<int32_t> added;
  for (int64_t j = 0; j < out.rows; ++j) {
    int32_t p = parents[j];
    for (int64_t w = 0; w < out.width; ++w) {
      double c = std::exp(out.logp[j * out.width + w]);
      added.push_back(static_cast<int32_t>(tok.size()));
      tok.push_back(static_cast<int32_t>(out.ids[j * out.width + w]));
      par.push_back(p);
      depth.push_back(p >= 0 ? depth[p] + 1 : 1);
      src.push_back(static_cast<int32_t>(j));
      row.push_back(-1);
      conf.push_back(c);
      P.push_back(plan.p(c) * (p >= 0 ? P[p] : 1.0));
    }
  }
  return added;
}

std::vector<int32_t> DraftTree::Expand(const std::vector<int32_t>& frontier, int width) const {
  std::vector<int32_t> fr = frontier;
  std::stable_sort(fr.begin(), fr.end(), [&](int32_t a, int32_t b) { return P[a] != P[b] ? P[a] > P[b] : a < b; });
  if (static_cast<int>(fr.size()) > width) fr.resize(width);
  return fr;
}

std::pair<std::vector<int32_t>, std::vector<int32_t>> DraftTree::Select(int64_t budget) const {
  std::vector<int32_t> keep(size());
  std::iota(keep.begin(), keep.end(), 0);
  std::sort(keep.begin(), keep.end(), [&](int32_t a, int32_t b) {
    if (P[a] != P[b]) return P[a] > P[b];
    if (depth[a] != depth[b]) return depth[a] < depth[b];
    return a < b;
  });
  if (static_cast<int64_t>(keep.size()) > budget) keep.resize(budget);
  std::sort(keep.begin(), keep.end(), [&](int32_t a, int32_t b) { return depth[a] != depth[b] ? depth[a] < depth[b] : a < b; });
  std::vector<int32_t> local(size(), -1), parents;
  for (size_t i = 0; i < keep.size(); ++i) local[keep[i]] = static_cast<int32_t>(i);
  for (int32_t n : keep) {
    int32_t p = par[n] >= 0 ? local[par[n]] : -1;
    if ((p < 0) != (par[n] < 0)) throw std::runtime_error("EAGLE: a draft candidate is more probable than its parent");
    parents.push_back(p);
  }
  return {keep, parents};
}

ForwardBatch ScratchRows::Plan(const std::vector<int32_t>& parents, std::vector<int32_t>* rows) {
  size_t n = parents.size(), first = path_.size();
  kv_.Reserve({seq_}, {static_cast<int64_t>(first + n)});
  ForwardBatch fb;
  fb.counts = {static_cast<int64_t>(n)};
  size_t width = 1;
  rows->clear();
  for (size_t i = 0; i < n; ++i) {
    int64_t r = base_ + static_cast<int64_t>(first + i);
    int32_t slot = kv_.Slot(seq_, r);
    std::vector<int32_t> path = parents[i] >= 0 ? path_[parents[i]] : std::vector<int32_t>{};
    path.push_back(slot);
    fb.positions.push_back(static_cast<int32_t>(base_ + static_cast<int64_t>(path.size()) - 1));
    fb.write_slots.push_back(slot);
    fb.token_seq.push_back(0);
    fb.token_prefix.push_back(static_cast<int32_t>(base_));
    fb.extra_len.push_back(static_cast<int32_t>(path.size()));
    width = std::max(width, path.size());
    rows->push_back(static_cast<int32_t>(path_.size()));
    path_.push_back(std::move(path));
  }
  kv_.PageTable({seq_}, &fb);
  fb.extra_cols = static_cast<int64_t>(width);
  fb.extra_slots.assign(n * width, 0);
  for (size_t i = 0; i < n; ++i) std::copy(path_[first + i].begin(), path_[first + i].end(), fb.extra_slots.begin() + i * width);
  return fb;
}

int64_t HeadKVTokens(int64_t max_total_tokens, int64_t max_num_sequence, int64_t width, int64_t max_depth,
                     int64_t page_size) {
  return max_total_tokens + max_num_sequence * (width * max_depth + 2 * page_size);
}

EagleProposer::EagleProposer(Model* head, const Model& target, int64_t max_total_tokens, int tree_width, int max_nodes)
    : head_(head, target, tree_width), target_(target), width_(tree_width), max_nodes_(max_nodes),
      coverage_(head_.vocab_ids()) {
  if (tree_width < 1) throw std::invalid_argument("--spec-tree-width must be >= 1 (1 = chain)");
  if (max_nodes < 1 || max_nodes > kMaxTreeNodes) {
    throw std::invalid_argument("--spec-tree-nodes must be in 1.." + std::to_string(kMaxTreeNodes));
  }
  int64_t pages = 0;
  head->CreateKVCache(max_total_tokens, &kv_tensor_, &pages);
  kv_ = std::make_unique<PagedKV>(pages, head->page_size());
}

void EagleProposer::AddSequence(int64_t seq_id, const std::vector<int32_t>& prompt) {
  kv_->AddSequence(seq_id);
  pending_.clear();
  live_ = true;
  coverage_.Add(prompt);
}

void EagleProposer::RemoveSequence(int64_t seq_id) {
  kv_->RemoveSequence(seq_id);
  pending_.clear();
  live_ = false;
}

int64_t EagleProposer::Resume(int64_t seq_id, const std::vector<int32_t>& prompt, int64_t keep) {
  coverage_.Add(prompt);
  // The head's row j is built from the target feature of position j and token j + 1, so rows
  // before keep - 1 stay valid, and so do pending features of positions before keep.
  int64_t built = kv_->Length(seq_id);
  if (built > keep - 1) {
    kv_->PopN(seq_id, built - std::max<int64_t>(keep - 1, 0));
    pending_.clear();
  } else {
    pending_.resize(std::min(pending_.size(), static_cast<size_t>(keep - built) * row_bytes_));
  }
  return kv_->Length(seq_id) + PendingRows();
}

void EagleProposer::ObserveHidden(int64_t seq_id, int64_t position, const char* rows, int64_t n, size_t row_bytes) {
  if (!live_) return;
  row_bytes_ = row_bytes;
  int64_t have = kv_->Length(seq_id) + PendingRows();
  if (position != have) {
    throw std::runtime_error("EAGLE: features for position " + std::to_string(position) + " arrived, " +
                             std::to_string(have) + " expected");
  }
  pending_.insert(pending_.end(), rows, rows + n * row_bytes);
}

HeadOut EagleProposer::CatchUp(int64_t seq_id, const std::vector<int32_t>& history) {
  // every pending true feature becomes a head row, paired with the token after it
  int64_t n = PendingRows(), start = kv_->Length(seq_id);
  if (n == 0 || start + 1 + n > static_cast<int64_t>(history.size())) {
    throw std::runtime_error("EAGLE: the target features and the history disagree");
  }
  kv_->Reserve({seq_id}, {n});  // all or nothing: a full cache leaves the pending rows pending
  int64_t limit = std::min(head_.model()->config().prefill_chunk_size, target_.config().prefill_chunk_size);
  HeadOut out;
  for (int64_t a = 0; a < n; a += limit) {  // a long prompt's rows over consecutive calls: the same rows
    int64_t e = std::min(n, a + limit);
    ForwardBatch fb = kv_->PlanChain({seq_id}, {e - a});
    std::vector<int32_t> tokens(history.begin() + start + 1 + a, history.begin() + start + 1 + e);
    std::vector<char> feats(pending_.begin() + a * row_bytes_, pending_.begin() + e * row_bytes_);
    out = head_.CatchUp(kv_tensor_, fb, tokens, feats, {static_cast<int32_t>(e - a - 1)}, width_);
    ++forwards_;
  }
  pending_.clear();
  return out;
}

DraftTree EagleProposer::Grow(int64_t seq_id, int64_t k, HeadOut root, const Plan& plan, double t0) {
  // EAGLE-2: per depth the `width` likeliest frontier nodes in one head call, while the plan
  // says the next call pays
  DraftTree tree;
  std::vector<int32_t> frontier = tree.Add({-1}, root, plan);
  plan.Spent(Seconds() - t0);
  plan.Drafted(tree.P);
  ScratchRows rows(*kv_, seq_id);
  Tensor hidden = root.feats;
  for (int64_t depth = 1; depth < k; ++depth) {
    std::vector<int32_t> expand = tree.Expand(frontier, width_);
    std::vector<std::pair<double, double>> nodes;
    for (int32_t e : expand) nodes.emplace_back(tree.P[e], plan.p(tree.conf[e]));
    if (!plan.ShouldDraft(static_cast<int64_t>(nodes.size()), nodes)) break;
    t0 = Seconds();
    std::vector<int32_t> parent_rows, new_rows, tokens, src;
    for (int32_t e : expand) {
      parent_rows.push_back(tree.par[e] >= 0 ? tree.row[tree.par[e]] : -1);
      tokens.push_back(tree.tok[e]);
      src.push_back(tree.src[e]);
    }
    ForwardBatch fb = rows.Plan(parent_rows, &new_rows);
    for (size_t i = 0; i < expand.size(); ++i) tree.row[expand[i]] = new_rows[i];
    HeadOut out = head_.Step(kv_tensor_, fb, tokens, hidden, src, width_);
    ++forwards_;
    hidden = out.feats;
    frontier = tree.Add(expand, out, plan);
    plan.Spent(Seconds() - t0);
    std::vector<double> probs;
    for (int32_t f : frontier) probs.push_back(tree.P[f]);
    plan.Drafted(probs);
  }
  return tree;
}

Draft EagleProposer::Propose(int64_t seq_id, const std::vector<int32_t>& history, int64_t k, const spc_generate_params&,
                             std::mt19937_64&, const Plan& plan, int64_t node_limit) {
  Draft draft;
  if (k <= 0) return draft;
  // the catch-up builds every true row the head lacks (a prompt, a plain stretch): the plan
  // charges part of it to this step, since it buys drafting for the steps after it too
  if (!plan.ShouldDraft(1, {coverage_.FirstToken(history, plan.first())}, PendingRows() - 1)) return draft;
  DraftTree tree;
  try {
    double t0 = Seconds();
    tree = Grow(seq_id, k, CatchUp(seq_id, history), plan, t0);
  } catch (...) {
    kv_->PopN(seq_id, 0);  // free the pages the scratch tree rows took
    throw;
  }
  kv_->PopN(seq_id, 0);
  int64_t budget = std::min<int64_t>(max_nodes_, node_limit > 0 ? node_limit : max_nodes_);
  auto selected = tree.Select(budget);
  for (int32_t n : selected.first) {
    draft.tokens.push_back(tree.tok[n]);
    draft.conf.push_back(tree.conf[n]);
  }
  if (width_ > 1) draft.parents = selected.second;
  return draft;
}

std::pair<std::map<int64_t, double>, double> EagleProposer::Measure(const std::vector<int64_t>& rows) {
  int64_t most = *std::max_element(rows.begin(), rows.end());
  std::vector<int64_t> scratch;
  for (int64_t i = 0; i < most; ++i) scratch.push_back(-1 - i);
  Model* head = head_.model();
  size_t esz = DTypeBytes(head->dtype());
  std::vector<char> zeros(static_cast<size_t>(most * head->hidden_size()) * esz, 0);
  Tensor hidden = head->Upload(zeros.data(), {most, head->hidden_size()}, head->dtype());
  std::vector<char> truth(static_cast<size_t>(32 * head_.feature_width()) * esz, 0);
  for (int64_t s : scratch) kv_->AddSequence(s);
  std::map<int64_t, double> table;
  double per_row = 0.0;
  auto step = [&](int64_t r) {  // one root row on each of r scratch sequences: a depth of r rows
    std::vector<int64_t> ids(scratch.begin(), scratch.begin() + r);
    kv_->Reserve(ids, std::vector<int64_t>(r, 1));
    ForwardBatch fb;
    fb.counts.assign(r, 1);
    for (int64_t i = 0; i < r; ++i) {
      int32_t slot = kv_->Slot(ids[i], 0);
      fb.positions.push_back(0);
      fb.write_slots.push_back(slot);
      fb.token_seq.push_back(static_cast<int32_t>(i));
      fb.token_prefix.push_back(0);
      fb.extra_slots.push_back(slot);
      fb.extra_len.push_back(1);
    }
    kv_->PageTable(ids, &fb);
    std::vector<int32_t> src(r);
    for (int64_t i = 0; i < r; ++i) src[i] = static_cast<int32_t>(i);
    head_.Step(kv_tensor_, fb, std::vector<int32_t>(r, 0), hidden, src, width_);
    for (int64_t s : ids) kv_->PopN(s, 0);
  };
  auto catch_up = [&](int64_t n) {
    ForwardBatch fb = kv_->PlanChain({scratch[0]}, {n});
    std::vector<char> feats(truth.begin(), truth.begin() + static_cast<int64_t>(n * head_.feature_width() * esz));
    head_.CatchUp(kv_tensor_, fb, std::vector<int32_t>(n, 0), feats, {static_cast<int32_t>(n - 1)}, width_);
    kv_->PopN(scratch[0], n);
  };
  try {
    for (int64_t r : rows) table[r] = TimeMin([&] { step(r); });
    per_row = std::max(TimeMin([&] { catch_up(32); }) - TimeMin([&] { catch_up(1); }), 0.0) / 31;
  } catch (...) {
    for (int64_t s : scratch) kv_->RemoveSequence(s);
    throw;
  }
  for (int64_t s : scratch) kv_->RemoveSequence(s);
  return {table, per_row};
}

}  // namespace spc
