// Kernel parameter structs and raw launchers of the CUDA backend. Included only from src/backend/cuda.
//
// Every launcher takes a plain Params struct of device pointers and sizes plus a stream, launches, and
// returns the launch status; it validates nothing. The host API (retro_layer.cpp, dense_decode.cpp)
// validates shapes, throws retroinfer::Error and checks each status through detail::launch_check.
//
// Shared notation:
//   H     flat head count = num_seqs * num_heads_kv; flat head h is (sequence h / Hkv, KV head h % Hkv)
//   G     GQA group (query heads per KV head), 1..8; query head of flat head h and member g is h * G + g,
//         so q / out of shape [num_seqs, num_heads_q, D] are [H, G, D]
//   D     head_dim, 64 or 128
//   K, V  [H, kv_stride, D] bf16 (uint16 bits), row-major; token t of head h at (h * kv_stride + t) * D
//   C     clusters per head (the same for every head: all heads of a layer index the same tokens)
//   n_idx indexed tokens per head; index token i is KV token idx_begin + i
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace retroinfer::cuda::detail {

inline constexpr int kMaxGroup = 8;  // largest GQA group the decode kernels support (register arrays)

// ---- k-means (kmeans.cu, kmeans_assign.cu, kmeans_sort.cu) ----

struct KMeansParams {
  const uint16_t* keys = nullptr;    // K: [H, kv_stride, D] bf16
  const uint16_t* values = nullptr;  // V: [H, kv_stride, D] bf16
  int64_t kv_stride = 0;
  int64_t idx_begin = 0;  // first indexed KV token
  int64_t n_idx = 0;      // indexed tokens per head (> 0)
  int num_heads = 0;      // H
  int head_dim = 0;       // D
  int num_clusters = 0;   // C (all segments)
  int num_segments = 0;   // S
  const int* seg_token_begin = nullptr;    // [S + 1]: segment s covers index tokens [b[s], b[s+1])
  const int* seg_cluster_begin = nullptr;  // [S + 1]: segment s owns clusters [b[s], b[s+1])
  int max_seg_tokens = 0;                  // max_s (b[s+1] - b[s]) of seg_token_begin
  int max_seg_clusters = 0;                // max_s (b[s+1] - b[s]) of seg_cluster_begin
  // Workspace and outputs.
  float* mean_partial = nullptr;   // [H, kMeanChunks, D] f32
  float* mean = nullptr;           // [H, D] f32: mean indexed key
  uint16_t* centred = nullptr;     // [H, n_idx, D] bf16: key - mean (assignment operand of v1 / a; may be null
                                   // under q8)
  // Assignment operands of variant q8 (null under v1 / a): per row with m = max |x|, x_q = clamp(rint(x *
  // (127 / m)), -127, 127) and scale m / 127 (IEEE operations, kmeans.cu quantize_q8); the key scale is not
  // kept (a positive factor per key does not move its argmax).
  int8_t* centred_q8 = nullptr;    // [H, n_idx, D] int8: key - mean (f32 difference) quantized per row
  int8_t* centroids_q8 = nullptr;  // [H, C, D] int8: the iterating (centred) centroids quantized per row
  float* centroid_scale = nullptr; // [H, C] f32: their scales
  float* centroids = nullptr;      // [H, C, D] f32: centred centroids while iterating; de-centred at the end
  uint16_t* centroids_bf16 = nullptr;  // [H, C, D] bf16 copy (assignment operand; decode meta at the end)
  float* value_sums = nullptr;     // [H, C, D] f32
  uint16_t* value_sums_bf16 = nullptr;  // [H, C, D] bf16 copy for the decode kernels
  int* sizes = nullptr;            // [H, C]
  int* assignment = nullptr;       // [H, n_idx]: cluster of each index token
  uint32_t* sort_keys = nullptr;   // [H * n_idx]: h * C + cluster
  uint32_t* sort_keys_out = nullptr;  // [H * n_idx]
  const uint32_t* iota = nullptr;  // [H * n_idx]: i mod n_idx (index token of each entry)
  uint32_t* members = nullptr;     // [H * n_idx]: index tokens grouped by flat cluster h * C + c, ascending
  int* offsets = nullptr;          // [H * C + 1]: CSR offsets into members (absolute; head h starts at h*n_idx)
  void* sort_temp = nullptr;       // CUB temporary storage
  size_t sort_temp_bytes = 0;
  // Kernel variants (A/B; every variant gives the same results bit for bit): kKMeansVariantEnv reads
  // RETROINFER_KMEANS_ASSIGN / RETROINFER_KMEANS_UPDATE at each launch (kmeans_assign_variant_from_env).
  int assign_variant = -1;  // KMeansAssignVariant or kKMeansVariantEnv
  int update_variant = -1;  // KMeansUpdateVariant or kKMeansVariantEnv
  int group_variant = -1;   // KMeansGroupVariant or kKMeansVariantEnv
};
inline constexpr int kMeanChunks = 32;  // partial sums per head for the mean key (deterministic two-pass)
inline constexpr int kKMeansVariantEnv = -1;

// Assignment kernels (kmeans.cu: v1; kmeans_assign.cu: a, q8). v1 and a: the same scores (the same
// mma.sync with the same operands in the same k order per output) and the same argmax rule, so the same
// assignment:
//   kV1  run 9's kernel: 2 m-tiles x 2 n-tiles per warp step, 64-centroid chunks, 2 barriers per chunk
//        (the reference the GPU tests compare against)
//   kA   as v1 with the independent MMA chains interleaved, one barrier per chunk, unguarded full chunks
//        (the default of runs 15-25)
//   kQ8  other arithmetic: int8 operands (centred_q8 . centroids_q8, mma.sync m16n8k32, exact int32 dot),
//        score = f32(dot) * centroid_scale; ties to the lowest id. Exact: a host reference computes the same
//        argmax bit for bit from the same int8 operands (tests/gpu/test_cuda_kmeans_fast.cpp CudaKMeansQ8).
// Run 15 also measured b-f (128-centroid chunks in a 3-stage ring, a max-tree argmax, 4 n-tiles or 3
// m-tiles per step; bench/results/run15/call2, call3): b-e slower than a, f level with it at 128K and
// slower at 32K; they were removed after it.
enum KMeansAssignVariant : int { kAssignV1 = 0, kAssignA, kAssignQ8, kAssignVariants };
inline constexpr int kAssignBf16Variants = 2;  // v1 and a: the variants with bf16 scores (same results)
// Centroid update / finalize: v1 = one warp per cluster, 2-byte loads per lane; kUpdateFast = D/8 lanes
// per cluster with 16-byte loads (the same f32 adds in the same member order).
enum KMeansUpdateVariant : int { kUpdateV1 = 0, kUpdateFast, kUpdateVariants };
// Grouping by cluster: kGroupRadix = CUB's stable radix sort of every pass; kGroupCount = a stable counting
// sort per (head, segment) in one CTA for the segment passes (the global pass keeps the radix sort). The
// same members and offsets.
enum KMeansGroupVariant : int { kGroupRadix = 0, kGroupCount, kGroupVariants };
inline constexpr int kGroupCountMaxBins = 1024;     // clusters per segment the counting sort takes (else radix)
inline constexpr int kGroupCountMaxTokens = 16384;  // ... and tokens per segment
// RETROINFER_KMEANS_ASSIGN = v1|a|q8, RETROINFER_KMEANS_UPDATE = v1|fast, RETROINFER_KMEANS_GROUP =
// radix|count (unset or empty: the defaults of kmeans.cu; another value throws Error), read at every call.
int kmeans_assign_variant_from_env();
int kmeans_update_variant_from_env();
int kmeans_group_variant_from_env();
const char* kmeans_assign_variant_name(int variant);
const char* kmeans_update_variant_name(int variant);
const char* kmeans_group_variant_name(int variant);

cudaError_t kmeans_mean(const KMeansParams& p, cudaStream_t s);          // mean, centred
cudaError_t kmeans_init(const KMeansParams& p, cudaStream_t s);          // initial centroids
// Assigns every index token to its best centroid: within its segment (global = false) or over all C.
cudaError_t kmeans_assign(const KMeansParams& p, bool global, cudaStream_t s);
// The assignment kernel `variant` (KMeansAssignVariant; kmeans_assign.cu); kmeans_assign dispatches to it.
// cudaErrorInvalidValue for another variant or head_dim.
cudaError_t kmeans_assign_variant(const KMeansParams& p, bool global, int variant, cudaStream_t s);
// Groups tokens by cluster (stable radix sort of sort_keys) and writes offsets.
cudaError_t kmeans_group(const KMeansParams& p, cudaStream_t s);
// The same after a segment pass (every token's cluster inside its segment): one CTA per (segment, head)
// sorts by counting (kmeans_group.cu); cudaErrorInvalidValue where a segment has more than
// kGroupCountMaxBins clusters or kGroupCountMaxTokens tokens. kmeans_group_pass picks it or kmeans_group by
// the group variant.
cudaError_t kmeans_group_segments(const KMeansParams& p, cudaStream_t s);
cudaError_t kmeans_group_pass(const KMeansParams& p, bool global, cudaStream_t s);
size_t kmeans_sort_temp_bytes(int64_t items, int end_bit);
// Recomputes centroids from the grouping: spherical (normalised sum) or plain mean; empty keeps.
cudaError_t kmeans_update(const KMeansParams& p, bool spherical, cudaStream_t s);
// Final outputs: de-centred centroids, value sums, sizes and their bf16 copies. with_mean: the plain-mean
// update of the last global iteration first (fused into the same pass over the members under the fast
// update variant; the same centroids as kmeans_update(p, false) then kmeans_finalize, bit for bit).
cudaError_t kmeans_finalize(const KMeansParams& p, cudaStream_t s, bool with_mean = false);
// out[h] = the sum of the k largest of sizes[h, 0 .. clusters) (int, >= 0), for each of `heads` heads: the
// retrieval zone's largest token count (RetroLayer's token-list capacity) without downloading the sizes.
// 1 <= k <= clusters, else cudaErrorInvalidValue.
cudaError_t top_sizes_sum(const int* sizes, int heads, int clusters, int k, long long* out, cudaStream_t s);

// ---- scoring and selection (select.cu) ----

// Score kernel variants (the same grid, tile partition and per-tile math: logits, normaliser partials and
// formed scores bit-identical):
//   kScoreV1      run 8's kernel (select.cu score_body): per warp, a double buffer of 16-byte cp.async
//                 copies and the tile's cluster sizes loaded a tile ahead into registers (early_loads);
//   kScoreStream  score_stream.cu: per warp a 2-stage mbarrier ring (8 tile stages per CTA, v1's shared
//                 memory) filled by one cp.async.bulk per centroid row into v1's padded rows, the tile's
//                 cluster sizes (4-byte cp.async) completing the same barrier, both stages issued before
//                 the query fragments are formed, and run 10's formation with all of a CTA's logits
//                 loaded before the grid barrier; early_loads has no effect on it;
//   kScoreTma     the same with the rows copied as 2-D tensor-map boxes (64 dims x 16 centroids, 128-byte
//                 swizzle; D / 64 copies per tile instead of 16); stream where no encoder is available.
//   kScoreTmaWide run 23: the tma kernel with CTA-wide stages: a stage holds the kScoreWarps warps' tiles
//                 of one round (64 consecutive centroids) copied by D / 64 boxes of 64 centroids (int8: one)
//                 and one bulk copy of their sizes (and scales), refilled by the last warp done with it (4x
//                 fewer copies); tma where C % 4 != 0 or the sizes are not 16-byte aligned.
enum ScoreVariant : int { kScoreV1 = 0, kScoreStream, kScoreTma, kScoreTmaWide, kScoreVariants };
inline constexpr int kScoreVariantEnv = -1;
// run 16: tma, the fastest of the first three; run 23: wide (the same kernel for bf16 centroids)
inline constexpr ScoreVariant kDefaultScoreVariant = kScoreTmaWide;
// RETROINFER_SCORE = v1 | stream | tma | wide, read at every call (a test runs both in one process); unset or empty:
// kDefaultScoreVariant; another value throws retroinfer::Error naming the valid ones.
ScoreVariant score_variant_from_env();
// score_stream.cu's variants (stream, tma, wide), and those that score the int8 copies where given (tma, wide).
inline constexpr bool score_variant_streams(int v) { return v == kScoreStream || v == kScoreTma || v == kScoreTmaWide; }
inline constexpr bool score_variant_reads_int8(int v) { return v == kScoreTma || v == kScoreTmaWide; }
const char* score_variant_name(int variant);  // "v1", "stream", "tma", "wide"; "?" otherwise

struct ScoreParams {
  const float* q = nullptr;                  // [H, G, D] f32
  const uint16_t* centroids_bf16 = nullptr;  // [H, C, D] bf16
  // Run 22: int8 copies of the centroids (quantize_centroids), scored instead of the bf16 ones by the tma
  // and wide variants (half the bytes): logit = (q . (u - 128)) * centroid_scale[c] * scale, the dot product on f16
  // tensor cores (the query split into f16 hi + lo parts). Null (or not a tma variant, or no tensor-map
  // encoder): the bf16 centroids. Both or neither.
  const uint8_t* centroids_q8 = nullptr;     // [H, C, D] u8: round(c / centroid_scale) + 128
  const float* centroid_scale = nullptr;     // [H, C] f32: max |c| / 127 of the row (0 for a zero row)
  const int* sizes = nullptr;                // [H, C]
  float* logits = nullptr;                   // [H, G, C] f32 out: q . c * scale; -inf for empty clusters
  // [H, G, score_blocks(C, D, H)] out: per CTA (max logit, sum of e^{logit - max}) over its clusters.
  float2* norm_partial = nullptr;
  int num_heads = 0, group = 0, head_dim = 0, num_clusters = 0;
  float scale = 0.0f;
  uint64_t* phase = nullptr;  // [H, kPhaseSlots] diagnostics (null: off); see kPhaseSlots
  // Run 8: the first tile's copy issued before the query fragments are formed, and the cluster sizes
  // loaded a tile ahead into registers (run 6: a dependent load after each tile's MMAs). Same logits.
  bool early_loads = false;
  // Run 10 (needs early_loads and score_form_fits): [H, C] f32 out, the selection's scores formed by the
  // same grid after a grid-wide barrier (cooperative launch), bit-identical to form_scores'; null: not.
  float* scores = nullptr;
  // ScoreVariant of the kernel, or kScoreVariantEnv: RETROINFER_SCORE at the launch (score_variant_from_env).
  int variant = kScoreVariantEnv;
  // Run 24 (stream / tma / wide kernels): the head's query copied into shared memory before the first centroid
  // copies are issued, the fragments formed from there (the same fragments); false: formed from global after
  // the issue (run 23). Up to 4 query heads for bf16 centroids, 8 for int8; a base not 16-byte aligned: off.
  // RetroLayer sets it from RETROINFER_SCORE_QUERY (smem, the default, or global).
  bool query_smem = true;
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
//   [kSlotScore .. + 4] inside the score grid (thread 0 of each CTA): ~latest first tile landed (stream /
//   tma kernels only), earliest and ~latest end of a CTA's tile loop (all its warps), ~latest pass of the
//   grid barrier before the formation (run 10 path), earliest first tile landed;
//   [kSlotSpan + 4 k .. + 3] per-CTA spans of the exact (k = 0) and estimation (k = 1) CTAs of decode.cu:
//   ~latest start, earliest end, and (added to the ~0 start value, so raw + 1) the sum of the CTAs'
//   durations in ns and their count;
//   [kSlotScoreStart] ~latest start of a score CTA (stream / tma kernels); [kSlotScoreIssued] ~latest CTA past
//   the issue of its first stages, [kSlotScoreQ], [kSlotScoreQ + 1] earliest / ~latest with its query fragments.
// Kernels that do not stamp (radix, cluster selection) leave their slots at ~0.
inline constexpr int kSelPhases = 8;
inline constexpr int kSlotExact = 2 + 2 * kSelPhases;
inline constexpr int kSlotEst = kSlotExact + 2;
inline constexpr int kSlotMerge = kSlotEst + 2;
inline constexpr int kSlotScore = kSlotMerge + 1;
inline constexpr int kSlotSpan = kSlotScore + 5;
inline constexpr int kSlotScoreStart = kSlotSpan + 8;  // run 23: ~latest start of a score CTA (stream / tma)
// Run 24 (stream / tma kernels, thread 0 of each CTA): ~latest CTA past the issue of its first stages,
// earliest / ~latest CTA with its query fragments formed.
inline constexpr int kSlotScoreIssued = kSlotScoreStart + 1;
inline constexpr int kSlotScoreQ = kSlotScoreIssued + 1;
inline constexpr int kPhaseSlots = kSlotScoreQ + 2;
// Run 22: the int8 copies of rows bf16 centroid rows (ScoreParams::centroids_q8): per row s = max |c| / 127
// (f32), u = rint(c / s) + 128 (all 128 for a zero row, s = 0). head_dim a multiple of 8.
cudaError_t quantize_centroids(const uint16_t* centroids_bf16, int64_t rows, int head_dim, uint8_t* q8, float* scale,
                               cudaStream_t s);
int score_blocks(int num_clusters, int head_dim, int num_heads);  // CTAs per head of score_clusters (any variant)
// Launches the variant p.variant (kScoreVariantEnv: RETROINFER_SCORE now, which may throw). Returns
// cudaErrorInvalidValue for a head_dim other than 64 / 128, for p.scores without early_loads or beyond
// score_form_fits, and (stream, tma) for centroids not 16-byte aligned.
cudaError_t score_clusters(const ScoreParams& p, cudaStream_t s);
// Run 10: whether score_clusters can form the scores in its own grid (ScoreParams::scores): the one-wave
// grid's CTAs all resident at once by the kernel's occupancy (a cooperative launch's condition), for the
// variant that score_clusters will launch (kScoreVariantEnv: RETROINFER_SCORE now).
bool score_form_fits(int num_clusters, int head_dim, int num_heads, int variant = kScoreVariantEnv);
// score_stream.cu: the stream / tma variants' launch (score_clusters dispatches to it; same contract) and
// the CTAs per multiprocessor of their cooperative (form) kernels by occupancy (0 for another head_dim).
cudaError_t score_clusters_stream(const ScoreParams& p, int variant, cudaStream_t s);
int score_stream_form_ctas_per_sm(int variant, int head_dim);

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
  uint64_t* phase = nullptr;  // [H, kPhaseSlots] diagnostics (null: off); select_bins.cu stamps
  // Launch the bins kernel as a programmatic dependent of the score kernel (run 8): its CTAs start while
  // the score grid drains and wait (griddepcontrol.wait) before reading anything it wrote. Only the
  // bins kernel takes it; the others launch plainly.
  bool pdl = false;
  // Run 8 (bins kernel): the head's CSR offsets prefetched into L2 before the PDL wait, the retrieval
  // clusters' members while compacting (the expansion's dependent loads then hit L2), and a half-warp per
  // item in the expansion. The result is the same.
  bool prefetch = false;
  // Run 19 (select_grid.cu): the multi-CTA selection's workspace, [num_heads, kSelectGridWsWords] u32, zero
  // when first used (every launch leaves it zero). Null: the one-CTA / cluster kernels.
  unsigned* grid_ws = nullptr;
};
inline constexpr int kSelectGridMaxChunks = 64;     // CTAs per head of the grid selection, at most
inline constexpr int kSelectGridWsWords = 13312;    // per head: three histograms, chunk counts, a barrier
inline size_t select_grid_ws_bytes(int64_t num_heads) { return size_t(num_heads) * kSelectGridWsWords * 4; }
// Of each head's words: [0, kSelectGridWsZeroWords) (the histograms) and the barrier count at
// kSelectGridWsBarWord are zero between launches; the rest (chunk counts, the barrier generation) is scratch.
inline constexpr int kSelectGridWsZeroWords = 12800;
inline constexpr int kSelectGridWsBarWord = 13184;
// The grid selection (select_grid.cu): RETROINFER_SELECT_GRID (unset or 1: past kSelectGridMinItems items;
// force: wherever it fits; 0: off; other values throw retroinfer::Error), read at every launch.
enum class SelectGridMode { kOff, kLarge, kForce };
// Items past which RETROINFER_SELECT_GRID=1 takes the grid kernel: the one-CTA kernels' limit, so the grid
// kernel replaces the cluster kernel (1M tokens, batch 1: 29 against 76 us per head). Run 19 (read flush, µs per
// head): the bins kernel 12.3 / 18.7 / 32.0 at 8188 / 16380 / 32764 items, the grid kernel 23.7 / 24.0 / 25.6 at
// batch 1 and 23.7 / 26.7 / 32.7 at batch 4, so the bins kernel stays up to here.
inline constexpr int kSelectGridMinItems = 40960;
SelectGridMode select_grid_mode();
// Its plan for p: *ipt items per thread and *chunks CTAs per head (256 threads each), or 0 / 0 where it does
// not apply (no workspace, scores to form (group > 0), or the CTAs would not all be resident at once).
cudaError_t select_grid_plan(const SelectParams& p, int* ipt, int* chunks);
// Launches with ipt items per thread and `chunks` CTAs per head: cudaErrorInvalidConfiguration when the
// num_heads * chunks CTAs would not all be resident at once (select_grid_capacity: how many are).
cudaError_t select_and_expand_grid(const SelectParams& p, int ipt, int chunks, cudaStream_t s);
cudaError_t select_grid_capacity(int ipt, int k_retrieval, int* ctas);
// Zone selection (select_cluster.cu): the one-CTA-per-head few-barrier kernel (one adapted histogram, run 6)
// while the scores fit its shared memory (<= 40K items), the 8-CTA thread-block-cluster kernel beyond;
// RETROINFER_SELECT=radix (or single) / cluster forces run 5's one-CTA radix kernel / the cluster kernel.
cudaError_t select_and_expand(const SelectParams& p, cudaStream_t s);
cudaError_t select_and_expand_bins(const SelectParams& p, cudaStream_t s);  // select.cu; <= 40K items
// CTAs per head select_and_expand_bins launches for p (RETROINFER_SELECT_SPLIT: 1 or 2; select_bins.cu).
cudaError_t select_bins_ctas_per_head(const SelectParams& p, int* per_head);
cudaError_t select_and_expand_cluster(const SelectParams& p, cudaStream_t s);
cudaError_t select_and_expand_single_cta(const SelectParams& p, cudaStream_t s);  // select.cu

// Run 9 (select_scores.cu): the selection's scores formed by a grid of (item blocks x heads) instead of
// inside the one-CTA-per-head selection: score[h, i] = sum_g e^{logits[h, g, i] - M_g} / L_g with (M_g, L_g)
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

// ---- decode attention (decode.cu) ----

// Fused merge (run 8): the CTA that writes the last of head h's total_splits partial states (decode and
// estimation CTAs together, counted by an atomic per head) merges them into out[h] itself, so no
// combine_states launch follows. counter: [H] int, zero before the decode; that CTA resets its head's
// entry to zero, so a graph replays without a memset. Needs total_splits * G <= kMergeMaxStates (the
// merge weights in shared memory) and a 16-byte aligned out (float4 stores); the host checks both.
struct FusedMerge {
  int* counter = nullptr;  // [H]
  float* out = nullptr;    // [H, G, D] f32
};
inline constexpr int kMergeMaxStates = 4096;  // 16 KiB of f32 weights: the estimate kernel's reduction buffer

struct EstimateParams {
  const float* logits = nullptr;  // [H, G, C] f32 (scaled, from score_clusters)
  const uint16_t* value_sums_bf16 = nullptr;  // [H, C, D]
  const int* sizes = nullptr;     // [H, C]
  const int* estimation_ids = nullptr;  // [H, k_estimation], -1 padded
  int num_heads = 0, group = 0, head_dim = 0, num_clusters = 0, k_estimation = 0;
  int num_splits = 0;
  float2* part_ml = nullptr;
  float* part_o = nullptr;
  int total_splits = 0, split_offset = 0;
  FusedMerge merge;  // as DecodeParams::merge (the same counter: both kernels' CTAs count)
  uint64_t* phase = nullptr;  // [H, kPhaseSlots] diagnostics (null: off)
};
inline constexpr int kEstimateChunk = 64;  // estimated clusters per CTA: num_splits = ceil(k_estimation / 64)
cudaError_t estimate_attention(const EstimateParams& p, cudaStream_t s);
// Run 9: estimated clusters per estimation CTA of the exact-attention grid (DecodeParams::est_ctas). A
// multiple of kEstimateChunk, so ceil(k / kEstimateFusedChunk) <= ceil(k / kEstimateChunk): run 9 fits in
// the partial-state slots the layers size for run 8's estimation splits. Equal to the decode CTA's thread
// count (one cluster per thread while loading).
inline constexpr int kEstimateFusedChunk = 128;
static_assert(kEstimateFusedChunk % kEstimateChunk == 0, "run 9 must need no more slots than run 8");

// Run 17 pre-merge (split64ep / erp): the estimation CTAs of head h count into counter[h] after writing their
// partial states; the last one merges the head's est_ctas states (fixed slot order, merge_if_last's arithmetic)
// into one unnormalised state (m, l, o: softmax_state.h) in slot `slot` of the final merge's states and counts
// into merge.counter like an exact CTA, so the final merge sums num_splits + 1 states. counter: [H] int, zero
// before the decode; the last estimation CTA of a head resets its entry (graph replays need no memset).
struct EstPremerge {
  int* counter = nullptr;     // [H]: estimation CTAs counted per head (null: off)
  float2* part_ml = nullptr;  // the final merge's states [H, total, G] (m, l) ...
  float* part_o = nullptr;    // ... and [H, total, G, D] numerators
  int total = 0, slot = 0;    // states of the final merge per head; the slot of the pre-merged state
  FusedMerge merge;           // the final merge's counter and output
};

inline constexpr int kPremergeSlots = 1;  // partial-state slots per head a layer sizes beyond attn + est splits

struct DecodeParams {
  const float* q = nullptr;   // [H, G, D] f32 (unscaled)
  const uint16_t* k = nullptr;  // K
  const uint16_t* v = nullptr;  // V
  int64_t kv_stride = 0;
  // Tokens: dense [0, num_tokens) when token_list is null, else token_list[h, 0 .. token_count[h]).
  int64_t num_tokens = 0;
  const int* token_list = nullptr;  // [H, list_stride]
  const int* token_count = nullptr;  // [H]
  int64_t list_stride = 0;
  int num_heads = 0, group = 0, head_dim = 0;
  float scale = 0.0f;
  int num_splits = 0;      // CTAs per head
  int64_t split_tokens = 0;  // tokens per split (multiple of kDecodeTile * warps)
  // Partial states: [H, total_splits, G] scalars (m, l) and [H, total_splits, G, D] numerators; this
  // kernel writes slots [split_offset, split_offset + num_splits).
  float2* part_ml = nullptr;
  float* part_o = nullptr;
  int total_splits = 0, split_offset = 0;
  FusedMerge merge;  // off unless merge.counter is set
  bool pdl = false;  // launch as a programmatic dependent of the previous kernel on the stream
  uint64_t* phase = nullptr;  // [H, kPhaseSlots] diagnostics (null: off)
  // Run 8: each head's tokens split evenly over its num_splits CTAs on the device (ceil(count / splits)
  // rounded up to whole tiles), instead of split_tokens (sized by the host for the list capacity).
  bool balance = false;
  // Run 9: est_ctas more CTAs per head (blockIdx.x in [num_splits, num_splits + est_ctas)) run the
  // estimation zone over kEstimateFusedChunk estimated clusters each, after the same PDL wait, instead of
  // estimate_attention on a side stream. est holds their inputs: logits, value sums, sizes, ids, group,
  // head_dim (= this kernel's), num_clusters, k_estimation, and est.split_offset = the slot of the first
  // of them (num_splits); part_ml / part_o / total_splits / merge / phase are this struct's. 0: none.
  EstimateParams est;
  int est_ctas = 0;
  // How the run 9 grid runs when est_ctas > 0 (ExactVariant): kExactV1 = one grid (above); kExactSplit /
  // kExactSplit64 = the exact splits as one grid, then the est_ctas estimation CTAs (exact_est_chunk clusters
  // each) as a second grid launched right after it, a programmatic dependent of it when chain_pdl (decode.cu
  // decode_exact_kernel); the est-first variants (exact_est_first) launch the estimation grid first and the
  // exact grid as its programmatic dependent when chain_pdl.
  int exact_variant = 0;
  bool chain_pdl = false;
  // Run 17 pre-merge (exact_premerges: split64ep / erp; decode.cu estimate_premerge_kernel): the estimation
  // CTAs' states pre-merged into one by the last estimation CTA of each head. The host sets premerge.counter
  // only (null: the variant runs its est-first grids without the pre-merge, the usual layout), and then
  // total_splits = num_splits + 1 + est_ctas and est.split_offset = num_splits + 1; decode.cu fills the rest for
  // the estimation grid (launch_premerged).
  EstPremerge premerge;
};
// RETROINFER_EXACT (exact_variant_from_env, read at every decode; layer_attention_zones.cpp) picks how run 9's
// exact + estimation grid runs (DecodeParams::exact_variant):
//   v1       run 9's grid: the exact splits and the estimation CTAs (128 clusters) in one kernel (the default
//            before run 16)
//   split    two grids, the estimation chained behind the exact one (128-cluster CTAs of estimate_cta without
//            the exact role's registers and shared memory; the same partial states as v1 bit for bit)
//   split64  as split with 64-cluster estimation CTAs (18.3 KiB of shared memory and 64 registers at D = 128:
//            eight to a multiprocessor without exact CTAs; meant to fit beside three exact CTAs, which it does
//            not by registers, see run 17 below; run 8's chunking, so ceil(n_e / 64) = est_splits slots; within
//            rounding of v1; the default since run 16)
// Run 17 (issue #4: the estimation grid ran mostly after the exact grid, whose CTAs hold 155 registers, so no
// 64-cluster estimation CTA fit beside three of them), each split64's chunks, code and partial states bit for
// bit (decode.cu "Run 17 exact-grid variants"):
//   split64r    the exact kernel capped at 128 registers (__launch_bounds__(128, 4)): one estimation CTA fits
//               beside three exact CTAs (shared memory then limits it to one)
//   split64i    the exact kernel's token ids loaded ahead: each warp loads the ids of its next 8 tiles in one
//               batch (4 registers per lane), so no tile's copies wait on an L2 round trip of their own
//   split64ri   both
//   split64rh   split64r with estimation CTAs that stage their rows half a chunk at a time and lay out their
//               weights and sums for G query heads (9.25 KiB at D = 128, G = 4): two fit beside three capped
//               exact CTAs, for one more round trip each
//   split64rih  split64ri with split64rh's estimation CTAs
//   split64e    the estimation grid first (it waits for the selection and triggers), the exact grid chained
//               behind it as its programmatic dependent (no wait of its own; its last CTA waits at its end)
//   split64eri  split64e with split64ri's exact kernel
// Run 17 pre-merge (issue #4: under split64e at 128K batch 4 the final merge over 42 states per head ended ~6 us
// after the exact grid), the est-first grids with the estimation states pre-merged (DecodeParams::premerge):
//   split64ep   split64e whose last estimation CTA of each head merges the head's estimation states into one,
//               off the critical path; the final merge sums num_splits + 1 states (exact slots, then the
//               pre-merged one). Within rounding of split64 (another merge tree), bit-identical run to run
//   split64erp  split64ep with split64r's exact kernel (128 registers)
enum ExactVariant : int {
  kExactV1 = 0,
  kExactSplit,
  kExactSplit64,
  kExactSplit64R,
  kExactSplit64I,
  kExactSplit64RI,
  kExactSplit64RH,
  kExactSplit64RIH,
  kExactSplit64E,
  kExactSplit64ERI,
  kExactSplit64EP,
  kExactSplit64ERP,
  kExactVariants
};
// run 17: split64r (the exact kernel at <= 128 registers) took 0.3-3.1 us off split64 at every shape of
// bench/results/run17/ab2-ab4 (32K-1M, batch 1/4/16, both flushes); run 16: split64 79.9 vs 81.3 us at 128K
// batch 4, 193.8 vs 206.3 at batch 16.
inline constexpr int kExactDefault = kExactSplit64R;
// Estimated clusters per estimation CTA of a variant (its est_ctas = ceil(n_e / this) <= est_splits).
constexpr int exact_est_chunk(int variant) {
  return variant == kExactV1 || variant == kExactSplit ? kEstimateFusedChunk : kEstimateChunk;
}
// The run 17 properties of a variant (all false for v1, split, split64).
constexpr bool exact_caps_registers(int variant) {
  return variant == kExactSplit64R || variant == kExactSplit64RI || variant == kExactSplit64RH ||
         variant == kExactSplit64RIH || variant == kExactSplit64ERI || variant == kExactSplit64ERP;
}
constexpr bool exact_ids_ahead(int variant) {
  return variant == kExactSplit64I || variant == kExactSplit64RI || variant == kExactSplit64RIH ||
         variant == kExactSplit64ERI;
}
constexpr bool exact_est_halves(int variant) { return variant == kExactSplit64RH || variant == kExactSplit64RIH; }
constexpr bool exact_est_first(int variant) {
  return variant == kExactSplit64E || variant == kExactSplit64ERI || variant == kExactSplit64EP ||
         variant == kExactSplit64ERP;
}
constexpr bool exact_premerges(int variant) { return variant == kExactSplit64EP || variant == kExactSplit64ERP; }
int exact_variant_from_env();  // throws retroinfer::Error for a value that names no variant
const char* exact_variant_name(int variant);
// RETROINFER_SCORE_QUERY (read at every decode; layer_attention_zones.cpp): ScoreParams::query_smem, true for
// smem (the default: unset or empty), false for global; anything else throws retroinfer::Error.
bool score_query_smem_from_env();
inline constexpr int kDecodeWarps = 4;   // warps per CTA
inline constexpr int kDecodeTile = 16;   // tokens per warp tile
cudaError_t decode_attention(const DecodeParams& p, cudaStream_t s);
// cp.async stages per warp of the decode kernel: 2 by default; RETROINFER_DECODE_STAGES=3 keeps 2 tiles in
// flight per warp (run 4, bench/results/run4: no gain at batch 4). CTAs that fit on one multiprocessor by
// shared memory: 3 with 2 stages (68 KiB each), 2 with 3 stages (102 KiB each).
int decode_stages();
int decode_ctas_per_sm();
// Run 17 diagnostics: the per-CTA resources of the exact and estimation kernels that a split* variant
// launches now (decode_stages()) at head_dim, group and total_splits (cudaFuncGetAttributes: registers per
// thread; shared memory = the launch's dynamic bytes + the kernel's static bytes, without the shared memory
// the device reserves per CTA), and the current device's limits per multiprocessor. cudaErrorInvalidValue for
// v1, another head_dim or group.
struct ExactGridFootprint {
  int exact_regs = 0, est_regs = 0;
  size_t exact_smem = 0, est_smem = 0;
  int sm_regs = 0;                        // registers per multiprocessor
  size_t sm_smem = 0, cta_reserved = 0;   // shared memory per multiprocessor, reserved per CTA (bytes)
};
cudaError_t exact_grid_footprint(int variant, int head_dim, int group, int total_splits, ExactGridFootprint* out);

struct CombineParams {
  const float2* part_ml = nullptr;
  const float* part_o = nullptr;
  int num_heads = 0, group = 0, head_dim = 0, total_splits = 0;
  float* out = nullptr;  // [H, G, D] f32
  uint64_t* phase = nullptr;  // [H, kPhaseSlots] diagnostics (null: off)
  // Run 17 (RETROINFER_DECODE=run10c): launched as a programmatic dependent of the grid before it (created
  // streams only); its CTAs wait for that grid (griddepcontrol.wait) before reading the partial states.
  bool pdl = false;
};
cudaError_t combine_states(const CombineParams& p, cudaStream_t s);

// ---- quest (quest.cu) ----

struct QuestParams {
  const uint16_t* keys = nullptr;  // K
  int64_t kv_stride = 0;
  int64_t idx_begin = 0, n_idx = 0;
  int num_heads = 0, group = 0, head_dim = 0, page_tokens = 0, num_pages = 0;
  uint16_t* page_min = nullptr;  // [H, P, D] bf16 (exact: min of bf16 values)
  uint16_t* page_max = nullptr;  // [H, P, D] bf16
  const float* q = nullptr;      // [H, G, D] f32
  float* scores = nullptr;       // [H, P] out: max_g sum_d max(q_gd * max_d, q_gd * min_d)
};
cudaError_t quest_pages(const QuestParams& p, cudaStream_t s);  // page min / max (build)
cudaError_t quest_score(const QuestParams& p, cudaStream_t s);  // page upper bounds (decode)

// ---- decode-attention layers behind the runner's seam (layer_attention_kernels.cu) ----

// Appends a k-means block (C_b clusters over n_b index tokens, CSR compact with head h's members at
// [off_blk[h*C_b], off_blk[(h+1)*C_b]), members relative to the block's first token) to an index of C_o
// clusters over n_o index tokens (same CSR form; empty when C_o == 0), writing the merged CSR: per head
// the old clusters then the block's (ids C_o + j), the block's members shifted by n_o (they follow the
// old index tokens), assignments likewise (-1 stays -1).
struct IndexAppendParams {
  int num_heads = 0, c_old = 0, c_blk = 0;
  int64_t n_old = 0, n_blk = 0;
  const int* off_old = nullptr;       // [H * c_old + 1] (unused when c_old == 0)
  const uint32_t* mem_old = nullptr;  // [off_old[H * c_old]]
  const int* asg_old = nullptr;       // [H, n_old]
  const int* off_blk = nullptr;       // [H * c_blk + 1]
  const uint32_t* mem_blk = nullptr;  // [off_blk[H * c_blk]]
  const int* asg_blk = nullptr;       // [H, n_blk]
  int* off_new = nullptr;             // [H * (c_old + c_blk) + 1] out
  uint32_t* mem_new = nullptr;        // out
  int* asg_new = nullptr;             // [H, n_old + n_blk] out; null: no assignment (asg_old/blk unread)
};
cudaError_t index_append(const IndexAppendParams& p, cudaStream_t s);

// Appends src[h, 0 .. src_count[h]) to list[h] after its count[h] entries and adds src_count[h] to count[h]
// (the outlier tokens after the selection's exact list). The list must have room (host-side capacity).
struct ListAppendParams {
  int num_heads = 0;
  const int* src = nullptr;        // [H, src_stride]
  const int* src_count = nullptr;  // [H]
  int64_t src_stride = 0;
  int* list = nullptr;             // [H, list_stride]
  int* count = nullptr;            // [H]
  int64_t list_stride = 0;
};
cudaError_t list_append(const ListAppendParams& p, cudaStream_t s);

// One token list shared by every head (decode with list_stride 0): [0, a_end) then [b_begin, b_end);
// count[h] = a_end + b_end - b_begin for every h (streaming; the steady-only oracle).
struct RangeListParams {
  int num_heads = 0;
  int64_t a_end = 0, b_begin = 0, b_end = 0;
  int* list = nullptr;   // [a_end + b_end - b_begin]
  int* count = nullptr;  // [H]
};
cudaError_t range_list(const RangeListParams& p, cudaStream_t s);
// retro_layout.cu (RetroLayer::make_cluster_contiguous): dst[j] = src[members[j]] for n rows of row_elems
// bf16 (row_elems % 8 == 0, 16-byte aligned rows); members[h * n_idx + j] = j for every head, and (when
// assignment is not null) assignment[p] = the cluster whose CSR range holds position p.
cudaError_t gather_rows(const uint16_t* src, const uint32_t* members, uint16_t* dst, int64_t n, int row_elems,
                        cudaStream_t s);
cudaError_t members_to_rows(uint32_t* members, int* assignment, const int* offsets, int64_t num_heads,
                            int64_t n_idx, int num_clusters, cudaStream_t s);

// Oracle scores: for flat head h and every query head g of its group, logits l_g[t] = scale * q_g . k_t
// over the whole cache t in [0, num_tokens), lse_g their log-sum-exp; score[h, t - idx_begin] =
// sum_g exp(l_g[t] - lse_g) for t in [idx_begin, idx_begin + n_idx) (attention/oracle.cpp).
struct OracleParams {
  const float* q = nullptr;     // [H, G, D] f32
  const uint16_t* k = nullptr;  // [H, kv_stride, D] bf16
  int64_t kv_stride = 0, num_tokens = 0, idx_begin = 0, n_idx = 0;
  int num_heads = 0, group = 0, head_dim = 0;
  float scale = 0.0f;
  float* logits = nullptr;        // [H, G, num_tokens] workspace
  float2* partial = nullptr;      // [H, G, oracle_blocks(num_tokens)]: (max, sum of exp) per CTA
  float* scores = nullptr;        // [H, n_idx] out
};
int oracle_blocks(int64_t num_tokens);
cudaError_t oracle_scores(const OracleParams& p, cudaStream_t s);

// Outlier split of a k-means result (index/wave_index.h split_outliers) over tokens [begin, begin + n) of
// each flat head, C clusters, the k-means CSR layout (head h's members at [h*n, (h+1)*n)).
struct OutlierParams {
  const uint16_t* keys = nullptr;    // K: [H, kv_stride, D] bf16
  const uint16_t* values = nullptr;  // V
  int64_t kv_stride = 0, begin = 0, n = 0;
  int num_heads = 0, head_dim = 0, num_clusters = 0;
  float* residual = nullptr;         // [H, n] out of outlier_residuals: ||k - c||^2, -inf if within rounding
  // From the selection over residual (ascending relative token ids, count per head):
  const int* picked = nullptr;       // [H, picked_stride]
  const int* picked_count = nullptr;  // [H]
  int64_t picked_stride = 0;
  uint8_t* touched = nullptr;        // [H, C] workspace (zeroed by outlier_mark)
  // k-means result, updated in place: centroids / value sums of touched clusters from their remaining
  // members, sizes, assignment (-1 for an outlier); members compacted into members_out with offsets.
  float* centroids = nullptr;        // [H, C, D] f32
  uint16_t* centroids_bf16 = nullptr;
  float* value_sums = nullptr;
  uint16_t* value_sums_bf16 = nullptr;
  int* sizes = nullptr;              // [H, C]
  int* assignment = nullptr;         // [H, n]
  const uint32_t* members = nullptr;  // [H * n]
  int* offsets = nullptr;            // [H * C + 1] (rewritten)
  uint32_t* members_out = nullptr;   // [H * n] out (compact)
  int* outliers = nullptr;           // [H, out_stride] out: KV tokens begin + i of the picked, appended
  int* outlier_count = nullptr;      // [H] in/out: entries already in outliers (new ones go after)
  int64_t out_stride = 0;
};
cudaError_t outlier_residuals(const OutlierParams& p, cudaStream_t s);
// Marks the picked tokens (assignment -1, touched clusters), recomputes the touched clusters, compacts
// the CSR and appends the picked tokens to the outlier lists.
cudaError_t outlier_remove(const OutlierParams& p, cudaStream_t s);

}  // namespace retroinfer::cuda::detail
