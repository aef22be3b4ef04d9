// Helpers shared by the host-side layers of the CUDA backend (src/backend/cuda only).
#pragma once

#include <cmath>
#include <cstdint>

#include "backend/cuda/kernels.h"
#include "retroinfer/attention.h"

namespace retroinfer::cuda::detail {

int sm_count();  // multiprocessors of the current device (read once)
// Throws Error unless num_seqs >= 1, the GQA grouping divides, group <= kMaxGroup, head_dim in {64, 128}.
void validate_layer_shape(const AttentionShape& s, int num_seqs, const char* who);
// Throws Error on null K/V, num_tokens < 1 or >= 2^31, or kv_stride < num_tokens.
void validate_kv(const void* k, const void* v, int64_t num_tokens, int64_t kv_stride, const char* who);
float effective_scale(float scale, int head_dim);

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Splits of a token range over CTAs: enough CTAs for ~`waves` full waves of the chip (decode_ctas_per_sm()
// CTAs of the decode kernel fit on one multiprocessor by shared memory), each split a multiple of a CTA's
// tile round.
inline int decode_splits(int64_t tokens, int num_heads, int waves) {
  const int64_t round = int64_t{kDecodeTile} * kDecodeWarps;
  const int64_t want = int64_t{decode_ctas_per_sm()} * sm_count() * waves / num_heads;  // floor: no partial extra wave
  const int64_t most = ceil_div(tokens, round);
  const int64_t s = want < most ? want : most;
  return static_cast<int>(s > 0 ? s : 1);
}
inline int64_t split_tokens(int64_t tokens, int splits) {
  const int64_t round = int64_t{kDecodeTile} * kDecodeWarps;
  return ceil_div(ceil_div(tokens, splits), round) * round;
}

}  // namespace retroinfer::cuda::detail
