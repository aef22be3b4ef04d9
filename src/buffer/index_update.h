// When each layer folds generated tokens into its wave index during decode (docs/design.md §3; the wave
// buffer's index updates, docs/wave-buffer.md).
//
// Token layout of one (sequence, layer) at `total` tokens: sinks [0, sinks), indexed tokens
// [sinks, index_end), steady tail [index_end, total). Decode attends exactly to the sinks and the steady
// tail (the steady zone) and to the selected clusters of [sinks, index_end): every token is in exactly
// one zone. The prompt's index ends at max(sinks, prompt - window). Generated tokens join the steady tail; block b of
// `interval` tokens, [index_end0 + b * interval, index_end0 + (b + 1) * interval), becomes due once all of
// it has left the recent window (total >= its end + window). Layers are staggered: layer l folds a due
// block in at total = due + l, so at most one layer of the model does an update per decode step and the
// side-stream copy of one layer overlaps the other layers' steps.
//
// Pure arithmetic, no state: the engine asks update_due() each step; tests check the zone invariants.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace retroinfer::buffer {

class IndexUpdatePlan {
 public:
  // prompt_tokens: tokens indexed at prefill (>= 0); sinks, window: steady-zone parts (>= 0);
  // interval: tokens per update (> 0, paper: 1024); layers: layers staggered (> 0).
  IndexUpdatePlan(int64_t prompt_tokens, int sinks, int window, int interval, int layers);

  // First token not in layer `layer`'s index when `total` tokens (prompt + generated) exist.
  int64_t index_end(int layer, int64_t total) const;
  // Steady-zone rows (sinks + steady tail) of `layer` at `total` tokens.
  int64_t steady_rows(int layer, int64_t total) const {
    const int64_t tail = total - index_end(layer, total);
    return sink_end(total) + (tail > 0 ? tail : 0);
  }
  // The block layer `layer` must index when the token count reaches `total` (its first token), or -1.
  // The block's tokens are [result, result + interval()).
  int64_t update_due(int layer, int64_t total) const;
  // The most steady rows any layer ever holds: the steady zone's capacity to allocate.
  int64_t max_steady_rows() const;

  int64_t index_end0() const { return index_end0_; }
  int interval() const { return interval_; }
  int layers() const { return layers_; }

 private:
  int64_t sink_end(int64_t total) const { return total < sinks_ ? total : sinks_; }

  int64_t index_end0_;
  int sinks_, window_, interval_, layers_;
};

// Host mirror of the wave buffer's per-cluster tables (src/backend/cuda/wave_buffer*: the layer uploads
// them) for H flat heads of C clusters each, and their growth by an index update. Pure, no CUDA.
//   members   [H, per_head]: each head's clustered tokens grouped by cluster (the CSR `offsets` within
//             the head); per_head is the same for every head (one stride);
//   store     cluster c of head h is the block [K rows | V rows] of sizes[h, c] rows at row store_at[h, c]
//             (element store_at * 2 * D); the build's clusters lie head by head in cluster order
//             (store_at = h * per_head + offsets[h, c]); each update's clusters follow at store_rows, head
//             by head, so the prompt's blocks never move;
//   cache     cluster c of head h owns page slots [slot_begin[h, c], slot_begin[h, c + 1]) of the head's
//             slot_stride slots in the device page table: ceil(size / page_tokens) each, new clusters'
//             slots after the old ones (slot_stride grows to the longest head).
struct WaveIndexTables {
  int heads = 0, clusters = 0, page_tokens = 1;
  int64_t per_head = 0;             // clustered tokens per head
  std::vector<int32_t> sizes;       // [H, C]
  std::vector<int32_t> offsets;     // [H, C + 1], from 0 per head
  std::vector<int32_t> slot_begin;  // [H, C + 1]
  int64_t slot_stride = 0;          // page slots per head (the longest head's)
  std::vector<int64_t> store_at;    // [H, C]
  int64_t store_rows = 0;           // store rows in use (the next update's clusters start here)

  // The build's tables from sizes [heads, clusters]; throws if the heads hold different token counts.
  static WaveIndexTables from_sizes(int heads, int clusters, int page_tokens, std::span<const int32_t> sizes);
  // Appends blk_clusters clusters to every head (sizes [heads, blk_clusters]; ids C .. C + blk - 1) and
  // places them in the store's tail; throws (changing nothing) if the heads' blocks differ in tokens.
  void append_block(int blk_clusters, std::span<const int32_t> blk_sizes);
  // [H * C + 1] member CSR over the flat [H, per_head] members array (what the selection expands).
  std::vector<int32_t> offsets_abs() const;
  // The most tokens of n_r clusters of any head (its n_r largest): the execution buffer's retrieval rows.
  int64_t retrieval_capacity(int n_r) const;
};

// The steady zone's rows after an index update, per head: [sinks | outliers | tail] becomes
// [sinks | outliers | the block's outliers | tail past the block]. Rows before: sinks + outliers + tail,
// the block = tail rows [0, block) (at row sinks + outliers). blk_outliers [heads, blk_out]: the block's
// outlier tokens, relative to the block, ascending. Returns [heads, rows_after] source rows (rows_after =
// rows - block + blk_out). Throws on inconsistent arguments.
std::vector<int32_t> steady_rows_after_update(int heads, int64_t sinks, int64_t outliers, int64_t rows,
                                              int64_t block, int64_t blk_out,
                                              std::span<const int32_t> blk_outliers);

}  // namespace retroinfer::buffer
