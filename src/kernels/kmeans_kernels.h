// K-means kernels (kmeans.cu, kmeans_assign.cu, kmeans_group.cu, kmeans_sort.cu): parameters and launchers.
// Shared notation: kernels/kernel_common.h. Launchers validate nothing and return the launch status.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/kernel_common.h"

namespace retroinfer::cuda::detail {

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

}  // namespace retroinfer::cuda::detail
