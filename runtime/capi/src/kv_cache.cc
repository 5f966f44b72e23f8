// See kv_cache.h. Page allocation order matches runtime/kv_cache.py exactly (free list
// initialised high-to-low, pages popped from the back, freed pages pushed back), so the
// C and Python runtimes touch the same slots for the same token stream.
#include "kv_cache.h"

#include <algorithm>
#include <string>

namespace spc {

PagedKV::PagedKV(int64_t num_pages, int64_t page_size) : num_pages_(num_pages), page_size_(page_size) {
  if (page_size <= 0) throw std::invalid_argument("KV page size must be positive");
  for (int64_t p = num_pages - 1; p >= 0; --p) free_.push_back(static_cast<int32_t>(p));
}

void PagedKV::AddSequence(int64_t seq_id) {
  if (seqs_.count(seq_id)) throw std::invalid_argument("sequence " + std::to_string(seq_id) + " already exists");
  seqs_[seq_id] = SeqState();
}

void PagedKV::RemoveSequence(int64_t seq_id) {
  auto it = seqs_.find(seq_id);
  if (it == seqs_.end()) return;
  const auto& pages = it->second.pages;
  for (auto p = pages.rbegin(); p != pages.rend(); ++p) free_.push_back(*p);
  seqs_.erase(it);
}

PagedKV::SeqState& PagedKV::Seq(int64_t seq_id) {
  auto it = seqs_.find(seq_id);
  if (it == seqs_.end()) throw std::invalid_argument("unknown sequence " + std::to_string(seq_id));
  return it->second;
}

int64_t PagedKV::Length(int64_t seq_id) const {
  auto it = seqs_.find(seq_id);
  if (it == seqs_.end()) throw std::invalid_argument("unknown sequence " + std::to_string(seq_id));
  return it->second.length;
}

int64_t PagedKV::PagesNeeded(const SeqState& st, int64_t extra) const {
  int64_t need = (st.length + extra + page_size_ - 1) / page_size_ - static_cast<int64_t>(st.pages.size());
  return std::max<int64_t>(0, need);
}

int32_t PagedKV::Slot(const SeqState& st, int64_t row) const {
  return static_cast<int32_t>(st.pages[row / page_size_] * page_size_ + row % page_size_);
}

void PagedKV::Trim(SeqState& st) {
  size_t keep = static_cast<size_t>((st.length + page_size_ - 1) / page_size_);
  while (st.pages.size() > keep) {
    free_.push_back(st.pages.back());
    st.pages.pop_back();
  }
}

ForwardBatch PagedKV::PlanChain(const std::vector<int64_t>& seq_ids, const std::vector<int64_t>& counts) {
  int64_t need = 0;
  for (size_t i = 0; i < seq_ids.size(); ++i) need += PagesNeeded(Seq(seq_ids[i]), counts[i]);
  if (need > NumFreePages()) {
    throw KVCacheFull("KV cache needs " + std::to_string(need) + " more pages, " +
                      std::to_string(NumFreePages()) + " free");
  }
  ForwardBatch fb;
  fb.counts = counts;
  for (size_t b = 0; b < seq_ids.size(); ++b) {
    SeqState& st = Seq(seq_ids[b]);
    for (int64_t k = PagesNeeded(st, counts[b]); k > 0; --k) {
      st.pages.push_back(free_.back());
      free_.pop_back();
    }
    for (int64_t j = 0; j < counts[b]; ++j) {
      int64_t r = st.length + j;
      fb.positions.push_back(static_cast<int32_t>(r));
      fb.write_slots.push_back(Slot(st, r));
      fb.token_seq.push_back(static_cast<int32_t>(b));
      fb.token_prefix.push_back(static_cast<int32_t>(r + 1));
    }
    st.length += counts[b];
  }
  size_t width = 1;
  for (int64_t s : seq_ids) width = std::max(width, Seq(s).pages.size());
  fb.pt_rows = static_cast<int64_t>(seq_ids.size());
  fb.pt_cols = static_cast<int64_t>(width);
  fb.page_table.assign(fb.pt_rows * fb.pt_cols, 0);
  for (size_t b = 0; b < seq_ids.size(); ++b) {
    const auto& pages = Seq(seq_ids[b]).pages;
    std::copy(pages.begin(), pages.end(), fb.page_table.begin() + b * width);
  }
  size_t n = fb.positions.size();
  fb.extra_slots.assign(n, 0);
  fb.extra_len.assign(n, 0);
  return fb;
}

void PagedKV::PopN(int64_t seq_id, int64_t n) {
  SeqState& st = Seq(seq_id);
  if (n > st.length) {
    throw std::invalid_argument("cannot pop " + std::to_string(n) + " tokens from a sequence of " +
                                std::to_string(st.length));
  }
  st.length -= n;
  Trim(st);
}

}  // namespace spc
