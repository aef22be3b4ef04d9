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
// Threading contract: a layer is used by one host thread at a time (the owner). Its manager thread runs
// from build() until destruction and touches only the pinned protocol region and its own LRU state;
// a manager error is rethrown by the owner's next decode(), wait_manager(), stats() or check().
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
};

// Manager-side counters (clusters), summed over flat heads since build().
struct WaveBufferStats {
  uint64_t steps_seen = 0, steps_lost = 0, hits = 0, misses = 0;
  uint64_t updates = 0, updates_dropped = 0, admitted = 0, evicted = 0;
};

// Device-side counts of the last decode step, summed over flat heads.
struct WaveStepCounts {
  int64_t hit_clusters = 0, miss_clusters = 0;
  int64_t hit_rows = 0, miss_rows = 0, steady_rows = 0;  // tokens gathered from cache / store / steady zone
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
  // [num_seqs, Hkv, D] bf16, post-RoPE), asynchronous on `s`. No index update runs on this tier: every
  // appended token stays in the steady zone and is attended exactly (the CPU method would cluster each
  // block of update_tokens once window + update_tokens have accumulated; see docs/wave-buffer.md). The
  // tail's GPU capacity starts at window + update_tokens rows and doubles when full (that append
  // synchronises the device, reallocates the steady and execution buffers and drops a captured graph).
  void append(const uint16_t* k_new, const uint16_t* v_new, Stream s = nullptr);
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
  RetroLayer& index();  // the wave index built by build() (decodes on the GPU-resident K/V it was given)
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
