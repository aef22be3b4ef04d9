// Helpers shared by the host-side attention layers of the CUDA backend (src/attention/cuda only).
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "kernels/kernels.h"
#include "retroinfer/attention.h"
#include "retroinfer/wave_counts.h"

namespace retroinfer::cuda::detail {

// sm_count, validate_layer_shape, validate_kv, effective_scale, ceil_div: kernels/kernel_common.h.

// decode_splits, split_tokens: kernels/decode_kernels.h.
// The exact grid of the indexed layers (RetroLayer, WaveBufferLayer: one rule, so that a wave buffer whose cache
// holds everything gives the index's output bit for bit): decode_splits capped at kExactCtasPerSm CTAs per
// multiprocessor over all heads, so that the estimation CTAs run beside the exact ones instead of after them.
// Three exact CTAs fit by shared memory; two take 1.0-2.4 us off the retro step at 128K batch 1 and 4 and stay
// within +1.4 / -0.3 us (write / read flush) at batch 16.
inline constexpr int kExactCtasPerSm = 2;
int exact_splits(int64_t list_tokens, int num_heads);

// Zone counts of the wave index for C clusters: zone_counts (retroinfer/wave_counts.h).

// The decode launch sequence of the wave index, shared by RetroLayer and WaveBufferLayer:
//   score_clusters -> select_and_expand -> after_select() -> decode_attention over the exact list, with the
//   estimation zone as a second grid chained behind the exact one -> combine_states.
// On a created stream the kernels after the score kernel launch as programmatic dependents of the one before
// (the selection where its kernel takes it; the exact grid only straight after the selection, not after
// after_select's kernels), so that each starts while the previous one drains.
// The selection's scores are formed, by shape:
//   - in the bins selection from the logits and the normaliser partials, where G <= 4, C % 4 == 0 and the bins
//     kernel selects (C <= kSelectBinsMaxItems): no grid barrier in the score
//     grid (select_bins.cu scores_from_logit_quads; its general formation would be ~5x slower on one
//     multiprocessor than the score grid's over ~24 CTAs);
//   - else in the score grid after a grid-wide barrier (cooperative launch, ScoreParams::scores), where its
//     one-wave grid fits at once (score_form_fits);
//   - else by their own grid (form_scores) between the score kernel and the selection.
// All three compute form_head_score's arithmetic (select_common.cuh): the scores, hence the selection, are the
// same bit for bit wherever they are formed.
// Shapes as kernels.h (H flat heads, G group, D head_dim, C clusters per head).
struct ZoneDecodeArgs {
  const float* q = nullptr;  // [H, G, D] f32
  float* out = nullptr;      // [H, G, D] f32
  int num_heads = 0, group = 0, head_dim = 0, num_clusters = 0, n_retrieval = 0, n_estimation = 0;
  float scale = 0.0f;
  // Index (kernels.h KMeansKernelParams shapes).
  const uint16_t* centroids_bf16 = nullptr;   // [H, C, D]
  const uint8_t* centroids_q8 = nullptr;      // [H, C, D] int8 copies (RetroLayer's int8 scoring; null: off)
  const float* centroid_scale = nullptr;      // [H, C] their row scales
  const uint16_t* value_sums_bf16 = nullptr;  // [H, C, D]
  const int* sizes = nullptr;                 // [H, C]
  const int* offsets = nullptr;               // [H * C + 1] absolute CSR offsets into members
  const uint32_t* members = nullptr;          // index tokens grouped by cluster
  int64_t n_idx = 0, idx_begin = 0, num_tokens = 0;
  // Selection workspace.
  float* logits = nullptr;        // [H, G, C]
  float2* norm_partial = nullptr;  // [H, G, score_blocks(C, D, H)]
  float* scores = nullptr;        // [H, C]
  int* retrieval_ids = nullptr;   // [H, max(n_r, 1)]
  int* estimation_ids = nullptr;  // [H, max(n_e, 1)]
  int* scan_scratch = nullptr;    // [H, n_r + 1]
  unsigned* grid_ws = nullptr;    // [H, kSelectGridWsWords] zero (the grid selection's; null: the one-CTA kernels)
  int* token_list = nullptr;      // [H, list_stride]: written by the selection (steady + retrieval tokens)
  int* token_count = nullptr;     // [H]
  int64_t list_stride = 0;
  // Exact attention: over k/v rows exact_list[h, 0 .. exact_count[h]) (exact_list_stride 0: one shared
  // list); RetroLayer passes its K/V and the selection's token list, the wave buffer its execution buffer.
  const uint16_t* k = nullptr;
  const uint16_t* v = nullptr;
  KvInt8Rows kv8;  // int8 rows instead of k / v (RetroLayer over an 8-bit KV cache)
  int64_t kv_stride = 0;
  const int* exact_list = nullptr;
  const int* exact_count = nullptr;
  int64_t exact_list_stride = 0;
  int64_t exact_capacity = 0;  // the most exact rows of any head (sizes the splits)
  // Partial states: attn_splits exact + est_splits = ceil(n_e / kEstimateChunk) estimation slots per head.
  int attn_splits = 0, est_splits = 0;
  float2* part_ml = nullptr;  // [H, attn_splits + est_splits, G]
  float* part_o = nullptr;    // [H, attn_splits + est_splits, G, D]
  bool timing = false;         // events between the stages (decode_stage_ms): no programmatic launches
  uint64_t* phase = nullptr;   // [H, kPhaseSlots] diagnostics (kernels.h), slots set to ~0; null: off
};

// Phase summary of the stamps of one decode (kernels.h kPhaseSlots; raw: [H, kPhaseSlots] as downloaded):
// ("phase.<name>", ms) pairs: the timeline over all heads relative to the first score CTA's start
// (score_end, select_start / _end, exact_start / _end, estimate_start / _end, merge_end) and the
// selection's phases (select_<phase>, select_head_total: medians over the heads); empty when nothing
// stamped.
std::vector<std::pair<std::string, float>> summarize_phases(const std::vector<uint64_t>& raw, int num_heads);
// The index part of ZoneDecodeArgs, shared by RetroLayer and WaveBufferLayer: M is either layer's Impl
// (members H, G, D, C, n_r, n_e, scale, n_idx, idx_begin, n, list_cap and the DeviceBuffers named below).
// offsets: the CSR offsets the selection expands through (RetroLayer: per head; the wave buffer:
// absolute into its store). The exact-attention source (k, v, exact_list, ...) stays with the caller.
template <typename M>
void fill_index_args(ZoneDecodeArgs& a, const M& m, const int* offsets, const float* q, float* out) {
  a.q = q;
  a.out = out;
  a.num_heads = m.H;
  a.group = m.G;
  a.head_dim = m.D;
  a.num_clusters = m.C;
  a.n_retrieval = m.n_r;
  a.n_estimation = m.n_e;
  a.scale = m.scale;
  a.centroids_bf16 = m.centroids_bf16.template as<uint16_t>();
  a.value_sums_bf16 = m.value_sums_bf16.template as<uint16_t>();
  a.sizes = m.sizes.template as<int>();
  a.offsets = offsets;
  a.members = m.members.template as<uint32_t>();
  a.n_idx = m.n_idx;
  a.idx_begin = m.idx_begin;
  a.num_tokens = m.n;
  a.logits = m.logits.template as<float>();
  a.norm_partial = m.norm_partial.template as<float2>();
  a.scores = m.scores.template as<float>();
  a.retrieval_ids = m.ret_ids.template as<int>();
  a.estimation_ids = m.est_ids.template as<int>();
  a.scan_scratch = m.scan_scratch.template as<int>();
  a.token_list = m.token_list.template as<int>();
  a.token_count = m.token_count.template as<int>();
  a.list_stride = m.list_cap;
  a.exact_capacity = m.list_cap;
  a.attn_splits = m.attn_splits;
  a.est_splits = m.est_splits;
  a.part_ml = m.part_ml.template as<float2>();
  a.part_o = m.part_o.template as<float>();
  a.grid_ws = m.sel_ws.template as<unsigned>();
}

// mark(stage) is called after "score", "select", "exact_attention" (the exact and estimation grids) and
// "combine"; after_select (may be empty) runs between the selection and the exact attention.
void launch_zone_decode(const ZoneDecodeArgs& a, cudaStream_t s, const std::function<void(const char*)>& mark,
                        const std::function<void()>& after_select);

}  // namespace retroinfer::cuda::detail
