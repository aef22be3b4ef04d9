// The wave buffer (docs/design.md §3): the configuration and counters of the KV tiers:
// the full KV of every (sequence, layer, KV head) in
// a cluster-ordered store in GPU or pinned host memory, a GPU block cache of page_tokens-token pages with
// LRU replacement kept by a CPU manager thread, and an execution buffer that one gather kernel fills with
// [steady | misses | hits] per flat head before exact attention. Host-only header (no CUDA).
//
// One decode step of a layer (WaveBufferLayer::decode), no host synchronisation, on the caller's stream and
// the layer's second stream (the apply beside the selection, the ring beside the gather and attention):
//   apply    the manager's last update: evictions, and admissions copied from the execution buffer of
//            the previous step into cache pages (device page table updated);
//   select   score clusters, top-k -> retrieval / estimation ids; estimation-zone attention;
//   lookup   per head: hit / miss per retrieval cluster from the device page table, execution-buffer
//            layout; then (ring) the step's ids and outcomes go to the pinned selection ring for the manager;
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
#include <string_view>
#include <utility>
#include <vector>

#include "retroinfer/error.h"

namespace retroinfer {

enum class KvTier : uint8_t { kGpu, kHost };  // where a KV store, or a layer's KV, lives

// Element type of a KV store (docs/wave-buffer.md "Compressed store"). kBf16: the K/V rows as the model
// writes them. kInt8: each K and each V row of a token as D int8 values and one f32 scale (absmax / 127).
// kInt4: each row as D 4-bit values and one bf16 scale per 32 of them (absmax / 7). The gather kernel widens
// both back to bf16; the block cache, the execution buffer and attention stay bf16.
enum class StoreDtype : uint8_t { kBf16, kInt8, kInt4 };

inline std::string_view store_dtype_name(StoreDtype t) {
  return t == StoreDtype::kInt8 ? "int8" : t == StoreDtype::kInt4 ? "int4" : "bf16";
}
// "bf16" | "int8" | "int4"; anything else: Error naming the accepted values.
inline StoreDtype parse_store_dtype(std::string_view s) {
  if (s == "bf16") return StoreDtype::kBf16;
  if (s == "int8") return StoreDtype::kInt8;
  if (s == "int4") return StoreDtype::kInt4;
  throw Error("unknown KV store dtype '" + std::string(s) + "' (use bf16, int8 or int4)");
}
// Store bytes of one token of one KV head, K and V together: bf16 2 * D * 2; int8 2 * D values plus the K
// and V row scales (2 * 4); int4 2 * D / 2 bytes of values plus 2 * D / 32 group scales of 2 bytes.
inline int64_t store_token_bytes(StoreDtype t, int head_dim) {
  switch (t) {
    case StoreDtype::kInt8: return int64_t{2} * head_dim + 8;
    case StoreDtype::kInt4: return int64_t{head_dim} + head_dim / 8;
    case StoreDtype::kBf16: break;
  }
  return int64_t{4} * head_dim;
}

struct WaveBufferConfig {
  KvTier tier = KvTier::kHost;  // store placement (the memory planner decides it in an engine)
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
  // Element type of the store (kInt8: about half the bytes per miss and of pinned host memory, kInt4 about
  // a quarter; outputs within the rounding of the rows, docs/wave-buffer.md "Compressed store").
  StoreDtype store_dtype = StoreDtype::kBf16;
  // Diagnostics (bench decode --stage-times): every decode step records timing events between its stages and
  // WaveBufferLayer::stage_times() sums them (WaveStageTimes). Off: no events beyond the step's fork / join.
  bool stage_times = false;
};

// Stage times of decode steps (WaveBufferConfig::stage_times), ms summed over steps (and over layers where a
// caller adds several). The apply runs on the layer's second stream beside the selection and the ring beside
// the gather and attention, so the stages overlap: `apply` and `select` both count from the step's start,
// `apply_wait` is the time the lookup waited for an apply slower than the selection, then `lookup`,
// `gather`, `attention` follow one another, and `ring_wait` is the step's end waiting for the ring. `step`
// is the whole step (start to end on the caller's stream).
struct WaveStageTimes {
  double apply = 0, select = 0, apply_wait = 0, lookup = 0, gather = 0, attention = 0, ring_wait = 0, step = 0;
  int64_t steps = 0;  // steps summed
  // The stages, in step order: their names and fields (the sum and named() follow this one list).
  static constexpr std::pair<const char*, double WaveStageTimes::*> kStages[] = {
      {"apply", &WaveStageTimes::apply},     {"select", &WaveStageTimes::select},
      {"apply_wait", &WaveStageTimes::apply_wait}, {"lookup", &WaveStageTimes::lookup},
      {"gather", &WaveStageTimes::gather},   {"attention", &WaveStageTimes::attention},
      {"ring_wait", &WaveStageTimes::ring_wait}, {"step", &WaveStageTimes::step}};
  WaveStageTimes& operator+=(const WaveStageTimes& o) {
    for (const auto& [name, field] : kStages) this->*field += o.*field;
    steps += o.steps;
    return *this;
  }
  // (name, ms) of each stage, in step order.
  std::vector<std::pair<std::string, double>> named() const {
    std::vector<std::pair<std::string, double>> out;
    for (const auto& [name, field] : kStages) out.emplace_back(name, this->*field);
    return out;
  }
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

}  // namespace retroinfer
