// Wave index of one (sequence, layer) (docs/design.md §2): per KV head, the clusters of the indexed tokens,
// cluster scoring against a GQA group of queries, and the split of the clusters into the retrieval,
// estimation and ignored zones. The steady zone is every token outside the indexed region.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "index/kmeans.h"
#include "retroinfer/kv_cache.h"
#include "retroinfer/wave_counts.h"

namespace retroinfer::index {

// Zone of one token for one decode step and KV head.
// kOutlier: an indexed token kept out of every cluster because its cluster's centroid represents it
// poorly (see split_outliers); always read exactly, like the steady zone.
enum class Zone : uint8_t { kSteady = 0, kRetrieval = 1, kEstimation = 2, kIgnored = 3, kOutlier = 4 };
std::string_view zone_name(Zone z);

// The clusters of one KV head. Cluster ids are stable: updates only append clusters.
// Threading contract: written by one thread (build / append); read by any number of threads meanwhile
// nobody writes.
struct HeadIndex {
  int head_dim = 0;
  std::vector<float> centroids;   // [num_clusters, head_dim], f32, row-major: de-centred mean keys
  std::vector<float> value_sums;  // [num_clusters, head_dim], f32, row-major
  std::vector<int32_t> sizes;     // [num_clusters]; 0 = empty cluster (scores -inf)
  std::vector<int64_t> offsets{0};  // [num_clusters + 1]: CSR offsets into members
  std::vector<int64_t> members;     // [offsets.back()]: absolute token positions grouped by cluster
  std::vector<int64_t> outliers;    // [num_outliers]: absolute positions of the outlier tokens, ascending

  int num_clusters() const { return static_cast<int>(sizes.size()); }
  int64_t num_tokens() const { return offsets.back(); }  // clustered tokens (outliers excluded)
  // Appends the clusters of ci, built over the tokens [first_token, first_token + n) of the cache, and the
  // outlier tokens `outliers` (positions relative to first_token, ascending; not members of ci).
  void append(const ClusterIndex& ci, int64_t first_token, const std::vector<int32_t>& outliers = {});
  void clear();
};

// Scores the clusters of hi for the `group` query heads of its KV head.
// q:      [group, head_dim] f32 (already post-RoPE).
// logits: [group, num_clusters] out: q_g . c_j * scale (the estimation logits).
// scores: [num_clusters] out: sum_g softmax_j(logits_g)[j] over the non-empty clusters; -inf if empty.
void score_clusters(const HeadIndex& hi, const float* q, int group, float scale, float* logits, float* scores);
// The logits step of score_clusters for the clusters [begin, end) only (logits [group, num_clusters]; the
// others untouched): a head's clusters may be scored in parts by several threads.
void cluster_logits_range(const HeadIndex& hi, const float* q, int group, float scale, int begin, int end,
                          float* logits);
// The scores step of score_clusters on given logits ([group, num_clusters]; those of empty clusters are not
// read): scores[j] = sum_g softmax_j(logits_g)[j] over the clusters with sizes[j] > 0, -inf where sizes[j] == 0.
void scores_from_logits(const int32_t* sizes, int num_clusters, const float* logits, int group, float* scores);

// Picks the best n_retrieval clusters (retrieval zone) and the next n_estimation (estimation zone) by
// score (the counts: zone_counts, retroinfer/wave_counts.h), ties broken by the lower cluster id; empty
// clusters (-inf) are never picked, so a zone may come out smaller than its count. Both lists are returned
// in ascending cluster id.
struct ZoneSelection {
  std::vector<int32_t> retrieval;
  std::vector<int32_t> estimation;
};
void select_zones(const float* scores, int num_clusters, const ZoneCounts& counts, ZoneSelection& out);

// Index of one (sequence, layer): the tokens [indexed_begin, indexed_end) are clustered (per KV head, every
// head over the same tokens); the steady zone is [0, indexed_begin) and [indexed_end, size).
struct WaveIndex {
  int64_t indexed_begin = 0;
  int64_t indexed_end = 0;
  std::vector<HeadIndex> heads;  // [num_heads_kv]
  int64_t indexed_tokens() const { return indexed_end - indexed_begin; }
};

// Outlier tokens: removes from ci the round(fraction * n) tokens worst represented by their cluster's
// centroid and returns them (ascending, relative token indices). "Worst represented" = largest residual
// ||k_i - c_a(i)||: a query q's estimation logit q.c differs from the token's true logit q.k by q.(k - c),
// at most ||q|| ||k - c|| (Cauchy-Schwarz), so the residual bounds, for every query, how far the
// estimate (and the cluster's score) can be from that token; a lone key that k-means folded into a cluster
// of ordinary keys (a "needle") has a large residual and is averaged away otherwise. Tokens with a zero
// residual are never taken (they are represented exactly). Ties: the lower token index first. Every
// cluster that loses members gets the plain mean of its remaining member keys as centroid (what the
// global k-means step gives; a spherical-only run's centroid is replaced too), its value sum and size
// lose the removed tokens (size 0: empty cluster, never scored); CSR offsets/members and assignment
// (-1 for an outlier) are rewritten. keys, values: [n, head_dim] f32 (the rows ci was built from).
// fraction in [0, 1].
std::vector<int32_t> split_outliers(ClusterIndex& ci, const float* keys, const float* values, int64_t n,
                                    double fraction);

// Clusters tokens [begin, end) of KV head h of kv with segmented k-means, splits off the outlier tokens
// (split_outliers with outlier_fraction; 0 = none) and appends both to hi.
// Runs in the caller's thread; the k-means's sgemm calls are threaded by OpenBLAS.
void index_tokens(const KvCache& kv, int h, int64_t begin, int64_t end, const KMeansParams& p, HeadIndex& hi,
                  double outlier_fraction = 0.0);
// Same with one segment of exactly num_clusters clusters (index updates).
void index_block(const KvCache& kv, int h, int64_t begin, int64_t end, int num_clusters, const KMeansParams& p,
                 HeadIndex& hi, double outlier_fraction = 0.0);

}  // namespace retroinfer::index
