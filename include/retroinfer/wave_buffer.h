// The wave buffer (DESIGN.md §3): decode attention with the full KV of every (sequence, layer, KV head) in
// a cluster-ordered store in GPU or pinned host memory, a GPU block cache of page_tokens-token pages with
// LRU replacement kept by a CPU manager thread, and an execution buffer that one gather kernel fills with
// [steady | misses | hits] per flat head before exact attention. Host-only header (no CUDA).
//
// One decode step of a layer (WaveBufferLayer::decode), all on one stream, no host synchronisation:
//   apply    the manager's last update: evictions, and admissions copied from the execution buffer of
//            the previous step into cache pages (device page table updated);
//   select   score clusters, top-k -> retrieval / estimation ids; estimation-zone attention;
//   lookup   per head: hit / miss per retrieval cluster from the device page table, execution-buffer
//            layout; the step's ids and outcomes go to the pinned selection ring for the manager;
//   gather   one kernel copies steady rows, missed clusters (straight from the store: zero-copy reads of
//            pinned host memory, each cluster a contiguous [K rows | V rows] block of size * 512 bytes at
//            d=128) and hit clusters (from cache pages) into the execution buffer;
//   attention the CUDA backend's sparse flash decoding over the execution buffer, merged with the
//            estimation state.
// The whole step can be captured in a CUDA graph (capture_graph / replay_graph).
//
// Index updates during decode (append(), on by default): each block of update_tokens generated tokens
// becomes update_clusters clusters as on the GPU tier (RetroLayer::append), synchronously on the owner
// thread between steps (docs/wave-buffer.md "Index updates during decode").
//
// Threading contract: a layer is used by one host thread at a time (the owner). Its manager thread runs
// from build() until destruction (an index update that outgrows the selection ring replaces it by a new
// one, with an empty cache) and touches only the pinned protocol region and its own LRU state; a manager
// error is rethrown by the owner's next decode(), append(), wait_manager(), stats() or check().
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "retroinfer/attention.h"

namespace retroinfer {

enum class StoreTier : uint8_t { kGpu, kHost };  // where a KV store lives

struct WaveBufferConfig {
  StoreTier tier = StoreTier::kHost;  // store placement (the memory planner decides it in an engine)
  int page_tokens = 8;                // block-cache page: 8 tokens = 2 KiB of K (or V) at d=128 bf16
  double cache_fraction = 0.05;       // block-cache pages per flat head: ceil(fraction * tokens / page)
  int64_t cache_pages = -1;           // >= 0: pages per flat head, overriding cache_fraction
  int ring_slots = 8;                 // selection-ring slots (steps the manager may lag before losing one)
  // Index updates during decode (append()): on, the layer clusters each block of update_tokens generated
  // tokens as RetroLayer::append does (same block, same k-means, same outliers), so the host tier stays
  // equal to the GPU tier; off, every appended token stays in the steady zone (the behaviour before).
  bool index_updates = true;
  // > 0: the most tokens per sequence the session reaches. With index updates on it sizes the store's tail
  // room (updates then never reallocate the store) and the selection ring's width (n_r of the most
  // clusters; a ring too narrow for a grown n_r is rebuilt at that update with an empty block cache).
  // 0: no tail room (the first update reallocates the store, growing it by a quarter or more each time).
  int64_t max_tokens = 0;
};

// Manager-side counters (clusters), summed over flat heads since build() (also the cache manager's own
// counters, buffer::CacheManagerStats).
struct WaveBufferStats {
  uint64_t steps_seen = 0;       // ring steps consumed
  uint64_t steps_lost = 0;       // ring steps overwritten before the manager read them
  uint64_t hits = 0;             // selected clusters that were resident
  uint64_t misses = 0;           // selected clusters read from the store
  uint64_t updates = 0;          // updates published
  uint64_t updates_dropped = 0;  // updates whose admissions the GPU dropped (applied late)
  uint64_t admitted = 0;         // clusters admitted (and applied)
  uint64_t evicted = 0;          // clusters evicted
  WaveBufferStats& operator+=(const WaveBufferStats& o) {
    steps_seen += o.steps_seen;
    steps_lost += o.steps_lost;
    hits += o.hits;
    misses += o.misses;
    updates += o.updates;
    updates_dropped += o.updates_dropped;
    admitted += o.admitted;
    evicted += o.evicted;
    return *this;
  }
};

// Device-side counts of the last decode step, summed over flat heads.
struct WaveStepCounts {
  int64_t hit_clusters = 0, miss_clusters = 0;
  int64_t hit_rows = 0, miss_rows = 0, steady_rows = 0;  // tokens gathered from cache / store / steady zone
  WaveStepCounts& operator+=(const WaveStepCounts& o) {
    hit_clusters += o.hit_clusters;
    miss_clusters += o.miss_clusters;
    hit_rows += o.hit_rows;
    miss_rows += o.miss_rows;
    steady_rows += o.steady_rows;
    return *this;
  }
};

namespace cuda {

using Stream = void*;  // a cudaStream_t; nullptr is the default stream
class RetroLayer;

class WaveBufferLayer {
 public:
  // Shapes and zone budgets as RetroLayer (cuda_backend.h); num_seqs sequences of equal length.
  WaveBufferLayer(const AttentionShape& shape, const AttentionConfig& cfg, const WaveBufferConfig& wcfg,
                  int num_seqs = 1);
  ~WaveBufferLayer();
  WaveBufferLayer(const WaveBufferLayer&) = delete;
  WaveBufferLayer& operator=(const WaveBufferLayer&) = delete;

