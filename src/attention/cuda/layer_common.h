// Helpers shared by the host-side layers of the CUDA backend (src/backend/cuda only).
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
// multiprocessor over all heads, so that the estimation CTAs run beside the exact ones instead of after them
// (3 exact CTAs fit by shared memory; with 2 the retro step at 128K batch 1 / 4 took 2.1-2.4 / 1.0-1.3 us less,
// batch 16 +1.4 / -0.3 us, write / read flush: bench/results/run18/ab2, run17/ab7). RETROINFER_EXACT_CTAS_PER_SM=1..3
// overrides it (read once; anything else is ignored).
inline constexpr int kExactCtasPerSm = 2;
int exact_splits(int64_t list_tokens, int num_heads);

// Zone counts of the wave index for C clusters: zone_counts (retroinfer/wave_counts.h).

// The decode launch sequence of the wave index, shared by RetroLayer and WaveBufferLayer:
//   score_clusters -> select_and_expand -> [estimate_attention on the side stream] -> after_select()
//   -> decode_attention over the exact list -> (join) -> combine_states.
// Shapes as kernels.h (H flat heads, G group, D head_dim, C clusters per head).
struct ZoneDecodeArgs {
  const float* q = nullptr;  // [H, G, D] f32
  float* out = nullptr;      // [H, G, D] f32
  int num_heads = 0, group = 0, head_dim = 0, num_clusters = 0, n_retrieval = 0, n_estimation = 0;
  float scale = 0.0f;
  // Index (kernels.h KMeansParams shapes).
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
  unsigned* grid_ws = nullptr;    // [H, kSelectGridWsWords] zero (run 19's grid selection; null: the one-CTA kernels)
  int* token_list = nullptr;      // [H, list_stride]: written by the selection (steady + retrieval tokens)
  int* token_count = nullptr;     // [H]
  int64_t list_stride = 0;
  // Exact attention: over k/v rows exact_list[h, 0 .. exact_count[h]) (exact_list_stride 0: one shared
  // list); RetroLayer passes its K/V and the selection's token list, the wave buffer its execution buffer.
  const uint16_t* k = nullptr;
  const uint16_t* v = nullptr;
  int64_t kv_stride = 0;
  const int* exact_list = nullptr;
  const int* exact_count = nullptr;
  int64_t exact_list_stride = 0;
  int64_t exact_capacity = 0;  // the most exact rows of any head (sizes the splits)
  int attn_splits = 0, est_splits = 0;
  float2* part_ml = nullptr;  // [H, attn_splits + est_splits + kPremergeSlots, G]
  float* part_o = nullptr;    // [H, attn_splits + est_splits + kPremergeSlots, G, D]
  // Side stream for the estimation (null: inline on the main stream).
  cudaStream_t side = nullptr;
  cudaEvent_t fork = nullptr, join = nullptr;
  // Run 8 (decode_path()): [H] int counters, zero before the decode (the layer zeroes them once at
  // allocation; the kernels leave them zero). Null keeps run 6's launches (separate combine_states, no
  // programmatic dependent launch) whatever RETROINFER_DECODE says.
  int* merge_counter = nullptr;
  // [H] int, zero before the decode (zeroed once at allocation; the last estimation CTA of each head leaves it
  // zero): the estimation CTAs' count of split64ep / erp (kernels.h EstPremerge). Null: those variants run
  // without the pre-merge. part_ml / part_o then hold kPremergeSlots more slots per head.
  int* est_counter = nullptr;
  bool timing = false;         // events between the stages (decode_stage_ms): no programmatic launches
  uint64_t* phase = nullptr;   // [H, kPhaseSlots] diagnostics (kernels.h), slots set to ~0; null: off
};

