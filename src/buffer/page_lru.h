// LRU state of one flat head's GPU block cache: a pool of `capacity_pages` pages of page_tokens tokens;
// a cluster of s tokens occupies ceil(s / page_tokens) pages (not necessarily contiguous) and is resident
// as a whole or not at all; replacement evicts whole clusters, least recently used first.
//
// Recency: touch() (a hit) and a successful admit() make the cluster the most recently used. Every
// cluster carries the step of its last use; admit(c, step) never evicts a cluster used at `step` itself
// (a step's misses do not push out that step's hits) and fails instead.
//
// Threading contract: not synchronised. The wave buffer's manager thread is its only user while running;
// other threads read it only after the manager is stopped or idle (CacheManager::wait_idle()).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

namespace retroinfer::buffer {

class PageLru {
 public:
  // cluster_sizes [num_clusters]: tokens of each cluster (0 allowed: never resident).
  PageLru(std::span<const int32_t> cluster_sizes, int page_tokens, int64_t capacity_pages);

  struct Admission {
    std::vector<int32_t> pages;    // page ids given to the cluster, in token order
    std::vector<int32_t> evicted;  // clusters evicted to make room, least recently used first
  };
  // Makes cluster c resident, evicting least recently used clusters (none used at `step`) as needed.
  // nullopt (and no change) when c is already resident, has no tokens, needs more pages than the cache
  // holds, or room could only be made by evicting clusters used at `step`.
  std::optional<Admission> admit(int32_t c, int64_t step);
  // Marks a resident cluster used at `step` (most recently used). Returns false (no change) if not resident.
  bool touch(int32_t c, int64_t step);
  // Drops a resident cluster and frees its pages (rollback of an admission that was not applied).
  void remove(int32_t c);
  // Index update during decode: appends clusters with the given sizes (tokens, >= 0) as ids
  // [num_clusters(), num_clusters() + sizes.size()), not resident; returns the first new id. Residency,
  // pages and LRU order of the existing clusters are unchanged; spans from pages() are invalidated.
  int32_t add_clusters(std::span<const int32_t> sizes);

  bool resident(int32_t c) const { return c >= 0 && c < num_clusters() && resident_[c] != 0; }
  int32_t size(int32_t c) const { return sizes_[static_cast<size_t>(c)]; }  // tokens of cluster c
  int32_t pages_of(int32_t c) const;  // ceil(size / page_tokens)
  std::span<const int32_t> pages(int32_t c) const;  // the resident cluster's pages (empty if not resident)
  int num_clusters() const { return static_cast<int>(sizes_.size()); }
  int64_t capacity_pages() const { return capacity_; }
  int64_t used_pages() const { return capacity_ - static_cast<int64_t>(free_pages_.size()); }
  int64_t resident_clusters() const { return resident_count_; }
  // Resident clusters from least to most recently used.
  std::vector<int32_t> lru_order() const;
  // Throws Error if an internal invariant is broken (page owned twice, counts disagree, list corrupt).
  void check_invariants() const;

 private:
  void unlink(int32_t c);
  void push_mru(int32_t c);
  void release(int32_t c);

  int page_tokens_;
  int64_t capacity_;
  std::vector<int32_t> sizes_;        // [C]
  std::vector<int64_t> slot_begin_;   // [C + 1]: CSR offsets of each cluster's page slots
  std::vector<int32_t> slots_;        // [sum pages_of]: page ids of resident clusters
  std::vector<uint8_t> resident_;     // [C]
  std::vector<int64_t> last_step_;    // [C]
  std::vector<int32_t> prev_, next_;  // [C]: doubly linked LRU list, -1 ends
  int32_t head_ = -1, tail_ = -1;     // head = least recently used, tail = most recently used
  std::vector<int32_t> free_pages_;   // stack of free page ids
  int64_t resident_count_ = 0;
};

}  // namespace retroinfer::buffer
