#include "buffer/cache_manager.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <utility>

#include "retroinfer/error.h"

namespace retroinfer::buffer {

namespace {

// Acquire / release accesses to words the other side (GPU or test producer) writes or reads. On the GPU
// path these words live in pinned host memory; x86 keeps the CPU's stores in order and the GPU's
// system-scope fences order its writes before the ones that publish them.
uint64_t load_acquire(const uint64_t& x) {
  return std::atomic_ref<uint64_t>(const_cast<uint64_t&>(x)).load(std::memory_order_acquire);
}
void store_release(uint64_t& x, uint64_t v) { std::atomic_ref<uint64_t>(x).store(v, std::memory_order_release); }

// Idle polling interval of the manager thread: short against a decode step of one layer (~100 us at
// 128K tokens) so that an update is ready by the next step, long enough not to burn a core.
constexpr auto kIdleSleep = std::chrono::microseconds(20);

}  // namespace

CacheManager::CacheManager(const WaveProtocolLayout& layout, void* region, std::span<const int32_t> cluster_sizes,
                           int num_clusters, int page_tokens, int64_t capacity_pages)
    : layout_(layout), region_(region), page_tokens_(page_tokens) {
  RETROINFER_CHECK(region != nullptr, "CacheManager: null protocol region");
  RETROINFER_CHECK(layout.heads >= 1 && layout.k >= 0 && layout.ring_slots >= 2, "CacheManager: bad layout (heads ",
                   layout.heads, ", k ", layout.k, ", ring slots ", layout.ring_slots, "; need >= 1, >= 0, >= 2)");
  RETROINFER_CHECK(num_clusters >= 0 && cluster_sizes.size() == size_t(layout.heads) * size_t(num_clusters),
                   "CacheManager: cluster_sizes has ", cluster_sizes.size(), " entries, expected heads (",
                   layout.heads, ") * clusters (", num_clusters, ")");
  lrus_.reserve(size_t(layout.heads));
  for (int h = 0; h < layout.heads; ++h)
    lrus_.emplace_back(cluster_sizes.subspan(size_t(h) * size_t(num_clusters), size_t(num_clusters)), page_tokens,
                       capacity_pages);
  ids_copy_.resize(size_t(layout.heads) * size_t(layout.k));
  rows_copy_.resize(ids_copy_.size());
}

CacheManager::~CacheManager() {
  try {
    stop();
  } catch (...) {  // a destructor must not throw; the owner had its chances through check()
  }
}

void CacheManager::start() {
  RETROINFER_CHECK(!running_.load(), "CacheManager::start: already running");
  stop_.store(false);
  running_.store(true);
  thread_ = std::thread([this] { run(); });
}

void CacheManager::stop() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
  running_.store(false);
  apply_pending_clusters();  // additions queued after the thread's last ring read: the owner holds the state now
  check();
}

void CacheManager::check() {
  std::exception_ptr e;
  {
    std::lock_guard<std::mutex> lock(mu_);
    e = std::exchange(error_, nullptr);
  }
  if (e) std::rethrow_exception(e);
}

CacheManagerStats CacheManager::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void CacheManager::wait_idle(uint64_t steps) {
  std::unique_lock<std::mutex> lock(mu_);
  // A step's decision is published before the step counts as seen, so consuming the steps is enough.
  // (Waiting for an outstanding update to be acked would deadlock when the producer has stopped: the
  // ack only comes with the next step's apply.)
  const auto done = [&] {
    return error_ != nullptr || !running_.load() || stats_.steps_seen + stats_.steps_lost >= steps;
  };
  while (!done()) cv_.wait_for(lock, std::chrono::milliseconds(1));
  if (error_ != nullptr) {
    auto e = std::exchange(error_, nullptr);
    lock.unlock();
    std::rethrow_exception(e);
  }
}

void CacheManager::add_clusters(int head, std::span<const int32_t> sizes) {
  RETROINFER_CHECK(head >= 0 && head < layout_.heads, "CacheManager::add_clusters: head ", head, " outside [0, ",
                   layout_.heads, ")");
  for (size_t i = 0; i < sizes.size(); ++i)
    RETROINFER_CHECK(sizes[i] >= 0, "CacheManager::add_clusters: head ", head, " new cluster ", i,
                     " has negative size ", sizes[i]);
  if (!running_.load()) {  // the owner holds the state (manager stopped or never started)
    lrus_[size_t(head)].add_clusters(sizes);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    pending_clusters_.push_back({head, std::vector<int32_t>(sizes.begin(), sizes.end())});
  }
  pending_.store(true, std::memory_order_release);
}