  // Builds the wave index over GPU-resident K/V (layout of cuda_backend.h: [num_seqs, Hkv, kv_stride, D]
  // bf16), then the cluster-ordered store on wcfg.tier, the steady zone, an empty block cache, the
  // execution buffer and the protocol region, and starts the manager thread. k / v may be freed after
  // build() unless index() is used for decoding (it keeps the pointers). Synchronous.
  void build(const uint16_t* k, const uint16_t* v, int64_t num_tokens, int64_t kv_stride);

  // Decode-time growth: appends one token per flat head to the steady zone's tail (k_new, v_new device
  // [num_seqs, Hkv, D] bf16, post-RoPE), asynchronous on `s` unless an index update or a capacity growth
  // runs. The tail's GPU capacity starts at window + update_tokens rows and doubles when full (that append
  // synchronises the device, reallocates the steady and execution buffers and drops a captured graph).
  // Index update (wcfg.index_updates, default on): when the tail after the indexed region holds
  // window + update_tokens tokens (RetroLayer::append's rule), its oldest update_tokens tokens are
  // clustered into update_clusters clusters by RetroLayer's own update code (a block-sized RetroLayer over
  // the steady rows: identical k-means and outlier split), their K/V rows copied in cluster order into the
  // store's tail, the device tables (centroids, value sums, sizes, CSR, page slots, residency) extended,
  // the manager told (CacheManager::add_clusters) and the rows dropped from the steady zone (which keeps
  // sinks, outliers, the block's outliers and the tail past the block). Synchronous: the append
  // synchronises the device once before and once after (an update runs every update_tokens steps), drops a
  // captured graph (capture again), and may reallocate the store (no tail room: wcfg.max_tokens) or the
  // execution buffer (rows kept for the manager's pending admissions). Owner thread only; the manager
  // thread keeps running (its additions are queued, wave_buffer.h threading contract). index() is not
  // updated: it keeps the prompt's index.
  void append(const uint16_t* k_new, const uint16_t* v_new, Stream s = nullptr);
  int64_t num_updates() const;         // index updates run by append() since build()
  int64_t indexed_begin() const;       // first indexed token (RetroLayer::indexed_begin)
  int64_t indexed_tokens() const;      // tokens in the index (clustered + outliers; RetroLayer::indexed_tokens)
  int64_t outlier_rows() const;        // outlier tokens per flat head (steady rows after the sinks)
  int64_t num_tokens() const;          // tokens per sequence (build + appended)
  int64_t steady_rows() const;         // steady-zone rows per flat head
  int num_clusters() const;
  int n_retrieval() const;
  int n_estimation() const;
  int64_t retrieval_capacity() const;  // execution-buffer rows per flat head beyond the steady capacity
  int64_t device_bytes() const;        // GPU memory held (index copies, cache, buffers, a GPU-tier store)
  int64_t host_bytes() const;          // pinned host memory held (a host-tier store, the protocol region)

  // One decode step: q [num_seqs, Hq, D] f32 device, out [num_seqs, Hq, D] f32 device (every element
  // written). Asynchronous on `s`; launches kernels only (graph-capturable).
  void decode(const float* q, float* out, Stream s = nullptr);
  // decode() on the default stream with events between the stages: (stage, ms) pairs for apply, select
  // (score + select + estimate), lookup (+ ring), gather, attention (+ merge). Synchronous.
  std::vector<std::pair<std::string, float>> decode_stage_ms(const float* q, float* out);
  // Captures one decode(q, out) into a CUDA graph (q and out are baked in: write new queries into q);
  // replay_graph() launches it. Each replay is one decode step. `s` must not be the legacy default
  // stream (cuda::StreamHandle gives one).
  void capture_graph(const float* q, float* out, Stream s);
  void replay_graph(Stream s);

  // Blocks until the manager has consumed every step issued so far and published its decisions (the
  // next step will apply them). For deterministic tests and benchmarks; rethrows a manager error.
  void wait_manager();
  void check();
  // Cache admissions on (default) or off (the cache keeps its content; benchmarks of the miss path).
  void set_admission(bool on);
  WaveBufferStats stats();
  WaveStepCounts last_step_counts();  // synchronous
  // The wave index built by build() (decodes on the GPU-resident K/V it was given); index updates of
  // append() do not reach it: it keeps the prompt's index.
  RetroLayer& index();
  int64_t cache_pages_per_head() const;
  int64_t exec_capacity() const;   // execution-buffer rows per flat head
  int64_t store_bytes() const;     // K + V of every flat head
  int64_t steps_issued() const;
  bool store_on_host() const;

 private:
  void launch_step(const float* q, float* out, void* stream, std::vector<void*>* marks);
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Free and total device memory (cudaMemGetInfo), bytes.
std::pair<int64_t, int64_t> device_memory_info();
// Asynchronous device-to-device copy on `s` (benchmarks: feed a query trace to a captured graph).
void copy_device_async(void* dst, const void* src, size_t bytes, Stream s);

}  // namespace cuda
}  // namespace retroinfer
