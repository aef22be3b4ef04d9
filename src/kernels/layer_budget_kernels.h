// The budget calibration's kernels (retrieval budgets by layer, src/index/layer_budgets.h): the attention mass
// of a few calibration queries per wave-index cluster, the clusters ranked by it and what each retrieval size
// leaves out, all on the device (the host reads back 8 numbers per query and KV head). Every key is read once
// per pass for all the pass's queries of its GQA group (a tile of tokens per CTA), so a pass over a 1M-token
// head costs one read of its keys; the probabilities are never stored: one pass finds each row's softmax
// maximum and sum, the next adds each token's normalised mass to its cluster.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace retroinfer::cuda::detail {

// Query rows of one KV head per pass (n queries x the group's query heads): at most kCalibrationRows, and their
// f32 copies within kCalibrationQueryFloats of shared memory.
inline constexpr int kCalibrationRows = 64;
inline constexpr int kCalibrationQueryFloats = 8192;
inline constexpr int kCalibrationTile = 128;  // tokens per CTA
inline int calibration_max_rows(int head_dim) {
  const int by_memory = kCalibrationQueryFloats / (head_dim > 0 ? head_dim : 1);
  return by_memory < kCalibrationRows ? by_memory : kCalibrationRows;
}

struct CalibrationMassParams {
  const float* q = nullptr;     // [n, num_heads_q, head_dim] f32 post-RoPE: queries of positions first_pos + i
  const uint16_t* k = nullptr;  // [num_heads_kv, kv_stride, head_dim] bf16 (one sequence)
  int64_t kv_stride = 0;
  int64_t num_tokens = 0;       // tokens in the cache; query i sees tokens [0, first_pos + i]
  int64_t first_pos = 0;
  int n = 0, num_heads_q = 0, num_heads_kv = 0, head_dim = 0;  // n * group <= calibration_max_rows(head_dim)
  float scale = 0.0f;
  float2* tile_stats = nullptr;  // workspace [n * num_heads_q, tiles]: each token tile's (max, sum of exp)
  float2* row_stats = nullptr;   // workspace [n * num_heads_q]: each row's softmax (max, sum of exp)
  // The wave index: cluster of each index token (relative to idx_begin), -1 for an outlier.
  const int* token_cluster = nullptr;  // [num_heads_kv, n_idx]
  int64_t idx_begin = 0, n_idx = 0;
  int clusters = 0;
  float* group_mass = nullptr;  // out [n, num_heads_kv, clusters] (zeroed by the caller): each cluster's mass
                                // summed over the GQA group
};

// Tiles of a pass: ceil(num_tokens / kCalibrationTile).
inline int64_t calibration_tiles(int64_t num_tokens) { return (num_tokens + kCalibrationTile - 1) / kCalibrationTile; }

// token_cluster [heads, n_idx] from the CSR (offsets [heads * clusters + 1] absolute, members relative to the
// indexed region); tokens in no cluster stay -1.
cudaError_t calibration_token_clusters(const int* offsets, const uint32_t* members, int heads, int clusters,
                                       int64_t n_idx, int* token_cluster, cudaStream_t s);
// row_stats: each (query, query head)'s causal softmax maximum and sum. head_dim % 8 == 0, <= 256.
cudaError_t calibration_row_stats(const CalibrationMassParams& p, cudaStream_t s);
// group_mass += each indexed token's probability, summed over the group, into its cluster (after row_stats).
cudaError_t calibration_cluster_mass(const CalibrationMassParams& p, cudaStream_t s);

// The ranking (layer_budget_rank.cu): for each of `rows` rows of group_mass, the mass outside its counts[m]
// heaviest clusters, for the kCalibrationMultiples retrieval sizes of index::kLayerBudgetMultipliers (ascending).
inline constexpr int kCalibrationMultiples = 8;
struct CalibrationRankParams {
  const float* group_mass = nullptr;  // [rows, clusters], each >= 0
  int rows = 0, max_rows = 0, clusters = 0;  // rows <= max_rows (the workspace's and the sort's size)
  int counts[kCalibrationMultiples] = {};
  uint64_t* keys = nullptr;         // workspace [max_rows * clusters]
  uint64_t* keys_sorted = nullptr;  // workspace [max_rows * clusters]
  void* sort_temp = nullptr;        // calibration_rank_temp_bytes(max_rows, clusters) bytes
  size_t sort_temp_bytes = 0;
  double* missed = nullptr;  // out [rows, kCalibrationMultiples]
};
size_t calibration_rank_temp_bytes(int max_rows, int clusters);
cudaError_t calibration_rank(const CalibrationRankParams& p, cudaStream_t s);

}  // namespace retroinfer::cuda::detail