void CacheManager::apply_pending_clusters() {
  if (!pending_.load(std::memory_order_acquire)) return;
  std::vector<PendingClusters> todo;
  {
    std::lock_guard<std::mutex> lock(mu_);
    todo.swap(pending_clusters_);
    pending_.store(false, std::memory_order_relaxed);
  }
  for (const auto& p : todo) lrus_[size_t(p.head)].add_clusters(p.sizes);
}

void CacheManager::run() {
  try {
    while (!stop_.load(std::memory_order_relaxed)) {
      if (!poll()) std::this_thread::sleep_for(kIdleSleep);
    }
  } catch (...) {
    std::lock_guard<std::mutex> lock(mu_);
    error_ = std::current_exception();
    running_.store(false);
  }
  cv_.notify_all();
}

void CacheManager::read_ack() {
  if (outstanding_ == 0) return;
  AckRecord* ack = layout_.ack(region_);
  if (load_acquire(ack->seq) != outstanding_) return;
  const uint64_t applied_step = ack->step, admitted = ack->admitted;
  if (admitted == 0) {  // applied late: the GPU kept the evictions, dropped the admissions
    for (const auto& a : admissions_) lrus_[size_t(a.head)].remove(a.cluster);
  }
  // Steps before applied_step looked clusters up in the page table as it was before this update.
  min_decision_step_ = std::max(min_decision_step_, applied_step);
  outstanding_ = 0;
  std::lock_guard<std::mutex> lock(mu_);
  if (admitted == 0) {
    ++stats_.updates_dropped;
    stats_.admitted -= admissions_.size();
  }
}

bool CacheManager::poll() {
  bool progressed = false;
  const int R = layout_.ring_slots;
  const size_t payload = size_t(layout_.heads) * size_t(layout_.k);
  for (;;) {
    read_ack();
    const int slot = static_cast<int>(next_step_ % uint64_t(R));
    RingSlotHeader* hdr = layout_.ring_header(region_, slot);
    const uint64_t end = load_acquire(hdr->end);
    if (end < next_step_ + 1) break;  // step next_step_ not written yet
    if (end > next_step_ + 1) {       // lapped: the slot already holds step end - 1 >= next_step_ + R
      // The oldest step that can still be in the ring is end - R (the slots hold R consecutive steps).
      const uint64_t resume = std::max<uint64_t>(next_step_ + 1, end - uint64_t(R));
      const uint64_t lost = resume - next_step_;
      next_step_ = resume;
      std::lock_guard<std::mutex> lock(mu_);
      stats_.steps_lost += lost;
      continue;
    }
    // The ring kernel acks an update before it writes a step's end: the ack read at the top of the loop may
    // predate this step (then the step would not decide, its misses never admitted); read after `end`, it does not.
    read_ack();
    // Seqlock read: payload (relaxed, it may be overwritten under us), acquire fence, then `begin` must
    // still name this step.
    const int32_t* ids = layout_.ring_ids(region_, slot);
    const int32_t* rows = layout_.ring_rows(region_, slot);
    for (size_t i = 0; i < payload; ++i) {
      ids_copy_[i] = std::atomic_ref<int32_t>(const_cast<int32_t&>(ids[i])).load(std::memory_order_relaxed);
      rows_copy_[i] = std::atomic_ref<int32_t>(const_cast<int32_t&>(rows[i])).load(std::memory_order_relaxed);
    }
    std::atomic_thread_fence(std::memory_order_acquire);
    if (std::atomic_ref<uint64_t>(hdr->begin).load(std::memory_order_relaxed) != next_step_ + 1) {  // overwritten
      std::lock_guard<std::mutex> lock(mu_);
      ++stats_.steps_lost;
      ++next_step_;
      continue;
    }
    // Additions queued before the producer wrote this step are visible now (the ring read was acquire).
    apply_pending_clusters();
    const uint64_t step = next_step_;
    // Decide only for the newest step (an older step's rows are gone by the time an update could land)
    // whose lookup already saw the last applied update, and only with no update outstanding.
    const RingSlotHeader* next_hdr = layout_.ring_header(region_, static_cast<int>((step + 1) % uint64_t(R)));
    const bool newest = load_acquire(next_hdr->end) < step + 2;
    const bool decide = newest && outstanding_ == 0 && step >= min_decision_step_ && admit_.load();
    process_step(step, ids_copy_.data(), rows_copy_.data(), decide);
    ++next_step_;
    progressed = true;
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++stats_.steps_seen;
    }
    cv_.notify_all();
  }
  return progressed;
}

