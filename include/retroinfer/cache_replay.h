// Offline replay of a cluster trace (retroinfer/cluster_trace.h) through the wave buffer's block cache
// (docs/wave-buffer.md#cluster-traces): one buffer::PageLru per (layer, sequence, KV head), pages of
// page_tokens tokens, capacity ceil(ceil(fraction * prompt tokens) / page_tokens) pages as
// WaveBufferConfig::cache_fraction sizes it at build, and the manager's rules with a manager that keeps up
// (WaveBufferLayer::wait_manager every step): a step's hits are the clusters resident when it starts; its
// hits are touched, then its misses are admitted in ascending cluster order (never evicting a cluster used
// in the same step) and are resident from the next step on.
#pragma once

#include <cstdint>
#include <vector>

#include "retroinfer/cluster_trace.h"

namespace retroinfer {

struct CacheReplayOptions {
  int page_tokens = 8;                             // block-cache page (WaveBufferConfig::page_tokens)
  std::vector<double> cache_fractions{0.02, 0.05, 0.10};  // each in (0, 1]
  int window_steps = 32;                           // steps per entry of the hit ratio over time
};

// A miss is a first reference when its head never selected the cluster before (no cache size avoids it), and
// the rest are capacity misses (selected before, evicted since). A first reference counts as near when the
// head selected a cluster at most kNearIds ids away within the last kNearSteps steps: clusters are numbered in
// token order within a segment, so those are the ones a prefetch of neighbours could have brought in.
inline constexpr int kNearIds = 2, kNearSteps = 4;

// Selected clusters and their tokens, split into hits and misses.
struct CacheReplayCounts {
  uint64_t hit_clusters = 0, miss_clusters = 0;
  uint64_t hit_tokens = 0, miss_tokens = 0;
  uint64_t first_misses = 0;       // misses of clusters the head never selected before (miss_clusters counts them)
  uint64_t first_misses_near = 0;  // of those, the ones next to a recent selection (kNearIds, kNearSteps)
  uint64_t capacity_misses() const { return miss_clusters - first_misses; }
  double share(uint64_t clusters) const;  // clusters / selected clusters (0 when none)
  double hit_ratio() const { return share(hit_clusters); }  // WaveBufferStats' ratio
  double token_hit_ratio() const;  // hit_tokens / selected tokens: the share of retrieval bytes the cache serves
  CacheReplayCounts& operator+=(const CacheReplayCounts& o);
};

struct CacheReplayResult {
  double cache_fraction = 0;
  int64_t capacity_pages_min = 0, capacity_pages_max = 0;  // over the replayed flat heads
  CacheReplayCounts total;
  std::vector<CacheReplayCounts> per_layer;   // [num_layers]
  std::vector<CacheReplayCounts> per_window;  // [ceil((max step + 1) / window_steps)]: steps [w * window, ...)
};

// Replays every (layer, sequence, head) of the trace once per cache fraction. Throws Error on invalid
// options or on a trace that names one cluster with two different sizes.
std::vector<CacheReplayResult> replay_cluster_trace(const ClusterTrace& trace, const CacheReplayOptions& opt);

}  // namespace retroinfer
