// Memory planner of the wave buffer: given the model's attention shape, the batch's context lengths and
// the wave-buffer settings, decides before anything is allocated which (sequence, layer) KV stores live in
// GPU memory and which in pinned host memory, from the memory actually free on each side, and refuses
// with a clear error (bytes needed, bytes free) a batch that cannot fit anywhere.
//
// Per (sequence, layer) with n context tokens (D = head_dim, Hkv = KV heads, e = bytes per element, 2):
//   store      n * Hkv * 2 * D * e                   K and V, cluster-ordered; GPU or pinned host
//              n * Hkv * (2 * D + 8)                 the same with store_dtype int8 (D int8 values and
//                                                   an f32 scale per K and per V row)
//              n * Hkv * (D + D / 8)                 with store_dtype int4 (D 4-bit values and a bf16
//                                                   scale per 32 of them, per K and per V row)
//   meta       C * Hkv * (c + D * e + 29 + b)         the layer's copies of the index (WaveBufferLayer):
//                + Hkv * (4 * n_idx + 4 * ceil(n_idx / page_tokens) + 8)
//                                                   centroids (c = D * e, or D + 4 with int8 scoring), value
//                                                   sums, per cluster its size, two CSR offsets, page-slot
//                                                   start, store row, residency byte and one page slot, per
//                                                   indexed token its member id and a page slot's share;
//                                                   b = 4 * D with an int4 store (its K and V base rows in
//                                                   bf16), else 0;
//                                                   C = the index's clusters over n_idx tokens
//                                                   (wave_counts.h index_clusters: per segment of
//                                                   segment_tokens, ceil(L / tokens_per_cluster))
//   steady     S * Hkv * 2 * D * e, S = sink + window + update + O, O = the build's outliers
//              (round(outlier_fraction * n_idx)) and one update's
//   cache      cache_pages * page_tokens * Hkv * 2 * D * e, cache_pages = ceil(cache_fraction * n / page)
//   exec       (min(n, S) + ceil(exec_slack * retrieval_fraction * n_idx)) * Hkv * 2 * D * e
// with n_idx the tokens retro indexes (wave_counts.h retro_indexed_tokens: n - sink - window, 0 below one
// cluster's worth).
// meta, steady, cache and exec always live on the GPU (the decode step reads them every step); the
// index build needs one transient workspace on the GPU for the largest layer of the batch:
//   workspace  n_idx * Hkv * B * (D * e + 20)          centred keys, assignment, sort keys, members.
// Stores go to the GPU while they fit under gpu_free - reserve, in sequence order, then to the host
// while they fit under host_free * host_usable_fraction.
//
// Threading contract: pure functions; host_memory_available() reads /proc/meminfo.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "retroinfer/attention_config.h"
#include "retroinfer/wave_buffer.h"
#include "retroinfer/wave_counts.h"

namespace retroinfer::buffer {

using KvTier = ::retroinfer::KvTier;
std::string_view kv_tier_name(KvTier t);

// Shared by the planners' messages and arithmetic: "12.34 GiB" and ceil(a / b) for a >= 0, b > 0.
std::string format_gib(int64_t bytes);
inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

struct PlannerShape {
  int num_layers = 0;
  int num_heads_kv = 0;
  int head_dim = 0;
  int bytes_per_element = 2;  // bf16
};

struct PlannerSettings {
  int page_tokens = WaveBufferConfig{}.page_tokens;           // block-cache page size
  double cache_fraction = WaveBufferConfig{}.cache_fraction;  // block cache, share of each sequence's context
  StoreDtype store_dtype = WaveBufferConfig{}.store_dtype;    // the stores' element type (bytes per token)
  // The wave index's parameters: sink_tokens, window_tokens, tokens_per_cluster, segment_tokens,
  // retrieval_fraction and update_tokens (steady-zone room for tokens generated between index updates).
  AttentionConfig attention;
  // Execution-buffer rows per retrieval token expected from the fraction (wave_counts.h
  // retrieval_rows_bound). The layer sizes its buffer exactly after the index is built (the n_r largest
  // clusters).
  double exec_slack = kWaveExecRowSlack;
  int64_t gpu_reserve_bytes = 0;     // kept free on the GPU (weights, activations, allocator slack)
  double host_usable_fraction = 0.8; // share of MemAvailable that pinned stores may take
  std::optional<KvTier> force_tier; // place every store on this tier (tests, benchmarks)
};

struct MemoryPlan {
  // [num_seqs, num_layers]: where each (sequence, layer) store lives.
  std::vector<std::vector<KvTier>> tier;
  int64_t gpu_fixed_bytes = 0;   // meta + steady + cache + exec + workspace
  int64_t gpu_store_bytes = 0;
  int64_t host_store_bytes = 0;
  int64_t gpu_free_bytes = 0;    // the inputs, for reporting
  int64_t host_free_bytes = 0;
  int64_t gpu_stores = 0, host_stores = 0;  // (sequence, layer) stores on each tier
  std::string summary() const;   // one line: "GPU 12.3 GiB (stores 8 of 32) / host 40.1 GiB ..."
};

// Per (sequence, layer) sizes used by the plan.
struct StoreBytes {
  int64_t store = 0, meta = 0, steady = 0, cache = 0, exec = 0, workspace = 0;
};
StoreBytes store_bytes(const PlannerShape& shape, const PlannerSettings& s, int64_t context_tokens);

// Throws Error (what needed, what free, what to do) when the fixed GPU parts exceed the GPU's free memory
// or the stores cannot be placed; allocates nothing.
MemoryPlan plan_memory(const PlannerShape& shape, const PlannerSettings& settings,
                       const std::vector<int64_t>& context_tokens, int64_t gpu_free_bytes, int64_t host_free_bytes);

// MemAvailable from a /proc/meminfo text, in bytes; throws Error if absent or malformed.
int64_t parse_meminfo_available(std::string_view meminfo_text);
// MemAvailable of this machine (reads /proc/meminfo); throws Error if unreadable.
int64_t host_memory_available();

}  // namespace retroinfer::buffer