// The decode path of launch_zone_decode, from RETROINFER_DECODE (read at every call, so that a test can
// run both paths in one process):
//   unset / "run8": everything below: fused merge (kernels.h FusedMerge), programmatic dependent launch of
//                   the selection after the score kernel and of the exact attention after the selection,
//                   the score kernel's early loads (ScoreParams::early_loads), the selection's L2
//                   prefetches and half-warp expansion (SelectParams::prefetch), the exact attention's
//                   splits balanced on the device over the actual token counts (DecodeParams::balance);
//   "nopdl":        all but the programmatic launches;
//   "fused":        the fused merge only;
//   "run6":         run 6's kernels and launch sequence (combine_states after the join, plain launches);
//   "run9":         run 8 plus (form_scores) the selection's scores formed by their own grid of
//                   ceil(C / 1024) CTAs per head (a programmatic dependent of the score kernel; the
//                   selection, dependent in turn, reads ready scores) and (fused_estimate) the estimation
//                   zone as kEstimateFusedChunk-cluster CTAs of the exact-attention grid (decode.cu
//                   estimate_cta; no side stream, no fork / join), sharing its programmatic launch;
//   "run9est" / "run9form": run 8 plus only run 9's estimation / only its score formation (attribution);
//   "run8":         run 8 whatever kRun9IsDefault says;
//   "run10c":       run 10 with combine_states chained by PDL instead of the fused merge (run 17);
//   "run10s":       run10c with the scores formed by the bins selection from the logits and the normaliser
//                   partials (select_bins.cu scores_from_logit_quads; run 25), where G <= 4, C % 4 == 0 and the
//                   bins kernel runs (else run10c): the score grid ends without a grid barrier. The default.
//   "run10" / "run10form": run 9 plus (form_in_score) the scores formed by the score grid itself after a
//                   grid-wide barrier (cooperative launch, ScoreParams::scores; only where score_form_fits,
//                   else run 9's form_scores grid), so the selection is the score kernel's programmatic
//                   dependent again; logits, scores, ids, token lists and outputs bit-identical to run 9 (the
//                   same values feed the same arithmetic, select_common.cuh form_head_score).
//                   Run 10's other two parts (the selection's CSR offsets in shared memory, "run10select";
//                   the exact attention's token list loaded ahead, "run10list") and run 11 (the exact grid
//                   reshaped, "run11*") were removed after run 15 (slower or no gain, docs/cuda-kernels.md):
//                   those names throw.
// All of it applies only where ZoneDecodeArgs::merge_counter is set; the fused merge only when
// total_splits * G <= kMergeMaxStates and out is 16-byte aligned (else combine_states runs). Every part
// leaves the logits, scores and selection bit-identical; only the merge's rounding differs (f32), and on
// run 9 the estimation's (the same terms summed in another order).
struct DecodePath {
  bool fused_merge = true, pdl = true, early_loads = true, prefetch = true, balance = true;
  bool form_scores = false, fused_estimate = false;  // run 9
  bool form_in_score = false;  // run 10
  bool combine_pdl = false;    // run 17 (run10c): no fused merge; combine_states as a programmatic dependent
  bool select_forms = false;   // run 25 (run10s): the bins selection forms the scores (no grid barrier in the
                               // score grid)
};
// The path taken when RETROINFER_DECODE is unset: run 9 since session 10's H200 run (kernel graph 0.82-0.96x
// run 8's time at 128K, batch 1-16; runner 717 vs 640 tok/s at 128K batch 6; the same GPU tests pass on
// both); "run8" keeps run 8 reachable. Since run 15 (session 12) the default adds run 10's score formation
// inside the cooperative score grid (kRun10FormIsDefault; "run10form" spelled out): graph replay 86.2 vs
// 90.1 us at 128K batch 4, 1-2 us less at 32K and 128K batch 1, +2.4 us at 128K batch 16
// (bench/results/run15/call4/sw11.jsonl); "run9" keeps run 9 alone.
inline constexpr bool kRun9IsDefault = true;
inline constexpr bool kRun10FormIsDefault = true;
// Since run 17 (session 14) the default merges the partial states with combine_states chained by PDL
// (DecodePath::combine_pdl, "run10c" spelled out) instead of the fused merge in the last CTA of each head:
// 1.5-4.1 us less at 128K batch 1-16, 7-16 us at 512K / 1M (bench/results/run17/ab5); "run10" keeps the
// fused merge.
inline constexpr bool kRun10CombineIsDefault = true;
// Since run 25 (session 22) the default forms the selection's scores in the bins selection itself (DecodePath::
// select_forms, "run10s" spelled out: no grid barrier and formation in the score grid) where G <= 4 and C % 4 == 0
// and the bins kernel runs; elsewhere run10c. Bit-identical to run10c; 128K batch 4, int8 scoring, read flush:
// 63.5-64.1 against 66.0-66.4 us, batch 16 152.5-153.2 against 159.7-160.6, 32K 1.8-3.2 us less
// (bench/results/run25/e). "run10c" keeps the formation in the score grid.
inline constexpr bool kRun25SelectFormsIsDefault = true;
DecodePath decode_path();

// Phase summary of the stamps of one decode (kernels.h kPhaseSlots; raw: [H, kPhaseSlots] as downloaded):
// ("phase.<name>", ms) pairs: the timeline over all heads relative to the first score CTA's start
// (score_end, select_start / _end, exact_start / _end, estimate_start / _end, merge_end) and the
// selection's phases (select_<phase>, select_head_total: medians over the heads); empty when nothing
// stamped.
std::vector<std::pair<std::string, float>> summarize_phases(const std::vector<uint64_t>& raw, int num_heads);
// mark(stage) is called after "score", "select", "estimate" (only when n_e > 0), "exact_attention" and
// "combine"; after_select (may be empty) runs between the selection/estimation and the exact attention.
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
  a.merge_counter = m.merge_counter.template as<int>();
  a.grid_ws = m.sel_ws.template as<unsigned>();
  a.est_counter = m.est_counter.template as<int>();
}

void launch_zone_decode(const ZoneDecodeArgs& a, cudaStream_t s, const std::function<void(const char*)>& mark,
                        const std::function<void()>& after_select);

}  // namespace retroinfer::cuda::detail
