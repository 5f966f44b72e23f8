// Host-side paged KV bookkeeping: the C++ twin of runtime/kv_cache.py (chains only).
//
// The pages live in one device tensor [layers, 2, pages * page_size, kv_heads, head_dim]
// that the model's own attention kernels read and write; this class decides which
// slot each token writes and which rows it attends, and builds the per-forward
// metadata arrays of runtime/contract.py's FORWARD_META. The page size is the one the
// kernels were compiled with, read from the library's _metadata (kv_page_size). Rolling back rejected
// drafts of a chain is shortening the sequence (PopN); committing a token tree moves the
// accepted path's rows into place (TreeCommitMoves, then Model::CommitTree copies them).
#ifndef SPECCOMPILE_CAPI_KV_CACHE_H_
#define SPECCOMPILE_CAPI_KV_CACHE_H_

#include <cstdint>
#include <map>
#include <stdexcept>
#include <utility>
#include <vector>

namespace spc {

// Not enough free pages for the requested tokens (nothing was changed).
struct KVCacheFull : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// One forward's metadata, the 7 arrays of contract.py's FORWARD_META (Model::Run passes
// them in that order, which Model checks the library's entry points take).
struct ForwardBatch {
  std::vector<int32_t> positions;    // [n] RoPE position of each token
  std::vector<int32_t> write_slots;  // [n] KV slot each token's k/v is written to
  std::vector<int32_t> page_table;   // [b, pages] page ids of each sequence
  int64_t pt_rows = 0, pt_cols = 0;
  std::vector<int32_t> token_seq;     // [n] page-table row of each token
  std::vector<int32_t> token_prefix;  // [n] rows 0..prefix-1 each token attends
  std::vector<int32_t> extra_slots;   // [n, extra_cols] a tree row's ancestors' slots, root first, then its own
  int64_t extra_cols = 1;
  std::vector<int32_t> extra_len;     // [n] (0 for chain rows)
  std::vector<int64_t> counts;        // tokens per sequence
};

class PagedKV {
 public:
  // page_size: tokens per page, as the library's kernels were compiled (Model::page_size()).
  PagedKV(int64_t num_pages, int64_t page_size);

  void AddSequence(int64_t seq_id);
  void RemoveSequence(int64_t seq_id);
  int64_t Length(int64_t seq_id) const;
  int64_t NumFreePages() const { return static_cast<int64_t>(free_.size()); }
  int64_t num_pages() const { return num_pages_; }
  int64_t page_size() const { return page_size_; }

  // Append counts[i] tokens to seq_ids[i]; token j of a sequence with committed length
  // L sits at row L+j and attends rows 0..L+j. Throws KVCacheFull before changing anything.
  ForwardBatch PlanChain(const std::vector<int64_t>& seq_ids, const std::vector<int64_t>& counts);
  // Verify one token tree per sequence (parents[i][j] = local parent, -1 = the last committed
  // token; here row 0 is that token itself, so its parent is -1 and the drafts hang off it):
  // kv_cache.py plan_tree. Node j is written at scratch row L+j, has RoPE position
  // L + (its chain length) - 1, and attends rows 0..L-1, then its ancestors from the root
  // down, ending with itself: the order its row would have in a plain decode once committed.
  ForwardBatch PlanTree(const std::vector<int64_t>& seq_ids, const std::vector<std::vector<int32_t>>& parents);
  // Pages for counts[i] rows past each sequence's committed length (scratch rows of a head's
  // draft tree); throws KVCacheFull before changing anything.
  void Reserve(const std::vector<int64_t>& seq_ids, const std::vector<int64_t>& counts);
  // The KV slot of a (reserved) row of a sequence.
  int32_t Slot(int64_t seq_id, int64_t row);
  // The page ids of each sequence, one row per sequence (FORWARD_META's page_table) into fb.
  void PageTable(const std::vector<int64_t>& seq_ids, ForwardBatch* fb);
  // Drop the last n tokens of a sequence (rejected drafts of a chain).
  void PopN(int64_t seq_id, int64_t n);
  // Accept tree nodes `path` (root first): the (src, dst) slot moves that put node path[d] at
  // row L+d; then the sequence grows by len(path). Moves go in increasing depth, which never
  // overwrites a later source (path[d] >= d).
  std::pair<std::vector<int32_t>, std::vector<int32_t>> TreeCommitMoves(int64_t seq_id, const std::vector<int32_t>& path);

 private:
  struct SeqState {
    std::vector<int32_t> pages;
    int64_t length = 0;
  };
  SeqState& Seq(int64_t seq_id);
  int64_t PagesNeeded(const SeqState& st, int64_t extra) const;
  int32_t Slot(const SeqState& st, int64_t row) const;
  void Trim(SeqState& st);

  int64_t num_pages_, page_size_;
  std::vector<int32_t> free_;  // a stack: the back is handed out first, like the Python list
  std::map<int64_t, SeqState> seqs_;
};

}  // namespace spc

#endif  // SPECCOMPILE_CAPI_KV_CACHE_H_
