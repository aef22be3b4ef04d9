// K-means kernels (kmeans.cu, kmeans_assign.cu, kmeans_group.cu, kmeans_sort.cu): parameters and launchers.
// Shared notation: kernels/kernel_common.h. Launchers validate only what their comments name and return the
// launch status.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/kernel_common.h"

namespace retroinfer::cuda::detail {

// ---- k-means (kmeans.cu, kmeans_assign.cu, kmeans_sort.cu) ----

struct KMeansKernelParams {
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
  // Assignment operands: per row with m = max |x|, x_q = clamp(rint(x * (127 / m)), -127, 127) and scale
  // m / 127 (IEEE operations, kmeans.cu quantize_q8); the key scale is not kept (a positive factor per key
  // does not move its argmax).
  int8_t* centred_q8 = nullptr;    // [H, n_idx, D] int8: key - mean (f32 difference) quantized per row
  int8_t* centroids_q8 = nullptr;  // [H, C, D] int8: the iterating (centred) centroids quantized per row
  float* centroid_scale = nullptr; // [H, C] f32: their scales
  float* centroids = nullptr;      // [H, C, D] f32: centred centroids while iterating; de-centred at the end
  uint16_t* centroids_bf16 = nullptr;  // [H, C, D] bf16 copy (decode meta at the end)
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
};
inline constexpr int kMeanChunks = 32;  // partial sums per head for the mean key (deterministic two-pass)

// Grouping by cluster after a segment pass: a stable counting sort per (head, segment) in one CTA where a
// segment has at most kGroupCountMaxBins clusters and kGroupCountMaxTokens tokens, else (and after a global
// pass) CUB's stable radix sort; the same members and offsets either way.
inline constexpr int kGroupCountMaxBins = 1024;     // clusters per segment the counting sort takes
inline constexpr int kGroupCountMaxTokens = 16384;  // ... and tokens per segment

// The launchers that read keys or values take head_dim 64 or 128 (else cudaErrorInvalidValue).
// Mean key and int8 centred keys (centred_q8 required).
cudaError_t kmeans_mean(const KMeansKernelParams& p, cudaStream_t s);
// Initial centroids (f32, bf16 and int8 copies; centroids_q8 and centroid_scale required).
cudaError_t kmeans_init(const KMeansKernelParams& p, cudaStream_t s);
// Assigns every index token to its best centroid, within its segment (global = false) or over all C
// (kmeans_assign.cu): the argmax of f32(centred_q8 . centroids_q8) * centroid_scale (mma.sync m16n8k32,
// exact int32 dots), ties to the lowest cluster id. Exact: a host computes the same argmax bit for bit
// from the same int8 operands (tests/gpu/test_cuda_kmeans_kernels.cpp). cudaErrorInvalidValue without the
// int8 operands.
cudaError_t kmeans_assign(const KMeansKernelParams& p, bool global, cudaStream_t s);
// Groups tokens by cluster (stable radix sort of sort_keys) and writes offsets.
cudaError_t kmeans_group(const KMeansKernelParams& p, cudaStream_t s);
// The same after a segment pass (every token's cluster inside its segment): one CTA per (segment, head)
// sorts by counting (kmeans_group.cu); cudaErrorInvalidValue where a segment has more than
// kGroupCountMaxBins clusters or kGroupCountMaxTokens tokens.
cudaError_t kmeans_group_segments(const KMeansKernelParams& p, cudaStream_t s);
// The grouping of a pass: kmeans_group_segments after a segment pass whose segments it takes, else
// kmeans_group.
cudaError_t kmeans_group_pass(const KMeansKernelParams& p, bool global, cudaStream_t s);
size_t kmeans_sort_temp_bytes(int64_t items, int end_bit);
// Recomputes centroids from the grouping: spherical (normalised sum) or plain mean; empty keeps
// (centroids_q8 and centroid_scale required).
cudaError_t kmeans_update(const KMeansKernelParams& p, bool spherical, cudaStream_t s);
// Final outputs: de-centred centroids, value sums, sizes and their bf16 copies. with_mean: the plain-mean
// update of the last global iteration first, in the same pass over the members (the same centroids as
// kmeans_update(p, false) then kmeans_finalize, bit for bit).
cudaError_t kmeans_finalize(const KMeansKernelParams& p, cudaStream_t s, bool with_mean = false);
// out[h] = the sum of the k largest of sizes[h, 0 .. clusters) (int, >= 0), for each of `heads` heads: the
// retrieval zone's largest token count (RetroLayer's token-list capacity) without downloading the sizes.
// 1 <= k <= clusters, else cudaErrorInvalidValue.
cudaError_t top_sizes_sum(const int* sizes, int heads, int clusters, int k, long long* out, cudaStream_t s);

}  // namespace retroinfer::cuda::detail
