// A simple, exact causal attention kernel on the CUDA cores (prefill_attention_ref.cu): one warp per
// (sequence, query row, query head), an online softmax over the keys in f32, K/V read as bf16. It is the
// correctness reference for the tensor-core PrefillAttention, the runner's prefill attention for shapes the
// fast kernel does not take (head_dim other than 64 / 128, GQA group > 8), and the decode attention of
// FullLayerAttention for those shapes (decode is the case n = 1, pos0 = num_tokens - 1). Slow for long
// prompts: O(n * tokens) sequential warp reductions per head. Included only from src/backend/cuda.
#pragma once

#include <cstdint>

#include "retroinfer/attention_config.h"
#include "retroinfer/cuda_device.h"

namespace retroinfer::cuda::model {

struct RefAttentionArgs {
  const float* q = nullptr;     // [num_seqs, n, num_heads_q, head_dim] f32, post-RoPE, unscaled
  const uint16_t* k = nullptr;  // [num_seqs, num_heads_kv, kv_stride, head_dim] bf16
  const uint16_t* v = nullptr;  // same layout
  float* out = nullptr;         // [num_seqs, n, num_heads_q, head_dim] f32, every element written
  int64_t kv_stride = 0;
  int64_t pos0 = 0;  // query row i of every sequence sits at position pos0 + i and sees keys [0, pos0 + i]
  int64_t n = 0;     // query rows per sequence
  int num_seqs = 1;
  float scale = 0.0f;  // 0 means 1 / sqrt(head_dim)
};

// Largest head_dim the reference takes (8 elements per lane of a warp).
inline constexpr int kRefMaxHeadDim = 256;

// Validates (shape positive, GQA divides, head_dim even and <= kRefMaxHeadDim, pos0 + n <= kv_stride,
// non-null pointers) and launches on `s`; throws Error on bad arguments or a launch failure.
void prefill_attention_reference(const AttentionShape& shape, const RefAttentionArgs& a, Stream s);

}  // namespace retroinfer::cuda::model
