// Kernels of the attention layers (quest.cu, layer_kernels.cu): quest page bounds, index append, token lists,
// the oracle's scores and the outlier split.
// Shared notation: kernels/kernel_common.h. Launchers validate nothing and return the launch status.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/kernel_common.h"

namespace retroinfer::cuda::detail {

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
