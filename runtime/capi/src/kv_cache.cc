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

void PagedKV::Reserve(const std::vector<int64_t>& seq_ids, const std::vector<int64_t>& counts) {
  int64_t need = 0;
  for (size_t i = 0; i < seq_ids.size(); ++i) need += PagesNeeded(Seq(seq_ids[i]), counts[i]);
  if (need > NumFreePages()) {
    throw KVCacheFull("KV cache needs " + std::to_string(need) + " more pages, " +
                      std::to_string(NumFreePages()) + " free");
  }
  for (size_t b = 0; b < seq_ids.size(); ++b) {
    SeqState& st = Seq(seq_ids[b]);
    for (int64_t k = PagesNeeded(st, counts[b]); k > 0; --k) {
      st.pages.push_back(free_.back());
      free_.pop_back();
    }
  }
}

int32_t PagedKV::Slot(int64_t seq_id, int64_t row) {
  const SeqState& st = Seq(seq_id);
  if (row < 0 || row / page_size_ >= static_cast<int64_t>(st.pages.size())) {
    throw std::out_of_range("row " + std::to_string(row) + " of sequence " + std::to_string(seq_id) + " is not reserved");
  }
  return Slot(st, row);
}

void PagedKV::PageTable(const std::vector<int64_t>& seq_ids, ForwardBatch* fb) {
  size_t width = 1;
  for (int64_t s : seq_ids) width = std::max(width, Seq(s).pages.size());
  fb->pt_rows = static_cast<int64_t>(seq_ids.size());
  fb->pt_cols = static_cast<int64_t>(width);
  fb->page_table.assign(fb->pt_rows * fb->pt_cols, 0);
  for (size_t b = 0; b < seq_ids.size(); ++b) {
    const auto& pages = Seq(seq_ids[b]).pages;
    std::copy(pages.begin(), pages.end(), fb->page_table.begin() + b * width);
  }
}

ForwardBatch PagedKV::PlanChain(const std::vector<int64_t>& seq_ids, const std::vector<int64_t>& counts) {
  Reserve(seq_ids, counts);
  ForwardBatch fb;
  fb.counts = counts;
  for (size_t b = 0; b < seq_ids.size(); ++b) {
    SeqState& st = Seq(seq_ids[b]);
    for (int64_t j = 0; j < counts[b]; ++j) {
      int64_t r = st.length + j;
      fb.positions.push_back(static_cast<int32_t>(r));
      fb.write_slots.push_back(Slot(st, r));
      fb.token_seq.push_back(static_cast<int32_t>(b));
      fb.token_prefix.push_back(static_cast<int32_t>(r + 1));
    }
    st.length += counts[b];
  }
  PageTable(seq_ids, &fb);
  size_t n = fb.positions.size();
  fb.extra_slots.assign(n, 0);
  fb.extra_len.assign(n, 0);
  return fb;
}

ForwardBatch PagedKV::PlanTree(const std::vector<int64_t>& seq_ids, const std::vector<std::vector<int32_t>>& parents) {
  std::vector<int64_t> counts;
  for (const auto& par : parents) {
    for (size_t j = 0; j < par.size(); ++j) {
      if (par[j] >= static_cast<int32_t>(j)) throw std::invalid_argument("token tree parents must precede their children");
    }
    counts.push_back(static_cast<int64_t>(par.size()));
  }
  Reserve(seq_ids, counts);
  ForwardBatch fb;
  fb.counts = counts;
  std::vector<std::vector<int32_t>> extras;
  for (size_t b = 0; b < seq_ids.size(); ++b) {
    const SeqState& st = Seq(seq_ids[b]);
    const auto& par = parents[b];
    for (size_t j = 0; j < par.size(); ++j) {
      std::vector<int32_t> chain{static_cast<int32_t>(j)};
      while (par[chain.back()] >= 0) chain.push_back(par[chain.back()]);
      std::reverse(chain.begin(), chain.end());
      fb.positions.push_back(static_cast<int32_t>(st.length + static_cast<int64_t>(chain.size()) - 1));
      fb.write_slots.push_back(Slot(st, st.length + static_cast<int64_t>(j)));
      fb.token_seq.push_back(static_cast<int32_t>(b));
      fb.token_prefix.push_back(static_cast<int32_t>(st.length));
      std::vector<int32_t> slots;
      for (int32_t a : chain) slots.push_back(Slot(st, st.length + a));
      extras.push_back(std::move(slots));
    }
  }
  PageTable(seq_ids, &fb);
  size_t width = 1;
  for (const auto& e : extras) width = std::max(width, e.size());
  fb.extra_cols = static_cast<int64_t>(width);
  fb.extra_slots.assign(extras.size() * width, 0);
  for (size_t i = 0; i < extras.size(); ++i) {
    std::copy(extras[i].begin(), extras[i].end(), fb.extra_slots.begin() + i * width);
    fb.extra_len.push_back(static_cast<int32_t>(extras[i].size()));
  }
  return fb;
}

std::pair<std::vector<int32_t>, std::vector<int32_t>> PagedKV::TreeCommitMoves(int64_t seq_id,
                                                                               const std::vector<int32_t>& path) {
  SeqState& st = Seq(seq_id);
  std::vector<int32_t> src, dst;
  for (size_t d = 0; d < path.size(); ++d) {
    if (path[d] != static_cast<int32_t>(d)) {
      src.push_back(Slot(st, st.length + path[d]));
      dst.push_back(Slot(st, st.length + static_cast<int64_t>(d)));
    }
  }
  st.length += static_cast<int64_t>(path.size());
  Trim(st);
  return {src, dst};
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
