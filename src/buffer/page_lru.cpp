#include "buffer/page_lru.h"

#include <algorithm>

#include "retroinfer/error.h"

namespace retroinfer::buffer {

PageLru::PageLru(std::span<const int32_t> cluster_sizes, int page_tokens, int64_t capacity_pages)
    : page_tokens_(page_tokens), capacity_(capacity_pages), sizes_(cluster_sizes.begin(), cluster_sizes.end()) {
  RETROINFER_CHECK(page_tokens >= 1, "PageLru: page_tokens must be >= 1, got ", page_tokens);
  RETROINFER_CHECK(capacity_pages >= 0 && capacity_pages < (int64_t{1} << 31),
                   "PageLru: capacity_pages must be in [0, 2^31), got ", capacity_pages);
  const size_t C = sizes_.size();
  slot_begin_.assign(C + 1, 0);
  for (size_t c = 0; c < C; ++c) {
    RETROINFER_CHECK(sizes_[c] >= 0, "PageLru: cluster ", c, " has negative size ", sizes_[c]);
    slot_begin_[c + 1] = slot_begin_[c] + pages_of(static_cast<int32_t>(c));
  }
  slots_.assign(static_cast<size_t>(slot_begin_[C]), -1);
  resident_.assign(C, 0);
  last_step_.assign(C, -1);
  prev_.assign(C, -1);
  next_.assign(C, -1);
  free_pages_.resize(static_cast<size_t>(capacity_));
  // Stack: page 0 on top, so a fresh cache hands out pages 0, 1, 2, ...
  for (int64_t i = 0; i < capacity_; ++i) free_pages_[static_cast<size_t>(i)] = static_cast<int32_t>(capacity_ - 1 - i);
}

int32_t PageLru::pages_of(int32_t c) const { return (sizes_[c] + page_tokens_ - 1) / page_tokens_; }

std::span<const int32_t> PageLru::pages(int32_t c) const {
  if (!resident(c)) return {};
  return {slots_.data() + slot_begin_[c], static_cast<size_t>(pages_of(c))};
}

void PageLru::unlink(int32_t c) {
  const int32_t p = prev_[c], n = next_[c];
  if (p >= 0) next_[p] = n; else head_ = n;
  if (n >= 0) prev_[n] = p; else tail_ = p;
  prev_[c] = next_[c] = -1;
}

void PageLru::push_mru(int32_t c) {
  prev_[c] = tail_;
  next_[c] = -1;
  if (tail_ >= 0) next_[tail_] = c; else head_ = c;
  tail_ = c;
}

void PageLru::release(int32_t c) {
  unlink(c);
  const int32_t n = pages_of(c);
  for (int32_t j = 0; j < n; ++j) {
    free_pages_.push_back(slots_[slot_begin_[c] + j]);
    slots_[slot_begin_[c] + j] = -1;
  }
  resident_[c] = 0;
  --resident_count_;
}

std::optional<PageLru::Admission> PageLru::admit(int32_t c, int64_t step) {
  RETROINFER_CHECK(c >= 0 && c < num_clusters(), "PageLru::admit: cluster ", c, " outside [0, ", num_clusters(), ")");
  if (resident_[c] != 0) return std::nullopt;
  const int32_t need = pages_of(c);
  if (need == 0 || need > capacity_) return std::nullopt;
  // Pages that evicting the LRU prefix of clusters not used at `step` would free.
  int64_t avail = static_cast<int64_t>(free_pages_.size());
  int32_t cut = head_;
  while (avail < need && cut >= 0 && last_step_[cut] < step) {
    avail += pages_of(cut);
    cut = next_[cut];
  }
  if (avail < need) return std::nullopt;
  Admission a;
  while (static_cast<int64_t>(free_pages_.size()) < need) {
    const int32_t victim = head_;
    a.evicted.push_back(victim);
    release(victim);
  }
  a.pages.resize(static_cast<size_t>(need));
  for (int32_t j = 0; j < need; ++j) {
    a.pages[j] = free_pages_.back();
    free_pages_.pop_back();
    slots_[slot_begin_[c] + j] = a.pages[j];
  }
  resident_[c] = 1;
  ++resident_count_;
  last_step_[c] = step;
  push_mru(c);
  return a;
}

bool PageLru::touch(int32_t c, int64_t step) {
  if (!resident(c)) return false;
  last_step_[c] = std::max(last_step_[c], step);
  unlink(c);
  push_mru(c);
  return true;
}

void PageLru::remove(int32_t c) {
  if (resident(c)) release(c);
}

int32_t PageLru::add_clusters(std::span<const int32_t> sizes) {
  const size_t C = sizes_.size();
  RETROINFER_CHECK(C + sizes.size() < (size_t{1} << 31), "PageLru::add_clusters: ", C, " + ", sizes.size(),
                   " clusters exceed the int32 id range");
  for (size_t i = 0; i < sizes.size(); ++i)
    RETROINFER_CHECK(sizes[i] >= 0, "PageLru::add_clusters: new cluster ", i, " has negative size ", sizes[i]);
  // Validate first, then grow: a refused call leaves the state unchanged.
  for (int32_t s : sizes) {
    sizes_.push_back(s);
    const int64_t pages = (int64_t{s} + page_tokens_ - 1) / page_tokens_;
    slot_begin_.push_back(slot_begin_.back() + pages);
    resident_.push_back(0);
    last_step_.push_back(-1);
    prev_.push_back(-1);
    next_.push_back(-1);
  }
  slots_.resize(static_cast<size_t>(slot_begin_.back()), -1);
  return static_cast<int32_t>(C);
}

std::vector<int32_t> PageLru::lru_order() const {
  std::vector<int32_t> out;
  for (int32_t c = head_; c >= 0; c = next_[c]) out.push_back(c);
  return out;
}

void PageLru::check_invariants() const {
  std::vector<uint8_t> owned(static_cast<size_t>(capacity_), 0);
  int64_t used = 0, count = 0;
  for (int32_t c = head_, prev = -1; c >= 0; prev = c, c = next_[c]) {
    RETROINFER_CHECK(resident_[c] != 0 && prev_[c] == prev, "PageLru: LRU list corrupt at cluster ", c);
    RETROINFER_CHECK(++count <= num_clusters(), "PageLru: LRU list has a cycle");
    for (int32_t p : pages(c)) {
      RETROINFER_CHECK(p >= 0 && p < capacity_ && owned[p] == 0, "PageLru: page ", p, " of cluster ", c,
                       " out of range or owned twice");
      owned[p] = 1;
      ++used;
    }
  }
  RETROINFER_CHECK(count == resident_count_, "PageLru: ", count, " clusters listed, ", resident_count_, " counted");
  RETROINFER_CHECK(used == used_pages() && used <= capacity_, "PageLru: ", used, " pages owned, ", used_pages(),
                   " counted, capacity ", capacity_);
  for (int32_t p : free_pages_)
    RETROINFER_CHECK(p >= 0 && p < capacity_ && owned[p] == 0, "PageLru: free page ", p, " is also owned");
}

}  // namespace retroinfer::buffer
