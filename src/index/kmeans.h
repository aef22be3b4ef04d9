// Segmented spherical k-means over the keys of one KV head (docs/design.md §2, "Clustering"): the CPU
// specification of the wave index's clustering, which the CUDA kernels are tested against.
//
// Algorithm (deterministic, no randomness):
//   1. centre: x_i = k_i - mu with mu the mean key (mu is added back to the final centroids);
//   2. split the tokens into segments of segment_tokens (the last one may be shorter); a segment of L
//      tokens gets max(1, ceil(L / tokens_per_cluster)) clusters, initialised with the centred keys at
//      positions floor(i * L / k), i = 0..k-1, L2-normalised (a zero key stays zero);
//   3. segment_iters spherical iterations per segment: assign each key to the centroid of largest inner
//      product (ties: lowest cluster id), centroid = normalised sum of its members; an empty cluster (or one
//      whose members sum to zero) keeps its previous centroid;
//   4. global_iters iterations over all clusters of all segments: assign each key to the best centroid of
//      any segment, centroid = plain mean of its members; an empty cluster keeps its previous centroid and
//      gets size 0 (scoring gives it -inf);
//   5. keep per cluster the de-centred centroid, the value sum and the size; members grouped by cluster.
// The membership kept is the one of the last assignment step, so after a global step every centroid of a
// non-empty cluster is the mean of its member keys. With no iteration at all (both counts 0) the keys are
// assigned once, within their segment, to the initial centroids.
// The runs are prefixes of each other: segment_iters = t with global_iters = 0 returns the state after t
// spherical iterations (centroids = unit centred centroid + mu), so a kernel can be checked step by step.
//
// Cost: segment step O(segment_iters * n * (segment_tokens / tokens_per_cluster) * d); global step
// O(global_iters * n * num_clusters * d) = O(n^2 d / tokens_per_cluster), the dominant term at long
// context. Both use cblas_sgemm on blocks of rows (scores of one block: a few MiB), threaded by OpenBLAS, with
// the argmax and the centroid sums in OpenMP loops. Called inside a parallel region (the CPU runner builds a
// prompt's layers in parallel: Session::index_prompt) all of it runs on the calling thread, which is where it
// runs fastest: alternating threaded sgemm calls with short parallel loops keeps threads waiting on each other.
#pragma once

#include <cstdint>
#include <vector>

#include "retroinfer/attention_config.h"

namespace retroinfer::index {

// Defaults: AttentionConfig's (tokens_per_cluster, segment_tokens, kmeans_segment_iters, kmeans_global_iters).
struct KMeansParams {
  int tokens_per_cluster = AttentionConfig{}.tokens_per_cluster;  // average cluster size: a segment of L tokens
                                                                  // gets max(1, ceil(L / this)) clusters
  int segment_tokens = AttentionConfig{}.segment_tokens;  // segment length (the last segment may be shorter)
  int segment_iters = AttentionConfig{}.kmeans_segment_iters;  // spherical iterations inside each segment
  int global_iters = AttentionConfig{}.kmeans_global_iters;    // final iterations over all clusters (plain means)
};

// The clusters of one KV head over n indexed tokens (token i = the i-th indexed token).
struct ClusterIndex {
  int num_clusters = 0;
  int head_dim = 0;
  std::vector<float> centroids;     // [num_clusters, head_dim], f32, row-major: de-centred mean keys
  std::vector<float> value_sums;    // [num_clusters, head_dim], f32, row-major: sum of the members' values
  std::vector<int32_t> sizes;       // [num_clusters]: members per cluster (0 = empty)
  std::vector<int32_t> assignment;  // [n]: cluster of each token
  std::vector<int32_t> offsets;     // [num_clusters + 1]: CSR offsets into members
  std::vector<int32_t> members;     // [n]: tokens grouped by cluster, ascending inside a cluster (a permutation)
};

// keys, values: [n, head_dim], f32, row-major (already converted from storage). n may be 0 (no cluster).
// Throws Error on a non-positive head_dim, negative n, null pointers with n > 0, or out-of-range params.
ClusterIndex segmented_kmeans(const float* keys, const float* values, int64_t n, int head_dim,
                              const KMeansParams& p);

// The same routine on one segment with exactly num_clusters clusters (1 <= num_clusters <= n): used by
// index updates during decode. p.tokens_per_cluster and p.segment_tokens are ignored.
ClusterIndex block_kmeans(const float* keys, const float* values, int64_t n, int head_dim, int num_clusters,
                          const KMeansParams& p);

// Spherical objective of an index over the keys it was built from: sum over tokens of
// (k_i - mu) . normalise(c_a(i) - mu), mu the mean key and a(i) the token's cluster. The spherical
// iterations never decrease it (each assignment and each normalised-mean update maximises it with the
// other fixed). keys: [n, head_dim] f32.
double kmeans_objective(const float* keys, int64_t n, int head_dim, const ClusterIndex& ci);

}  // namespace retroinfer::index
