// The wave buffer's cache manager: a CPU thread that keeps the block cache's LRU state off the GPU's
// critical path (docs/design.md §3, step 7).
//
// It reads each decode step's selected clusters and their hit / miss outcome from the selection ring
// (written by the GPU), updates one PageLru per flat head, decides admissions (the step's misses, in
// ascending cluster order per head, within the mailbox's limits) and the evictions they need, and
// publishes them as one update in the mailbox. A GPU kernel applies the update at the start of the next
// decode step (wave_protocol.h). At most one update is outstanding: the next decision waits for the
// GPU's ack. An update applied late (its rows are gone from the execution buffer) has its admissions
// dropped by the GPU; the manager then rolls them back, so its LRU state always equals the device's
// page table once acks are in.
//
// Threading contract:
//   - start() / stop() / wait_idle() / check() / stats() are called by one owner thread (the layer's);
//   - while running, the manager thread alone reads the ring and ack and writes the mailbox and the LRU
//     state; the producer (GPU) alone writes the ring and ack and reads the mailbox;
//   - add_clusters() is called by the owner between decode steps; while running it is queued (under the
//     mutex) and the manager thread applies it before it processes any ring step read afterwards;
//   - lru(h) may be read by the owner only while the manager is stopped or after wait_idle() returned;
//   - an exception in the manager thread stops it; check(), wait_idle() and stop() rethrow it on the
//     owner thread (the next synchronisation point).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <span>
#include <thread>
#include <vector>

#include "buffer/page_lru.h"
#include "kernels/wave_protocol.h"
#include "retroinfer/wave_buffer.h"

namespace retroinfer::buffer {

using CacheManagerStats = WaveBufferStats;  // retroinfer/wave_buffer.h: one set of counters

class CacheManager {
 public:
  // region: the protocol region laid out by `layout` (pinned mapped memory on the GPU path); it must stay
  // valid until the manager is destroyed. cluster_sizes: [layout.heads, num_clusters] tokens per cluster.
  // capacity_pages: the block cache's pages per flat head.
  CacheManager(const WaveProtocolLayout& layout, void* region, std::span<const int32_t> cluster_sizes,
               int num_clusters, int page_tokens, int64_t capacity_pages);
  ~CacheManager();  // stops the thread; never throws (a pending error is dropped)
  CacheManager(const CacheManager&) = delete;
  CacheManager& operator=(const CacheManager&) = delete;

  void start();
  void stop();   // joins the thread, applies queued add_clusters; rethrows its error, if any
  void check();  // rethrows the manager thread's error, if any
  // Blocks until the manager has consumed ring steps [0, steps) (read or counted lost), including the
  // decision it made for the last of them: with the producer waiting too, step `steps` applies that
  // decision in time. Rethrows a manager error. For deterministic tests and benchmarks.
  void wait_idle(uint64_t steps);
  CacheManagerStats stats() const;
  // Admissions on (default) or off: off, the manager only tracks recency and the cache stops changing
  // (benchmarks measure the all-miss path this way). Any thread.
  void set_admission(bool on) { admit_.store(on); }
  // Index update during decode: flat head `head` gains clusters with the given sizes (tokens), ids
  // continuing that head's numbering (lru(head).num_clusters() before the call, once applied). Call before
  // launching the first step whose selection can name them: a ring step read after this call sees them.
  // Stopped: applied at once; running: queued for the manager thread. Owner thread only.
  void add_clusters(int head, std::span<const int32_t> sizes);
  const PageLru& lru(int head) const { return lrus_[static_cast<size_t>(head)]; }
  int heads() const { return layout_.heads; }

  // One round of the manager's work (what the thread does in a loop); returns true if anything changed.
  // Public for single-threaded tests: call only while the thread is not running.
  bool poll();

 private:
  void run();
  void read_ack();
  void process_step(uint64_t step, const int32_t* ids, const int32_t* rows, bool decide);
  void publish(uint64_t src_step);
  void apply_pending_clusters();  // manager thread: moves queued additions into the LRUs

  WaveProtocolLayout layout_;
  void* region_;
  int page_tokens_;
  std::vector<PageLru> lrus_;  // [heads]

  // Manager-thread state.
  uint64_t next_step_ = 0;         // next ring step to read
  uint64_t seq_ = 0;               // last published update
  uint64_t outstanding_ = 0;       // seq awaiting ack, 0 = none
  uint64_t min_decision_step_ = 0; // steps before this saw a page table older than the last update
  std::vector<MailboxEviction> evictions_;
  std::vector<MailboxAdmission> admissions_;
  std::vector<int32_t> pages_;
  std::vector<int32_t> ids_copy_, rows_copy_;  // [heads, k] ring payload snapshot

  // Shared with the owner.
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> running_{false};
  std::atomic<bool> admit_{true};
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<bool> pending_{false};  // additions queued (set with release after queueing)
  struct PendingClusters {
    int head;
    std::vector<int32_t> sizes;
  };
  std::vector<PendingClusters> pending_clusters_;  // guarded by mu_
  std::exception_ptr error_;       // guarded by mu_
  CacheManagerStats stats_;        // guarded by mu_
};

}  // namespace retroinfer::buffer