void CacheManager::process_step(uint64_t step, const int32_t* ids, const int32_t* rows, bool decide) {
  const int K = layout_.k;
  uint64_t hits = 0, misses = 0, evicted = 0;
  evictions_.clear();
  if (decide) {
    admissions_.clear();
    pages_.clear();
  }
  const int64_t s = static_cast<int64_t>(step);
  // Hits first (recency of every head), then the admissions, so that a step's misses never evict its hits.
  for (int h = 0; h < layout_.heads; ++h)
    for (int j = 0; j < K; ++j) {
      const int32_t c = ids[size_t(h) * K + j];
      if (c < 0) continue;
      RETROINFER_CHECK(c < lrus_[size_t(h)].num_clusters(), "CacheManager: ring step ", step, " head ", h,
                       " names cluster ", c, " of ", lrus_[size_t(h)].num_clusters(),
                       " (an index update must call add_clusters before the step that can select its clusters)");
      if (rows[size_t(h) * K + j] < 0) {
        ++hits;
        lrus_[size_t(h)].touch(c, s);  // false when the manager already evicted it: nothing to do
      } else {
        ++misses;
      }
    }
  if (decide) {
    bool full = false;
    for (int h = 0; h < layout_.heads && !full; ++h) {
      PageLru& lru = lrus_[size_t(h)];
      for (int j = 0; j < K; ++j) {
        const int32_t c = ids[size_t(h) * K + j], row = rows[size_t(h) * K + j];
        if (c < 0 || row < 0 || lru.resident(c)) continue;
        const int32_t need = lru.pages_of(c);
        // Worst case an admission evicts `need` clusters (each frees >= 1 page).
        if (int(admissions_.size()) + 1 > layout_.max_admissions ||
            int(pages_.size()) + need > layout_.max_admit_pages ||
            int(evictions_.size()) + need > layout_.max_evictions) {
          full = true;
          break;
        }
        auto a = lru.admit(c, s);
        if (!a) continue;
        for (int32_t v : a->evicted) evictions_.push_back({h, v});
        evicted += a->evicted.size();
        MailboxAdmission m{};
        m.head = h;
        m.cluster = c;
        m.exec_row = row;
        m.num_rows = lru.size(c);
        m.page_begin = static_cast<int32_t>(pages_.size());
        pages_.insert(pages_.end(), a->pages.begin(), a->pages.end());
        admissions_.push_back(m);
      }
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.hits += hits;
    stats_.misses += misses;
    stats_.evicted += evicted;
  }
  if (decide && (!admissions_.empty() || !evictions_.empty())) publish(step);
}

void CacheManager::publish(uint64_t src_step) {
  MailboxHeader* mb = layout_.mailbox(region_);
  // (memcpy with an empty vector's null data() is undefined even for 0 bytes.)
  if (!evictions_.empty())
    std::memcpy(layout_.evictions(region_), evictions_.data(), evictions_.size() * sizeof(MailboxEviction));
  if (!admissions_.empty())
    std::memcpy(layout_.admissions(region_), admissions_.data(), admissions_.size() * sizeof(MailboxAdmission));
  if (!pages_.empty()) std::memcpy(layout_.pages(region_), pages_.data(), pages_.size() * sizeof(int32_t));
  mb->src_step = src_step;
  mb->num_evictions = static_cast<int32_t>(evictions_.size());
  mb->num_admissions = static_cast<int32_t>(admissions_.size());
  mb->num_pages = static_cast<int32_t>(pages_.size());
  outstanding_ = ++seq_;
  store_release(mb->seq, seq_);
  std::lock_guard<std::mutex> lock(mu_);
  ++stats_.updates;
  stats_.admitted += admissions_.size();
}

}  // namespace retroinfer::buffer
