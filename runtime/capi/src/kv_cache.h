// Host-side paged KV bookkeeping: the C++ twin of runtime/kv_cache.py (chains only).
//
// The pages live in one device tensor [layers, 2, pages * page_size, kv_heads, head_dim]
// that the model's own attention kernels read and write; this class decides which
// slot each token writes and which rows it attends, and builds the per-forward
// metadata arrays of runtime/contract.py's FORWARD_META. The page size is the one the
// kernels were compiled with, read from the library's _metadata (kv_page_size). Rolling back rejected
// drafts is shortening the sequence (PopN). Token trees are not needed by the C API's
// proposers (n-gram drafts are chains), so plan_tree is not ported.
#ifndef SPECCOMPILE_CAPI_KV_CACHE_H_
#define SPECCOMPILE_CAPI_KV_CACHE_H_

#include <cstdint>
#include <map>
#include <stdexcept>
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
  std::vector<int32_t> extra_slots;   // [n, 1] further slots (trees only; zeros here)
  std::vector<int32_t> extra_len;     // [n]
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
  // Drop the last n tokens of a sequence (rejected drafts of a chain).
  void PopN(int64_t seq_id, int64_t n);

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
