// Cluster scoring and zone selection kernels (score_clusters.cu, select*.cu): parameters and launchers.
// Shared notation: kernels/kernel_common.h. Launchers validate nothing and return the launch status.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/kernel_common.h"

namespace retroinfer::cuda::detail {

// ---- cluster scores (score_clusters.cu) ----

// score_clusters chooses the kernel by the centroids it is given; all share the grid (score_blocks), the tile
// partition, the per-lane online (max, sum) and its merge, and the formation (score_common.cuh):
//   int8 copies (ScoreParams::centroids_q8): CTA-wide stages, a stage holding the 4 warps' tiles of one
//     round (64 consecutive centroids) copied by one 64-row tensor-map box and one bulk copy each of their
//     sizes and scales, refilled by the last warp done with it; where C % 4 != 0 or the sizes / scales are
//     not 16-byte aligned (one bulk copy per stage needs both), per-warp 2-stage rings of one 16-row box per
//     tile: the same logits bit for bit, the normaliser partials' sums in another order (within 1e-5);
//   bf16 centroids: per-warp 2-stage rings of D / 64 tensor-map boxes (64 dims x 16 centroids, 128-byte
//     swizzle) per tile.
struct ScoreParams {
  const float* q = nullptr;                  // [H, G, D] f32
  const uint16_t* centroids_bf16 = nullptr;  // [H, C, D] bf16 (not read where int8 copies are given)
  // Int8 copies of the centroids (quantize_centroids), scored instead of the bf16 ones (half the bytes):
  // logit = (q . (u - 128)) * centroid_scale[c] * scale, the dot product on f16 tensor cores (the query split
  // into f16 hi + lo parts). Both or neither; null: the bf16 centroids.
  const uint8_t* centroids_q8 = nullptr;     // [H, C, D] u8: round(c / centroid_scale) + 128
  const float* centroid_scale = nullptr;     // [H, C] f32: max |c| / 127 of the row (0 for a zero row)
  const int* sizes = nullptr;                // [H, C]
  float* logits = nullptr;                   // [H, G, C] f32 out: q . c * scale; -inf for empty clusters
  // [H, G, score_blocks(C, D, H)] out: per CTA (max logit, sum of e^{logit - max}) over its clusters.
  float2* norm_partial = nullptr;
  int num_heads = 0, group = 0, head_dim = 0, num_clusters = 0;
  float scale = 0.0f;
  uint64_t* phase = nullptr;  // [H, kPhaseSlots] diagnostics (null: off); see kPhaseSlots
  // [H, C] f32 out (only where score_form_fits): the selection's scores formed by the same grid after a
  // grid-wide barrier (cooperative launch), bit-identical to form_scores'; null: not formed.
  float* scores = nullptr;
};
// Phase stamps (diagnostics, RetroLayer::decode_stage_ms with RETROINFER_SELECT_PHASES=1, taken from one
// graph replay of the decode): per flat head h, phase[h * kPhaseSlots + j], all slots set to ~0 before
// the decode; "first" = earliest CTA (%globaltimer ns, atomicMin), "last" = latest, kept as its complement
// (atomicMin of ~t):
//   [0] score first start, [1] ~score last end;
//   [2 + j] / [2 + kSelPhases + j]: %globaltimer ns / clock64 of thread 0 of the selection CTA at its
//   phase boundary j (select_bins.cu: 0 start (after the PDL wait), 1 scores + range, 2 histogram,
//   3 threshold bins, 4 candidates, 5 thresholds, 6 compaction, 7 expansion = end);
//   [kSlotExact] exact attention first start (after the PDL wait), [kSlotExact + 1] ~its last end (partial
//   states written); [kSlotEst], [kSlotEst + 1] the same for the estimation;
//   [kSlotMerge] ~(end of the merge): the fused merge's last CTA, or the last combine_states CTA;
//   [kSlotScore .. + 4] inside the score grid (thread 0 of each CTA): ~latest first tile landed, earliest and
//   ~latest end of a CTA's tile loop (all its warps), ~latest pass of the grid barrier before the formation
//   (ScoreParams::scores), earliest first tile landed;
//   [kSlotSpan + 4 k .. + 3] per-CTA spans of the exact (k = 0) and estimation (k = 1) CTAs of decode.cu:
//   ~latest start, earliest end, and (added to the ~0 start value, so raw + 1) the sum of the CTAs'
//   durations in ns and their count;
//   [kSlotScoreStart] ~latest start of a score CTA; [kSlotScoreIssued] ~latest CTA past the issue of its
//   first stages, [kSlotScoreQ], [kSlotScoreQ + 1] earliest / ~latest with its query fragments.
// The cluster selection kernel does not stamp and leaves its slots at ~0.
inline constexpr int kSelPhases = 8;
inline constexpr int kSlotExact = 2 + 2 * kSelPhases;
inline constexpr int kSlotEst = kSlotExact + 2;
inline constexpr int kSlotMerge = kSlotEst + 2;
inline constexpr int kSlotScore = kSlotMerge + 1;
inline constexpr int kSlotSpan = kSlotScore + 5;
inline constexpr int kSlotScoreStart = kSlotSpan + 8;
inline constexpr int kSlotScoreIssued = kSlotScoreStart + 1;
inline constexpr int kSlotScoreQ = kSlotScoreIssued + 1;
inline constexpr int kPhaseSlots = kSlotScoreQ + 2;
// The int8 copies of `rows` bf16 centroid rows (ScoreParams::centroids_q8): per row s = max |c| / 127 (f32),
// u = rint(c / s) + 128 (all 128 for a zero row, s = 0). head_dim a multiple of 8.
cudaError_t quantize_centroids(const uint16_t* centroids_bf16, int64_t rows, int head_dim, uint8_t* q8, float* scale,
                               cudaStream_t s);
int score_blocks(int num_clusters, int head_dim, int num_heads);  // CTAs per head of score_clusters
// Returns cudaErrorInvalidValue for a head_dim other than 64 / 128, for p.scores beyond score_form_fits, for
// centroids not 16-byte aligned, for int8 copies without scales (or scales without copies) and for int8
// copies with a query not 16-byte aligned;
// cudaErrorNotSupported where no tensor map of the centroids can be encoded (a driver without the encoder).
cudaError_t score_clusters(const ScoreParams& p, cudaStream_t s);
// Whether score_clusters can form the scores in its own grid (ScoreParams::scores): the one-wave grid's CTAs
// all resident at once by the occupancy of every kernel it may launch (a cooperative launch's condition).
bool score_form_fits(int num_clusters, int head_dim, int num_heads);

// ---- zone selection (select.cu, select_bins.cu, select_grid.cu, select_cluster.cu) ----

struct SelectParams {
  // Either logits (group > 0: score = sum_g softmax over the items of logits[h, g, :]) or ready scores.
  const float* logits = nullptr;  // [H, G, N] f32 (group > 0)
  const float2* norm_partial = nullptr;  // [H, G, norm_parts] (group > 0): from score_clusters
  int norm_parts = 0;
  float* scores = nullptr;        // [H, N] f32: written when group > 0, read otherwise; -inf = never picked
  int num_heads = 0, group = 0, num_items = 0;
  int k_retrieval = 0;   // best items -> retrieval ids
  int k_estimation = 0;  // next items -> estimation ids
  int* retrieval_ids = nullptr;   // [H, k_retrieval]: ascending, padded with -1
  int* estimation_ids = nullptr;  // [H, k_estimation]: ascending, padded with -1 (may be null if 0)
  // Expansion of the retrieval ids into the exact-token list of each head.
  // Clusters: items are clusters with CSR offsets/members (page_tokens == 0); pages otherwise.
  const int* offsets = nullptr;       // [H * N + 1] absolute CSR offsets (clusters)
  const uint32_t* members = nullptr;  // [H * n_idx] index tokens (clusters)
  int page_tokens = 0;                // > 0: item j covers index tokens [j * page_tokens, ...) (pages)
  int64_t n_idx = 0;
  int64_t idx_begin = 0;      // KV token of index token 0
  int64_t num_tokens = 0;     // n: KV tokens per head
  int* token_list = nullptr;  // [H, list_stride] out: steady tokens then the retrieval tokens (KV positions)
  int* token_count = nullptr;  // [H] out
  int* scan_scratch = nullptr;  // [H, k_retrieval + 1]
  int64_t list_stride = 0;
  uint64_t* phase = nullptr;  // [H, kPhaseSlots] diagnostics (null: off); the bins and grid kernels stamp
  // Launch the bins kernel as a programmatic dependent of the score kernel: its CTAs start while the score
  // grid drains and wait (griddepcontrol.wait) before reading anything it wrote. Only the bins kernel takes
  // it (the grid kernel as a cooperative launch where the driver allows both); the cluster kernel launches
  // plainly.
  bool pdl = false;
  // Bins and grid kernels: the head's CSR offsets prefetched into L2 before the PDL wait, the retrieval
  // clusters' members while compacting (the expansion's dependent loads then hit L2), and a half-warp per
  // item in the expansion. The result is the same.
  bool prefetch = false;
  // The grid selection's workspace, [num_heads, kSelectGridWsWords] u32, zero when first used (every launch
  // leaves it zero). Null: the one-CTA / cluster kernels.
  unsigned* grid_ws = nullptr;
};
inline constexpr int kSelectGridMaxChunks = 64;     // CTAs per head of the grid selection, at most
inline constexpr int kSelectGridWsWords = 13312;    // per head: three histograms, chunk counts, a barrier
inline size_t select_grid_ws_bytes(int64_t num_heads) { return size_t(num_heads) * kSelectGridWsWords * 4; }
// Of each head's words: [0, kSelectGridWsZeroWords) (the histograms) and the barrier count at
// kSelectGridWsBarWord are zero between launches; the rest (chunk counts, the barrier generation) is scratch.
inline constexpr int kSelectGridWsZeroWords = 12800;
inline constexpr int kSelectGridWsBarWord = 13184;
// The bins kernel's limit: its scores live in its shared memory (160 KiB).
inline constexpr int kSelectBinsMaxItems = 40960;
// Items past which select_and_expand takes the grid kernel where it applies: the bins kernel's limit, so the
// grid kernel replaces the cluster kernel (1M tokens, batch 1: 29 against 76 us per head). Below, the bins
// kernel is faster (read flush, us per head: 12.3 / 18.7 / 32.0 at 8188 / 16380 / 32764 items, the grid
// kernel 23.7 / 24.0 / 25.6 at batch 1 and 23.7 / 26.7 / 32.7 at batch 4).
inline constexpr int kSelectGridMinItems = kSelectBinsMaxItems;
// Its plan for p: *ipt items per thread and *chunks CTAs per head (256 threads each), or 0 / 0 where it does
// not apply (no workspace, scores to form (group > 0), or the CTAs would not all be resident at once).
cudaError_t select_grid_plan(const SelectParams& p, int* ipt, int* chunks);
// Launches with ipt items per thread and `chunks` CTAs per head: cudaErrorInvalidConfiguration when the
// num_heads * chunks CTAs would not all be resident at once (select_grid_capacity: how many are).
cudaError_t select_and_expand_grid(const SelectParams& p, int ipt, int chunks, cudaStream_t s);
cudaError_t select_grid_capacity(int ipt, int k_retrieval, int* ctas);
// Zone selection (select.cu): the bins kernel up to kSelectBinsMaxItems items; beyond, the grid kernel where
// p.grid_ws is given and its plan applies, else the cluster kernel.
cudaError_t select_and_expand(const SelectParams& p, cudaStream_t s);
// The one-CTA-per-head few-barrier kernel (select_bins.cu): <= kSelectBinsMaxItems items, else
// cudaErrorInvalidValue.
cudaError_t select_and_expand_bins(const SelectParams& p, cudaStream_t s);
// The 8-CTA thread-block cluster per head (select_cluster.cu): any number of items.
cudaError_t select_and_expand_cluster(const SelectParams& p, cudaStream_t s);

// The selection's scores formed by a grid of (item blocks x heads) (select_scores.cu) instead of inside the
// selection or the score grid: score[h, i] = sum_g e^{logits[h, g, i] - M_g} / L_g with (M_g, L_g)
// merged from score_clusters' per-CTA partials, -inf when the cluster is empty (logit -inf). The same
// expressions in the same order as the selection kernels' own formation, so the scores are bit-identical;
// the selection then runs on them with group = 0.
struct FormScoresParams {
  const float* logits = nullptr;         // [H, G, N] f32
  const float2* norm_partial = nullptr;  // [H, G, norm_parts]
  int norm_parts = 0;
  float* scores = nullptr;               // [H, N] f32 out
  int num_heads = 0, group = 0, num_items = 0;
  bool pdl = false;  // a programmatic dependent of score_clusters (waits before reading its outputs)
};
inline constexpr int kFormThreads = 256;       // threads per CTA of form_scores
inline constexpr int kFormItemsPerThread = 4;  // items per thread (independent loads in flight)
cudaError_t form_scores(const FormScoresParams& p, cudaStream_t s);

}  // namespace retroinfer::cuda::detail
