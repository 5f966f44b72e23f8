// runtime/drafters/eagle.py in C++: EAGLE drafting with an EAGLE-1 or EAGLE-3 head, as chains
// (width 1) and EAGLE-2 dynamic trees, for the session's one sequence.
//
// The bookkeeping is Python's. Head row i holds (target feature f_i, token i+1). The session
// hands over the true features of every token the target forwarded (ObserveHidden); at the next
// Propose the head first catches up on the rows it lacks, in one call whose last row gives the
// depth-1 candidates. Rows built from the head's own predicted features are scratch rows of a
// token tree (ScratchRows never grows the committed length), so after drafting the head's cache
// holds exactly the rows built from true features. Per depth the `width` likeliest frontier
// nodes are expanded (path probability P: the plan's predicted acceptance of each node's
// confidence, times its parent's), and the `max_nodes` likeliest candidates are drafted.
#ifndef SPECCOMPILE_CAPI_DRAFTERS_EAGLE_H_
#define SPECCOMPILE_CAPI_DRAFTERS_EAGLE_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "eagle_heads.h"
#include "proposers.h"

namespace spc {

constexpr int kMaxTreeNodes = 256;  // eagle.py MAX_TREE_NODES

// eagle.py DraftTree, for one sequence: the candidates of one Propose in creation order.
struct DraftTree {
  std::vector<int32_t> tok, par, depth, src, row;  // target token; parent node (-1: root); depth;
  // the row of the head call that gave it; its scratch row once expanded (-1)
  std::vector<double> conf, P;  // the head's probability of the token; path probability

  size_t size() const { return tok.size(); }
  // Row j of a head call gives `width` children of node parents[j]; returns the new nodes.
  std::vector<int32_t> Add(const std::vector<int32_t>& parents, const HeadOut& out, const Plan& plan);
  // The `width` likeliest of these nodes (ties: created first).
  std::vector<int32_t> Expand(const std::vector<int32_t>& frontier, int width) const;
  // The `budget` likeliest nodes (ties: shallower, then created first), ordered by depth, and
  // each one's local parent (-1: root).
  std::pair<std::vector<int32_t>, std::vector<int32_t>> Select(int64_t budget) const;
};

// eagle.py ScratchRows, for one sequence: the KV metadata of a head's scratch tree rows,
// planned row by row as the tree grows (row j at L + j, RoPE position L + depth - 1, attending
// rows 0..L-1 and then its ancestors' rows from the root down and itself).
class ScratchRows {
 public:
  ScratchRows(PagedKV& kv, int64_t seq_id) : kv_(kv), seq_(seq_id), base_(kv.Length(seq_id)) {}
  // New rows whose parents are these earlier rows (-1: the root) -> their forward's metadata;
  // `rows` receives their indices.
  ForwardBatch Plan(const std::vector<int32_t>& parents, std::vector<int32_t>* rows);

 private:
  PagedKV& kv_;
  int64_t seq_, base_;
  std::vector<std::vector<int32_t>> path_;  // slots of each row's ancestors, root first, then itself
};

class EagleProposer : public Proposer {
 public:
  // The head must outlive the proposer; max_total_tokens: the target's KV capacity.
  EagleProposer(Model* head, const Model& target, int64_t max_total_tokens, int tree_width, int max_nodes);
  void AddSequence(int64_t seq_id, const std::vector<int32_t>& prompt) override;
  void RemoveSequence(int64_t seq_id) override;
  int64_t Resume(int64_t seq_id, const std::vector<int32_t>& prompt, int64_t keep) override;
  void Prefill(int64_t, const std::vector<int32_t>&, int64_t) override {}
  Draft Propose(int64_t seq_id, const std::vector<int32_t>& history, int64_t k, const spc_generate_params& sampling,
                std::mt19937_64& rng, const Plan& plan, int64_t node_limit) override;
  std::string features() const override { return head_.features(); }
  void ObserveHidden(int64_t seq_id, int64_t position, const char* rows, int64_t n, size_t row_bytes) override;
  bool supports_trees() const override { return true; }
  int64_t forwards() const override { return forwards_; }
  // eagle.py measure: one draft depth over r scratch rows (one per scratch sequence), and what
  // one more true-feature row costs in a catch-up (32 rows against one).
  std::pair<std::map<int64_t, double>, double> Measure(const std::vector<int64_t>& rows) override;

 private:
  HeadOut CatchUp(int64_t seq_id, const std::vector<int32_t>& history);
  DraftTree Grow(int64_t seq_id, int64_t depth, HeadOut root, const Plan& plan, double t0);
  int64_t PendingRows() const { return row_bytes_ ? static_cast<int64_t>(pending_.size() / row_bytes_) : 0; }

  EagleHead head_;
  const Model& target_;
  int width_, max_nodes_;
  Tensor kv_tensor_;
  std::unique_ptr<PagedKV> kv_;
  std::vector<char> pending_;  // true features not yet in the head's cache, row after row
  size_t row_bytes_ = 0;
  bool live_ = false;  // the sequence was added
  VocabCoverage coverage_;
  int64_t forwards_ = 0;
};

// eagle.py head_kv_tokens: the committed rows plus each sequence's scratch tree rows.
int64_t HeadKVTokens(int64_t max_total_tokens, int64_t max_num_sequence, int64_t width, int64_t max_depth,
                     int64_t page_size);

}  // namespace spc

#endif  // SPECCOMPILE_CAPI_DRAFTERS_EAGLE_H_
